//! Where the checks read from: the files of a root directory, and this process's identity,
//! groups and CPU affinity. The tool reads `/`; only the unit tests build a [`Host`] over a
//! fabricated tree (there is deliberately no variable the shipped tool reads to move it).

#[cfg(test)]
use std::path::Path;
use std::path::PathBuf;

/// The filesystem the checks read.
pub struct Host {
    root: PathBuf,
}

impl Host {
    /// This system.
    pub fn system() -> Host {
        Host { root: "/".into() }
    }

    /// A fabricated tree (tests only).
    #[cfg(test)]
    pub fn under(root: &Path) -> Host {
        Host { root: root.into() }
    }

    /// `abs` (an absolute path on the system) under this root.
    pub fn path(&self, abs: &str) -> PathBuf {
        self.root.join(abs.trim_start_matches('/'))
    }

    /// The file's text, if it can be read.
    pub fn read(&self, abs: &str) -> Option<String> {
        std::fs::read_to_string(self.path(abs)).ok()
    }

    /// The file's text, trimmed, if it can be read.
    pub fn value(&self, abs: &str) -> Option<String> {
        self.read(abs).map(|s| s.trim().to_string())
    }

    pub fn exists(&self, abs: &str) -> bool {
        self.path(abs).exists()
    }

    /// The names in directory `abs`, sorted; empty if it cannot be read.
    pub fn entries(&self, abs: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.path(abs))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(String::from))
            .collect();
        names.sort();
        names
    }
}

/// The facts of this process the checks need.
#[derive(Clone, Debug)]
pub struct Process {
    pub uid: u32,
    /// The effective group and the supplementary groups.
    pub gids: Vec<u32>,
    /// The user's name, from the password database, if it has one.
    pub user: Option<String>,
    /// The user's primary group per the password database.
    pub primary_gid: Option<u32>,
    /// The CPUs this process may run on.
    pub cpus: Vec<usize>,
}

impl Process {
    pub fn current() -> Process {
        // SAFETY: getuid and getegid cannot fail and take no pointers.
        let (uid, egid) = unsafe { (libc::getuid(), libc::getegid()) };
        let mut gids = supplementary_groups();
        gids.push(egid);
        let (user, primary_gid) = password_entry(uid).unzip();
        Process {
            uid,
            gids,
            user,
            primary_gid,
            cpus: affinity(),
        }
    }
}

fn supplementary_groups() -> Vec<u32> {
    // SAFETY: a size of 0 only asks for the count.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    let Ok(n) = usize::try_from(n) else {
        return Vec::new();
    };
    let mut groups = vec![0 as libc::gid_t; n];
    // SAFETY: `groups` has room for `n` entries, the size passed.
    let got = unsafe { libc::getgroups(n as libc::c_int, groups.as_mut_ptr()) };
    groups.truncate(usize::try_from(got).unwrap_or(0));
    groups
}

/// The user's name and primary group from the password database.
fn password_entry(uid: u32) -> Option<(String, u32)> {
    let mut pwd = std::mem::MaybeUninit::<libc::passwd>::zeroed();
    let mut buf = vec![0 as libc::c_char; 16384];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the sizes given; on success `result` points to `pwd`,
    // whose strings live in `buf`.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            pwd.as_mut_ptr(),
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r succeeded, so `pwd` is initialised and pw_name points into `buf`.
    let pwd = unsafe { pwd.assume_init() };
    // SAFETY: pw_name is a NUL-terminated string in `buf`, alive here.
    let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
    Some((name.to_string_lossy().into_owned(), pwd.pw_gid))
}

/// The CPUs this process may run on (sched_getaffinity).
fn affinity() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is writable for the size passed; pid 0 is this thread.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE, the set's capacity.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// CPU numbers from a kernel cpulist (`0-3,8,10-11`); `None` if it is malformed.
pub fn parse_cpulist(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if a > b {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// `cpus` as a cpulist (`0-3,8`).
pub fn format_cpulist(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        while i + 1 < sorted.len() && sorted[i + 1] == sorted[i] + 1 {
            i += 1;
        }
        parts.push(if sorted[i] == start {
            start.to_string()
        } else {
            format!("{start}-{}", sorted[i])
        });
        i += 1;
    }
    parts.join(",")
}

/// A fabricated tree for the checks' unit tests, removed on drop.
#[cfg(test)]
pub struct FakeRoot {
    pub dir: PathBuf,
}

#[cfg(test)]
impl FakeRoot {
    pub fn new(name: &str) -> FakeRoot {
        // Unique per instance: tests run in parallel threads of one process, and two of them
        // may build a root of the same name (one's drop would remove the other's tree).
        static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "mtgdrcopy-doctor-{name}-{}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temporary directory");
        FakeRoot { dir }
    }

    /// Writes `text` to the system path `abs` under the root.
    pub fn file(&self, abs: &str, text: &str) -> &FakeRoot {
        let path = self.dir.join(abs.trim_start_matches('/'));
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("directories");
        std::fs::write(&path, text).expect("write");
        self
    }

    pub fn dir(&self, abs: &str) -> &FakeRoot {
        std::fs::create_dir_all(self.dir.join(abs.trim_start_matches('/'))).expect("directories");
        self
    }

    pub fn host(&self) -> Host {
        Host::under(&self.dir)
    }
}

#[cfg(test)]
impl Drop for FakeRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists_round_trip() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(format_cpulist(&[11, 0, 1, 2, 3, 8, 10]), "0-3,8,10-11");
        assert_eq!(parse_cpulist(""), Some(vec![]));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("x"), None);
    }

    #[test]
    fn paths_are_under_the_root() {
        let host = Host::under(Path::new("/tmp/fake"));
        assert_eq!(host.path("/sys/module"), Path::new("/tmp/fake/sys/module"));
    }
}
