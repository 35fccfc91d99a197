//! Where mtgdrdrv-dkms installs the files that the package tests check and run.

/// Where mtgdrdrv-dkms installs debian/scripts/mtgdrdrv-load (debian/scripts/install-tree),
/// which decides whether mtgdrdrv may be loaded and loads it; the postinst runs it from there
/// (`@LOAD_SCRIPT@`, filled in by debian/rules).
pub(super) const LOAD_SCRIPT: &str = "/usr/lib/mtgdrdrv/mtgdrdrv-load";

/// Where mtgdrdrv-dkms installs debian/mtgdrdrv.modprobe.conf, the softdep on mtgpu.
pub(super) const SOFTDEP: &str = "/usr/lib/modprobe.d/mtgdrdrv.conf";

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use xtask_base::paths;

    /// The code of a shell script, without its comments.
    fn code(path: &str) -> String {
        fs::read_to_string(paths::root().join(path))
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    /// debian/tests/gpu runs mtgdrdrv-load exactly as the postinst does, from where the package
    /// installs it, and the postinst loads mtgdrdrv only through it.
    #[test]
    fn the_gpu_test_runs_mtgdrdrv_load_as_the_postinst_does() {
        let postinst = code("debian/mtgdrdrv-dkms.postinst.in");
        assert_eq!(postinst.matches("@LOAD_SCRIPT@ --if-provider").count(), 1);
        assert!(
            !postinst.contains("modprobe"),
            "the postinst loads mtgdrdrv itself"
        );
        let gpu = code("debian/tests/gpu");
        assert!(gpu.contains(&format!("load_script={LOAD_SCRIPT}\n")));
        assert!(gpu.contains(&format!("softdep={SOFTDEP}\n")));
        assert_eq!(gpu.matches("\"$load_script\" --if-provider").count(), 2);
    }
}
