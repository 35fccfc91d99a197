//! A thread storm, in a forked child: threads race pins, unpins, mmaps, munmaps, mremaps,
//! mprotects, queries and kernel reads of the mappings on one shared file of /dev/mtgdrdrv,
//! with no model to keep (any errno is fine). What it checks is the kernel's: no WARN/BUG/
//! lockdep report (the harness reads the console), no crash of this process, and, back in the
//! parent, every counter where the parent's model says (so nothing the threads did leaked).
//!
//! Each mapping is owned by the thread that took it out of the shared list, so no range is
//! unmapped twice (a second munmap could hit memory reused by the allocator).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use mtgdrdrv::*;

use crate::emu::{Emu, Raw};
use crate::rng::Rng;
use crate::sys;

struct Shared {
    fd: i32,
    page: usize,
    /// Pinned (or once pinned) handles with their pinned sizes.
    handles: Mutex<Vec<(u64, u64)>>,
    /// Mappings nobody is working on: (address, length).
    maps: Mutex<Vec<(usize, usize)>>,
    /// Allocation to pin from.
    va: u64,
    size: u64,
    ops: &'static AtomicU64,
}

fn take<T>(list: &Mutex<Vec<T>>, rng: &mut Rng) -> Option<T> {
    let mut l = list.lock().ok()?;
    if l.is_empty() {
        return None;
    }
    let i = rng.index(l.len());
    Some(l.swap_remove(i))
}

fn put<T>(list: &Mutex<Vec<T>>, item: T) {
    if let Ok(mut l) = list.lock() {
        l.push(item);
    }
}

fn pick<T: Copy>(list: &Mutex<Vec<T>>, rng: &mut Rng) -> Option<T> {
    let l = list.lock().ok()?;
    if l.is_empty() {
        None
    } else {
        Some(l[rng.index(l.len())])
    }
}

fn racer(sh: &Shared, seed: u64, iterations: u32) {
    let mut rng = Rng::new(seed);
    let Ok(prober) = sys::Prober::new() else {
        return;
    };
    let page = sh.page;
    for _ in 0..iterations {
        sh.ops.fetch_add(1, Ordering::Relaxed);
        match rng.weighted(&[20, 15, 25, 15, 8, 6, 12, 10, 6]) {
            0 => {
                let units = sh.size / 65536;
                let first = rng.below(units);
                let n = 1 + rng.below((units - first).min(8));
                let mut p = GDRDRV_IOC_PIN_BUFFER_V2_PARAMS {
                    addr: sh.va + first * 65536,
                    size: n * 65536,
                    ..Default::default()
                };
                if sys::ioctl(sh.fd, GDRDRV_IOC_PIN_BUFFER_V2, &mut p as *mut _ as usize).is_ok() {
                    put(&sh.handles, (p.handle, n * 65536));
                }
            }
            1 => {
                if let Some((h, _)) = pick(&sh.handles, &mut rng) {
                    let mut u = GDRDRV_IOC_UNPIN_BUFFER_PARAMS { handle: h };
                    let _ = sys::ioctl(sh.fd, GDRDRV_IOC_UNPIN_BUFFER, &mut u as *mut _ as usize);
                }
            }
            2 => {
                if let Some((h, size)) = pick(&sh.handles, &mut rng) {
                    let len = page * (1 + rng.index(size as usize / page));
                    if let Ok(a) = sys::mmap(
                        0,
                        len,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED,
                        sh.fd,
                        h * page as u64,
                    ) {
                        put(&sh.maps, (a, len));
                    }
                }
            }
            3 => {
                if let Some((a, len)) = take(&sh.maps, &mut rng) {
                    // All, or a middle part (the rest stays, split in two).
                    let pages = len / page;
                    let first = rng.index(pages);
                    let n = 1 + rng.index(pages - first);
                    if rng.chance(500) || pages == 1 {
                        let _ = sys::munmap(a, len);
                    } else {
                        let (s, l) = (a + first * page, n * page);
                        if sys::munmap(s, l).is_ok() {
                            if first > 0 {
                                put(&sh.maps, (a, first * page));
                            }
                            if first + n < pages {
                                put(&sh.maps, (s + l, len - (first + n) * page));
                            }
                        } else {
                            put(&sh.maps, (a, len));
                        }
                    }
                }
            }
            4 => {
                if let Some((a, len)) = take(&sh.maps, &mut rng) {
                    match sys::anon(len, libc::PROT_NONE) {
                        Ok(dest) => match sys::mremap(
                            a,
                            len,
                            len,
                            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                            dest,
                        ) {
                            Ok(n) => put(&sh.maps, (n, len)),
                            // A failed MREMAP_FIXED may already have unmapped `dest`, and another
                            // thread may have mapped something there since (a thread stack): never
                            // unmap it here. A reservation left behind is harmless.
                            Err(_) => put(&sh.maps, (a, len)),
                        },
                        Err(_) => put(&sh.maps, (a, len)),
                    }
                }
            }
            5 => {
                if let Some((a, len)) = take(&sh.maps, &mut rng) {
                    let prot = [
                        libc::PROT_NONE,
                        libc::PROT_READ,
                        libc::PROT_READ | libc::PROT_WRITE,
                    ][rng.index(3)];
                    let _ = sys::mprotect(a, page * (1 + rng.index(len / page)), prot);
                    put(&sh.maps, (a, len));
                }
            }
            6 => {
                // A kernel read of a mapping another thread may be unmapping or zapping.
                if let Some((a, len)) = pick(&sh.maps, &mut rng) {
                    let _ = prober.probe(a + rng.index(len), 1 + rng.index(64));
                }
            }
            7 => {
                if let Some((h, _)) = pick(&sh.handles, &mut rng) {
                    let mut i = GDRDRV_IOC_GET_INFO_V2_PARAMS {
                        handle: h,
                        ..Default::default()
                    };
                    let _ = sys::ioctl(sh.fd, GDRDRV_IOC_GET_INFO_V2, &mut i as *mut _ as usize);
                    let mut r = GDRDRV_IOC_REQ_MAPPING_TYPE_PARAMS {
                        handle: h,
                        mapping_type: [1, 3][rng.index(2)],
                        _pad: 0,
                    };
                    let _ = sys::ioctl(
                        sh.fd,
                        GDRDRV_IOC_REQ_MAPPING_TYPE,
                        &mut r as *mut _ as usize,
                    );
                }
            }
            _ => {
                // An ioctl whose argument lives in a mapping another thread may zap.
                if let (Some((a, _)), Some((h, _))) =
                    (pick(&sh.maps, &mut rng), pick(&sh.handles, &mut rng))
                {
                    let i = GDRDRV_IOC_GET_INFO_V2_PARAMS {
                        handle: h,
                        ..Default::default()
                    };
                    let bytes = crate::emu::bytes_of(&i);
                    // The kernel reads the handle there and writes the struct back: a page
                    // zapped or unmapped meanwhile gives EFAULT.
                    if prober.probe(a, bytes.len()).is_ok() {
                        let _ = sys::ioctl(sh.fd, GDRDRV_IOC_GET_INFO_V2, a);
                    }
                }
            }
        }
    }
}

/// The child's body: returns its exit status.
pub fn run(seed: u64, ops: &'static AtomicU64) -> i32 {
    let mut rng = Rng::new(seed);
    let Ok(emu) = Emu::open().raw() else { return 2 };
    let size = 65536 * rng.range(4, 24);
    let Ok(va) = emu.alloc_flags(size, 0, 65536, 0).raw() else {
        return 0; // out of memory: nothing to storm
    };
    let Ok(fd) = sys::open("/dev/mtgdrdrv", libc::O_RDWR | libc::O_CLOEXEC) else {
        return 3;
    };
    let sh = Shared {
        fd,
        page: sys::page_size(),
        handles: Mutex::new(Vec::new()),
        maps: Mutex::new(Vec::new()),
        va,
        size,
        ops,
    };
    let threads = rng.range(2, 4);
    let iterations = rng.range(50, 300) as u32;
    std::thread::scope(|s| {
        for t in 0..threads {
            let sh = &sh;
            let seed = Rng::derive(seed, t);
            // Small stacks; a thread the system cannot give (memory is tight in the VM) is
            // simply not raced.
            let _ = std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn_scoped(s, move || racer(sh, seed, iterations));
        }
    });
    // Half the storms clean up, the others exit with whatever is left.
    if rng.chance(500) {
        if let Ok(maps) = sh.maps.lock() {
            for &(a, len) in maps.iter() {
                let _ = sys::munmap(a, len);
            }
        }
        sys::close(fd);
    }
    0
}
