//! `pat` (x86 only) and `copy variant`.
//!
//! PAT: write-combined mappings need the x86 Page Attribute Table; without it mtgdrdrv's
//! mappings are uncached and copies to the GPU many times slower. Unprivileged and without
//! dmesg (often restricted), the reliable test is the CPU's `pat` flag in /proc/cpuinfo and the
//! absence of `nopat` on the kernel command line, the two ways PAT ends up off on bare metal
//! and in VMs. Where debugfs is readable (root), the kernel's own `x86/pat_memtype_list`, which
//! exists only while PAT is enabled, settles it for the other reasons too.

use super::report::Line;
use super::Host;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pat {
    /// The CPU offers PAT (`pat` in the flags), if /proc/cpuinfo could be read.
    pub cpu_flag: Option<bool>,
    /// `nopat` is on the kernel command line.
    pub nopat: bool,
    /// Whether debugfs's `x86/pat_memtype_list` exists, if debugfs's x86 directory is readable.
    pub memtype_list: Option<bool>,
}

impl Pat {
    pub fn probe(host: &Host) -> Pat {
        let cpu_flag = host.read("/proc/cpuinfo").map(|info| {
            info.lines()
                .find_map(|l| {
                    l.strip_prefix("flags")?
                        .split_once(':')
                        .map(|(_, f)| f.to_string())
                })
                .is_some_and(|f| f.split_whitespace().any(|w| w == "pat"))
        });
        let nopat = host
            .read("/proc/cmdline")
            .is_some_and(|c| c.split_whitespace().any(|w| w == "nopat"));
        let debugfs = "/sys/kernel/debug/x86";
        let memtype_list = (!host.entries(debugfs).is_empty())
            .then(|| host.exists(&format!("{debugfs}/pat_memtype_list")));
        Pat {
            cpu_flag,
            nopat,
            memtype_list,
        }
    }
}

pub fn pat_line(pat: &Pat) -> Line {
    const SLOW: &str = "mtgdrdrv's mappings are then uncached, not write-combined, and copies to the GPU much slower";
    if pat.nopat {
        return Line::warn(
            "pat",
            format!("x86 PAT is off (nopat on the kernel command line): {SLOW}"),
            "remove nopat from the kernel command line (GRUB_CMDLINE_LINUX in /etc/default/grub), \
             run sudo update-grub and reboot",
        );
    }
    if pat.cpu_flag == Some(false) {
        return Line::warn(
            "pat",
            format!("the CPU (or the hypervisor) does not offer x86 PAT: {SLOW}"),
            "on a VM, give the guest the host's CPU model (e.g. QEMU -cpu host); on bare metal, \
             check the firmware settings",
        );
    }
    if pat.memtype_list == Some(false) {
        return Line::warn(
            "pat",
            format!("the kernel disabled x86 PAT (debugfs has no x86/pat_memtype_list): {SLOW}"),
            "`sudo dmesg | grep -i pat` says why; fix that and reboot",
        );
    }
    let Some(true) = pat.cpu_flag else {
        return Line::warn(
            "pat",
            "cannot tell whether x86 PAT is on (/proc/cpuinfo unreadable)",
            "mount /proc, or run the doctor on the host",
        );
    };
    Line::ok(
        "pat",
        format!(
            "x86 PAT on (CPU flag pat, no nopat on the kernel command line{})",
            if pat.memtype_list == Some(true) {
                ", x86/pat_memtype_list present"
            } else {
                ""
            }
        ),
    )
}

/// The chosen variant; when none is forced, also the preferred one the CPU lacks and what it
/// needs (on arm64 without LS64: ls64); when one is forced in vain, what the CPU lacks for it.
pub fn variant_line(variant: &gdrapi::copy::Variant, forced: Option<&str>) -> Line {
    let variants = gdrapi::copy::variants();
    let finding = format!(
        "{} (device stores of up to {} bytes, loads of up to {})",
        variant.name, variant.store_width, variant.load_width
    );
    let env = gdrapi::copy::VARIANT_ENV;
    let ignored = |why: String| {
        let usable: Vec<&str> = variants
            .iter()
            .filter(|v| v.is_supported())
            .map(|v| v.name)
            .collect();
        Line::warn(
            "copy variant",
            format!(
                "{finding}: {env}={} is ignored: {why}",
                forced.unwrap_or("")
            ),
            format!("unset {env} or set one of: {}", usable.join(", ")),
        )
    };
    match forced.map(|name| (name, variants.iter().find(|v| v.name == name))) {
        Some((name, _)) if name == variant.name => {
            Line::ok("copy variant", format!("{finding}, forced by {env}"))
        }
        Some((_, Some(wanted))) => ignored(format!("this CPU lacks {}", wanted.needs)),
        Some((_, None)) => ignored("no variant has that name".to_string()),
        None => {
            // The preferred variant the CPU lacks, if the chosen one is not the first default.
            let better = variants
                .iter()
                .take_while(|v| v.name != variant.name)
                .find(|v| !v.on_request && !v.is_supported());
            match better {
                Some(b) => Line::ok(
                    "copy variant",
                    format!("{finding}; {} would need {}", b.name, b.needs),
                ),
                None => Line::ok("copy variant", finding),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::host::FakeRoot;
    use crate::doctor::Level;

    #[test]
    fn pat_is_read_from_cpuinfo_cmdline_and_debugfs() {
        let root = FakeRoot::new("pat");
        root.file(
            "/proc/cpuinfo",
            "processor\t: 0\nflags\t\t: fpu vme pat pse36\n",
        )
        .file(
            "/proc/cmdline",
            "BOOT_IMAGE=/vmlinuz root=/dev/sda1 quiet\n",
        );
        let on = Pat::probe(&root.host());
        assert_eq!(
            on,
            Pat {
                cpu_flag: Some(true),
                nopat: false,
                memtype_list: None
            }
        );
        assert_eq!(
            pat_line(&on).to_string(),
            "OK    pat: x86 PAT on (CPU flag pat, no nopat on the kernel command line)"
        );
        root.file("/proc/cmdline", "root=/dev/sda1 nopat console=ttyS0\n");
        let off = pat_line(&Pat::probe(&root.host()));
        assert_eq!(off.level, Level::Warn);
        assert!(
            off.to_string()
                .starts_with("WARN  pat: x86 PAT is off (nopat on the kernel command line)"),
            "{off}"
        );
        root.file("/proc/cmdline", "root=/dev/sda1\n")
            .file("/proc/cpuinfo", "flags\t\t: fpu vme pse36 patx\n");
        assert_eq!(Pat::probe(&root.host()).cpu_flag, Some(false));
        root.file("/proc/cpuinfo", "flags\t\t: fpu pat\n")
            .file("/sys/kernel/debug/x86/cpa_stats", "");
        let p = Pat::probe(&root.host());
        assert_eq!(p.memtype_list, Some(false));
        assert_eq!(pat_line(&p).level, Level::Warn);
        root.file("/sys/kernel/debug/x86/pat_memtype_list", "");
        assert_eq!(pat_line(&Pat::probe(&root.host())).level, Level::Ok);
    }

    #[test]
    fn a_forced_variant_that_is_ignored_warns() {
        let generic = &gdrapi::copy::GENERIC;
        assert_eq!(variant_line(generic, None).level, Level::Ok);
        assert!(variant_line(generic, Some("generic"))
            .finding
            .contains("forced by GDRCOPY_COPY_VARIANT"));
        let ignored = variant_line(generic, Some("nonsense"));
        assert_eq!(ignored.level, Level::Warn);
        assert!(
            ignored.finding.contains("no variant has that name"),
            "{ignored}"
        );
        assert!(ignored.fix.contains("generic"), "{ignored}");
    }

    /// Every variant this CPU lacks, forced, is refused naming what it needs; unforced, the
    /// line names the preferred one the CPU lacks (arm64 without LS64: "ls64 would need
    /// FEAT_LS64 ...").
    #[test]
    fn the_line_names_what_the_cpu_lacks() {
        let variants = gdrapi::copy::variants();
        let chosen = gdrapi::copy::default_variant();
        for lacking in variants.iter().filter(|v| !v.is_supported()) {
            let line = variant_line(chosen, Some(lacking.name));
            assert_eq!(line.level, Level::Warn, "{line}");
            assert!(
                line.finding
                    .ends_with(&format!("is ignored: this CPU lacks {}", lacking.needs)),
                "{line}"
            );
        }
        let line = variant_line(chosen, None);
        let better = variants
            .iter()
            .take_while(|v| v.name != chosen.name)
            .find(|v| !v.on_request);
        match better {
            Some(b) => assert!(
                line.finding
                    .ends_with(&format!("; {} would need {}", b.name, b.needs)),
                "{line}"
            ),
            None => assert!(!line.finding.contains("would need"), "{line}"),
        }
        #[cfg(target_arch = "aarch64")]
        {
            let ls64 = &variants[0];
            assert_eq!(ls64.name, "ls64");
            assert!(ls64.needs.contains("FEAT_LS64"), "{}", ls64.needs);
        }
    }
}
