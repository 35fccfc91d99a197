//! The warnings of a kbuild log, ours (an error) or the kernel's (counted): for the module
//! builds of [`super::build_modules`] and the DKMS builds of the kernel matrix.

use std::path::Path;

/// The warnings of a kbuild log, split into ours and the kernel's. Kbuild compiles an external
/// module with the kernel tree as working directory before 6.13 (our files then appear under
/// the module's absolute directory) and with the module's directory since (bare file names);
/// the kernel's headers always appear under the kernel tree. A warning in a kernel header that
/// our code triggers through a macro is reported at our line too ("in expansion of macro").
#[derive(Debug, Default, PartialEq)]
pub struct Warnings {
    /// Compiler warnings located in `dir`, and every modpost or objtool warning (they are about
    /// our modules: modpost only checks the modules being built).
    pub ours: Vec<String>,
    /// Other warning lines: the kernel's headers, compiler notes without a location.
    pub others: usize,
}

impl Warnings {
    /// The warnings of `log`, a kbuild run for the module in `dir` (as the compiler saw it).
    pub fn find(log: &str, dir: &Path) -> Warnings {
        let mut found = Warnings::default();
        for line in log.lines() {
            let line = line.trim_end();
            if line.starts_with("WARNING:") {
                found.ours.push(line.to_owned());
                continue;
            }
            let Some(at) = line.find(": warning: ") else {
                continue;
            };
            match location(&line[..at]) {
                Some(path) if is_ours(path, dir) => found.ours.push(line.to_owned()),
                _ => found.others += 1,
            }
        }
        found
    }
}

/// The file of a `path:line[:column]` compiler location, or of an objtool `object.o` one.
fn location(loc: &str) -> Option<&str> {
    let mut path = loc;
    let mut numbers = 0;
    while numbers < 2 {
        match path.rsplit_once(':') {
            Some((head, tail)) if !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) => {
                path = head;
                numbers += 1;
            }
            _ => break,
        }
    }
    // "cc1: warning: …" has no file.
    (numbers > 0 || path.ends_with(".o")).then_some(path)
}

fn is_ours(path: &str, dir: &Path) -> bool {
    let path = path.strip_prefix("./").unwrap_or(path);
    // The emulator includes mtgdrdrv's compat.h as "../../mtgdrdrv/kmod/compat.h": relative
    // since 6.13, below its own directory (through "..") before.
    !path.contains('/')
        || Path::new(path).starts_with(dir)
        || path.starts_with("../../mtgdrdrv/kmod/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_before_6_13_are_absolute() {
        let dir = Path::new("/root/mtgdrcopy-kmod/kmod");
        let log = "/root/mtgdrcopy-kmod/kmod/mtgdrdrv_main.c: In function 'f':\n\
                   /root/mtgdrcopy-kmod/kmod/mtgdrdrv_main.c:45:36: warning: unused variable 'x' [-Wunused-variable]\n\
                   /usr/src/linux-headers-5.10.0-32-common/include/linux/mm.h:12:1: warning: something\n\
                   ./include/generated/autoconf.h:3:9: warning: generated\n\
                   cc1: warning: command-line option\n";
        let found = Warnings::find(log, dir);
        assert_eq!(found.ours.len(), 1);
        assert!(found.ours[0].contains("mtgdrdrv_main.c:45:36"));
        assert_eq!(found.others, 3);
    }

    #[test]
    fn warnings_since_6_13_are_relative() {
        let dir = Path::new("/root/mtgdrcopy-kmod/kmod");
        let log = "compat.h:40:5: warning: unused\n\
                   mtgdrdrv_pin.c:7: warning: no column\n\
                   mtgdrdrv.o: warning: objtool: f() falls through to next function g()\n\
                   WARNING: modpost: missing MODULE_DESCRIPTION() in mtgdrdrv.o\n\
                   /usr/src/linux-headers-7.2.13+deb14-common/include/linux/compat.h:1:1: warning: theirs\n";
        let found = Warnings::find(log, dir);
        assert_eq!(found.ours.len(), 4, "{found:?}");
        assert_eq!(found.others, 1);
    }

    #[test]
    fn the_emulators_warnings_in_mtgdrdrvs_compat_header_are_ours() {
        let dir = Path::new("/root/mtgdrcopy-kmod/testing/mtgpu-emu");
        let log = "../../mtgdrdrv/kmod/compat.h:40:5: warning: since 6.13\n\
                   /root/mtgdrcopy-kmod/testing/mtgpu-emu/../../mtgdrdrv/kmod/compat.h:40:5: warning: before\n\
                   ../linux-headers-6.1.0-57-common/include/linux/mm.h:1:1: warning: theirs\n";
        let found = Warnings::find(log, dir);
        assert_eq!(found.ours.len(), 2, "{found:?}");
        assert_eq!(found.others, 1);
    }
}
