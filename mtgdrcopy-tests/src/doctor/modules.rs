//! `mtgpu` and `mtgdrdrv`: the two kernel modules, read from sysfs and procfs only.
//!
//! The provider's module name is one input, `MTGDRDRV_PROVIDER` (default `mtgpu`), the variable
//! the package's mtgdrdrv-load and the source tree's insmod.sh read too: the test suite's
//! emulated provider is the module `mtgpu_emu`, which registers the same PCI driver, `mtgpu`.
//! Whether the provider is initialised is read from its `disable_driver` parameter and from
//! the PCI driver's registration, never by calling it.

use super::report::Line;
use super::Host;

/// The variable that names the provider's module.
pub const PROVIDER_ENV: &str = "MTGDRDRV_PROVIDER";
/// The real provider's module.
pub const DEFAULT_PROVIDER: &str = "mtgpu";
/// The PCI driver the provider registers once initialised (mtgdrdrv looks it up by this name).
pub const PCI_DRIVER: &str = "mtgpu";

/// The provider's module name: `MTGDRDRV_PROVIDER` if it is a plausible module name, else mtgpu.
pub fn provider_name() -> String {
    std::env::var(PROVIDER_ENV)
        .ok()
        .filter(|n| is_module_name(n))
        .unwrap_or_else(|| DEFAULT_PROVIDER.to_string())
}

fn is_module_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The provider's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Provider {
    /// Not loaded.
    Missing,
    /// Loaded with `disable_driver=1`: symbols exported, GPU driver not initialised.
    Disabled,
    /// Loaded, and its PCI driver is registered, with these devices bound (PCI addresses).
    Live { devices: Vec<String> },
    /// Loaded, not disabled, yet its PCI driver is not registered.
    Unregistered,
}

impl Provider {
    pub fn is_live(&self) -> bool {
        matches!(self, Provider::Live { .. })
    }
}

/// Whether a module parameter's value reads as set (`Y` for a bool, `1` for an int).
fn is_set(value: &str) -> bool {
    matches!(value.trim(), "Y" | "y" | "1")
}

/// The PCI addresses bound to the provider's PCI driver.
pub fn bound_devices(host: &Host) -> Vec<String> {
    host.entries(&format!("/sys/bus/pci/drivers/{PCI_DRIVER}"))
        .into_iter()
        .filter(|e| is_pci_address(e))
        .collect()
}

/// `DDDD:BB:DD.F`.
pub fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.chars()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

pub fn provider(host: &Host, name: &str) -> Provider {
    let module = format!("/sys/module/{name}");
    if !host.exists(&module) {
        return Provider::Missing;
    }
    if host
        .value(&format!("{module}/parameters/disable_driver"))
        .is_some_and(|v| is_set(&v))
    {
        return Provider::Disabled;
    }
    if !host.exists(&format!("/sys/bus/pci/drivers/{PCI_DRIVER}")) {
        return Provider::Unregistered;
    }
    Provider::Live {
        devices: bound_devices(host),
    }
}

pub fn mtgpu_line(name: &str, state: &Provider) -> Line {
    let module = if name == DEFAULT_PROVIDER {
        name.to_string()
    } else {
        format!("{name} ({PROVIDER_ENV})")
    };
    match state {
        Provider::Missing => Line::fail(
            "mtgpu",
            format!("{module} is not loaded"),
            format!(
                "install Moore Threads' GPU driver and load it (sudo modprobe {name}); \
                 `dmesg | grep -i {name}` says why a load failed"
            ),
        ),
        Provider::Disabled => Line::fail(
            "mtgpu",
            format!(
                "{module} is loaded with disable_driver=1: its GPU driver is not initialised, \
                 and calling into it crashes the caller"
            ),
            format!(
                "reboot (the driver's installer leaves it so until then), or \
                 sudo modprobe -r mtgdrdrv {name} && sudo modprobe {name} (without disable_driver)"
            ),
        ),
        Provider::Unregistered => Line::fail(
            "mtgpu",
            format!("{module} is loaded but its PCI driver ({PCI_DRIVER}) is not registered"),
            format!("see `dmesg | grep -i {name}` for why it did not initialise, then reload it"),
        ),
        Provider::Live { devices } if devices.is_empty() => Line::fail(
            "mtgpu",
            format!("{module} is loaded but drives no GPU"),
            "check that the GPU is seated and visible (lspci -d 1ed5:) and `dmesg | grep -i mtgpu`",
        ),
        Provider::Live { devices } => Line::ok(
            "mtgpu",
            format!(
                "{module} loaded, driving {} GPU{} ({})",
                devices.len(),
                if devices.len() == 1 { "" } else { "s" },
                devices.join(", ")
            ),
        ),
    }
}

/// mtgdrdrv, loaded: its version as `(major, minor)`, if it could be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mtgdrdrv {
    pub version: Option<(u32, u32)>,
}

/// `major.minor` (a third part ignored).
pub fn parse_version(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// mtgdrdrv if loaded: the version from sysfs (`MODULE_VERSION`), else from its procfs params.
pub fn mtgdrdrv(host: &Host) -> Option<Mtgdrdrv> {
    if !host.exists("/sys/module/mtgdrdrv") {
        return None;
    }
    let version = host
        .value("/sys/module/mtgdrdrv/version")
        .and_then(|v| parse_version(&v))
        .or_else(|| {
            host.read(mtgdrdrv::procfs::PARAMS_PATH)?
                .lines()
                .find_map(|l| parse_version(l.strip_prefix("Version:")?))
        });
    Some(Mtgdrdrv { version })
}

/// The libgdrapi this process loads (what the tools and applications load: libgdrapi.so.1).
pub struct LoadedLibrary {
    /// `(major, minor, path)`, or why it cannot be loaded.
    pub found: Result<(u32, u32, String), String>,
}

impl LoadedLibrary {
    pub fn probe() -> LoadedLibrary {
        let found = crate::gdr::api()
            .map(|api| {
                let (major, minor) = crate::gdr::runtime_version(api);
                let path = crate::gdr::library_path().unwrap_or_else(|| "path unknown".into());
                (major as u32, minor as u32, path)
            })
            .map_err(|e| format!("{e:#}"));
        LoadedLibrary { found }
    }
}

pub fn mtgdrdrv_line(driver: Option<&Mtgdrdrv>, library: &LoadedLibrary) -> Line {
    let Some(driver) = driver else {
        return Line::fail(
            "mtgdrdrv",
            "not loaded",
            "sudo modprobe mtgdrdrv (package mtgdrdrv-dkms); if that fails, `dkms status` and \
             `dmesg | grep mtgdrdrv` say why",
        );
    };
    let Some((major, minor)) = driver.version else {
        return Line::warn(
            "mtgdrdrv",
            "loaded, version unreadable (/sys/module/mtgdrdrv/version)",
            "reinstall mtgdrdrv-dkms; this module does not report its version",
        );
    };
    let have = mtgdrdrv::pack(major, minor);
    let (lib_major, lib_minor, path) = match &library.found {
        Ok(found) => found.clone(),
        Err(e) => {
            return Line::warn(
                "mtgdrdrv",
                format!("{major}.{minor} loaded; libgdrapi cannot be loaded to judge it: {e}"),
                "install the libgdrapi package (libgdrapi.so.1)",
            )
        }
    };
    // The rule is this build's (libgdrapi 1.x accepts driver 0.x from its minimum on); a
    // library of another major than the one built in here is judged by that library itself.
    if lib_major != gdrapi::GDR_API_MAJOR_VERSION {
        return Line::warn(
            "mtgdrdrv",
            format!("{major}.{minor} loaded; libgdrapi {lib_major}.{lib_minor} ({path}) is not the 1.x this doctor knows"),
            "install libgdrapi and mtgdrcopy-tests of the same release",
        );
    }
    let minimum = gdrapi::MINIMUM_GDRDRV_VERSION;
    let wanted = format!(
        "{}.x, x >= {}",
        mtgdrdrv::major(minimum),
        mtgdrdrv::minor(minimum)
    );
    if mtgdrdrv::accepts(minimum, have) {
        Line::ok(
            "mtgdrdrv",
            format!("{major}.{minor} loaded; libgdrapi {lib_major}.{lib_minor} ({path}) accepts it (needs {wanted})"),
        )
    } else {
        Line::fail(
            "mtgdrdrv",
            format!("{major}.{minor} loaded; libgdrapi {lib_major}.{lib_minor} ({path}) refuses it (needs {wanted})"),
            "install the mtgdrdrv-dkms of libgdrapi's release, then sudo modprobe -r mtgdrdrv && sudo modprobe mtgdrdrv",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::host::FakeRoot;
    use crate::doctor::Level;

    #[test]
    fn the_provider_states() {
        let root = FakeRoot::new("provider");
        assert_eq!(provider(&root.host(), "mtgpu_emu"), Provider::Missing);
        root.file("/sys/module/mtgpu_emu/parameters/disable_driver", "Y\n");
        assert_eq!(provider(&root.host(), "mtgpu_emu"), Provider::Disabled);
        root.file("/sys/module/mtgpu_emu/parameters/disable_driver", "N\n");
        assert_eq!(provider(&root.host(), "mtgpu_emu"), Provider::Unregistered);
        root.dir("/sys/bus/pci/drivers/mtgpu/0000:00:04.0")
            .file("/sys/bus/pci/drivers/mtgpu/new_id", "");
        assert_eq!(
            provider(&root.host(), "mtgpu_emu"),
            Provider::Live {
                devices: vec!["0000:00:04.0".into()]
            }
        );
        // The real driver's parameter is an int.
        root.file("/sys/module/mtgpu/parameters/disable_driver", "1\n");
        assert_eq!(provider(&root.host(), "mtgpu"), Provider::Disabled);
    }

    #[test]
    fn disabled_and_missing_fail_with_a_fix() {
        let line = mtgpu_line("mtgpu", &Provider::Disabled);
        assert_eq!(line.level, Level::Fail);
        assert!(line.finding.contains("disable_driver=1"), "{line}");
        assert!(line.fix.contains("modprobe mtgpu"), "{line}");
        let line = mtgpu_line("mtgpu_emu", &Provider::Missing);
        assert!(
            line.to_string()
                .starts_with("FAIL  mtgpu: mtgpu_emu (MTGDRDRV_PROVIDER) is not loaded; fix: "),
            "{line}"
        );
        let live = Provider::Live {
            devices: vec!["0000:00:04.0".into()],
        };
        assert_eq!(
            mtgpu_line("mtgpu", &live).to_string(),
            "OK    mtgpu: mtgpu loaded, driving 1 GPU (0000:00:04.0)"
        );
    }

    #[test]
    fn the_version_comes_from_sysfs_else_procfs() {
        let root = FakeRoot::new("mtgdrdrv");
        assert_eq!(mtgdrdrv(&root.host()), None);
        root.dir("/sys/module/mtgdrdrv");
        assert_eq!(mtgdrdrv(&root.host()), Some(Mtgdrdrv { version: None }));
        root.file(
            mtgdrdrv::procfs::PARAMS_PATH,
            "Version: 0.3\ndbg_enabled: 0\n",
        );
        assert_eq!(mtgdrdrv(&root.host()).and_then(|m| m.version), Some((0, 3)));
        root.file("/sys/module/mtgdrdrv/version", "0.1\n");
        assert_eq!(mtgdrdrv(&root.host()).and_then(|m| m.version), Some((0, 1)));
    }

    #[test]
    fn the_library_judges_the_driver_by_the_compatibility_promise() {
        let lib = LoadedLibrary {
            found: Ok((1, 0, "/usr/lib/libgdrapi.so.1".into())),
        };
        let ok = mtgdrdrv_line(
            Some(&Mtgdrdrv {
                version: Some((0, 7)),
            }),
            &lib,
        );
        assert_eq!(
            ok.to_string(),
            "OK    mtgdrdrv: 0.7 loaded; libgdrapi 1.0 (/usr/lib/libgdrapi.so.1) accepts it (needs 0.x, x >= 1)"
        );
        let old = mtgdrdrv_line(
            Some(&Mtgdrdrv {
                version: Some((0, 0)),
            }),
            &lib,
        );
        assert_eq!(old.level, Level::Fail, "{old}");
        let major = mtgdrdrv_line(
            Some(&Mtgdrdrv {
                version: Some((1, 1)),
            }),
            &lib,
        );
        assert_eq!(major.level, Level::Fail, "{major}");
        let none = mtgdrdrv_line(None, &lib);
        assert!(none
            .to_string()
            .starts_with("FAIL  mtgdrdrv: not loaded; fix: sudo modprobe mtgdrdrv"));
    }

    #[test]
    fn pci_addresses() {
        assert!(is_pci_address("0000:3b:00.0"));
        assert!(!is_pci_address("new_id"));
        assert!(!is_pci_address("0000:3b:00:0"));
    }
}
