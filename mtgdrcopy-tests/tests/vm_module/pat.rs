//! The x86 PAT memory types that the test VM's kernel has reserved for the emulator's BAR, read
//! from debugfs (x86/pat_memtype_list). A PTE of a mapping takes the type its page is
//! reserved with, and a reservation left behind after everything is unmapped is a leak.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::ptr;

/// The host page (x86-64).
pub const PAGE: usize = 4096;

const PAT_LIST: &str = "/sys/kernel/debug/x86/pat_memtype_list";

/// One entry of the kernel's memtype list: `[start, end)` reserved as `kind`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Memtype {
    pub start: u64,
    pub end: u64,
    pub kind: String,
}

/// Whether PAT is on: the kernel lists memtypes then only (debugfs mounted if it is not yet).
pub fn enabled() -> bool {
    if !Path::new(PAT_LIST).exists() {
        // SAFETY: NUL-terminated literals; mounting debugfs where the kernel expects it.
        unsafe {
            libc::mount(
                c"debugfs".as_ptr(),
                c"/sys/kernel/debug".as_ptr(),
                c"debugfs".as_ptr(),
                0,
                ptr::null(),
            )
        };
    }
    Path::new(PAT_LIST).exists()
}

/// The kernel's PAT memtype reservations.
pub fn pat_list() -> Vec<Memtype> {
    assert!(enabled(), "x86 PAT is off: no memtype list");
    let text = std::fs::read_to_string(PAT_LIST).expect("PAT memtype list (x86 PAT on)");
    // "PAT: [mem 0x00000000e0000000-0x00000000e0001000] write-combining"
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("PAT: [mem 0x")?;
            let (range, kind) = rest.split_once("] ")?;
            let (start, end) = range.split_once("-0x")?;
            Some(Memtype {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                kind: kind.trim().to_owned(),
            })
        })
        .collect()
}

/// The emulator's BAR (BAR 2 of the ivshmem device) as `[start, end)`, and its sysfs directory.
pub fn ivshmem() -> (PathBuf, u64, u64) {
    for entry in std::fs::read_dir("/sys/bus/pci/devices").expect("pci devices") {
        let dir = entry.expect("pci device").path();
        let id = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        if id("vendor").trim() != "0x1af4" || id("device").trim() != "0x1110" {
            continue;
        }
        let resource = id("resource");
        let bar2: Vec<u64> = resource
            .lines()
            .nth(2)
            .expect("BAR 2")
            .split_whitespace()
            .map(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).expect("hex"))
            .collect();
        return (dir, bar2[0], bar2[1] + 1);
    }
    panic!("no ivshmem device (1af4:1110)");
}

/// The memtype entries that overlap `[lo, hi)`.
pub fn memtypes_in(lo: u64, hi: u64) -> Vec<Memtype> {
    pat_list()
        .into_iter()
        .filter(|m| m.start < hi && m.end > lo)
        .collect()
}

/// The memtype entries that overlap the BAR.
pub fn bar_memtypes() -> Vec<Memtype> {
    let (_, lo, hi) = ivshmem();
    memtypes_in(lo, hi)
}

/// The host pages that `entries` cover, by physical address.
pub fn pages_of(entries: &[Memtype]) -> BTreeSet<u64> {
    entries
        .iter()
        .flat_map(|m| (m.start..m.end).step_by(PAGE))
        .collect()
}

/// The entries of `now` that `before` did not have (each entry counted as often as it occurs).
pub fn added(before: &[Memtype], now: &[Memtype]) -> Vec<Memtype> {
    let mut old = before.to_vec();
    now.iter()
        .filter(|m| match old.iter().position(|o| o == *m) {
            Some(i) => {
                old.swap_remove(i);
                false
            }
            None => true,
        })
        .cloned()
        .collect()
}
