//! What the module tests' guest holds: both modules (built by [`crate::kbuild`]), the in-VM
//! test binary, the tools and libraries of the packages, the doctor's files; the VM around
//! them, with no script yet.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use xshell::{cmd, Shell};

use xtask_base::paths;

use super::doctor;
use super::script::load_only;
use crate::kbuild::build_modules;
use crate::kernel::Kernel;
use crate::step::timed;
use crate::vm;

/// Builds the in-VM test binary (release, debug info stripped to keep the initramfs small).
fn build_test_binary(sh: &Shell) -> Result<PathBuf> {
    let json = cmd!(
        sh,
        "cargo test --release --quiet -p mtgdrcopy-tests --features vm --test vm_module --no-run --message-format=json"
    )
    .read()?;
    let exe = json
        .lines()
        .filter(|l| {
            l.contains("\"reason\":\"compiler-artifact\"") && l.contains("\"name\":\"vm_module\"")
        })
        .find_map(|l| {
            let key = "\"executable\":\"";
            let start = l.find(key)? + key.len();
            let end = start + l[start..].find('"')?;
            Some(PathBuf::from(&l[start..end]))
        })
        .context("cargo did not report the vm_module test executable")?;
    let stripped = paths::build_dir().join("vm").join("vm_module");
    std::fs::create_dir_all(paths::build_dir().join("vm"))?;
    cmd!(sh, "strip --strip-debug -o {stripped} {exe}").run()?;
    Ok(stripped)
}

/// The programs of the mtgdrcopy-tests package (with the emulator-only checks, feature
/// `emulator`), libgdrapi.so.1 and the emulated libmusa.so.1, built in release mode and
/// stripped, with their guest paths (programs in /usr/bin).
fn tool_files(sh: &Shell) -> Result<Vec<(PathBuf, String)>> {
    cmd!(sh, "cargo build --quiet --release -p libgdrapi --lib").run()?;
    cmd!(
        sh,
        "cargo build --quiet --release -p mtgdrcopy-tests -p mtgdrdrv-fuzz --bins --features mtgdrcopy-tests/emulator"
    )
    .run()?;
    let release = paths::release_dir();
    let staged = paths::build_dir().join("vm/bin");
    std::fs::create_dir_all(&staged)?;
    let mut files = Vec::new();
    let mut stage = |from: PathBuf, name: &str, guest: String| -> Result<()> {
        let to = staged.join(name);
        cmd!(sh, "strip --strip-debug -o {to} {from}").run()?;
        files.push((to, guest));
        Ok(())
    };
    // The tools, and the adversarial suite's fuzzer (test-only, not in any package).
    for (path, name) in programs(&release, |name| name == "mtgdrdrv_fuzz")? {
        stage(path, &name, format!("/usr/bin/{name}"))?;
    }
    let soname = xtask_base::library::soname();
    stage(
        release.join("libgdrapi.so"),
        &soname,
        format!("/usr/lib/mtgdrcopy/{soname}"),
    )?;
    stage(
        xtask_base::build::emulated_musa(sh)?,
        "libmusa.so.1",
        "/usr/lib/mtgdrcopy/emu/libmusa.so.1".into(),
    )?;
    Ok(files)
}

/// The programs cargo built in `dir` (files without an extension): the mtgdrcopy tools and those
/// `also` names, with their names.
pub fn programs(dir: &Path, also: impl Fn(&str) -> bool) -> Result<Vec<(PathBuf, String)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(String::from) else {
            continue;
        };
        if (name.starts_with("mtgdrcopy_") || also(&name)) && path.is_file() && !name.contains('.')
        {
            found.push((path, name));
        }
    }
    Ok(found)
}

/// A VM of `kernel` holding both modules (under /lib/mtgdrcopy) and the in-VM test binary
/// (/opt/mtgdrcopy/vm_module), with no script yet.
pub(super) fn module_vm(sh: &Shell, kernel: &Kernel) -> Result<vm::VmSpec> {
    let t = Instant::now();
    let (mtgdrdrv_ko, emu_ko) = build_modules(sh, kernel)?;
    timed("modules built", t);
    let t = Instant::now();
    let test_exe = build_test_binary(sh)?;
    timed("test binary built", t);

    let t = Instant::now();
    let tools = tool_files(sh)?;
    timed("tools and libraries built", t);

    let mut spec = vm::VmSpec::new(kernel.clone());
    spec.files = vec![
        (mtgdrdrv_ko, "/lib/mtgdrcopy/mtgdrdrv.ko".into()),
        (emu_ko, "/lib/mtgdrcopy/mtgpu_emu.ko".into()),
        (test_exe, "/opt/mtgdrcopy/vm_module".into()),
    ];
    spec.files.extend(tools);
    spec.files.extend(doctor::files());
    spec.ivshmem_mb = 256;
    spec.memory_mb = 1024;
    // Guest time is ~4 min on an idle host and 13 min at load average 8 (10,000-cycle stress and
    // the 100,000-operation fuzzer); the limit only catches a hung guest.
    spec.timeout = Duration::from_secs(1800);
    Ok(spec)
}

/// The test VM with both modules loaded, the tools in /usr/bin and LD_LIBRARY_PATH set, then
/// running `script` (a shell script); for subcommands that judge the console themselves
/// (`cargo xtask bench`).
pub fn tools_vm(sh: &Shell, kernel: &Kernel, script: &str) -> Result<vm::VmSpec> {
    let mut spec = module_vm(sh, kernel)?;
    spec.script = format!("{}\n{script}\n", load_only());
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_the_tools_and_what_is_asked_for() {
        let dir = std::env::temp_dir().join(format!("xtask-programs-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("mtgdrcopy_dir")).unwrap();
        for name in [
            "mtgdrcopy_copybw",
            "mtgdrcopy_copybw.d",
            "mtgdrdrv_fuzz",
            "other",
        ] {
            std::fs::write(dir.join(name), "").unwrap();
        }
        let names = |also: fn(&str) -> bool| {
            let mut n: Vec<String> = programs(&dir, also)
                .unwrap()
                .into_iter()
                .map(|p| p.1)
                .collect();
            n.sort();
            n
        };
        assert_eq!(names(|_| false), ["mtgdrcopy_copybw"]);
        assert_eq!(
            names(|n| n == "mtgdrdrv_fuzz"),
            ["mtgdrcopy_copybw", "mtgdrdrv_fuzz"]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
