//! libgdrapi against the real mtgdrdrv module and the emulated mtgpu provider. Runs inside the
//! test VM (`cargo xtask test`), one test at a time (`--test-threads=1`), because several tests
//! check system-wide counters.
//!
//! The tests are grouped by concern in `vm_module/`; this file holds what they share: the
//! module's counters, forked helper processes and `/dev/mtgdrdrv` opened directly.

use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr;

use gdrapi::capi::*;
use gdrapi::{Attribute, Gdr, MapRequest, MappingType, PinFlags};
use mtgpu_emu_abi::{Emu, FaultKind, PAGE_SIZES};
use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult};

mod basics;
mod concurrency;
mod emu_dmabuf;
mod hardening;
mod pat;
mod provider;
mod vmm;

// -------------------------------------------------------------------------------------------
// The adversarial suite (issue 7): isolation, lifetimes, unload, bad input. The random side is
// mtgdrdrv_fuzz (testing/fuzz), which `cargo xtask test` runs after these tests.
mod bad_input;
mod isolation;
mod library_races;
mod lifetimes;
mod permissions;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// The module's always-present counters.
fn module_counters() -> std::collections::HashMap<String, i64> {
    let text = std::fs::read_to_string(mtgdrdrv::procfs::COUNTERS_PATH).expect("counters file");
    mtgdrdrv::procfs::parse_counters(&text)
        .map(|(name, value)| (name.to_string(), value))
        .collect()
}

/// Both modules hold no pin and no mapping.
fn assert_no_pins(emu: &Emu) {
    let c = module_counters();
    assert_eq!(c.get("pins_outstanding"), Some(&0), "module counters {c:?}");
    assert_eq!(c.get("mappings"), Some(&0), "module counters {c:?}");
    assert_eq!(c.get("bytes_pinned"), Some(&0), "module counters {c:?}");
    let s = emu.stats().expect("stats");
    assert_eq!(s.pins_outstanding, 0, "emulator {s:?}");
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64 * 7 + seed * 13 + 3) % 253) as u8)
        .collect()
}

/// Runs `child` in a forked process and returns its exit code.
fn in_child(child: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child only makes system calls and exits with _exit; the test runs single-
    // threaded (--test-threads=1).
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
            // SAFETY: leaving the child without running the parent's destructors.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => match waitpid(child, None).expect("waitpid") {
            WaitStatus::Exited(_, code) => code,
            other => panic!("child ended with {other:?}"),
        },
    }
}

/// `/dev/mtgdrdrv` opened directly, for what the library never does.
struct RawDev(OwnedFd);

impl RawDev {
    fn open() -> RawDev {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/mtgdrdrv")
            .expect("open /dev/mtgdrdrv");
        RawDev(f.into())
    }

    fn ioctl<T>(&self, cmd: u32, arg: &mut T) -> Result<(), Errno> {
        // SAFETY: `arg` is a live struct of the type `cmd` copies in and out.
        let r = unsafe { libc::ioctl(self.0.as_raw_fd(), cmd as _, arg as *mut T) };
        if r < 0 {
            Err(Errno::last())
        } else {
            Ok(())
        }
    }

    fn pin(&self, addr: u64, size: u64) -> Result<u64, Errno> {
        let mut p = mtgdrdrv::GDRDRV_IOC_PIN_BUFFER_V2_PARAMS {
            addr,
            size,
            ..Default::default()
        };
        self.ioctl(mtgdrdrv::GDRDRV_IOC_PIN_BUFFER_V2, &mut p)?;
        Ok(p.handle)
    }

    fn unpin(&self, handle: u64) -> Result<(), Errno> {
        let mut p = mtgdrdrv::GDRDRV_IOC_UNPIN_BUFFER_PARAMS { handle };
        self.ioctl(mtgdrdrv::GDRDRV_IOC_UNPIN_BUFFER, &mut p)
    }

    fn info(&self, handle: u64) -> Result<mtgdrdrv::GDRDRV_IOC_GET_INFO_V2_PARAMS, Errno> {
        let mut p = mtgdrdrv::GDRDRV_IOC_GET_INFO_V2_PARAMS {
            handle,
            ..Default::default()
        };
        self.ioctl(mtgdrdrv::GDRDRV_IOC_GET_INFO_V2, &mut p)?;
        Ok(p)
    }

    fn mmap(&self, handle: u64, len: usize) -> Result<usize, Errno> {
        mmap_shared(&self.0, handle * 4096, len)
    }
}

/// A new `MAP_SHARED`, read-write mapping of `len` bytes of `fd` from byte `offset`.
fn mmap_shared(fd: &OwnedFd, offset: u64, len: usize) -> Result<usize, Errno> {
    // SAFETY: a new shared mapping chosen by the kernel; nothing else is at its address.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        Err(Errno::last())
    } else {
        Ok(p as usize)
    }
}

fn munmap(addr: usize, len: usize) {
    // SAFETY: only ranges of device or dma-buf mappings the test made.
    assert_eq!(
        unsafe { libc::munmap(addr as *mut c_void, len) },
        0,
        "munmap"
    );
}

/// Whether the kernel can read a byte at `addr` (write(2) into a pipe: EFAULT on an unmapped or
/// zapped page instead of a signal).
fn kernel_can_read(addr: usize) -> bool {
    let (rd, wr) = nix::unistd::pipe().expect("pipe");
    // SAFETY: the kernel validates the source address.
    let n = unsafe { libc::write(wr.as_raw_fd(), addr as *const c_void, 1) };
    drop((rd, wr));
    n == 1
}

/// The type a WC mapping of mtgdrdrv reports: without x86 PAT (the `nopat` boot) the pages are
/// uncached, and the module says so (DEVICE).
fn wc_as_mapped() -> MappingType {
    if pat::enabled() {
        MappingType::WriteCombining
    } else {
        MappingType::Device
    }
}

fn counter(name: &str) -> i64 {
    module_counters().get(name).copied().unwrap_or(i64::MAX)
}
