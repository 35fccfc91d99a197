//! What the cases share: a thin wrapper over the gdrapi C API (errno results, close on drop),
//! device buffers, upstream's walking-bit pattern and buffer comparison, raw accesses through
//! a mapping, the module's counters, forked helper processes and pipes between them.

use std::ffi::{c_int, c_ulong, c_void};
use std::fmt;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use crate::emu::Emu;
use crate::gdr::{self, gdr_info_v2, gdr_mh_t, gdr_t, Api};
use crate::gpu::{DevicePtr, Gpu};

use super::{note, skip};

pub const KIB: usize = 1024;
pub const MIB: usize = 1024 * KIB;
/// The 64 KiB GPU page pins are rounded to first (gdrapi.h `GPU_PAGE_SIZE`).
pub const GPU_PAGE: usize = gdrapi::GPU_PAGE_SIZE as usize;
/// Upstream's data buffer: 256 KiB + 16 bytes, rounded up to the GPU page (320 KiB).
pub const DATA_SIZE: usize = round_up(256 * KIB + 16, GPU_PAGE);
/// Upstream's small buffer: 16 ints, rounded up to the GPU page.
pub const SMALL_SIZE: usize = round_up(16 * 4, GPU_PAGE);

/// gdrapi.h values, as the C functions take them.
pub const PIN_FLAG_FORCE_PCIE: u32 = 1;
pub const MAP_FLAG_WC: c_int = gdrapi::MapRequest::WriteCombining as c_int;
pub const MAP_FLAG_CACHE: c_int = gdrapi::MapRequest::Caching as c_int;
pub const MAP_FLAG_DEVICE: c_int = gdrapi::MapRequest::Device as c_int;
pub const MAPPING_TYPE_NONE: c_int = gdrapi::MappingType::None as c_int;
pub const MAPPING_TYPE_WC: c_int = gdrapi::MappingType::WriteCombining as c_int;
pub const MAPPING_TYPE_DEVICE: c_int = gdrapi::MappingType::Device as c_int;
pub const ATTR_USE_PERSISTENT_MAPPING: c_int = gdrapi::Attribute::UsePersistentMapping as c_int;
pub const ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE: c_int =
    gdrapi::Attribute::SupportPinFlagForcePcie as c_int;
pub const ATTR_USING_DMA_BUF_MMAP: c_int = gdrapi::Attribute::UsingDmaBufMmap as c_int;
/// `gdr_info_v2.flags` bits (the C bitfields `mapped` and `wc_mapping`).
pub const INFO_MAPPED: u32 = 1;
pub const INFO_WC_MAPPING: u32 = 2;

pub const fn round_up(v: usize, to: usize) -> usize {
    v.div_ceil(to) * to
}

/// The host page size.
pub fn host_page() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|v| usize::try_from(v).ok())
        .unwrap_or(4096)
}

// ---------------------------------------------------------------------------------------------
// The C API

/// A failed gdrapi call: which one, and the errno it returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdrErr {
    pub call: &'static str,
    pub errno: Errno,
}

impl fmt::Display for GdrErr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {} ({})",
            self.call,
            self.errno,
            self.errno.desc()
        )
    }
}

impl std::error::Error for GdrErr {}

pub type GdrResult<T> = std::result::Result<T, GdrErr>;

fn check(call: &'static str, rc: c_int) -> GdrResult<()> {
    gdr::check(rc).map_err(|errno| GdrErr { call, errno })
}

/// Requires `r` to have failed with `want`; `what` names the operation in the error.
pub fn expect_errno<T>(r: GdrResult<T>, want: Errno, what: &str) -> Result<()> {
    match r {
        Ok(_) => bail!("{what} succeeded; expected {want}"),
        Err(e) if e.errno == want => {
            note!("{what}: {want} as expected");
            Ok(())
        }
        Err(e) => bail!("{what}: {e}; expected {want}"),
    }
}

/// An open `gdr_t`, closed on drop unless [`Gdr::close`] or [`Gdr::leak`] consumed it.
pub struct Gdr {
    api: &'static Api,
    g: gdr_t,
}

// SAFETY: libgdrapi documents a gdr_t as safe to use from several threads at once.
unsafe impl Send for Gdr {}
// SAFETY: as above.
unsafe impl Sync for Gdr {}

impl Gdr {
    /// `gdr_open`; the errno on failure.
    pub fn try_open() -> Result<GdrResult<Gdr>> {
        let api = gdr::api()?;
        // SAFETY: gdr_open takes no arguments.
        let g = unsafe { (api.open)() };
        if g.is_null() {
            return Ok(Err(GdrErr {
                call: "gdr_open",
                errno: Errno::last(),
            }));
        }
        Ok(Ok(Gdr { api, g }))
    }

    /// `gdr_open`, which must work.
    pub fn open() -> Result<Gdr> {
        Ok(Gdr::try_open()??)
    }

    /// `gdr_close`.
    pub fn close(self) -> GdrResult<()> {
        let api = self.api;
        let g = self.leak();
        // SAFETY: `g` is live and not used again (leak consumed the wrapper).
        check("gdr_close", unsafe { (api.close)(g) })
    }

    /// `gdr_close` of a forked child's copy of the parent's `gdr_t` (the parent keeps its
    /// own): frees the child's copy and closes the child's descriptor.
    ///
    /// # Safety
    /// Only in a forked child, which must not use this `gdr_t` afterwards.
    pub unsafe fn close_inherited(&self) -> GdrResult<()> {
        // SAFETY: per the caller, this process holds a copy nobody else uses afterwards.
        check("gdr_close", unsafe { (self.api.close)(self.g) })
    }

    /// Gives up the wrapper without closing (for a `gdr_t` whose file was closed behind its
    /// back, or that a forked child must not close).
    pub fn leak(self) -> gdr_t {
        let g = self.g;
        std::mem::forget(self);
        g
    }

    /// `gdr_pin_buffer` without tokens.
    pub fn pin(&self, addr: DevicePtr, size: usize) -> GdrResult<gdr_mh_t> {
        self.pin_with_tokens(addr, size, 0, 0)
    }

    /// `gdr_pin_buffer`.
    pub fn pin_with_tokens(
        &self,
        addr: DevicePtr,
        size: usize,
        p2p_token: u64,
        va_space: u32,
    ) -> GdrResult<gdr_mh_t> {
        let mut mh = gdr_mh_t::default();
        // SAFETY: `self.g` is live; `mh` is a valid out pointer.
        let rc = unsafe {
            (self.api.pin_buffer)(self.g, addr as c_ulong, size, p2p_token, va_space, &mut mh)
        };
        check("gdr_pin_buffer", rc)?;
        Ok(mh)
    }

    /// `gdr_pin_buffer_v2`.
    pub fn pin_v2(&self, addr: DevicePtr, size: usize, flags: u32) -> GdrResult<gdr_mh_t> {
        let mut mh = gdr_mh_t::default();
        // SAFETY: `self.g` is live; `mh` is a valid out pointer.
        let rc = unsafe { (self.api.pin_buffer_v2)(self.g, addr as c_ulong, size, flags, &mut mh) };
        check("gdr_pin_buffer_v2", rc)?;
        Ok(mh)
    }

    pub fn unpin(&self, mh: gdr_mh_t) -> GdrResult<()> {
        // SAFETY: `self.g` is live; the handle is checked by the library.
        check("gdr_unpin_buffer", unsafe {
            (self.api.unpin_buffer)(self.g, mh)
        })
    }

    pub fn info(&self, mh: gdr_mh_t) -> GdrResult<gdr_info_v2> {
        let mut info = gdr_info_v2::default();
        // SAFETY: `self.g` is live; `info` is a valid out pointer of the v2 layout.
        check("gdr_get_info_v2", unsafe {
            (self.api.get_info_v2)(self.g, mh, &mut info)
        })?;
        Ok(info)
    }

    pub fn callback_flag(&self, mh: gdr_mh_t) -> GdrResult<c_int> {
        let mut flag: c_int = -1;
        // SAFETY: `self.g` is live; `flag` is a valid out pointer.
        check("gdr_get_callback_flag", unsafe {
            (self.api.get_callback_flag)(self.g, mh, &mut flag)
        })?;
        Ok(flag)
    }

    /// `gdr_map`: the address of the mapping's first byte.
    pub fn map(&self, mh: gdr_mh_t, size: usize) -> GdrResult<*mut u8> {
        let mut va: *mut c_void = ptr::null_mut();
        // SAFETY: `self.g` is live; `va` is a valid out pointer.
        check("gdr_map", unsafe {
            (self.api.map)(self.g, mh, &mut va, size)
        })?;
        Ok(va.cast())
    }

    /// `gdr_map_v2`.
    pub fn map_v2(&self, mh: gdr_mh_t, size: usize, flags: c_int) -> GdrResult<*mut u8> {
        let mut va: *mut c_void = ptr::null_mut();
        // SAFETY: `self.g` is live; `va` is a valid out pointer.
        check("gdr_map_v2", unsafe {
            (self.api.map_v2)(self.g, mh, &mut va, size, flags)
        })?;
        Ok(va.cast())
    }

    /// `gdr_unmap`. The caller makes no access through the mapping afterwards.
    pub fn unmap(&self, mh: gdr_mh_t, va: *mut u8, size: usize) -> GdrResult<()> {
        // SAFETY: `self.g` is live; the library checks `va`/`size` against the mapping.
        check("gdr_unmap", unsafe {
            (self.api.unmap)(self.g, mh, va.cast(), size)
        })
    }

    /// `gdr_copy_to_mapping` of `src` to `dst` (inside the mapping of `mh`).
    pub fn copy_to(&self, mh: gdr_mh_t, dst: *mut u8, src: &[u8]) -> GdrResult<()> {
        // SAFETY: `src` is readable for its length; the library refuses a device range that
        // is not inside the live mapping of `mh`.
        check("gdr_copy_to_mapping", unsafe {
            (self.api.copy_to_mapping)(mh, dst.cast(), src.as_ptr().cast(), src.len())
        })
    }

    /// `gdr_copy_from_mapping` from `src` (inside the mapping of `mh`) to `dst`.
    pub fn copy_from(&self, mh: gdr_mh_t, dst: &mut [u8], src: *const u8) -> GdrResult<()> {
        // SAFETY: `dst` is writable for its length; the library refuses a device range that
        // is not inside the live mapping of `mh`.
        check("gdr_copy_from_mapping", unsafe {
            (self.api.copy_from_mapping)(mh, dst.as_mut_ptr().cast(), src.cast(), dst.len())
        })
    }

    pub fn attribute(&self, attr: c_int) -> GdrResult<c_int> {
        let mut v: c_int = -1;
        // SAFETY: `self.g` is live; `v` is a valid out pointer.
        check("gdr_get_attribute", unsafe {
            (self.api.get_attribute)(self.g, attr, &mut v)
        })?;
        Ok(v)
    }

    pub fn driver_version(&self) -> GdrResult<(c_int, c_int)> {
        let (mut major, mut minor) = (-1, -1);
        // SAFETY: `self.g` is live; both are valid out pointers.
        check("gdr_driver_get_version", unsafe {
            (self.api.driver_get_version)(self.g, &mut major, &mut minor)
        })?;
        Ok((major, minor))
    }
}

impl Drop for Gdr {
    fn drop(&mut self) {
        // SAFETY: `self.g` is live and never used after this.
        unsafe { (self.api.close)(self.g) };
    }
}

/// Pins `size` bytes at `addr`, maps them and checks that `info` describes the pin.
pub fn pin_and_map(gdr: &Gdr, addr: DevicePtr, size: usize) -> Result<(gdr_mh_t, *mut u8)> {
    let mh = gdr.pin(addr, size)?;
    let info = gdr.info(mh)?;
    ensure!(
        info.va == addr,
        "info.va {:#x} for a pin at {addr:#x}: the buffer is not aligned to the pin granule",
        info.va
    );
    let map = gdr.map(mh, size)?;
    Ok((mh, map))
}

// ---------------------------------------------------------------------------------------------
// Device memory

/// A device allocation, freed on drop unless freed explicitly. `ptr` is the address to use:
/// the allocation's start, or its first 64 KiB boundary for [`DevBuf::aligned`].
pub struct DevBuf<'g> {
    gpu: &'g dyn Gpu,
    base: DevicePtr,
    pub ptr: DevicePtr,
    pub size: usize,
    freed: bool,
}

impl<'g> DevBuf<'g> {
    /// `size` bytes as the driver places them (upstream `gpu_mem_alloc(.., aligned=false)`).
    pub fn new(gpu: &'g dyn Gpu, size: usize) -> Result<DevBuf<'g>> {
        let base = gpu
            .alloc(size)
            .with_context(|| format!("allocating {size} bytes"))?;
        Ok(DevBuf::adopt(gpu, base, base, size))
    }

    /// `size` bytes starting on a 64 KiB boundary: allocates `size + 64 KiB - 1` and rounds
    /// the pointer up, as upstream's `gpu_mem_alloc(.., aligned=true)`.
    pub fn aligned(gpu: &'g dyn Gpu, size: usize) -> Result<DevBuf<'g>> {
        let total = size + GPU_PAGE - 1;
        let base = gpu
            .alloc(total)
            .with_context(|| format!("allocating {total} bytes"))?;
        let ptr = (base + GPU_PAGE as u64 - 1) & !(GPU_PAGE as u64 - 1);
        Ok(DevBuf::adopt(gpu, base, ptr, size))
    }

    fn adopt(gpu: &'g dyn Gpu, base: DevicePtr, ptr: DevicePtr, size: usize) -> DevBuf<'g> {
        if let Err(e) = gpu.set_sync_memops(base) {
            note!("warning: SYNC_MEMOPS not set on {base:#x}: {e:#}");
        }
        note!("device buffer {ptr:#x} (allocation {base:#x}), {size} bytes");
        DevBuf {
            gpu,
            base,
            ptr,
            size,
            freed: false,
        }
    }

    pub fn free(&mut self) -> Result<()> {
        if !self.freed {
            self.freed = true;
            self.gpu.free(self.base)?;
        }
        Ok(())
    }

    pub fn fill(&self, value: u8) -> Result<()> {
        self.gpu.memset_d8(self.ptr, value, self.size)
    }

    /// The buffer through the driver's copy, bypassing any CPU mapping.
    pub fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.gpu.memcpy_dtoh(&mut v, self.ptr + offset as u64)?;
        Ok(v)
    }
}

impl Drop for DevBuf<'_> {
    fn drop(&mut self) {
        if !self.freed {
            let _ = self.gpu.free(self.base);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Data

/// Upstream's walking-bit pattern: word `w` is `0x3F4C5E6A ^ (1 << (w % 32))`, little endian.
pub fn walking_bit(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let w = (i / 4) as u32;
            (0x3F4C_5E6Au32 ^ (1u32 << (w % 32))).to_le_bytes()[i % 4]
        })
        .collect()
}

/// Compares whole buffers; the error names the first 10 differing words (byte offset,
/// expected, found) and how many differ in all.
pub fn compare(what: &str, expected: &[u8], got: &[u8]) -> Result<()> {
    ensure!(
        expected.len() == got.len(),
        "{what}: {} bytes compared with {}",
        got.len(),
        expected.len()
    );
    if expected == got {
        return Ok(());
    }
    let word = |b: &[u8]| {
        b.iter()
            .rev()
            .fold(String::new(), |s, x| format!("{s}{x:02x}"))
    };
    let bad: Vec<usize> = expected
        .chunks(4)
        .zip(got.chunks(4))
        .enumerate()
        .filter(|(_, (e, g))| e != g)
        .map(|(i, _)| i)
        .collect();
    let mut text = format!(
        "{what}: {} of {} words differ",
        bad.len(),
        expected.len().div_ceil(4)
    );
    for &i in bad.iter().take(10) {
        let (e, g) = (
            &expected[i * 4..(i * 4 + 4).min(expected.len())],
            &got[i * 4..(i * 4 + 4).min(got.len())],
        );
        text += &format!(
            "\n    at byte {:#x}: expected 0x{}, found 0x{}",
            i * 4,
            word(e),
            word(g)
        );
    }
    bail!(text)
}

/// Stores `data` through a mapping with aligned 4-byte volatile stores (the tail byte-wise):
/// the "CPU initialization through the mapping" of upstream's check 1.
///
/// # Safety
/// `dst .. dst + data.len()` lies inside a live mapping and `dst` is 4-byte aligned.
pub unsafe fn store_words(dst: *mut u8, data: &[u8]) {
    let words = data.chunks_exact(4);
    let tail = words.remainder();
    for (i, w) in words.enumerate() {
        let v = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        // SAFETY: in bounds and aligned, per the caller.
        unsafe { ptr::write_volatile(dst.add(i * 4).cast::<u32>(), v) };
    }
    let start = data.len() - tail.len();
    for (i, b) in tail.iter().enumerate() {
        // SAFETY: in bounds, per the caller.
        unsafe { ptr::write_volatile(dst.add(start + i), *b) };
    }
    store_fence();
}

/// One volatile 4-byte load through a mapping.
///
/// # Safety
/// `src` is 4-byte aligned and inside a live mapping (or the caller expects the fault).
pub unsafe fn load_u32(src: *const u8) -> u32 {
    // SAFETY: per the caller.
    unsafe { ptr::read_volatile(src.cast::<u32>()) }
}

/// One volatile 4-byte store through a mapping, followed by a store fence.
///
/// # Safety
/// `dst` is 4-byte aligned and inside a live mapping.
pub unsafe fn store_u32(dst: *mut u8, v: u32) {
    // SAFETY: per the caller.
    unsafe { ptr::write_volatile(dst.cast::<u32>(), v) };
    store_fence();
}

/// Makes write-combined stores visible before what follows (upstream's `SB()`).
fn store_fence() {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// A value unlikely to be in device memory by chance, different in every process.
pub fn token_value(salt: u32) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (t ^ std::process::id().rotate_left(16) ^ salt.wrapping_mul(0x9E37_79B9)) | 1
}

// ---------------------------------------------------------------------------------------------
// The module's counters and the emulator

pub const COUNTERS_PATH: &str = "/proc/driver/mtgdrdrv/counters";

/// `/proc/driver/mtgdrdrv/counters`: pins, pinned bytes and mappings outstanding system-wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counters {
    pub pins_outstanding: i64,
    pub bytes_pinned: i64,
    pub mappings: i64,
}

impl Counters {
    pub fn read() -> Result<Counters> {
        let text = std::fs::read_to_string(COUNTERS_PATH)
            .with_context(|| format!("reading {COUNTERS_PATH}"))?;
        let get = |name: &str| -> Result<i64> {
            text.lines()
                .find_map(|l| {
                    let mut f = l.split_whitespace();
                    (f.next()?.trim_end_matches(':') == name).then(|| f.next()?.parse().ok())?
                })
                .with_context(|| format!("{COUNTERS_PATH} has no {name} line"))
        };
        Ok(Counters {
            pins_outstanding: get("pins_outstanding")?,
            bytes_pinned: get("bytes_pinned")?,
            mappings: get("mappings")?,
        })
    }
}

/// What is pinned system-wide: the module's counters (when it is loaded) and, on the
/// emulator, its page tables, live dma-bufs and their mappings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinSnapshot {
    module: Option<Counters>,
    emulator: Option<EmuPins>,
}

/// The emulator's counters of what holds its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmuPins {
    pub page_tables: u64,
    pub dmabufs: u64,
    pub dmabuf_mappings: u64,
}

impl EmuPins {
    pub fn read(emu: &Emu) -> Result<EmuPins> {
        let stats = emu
            .stats()
            .map_err(|e| anyhow::anyhow!("emulator stats: {e}"))?;
        Ok(EmuPins {
            page_tables: stats.pins_outstanding,
            dmabufs: stats.dmabufs_live,
            dmabuf_mappings: stats.dmabuf_mappings,
        })
    }
}

impl PinSnapshot {
    pub fn take() -> Result<PinSnapshot> {
        let emulator = if emulated() {
            let emu = Emu::open().map_err(|e| anyhow::anyhow!("opening the emulator: {e}"))?;
            Some(EmuPins::read(&emu)?)
        } else {
            None
        };
        let module = if std::path::Path::new(COUNTERS_PATH).exists() {
            Some(Counters::read()?)
        } else {
            None
        };
        Ok(PinSnapshot { module, emulator })
    }

    /// Fails unless nothing more (or less) is pinned or mapped than in `self`.
    pub fn expect_same(&self, what: &str) -> Result<()> {
        let now = PinSnapshot::take()?;
        ensure!(now == *self, "{what}: pins went from {self:?} to {now:?}");
        Ok(())
    }
}

/// Whether `gdr` is libgdrapi's dma-buf backend (`GDR_ATTR_USING_DMA_BUF_MMAP`).
pub fn dma_buf_backend(gdr: &Gdr) -> Result<bool> {
    Ok(gdr.attribute(ATTR_USING_DMA_BUF_MMAP)? == 1)
}

/// A skip when `gdr` is the dma-buf backend, for cases about what only the module does.
pub fn module_backend_or_skip(gdr: &Gdr, what: &str) -> Result<()> {
    if dma_buf_backend(gdr)? {
        skip!("{what} is about the mtgdrdrv module; this run uses the dma-buf backend");
    }
    Ok(())
}

/// The emulated provider, or a skip for hardware runs.
pub fn emulator_or_skip(what: &str) -> Result<Emu> {
    let path = crate::emu::device_path();
    if !std::path::Path::new(&path).exists() {
        skip!("{what} needs the emulated provider ({path}); not available on MUSA hardware");
    }
    Emu::open().map_err(|e| anyhow::anyhow!("opening {path}: {e}"))
}

/// Whether the run uses the emulated provider.
pub fn emulated() -> bool {
    std::path::Path::new(&crate::emu::device_path()).exists()
}

// ---------------------------------------------------------------------------------------------
// Helper processes

/// Exit status of a helper process whose body returned an error (printed on its stderr).
pub const EXIT_HELPER_ERROR: i32 = 99;

/// How a helper process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Exited(i32),
    Signaled(Signal),
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::Exited(EXIT_HELPER_ERROR) => {
                write!(f, "failed (its error is printed above)")
            }
            End::Exited(code) => write!(f, "exited with status {code}"),
            End::Signaled(s) => write!(f, "was killed by {s:?}"),
        }
    }
}

impl End {
    /// Fails unless the helper exited 0.
    pub fn expect_success(self, who: &str) -> Result<()> {
        ensure!(self == End::Exited(0), "{who} {self}");
        Ok(())
    }

    pub fn is_fault(self) -> bool {
        matches!(self, End::Signaled(Signal::SIGSEGV | Signal::SIGBUS))
    }
}

/// A forked helper process (in the case's process group, so the harness's kill reaches it).
pub struct Helper {
    pid: Pid,
}

impl Helper {
    /// Forks; the child runs `body` and exits with the status it returns, or
    /// [`EXIT_HELPER_ERROR`] after printing its error. The case process must be single-
    /// threaded here.
    pub fn spawn(name: &str, body: impl FnOnce() -> Result<i32>) -> Result<Helper> {
        let _ = std::io::stdout().flush();
        // SAFETY: the case process is single-threaded when it forks; the child runs `body` and
        // leaves with `_exit`.
        match unsafe { fork() }.context("fork")? {
            ForkResult::Child => {
                let code = match catch_unwind(AssertUnwindSafe(body)) {
                    Ok(Ok(code)) => code,
                    Ok(Err(e)) => {
                        eprintln!("  {name}: {e:#}");
                        EXIT_HELPER_ERROR
                    }
                    Err(_) => EXIT_HELPER_ERROR,
                };
                // SAFETY: leaves the helper without the parent's destructors (a Gdr or DevBuf
                // it inherited belongs to the parent).
                unsafe { libc::_exit(code) }
            }
            ForkResult::Parent { child } => Ok(Helper { pid: child }),
        }
    }

    pub fn wait(self) -> Result<End> {
        loop {
            match waitpid(self.pid, None) {
                Ok(WaitStatus::Exited(_, code)) => return Ok(End::Exited(code)),
                Ok(WaitStatus::Signaled(_, s, _)) => return Ok(End::Signaled(s)),
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(e) => return Err(e).context("waitpid"),
            }
        }
    }
}

/// Runs `body` in a helper process and waits for it.
pub fn in_helper(name: &str, body: impl FnOnce() -> Result<i32>) -> Result<End> {
    Helper::spawn(name, body)?.wait()
}

/// Turns off core dumps of this process (a helper expected to die by SIGSEGV/SIGBUS).
pub fn no_core_dump() {
    let zero = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit reads the struct we pass.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &zero) };
}

/// How long a process waits for a message from the other before giving up.
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(20);

/// One direction of a pipe between the case process and a helper: 8-byte messages.
pub struct Channel {
    rx: File,
    tx: File,
}

impl Channel {
    pub fn new() -> Result<Channel> {
        let (r, w) = nix::unistd::pipe().context("pipe")?;
        Ok(Channel {
            rx: File::from(r),
            tx: File::from(w),
        })
    }

    pub fn send(&self, v: u64) -> Result<()> {
        (&self.tx)
            .write_all(&v.to_le_bytes())
            .context("writing to a pipe")
    }

    /// Waits up to 20 s for the next message.
    pub fn recv(&self) -> Result<u64> {
        wait_readable(self.rx.as_raw_fd(), MESSAGE_TIMEOUT)?;
        let mut b = [0u8; 8];
        (&self.rx)
            .read_exact(&mut b)
            .context("reading from a pipe (the other process ended?)")?;
        Ok(u64::from_le_bytes(b))
    }
}

/// Waits until `fd` is readable (or closed), at most `timeout`.
pub fn wait_readable(fd: RawFd, timeout: Duration) -> Result<()> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as c_int) };
        match n {
            0 => bail!("no message from the other process within {timeout:?}"),
            n if n > 0 => return Ok(()),
            _ if Errno::last() == Errno::EINTR => continue,
            _ => return Err(Errno::last()).context("poll"),
        }
    }
}

/// The descriptor of `/dev/mtgdrdrv` this process has open (the one `gdr_open` made).
pub fn device_fd() -> Result<RawFd> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").context("listing /proc/self/fd")? {
        let entry = entry?;
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if target == std::path::Path::new(gdrapi::DEVICE_PATH) {
            if let Some(fd) = entry.file_name().to_str().and_then(|s| s.parse().ok()) {
                found.push(fd);
            }
        }
    }
    match found.as_slice() {
        [fd] => Ok(*fd),
        [] => bail!("no open descriptor of {}", gdrapi::DEVICE_PATH),
        _ => bail!(
            "several open descriptors of {}: {found:?}",
            gdrapi::DEVICE_PATH
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walking_bit_is_upstreams_pattern() {
        let p = walking_bit(33 * 4 + 2);
        let word =
            |w: usize| u32::from_le_bytes([p[w * 4], p[w * 4 + 1], p[w * 4 + 2], p[w * 4 + 3]]);
        assert_eq!(word(0), 0x3F4C_5E6B);
        assert_eq!(word(1), 0x3F4C_5E68);
        assert_eq!(word(31), 0x3F4C_5E6A ^ 0x8000_0000);
        assert_eq!(word(32), 0x3F4C_5E6B);
        assert_eq!(&p[132..], &0x3F4C_5E68u32.to_le_bytes()[..2]);
    }

    #[test]
    fn compare_names_the_first_ten_differing_words() {
        let expected = walking_bit(64 * 4 + 3);
        assert!(compare("same", &expected, &expected.clone()).is_ok());
        let got = vec![0u8; expected.len()];
        let text = format!("{:#}", compare("zeros", &expected, &got).unwrap_err());
        assert!(text.starts_with("zeros: 65 of 65 words differ"), "{text}");
        assert_eq!(text.lines().count(), 11, "{text}");
        assert!(
            text.contains("at byte 0x4: expected 0x3f4c5e68, found 0x00000000"),
            "{text}"
        );
        let mut tail = expected.clone();
        *tail.last_mut().unwrap() ^= 1;
        let text = format!("{:#}", compare("tail", &expected, &tail).unwrap_err());
        assert!(
            text.contains("1 of 65 words differ") && text.contains("at byte 0x100"),
            "{text}"
        );
        assert!(compare("length", &expected, &expected[1..]).is_err());
    }
}
