//! What a benchmark run holds: the GPU, an open `gdr_t`, pins and mappings of device buffers,
//! each released in reverse order (explicitly where the error matters, else on drop). The C
//! API of the loaded libgdrapi is called here and nowhere else in the benchmarks.

use std::ffi::{c_int, c_ulong, c_void};
use std::io::Write;

use anyhow::{bail, Context, Result};
use gdrapi::MappingType;

use super::cli::{Common, MapType};
use super::export::JsonExport;
use super::result::{BenchResult, Report, Setup, Tool, SCHEMA_VERSION};
use crate::gdr::{self, gdr_info_v2, gdr_mh_t};
use crate::gpu::{DevicePtr, Gpu};
use crate::term::Term;

/// The GPU page: pins and mappings are made of whole ones.
pub const GPU_PAGE: u64 = gdrapi::GPU_PAGE_SIZE;

/// `x` rounded up to a multiple of `align` (a power of two).
pub fn round_up(x: u64, align: u64) -> u64 {
    x.div_ceil(align) * align
}

/// The largest power of two `<= x` (`x >= 1`).
pub fn pow2_floor(x: u64) -> u64 {
    if x == 0 {
        0
    } else {
        1 << (63 - x.leading_zeros())
    }
}

/// 1, 2, 4, … up to and including `max`'s largest power of two.
pub fn pow2_sizes(max: u64) -> Vec<u64> {
    std::iter::successors(Some(1u64), |&s| s.checked_mul(2))
        .take_while(|&s| s <= max)
        .collect()
}

/// Where a run's results go: the human-readable report and the JSON export.
pub struct Output {
    /// The human-readable report: stdout, or stderr when the JSON takes stdout.
    pub out: Box<dyn Write>,
    /// `--json`, already created.
    pub export: Option<JsonExport>,
}

impl Output {
    /// Creates the `--json` file (a bad path fails before anything is measured).
    pub fn open(common: &Common) -> Result<Output> {
        let export = common.json.as_deref().map(JsonExport::open).transpose()?;
        let out: Box<dyn Write> = if export.as_ref().is_some_and(JsonExport::is_stdout) {
            Box::new(std::io::stderr())
        } else {
            Box::new(std::io::stdout())
        };
        Ok(Output { out, export })
    }

    /// Flushes the report and writes the JSON, if asked for.
    pub fn finish(mut self, tool: Tool, results: Vec<BenchResult>) -> Result<()> {
        self.out.flush()?;
        if let Some(export) = self.export {
            export.write(&Report {
                schema_version: SCHEMA_VERSION,
                tool,
                results,
            })?;
        }
        Ok(())
    }
}

/// The GPU and an open gdr.
pub struct Env {
    pub common: Common,
    /// Declared before `gpu`, so that it is closed before the GPU context is released.
    pub gdr: Gdr,
    pub gpu: Box<dyn Gpu>,
}

impl Env {
    /// Opens the GPU (`-d`) and gdr.
    pub fn open(common: &Common) -> Result<Env> {
        let gpu = crate::musa::open(common.device)
            .with_context(|| format!("opening GPU {}", common.device))?;
        // A device without pinnable VMM memory is a missing feature (exit 77), as no device is.
        let gpu =
            crate::gpu::with_alloc_fn(gpu, common.alloc_fn).map_err(crate::status::unavailable)?;
        let gdr = Gdr::open()?;
        if let Some(warning) = crate::gdr::fallback_warning(gdr.using_dmabuf()) {
            Term::detect().warn(warning);
        }
        Ok(Env {
            common: common.clone(),
            gdr,
            gpu,
        })
    }

    /// The run's description, for every result row.
    pub fn setup(&self, tool: Tool, buffer_size: u64, info: &Info) -> Setup {
        let (lib_major, lib_minor) = self.gdr.runtime_version();
        Setup {
            tool,
            tool_version: env!("CARGO_PKG_VERSION").into(),
            device_index: self.common.device,
            device_name: self.gpu.name(),
            pci_bus_id: self.gpu.pci_bus_id(),
            gpu_driver_version: self.gpu.driver_version().ok(),
            gdrapi_version: format!("{lib_major}.{lib_minor}"),
            mtgdrdrv_version: match self.gdr.driver_version() {
                Ok((major, minor)) => format!("{major}.{minor}"),
                Err(_) if self.gdr.using_dmabuf() => "none (dma-buf backend)".into(),
                Err(_) => "unknown".into(),
            },
            copy_variant: gdrapi::copy::selected().name.into(),
            alloc_fn: self.common.alloc_fn.name().into(),
            mapping_requested: self.common.mapping.name().into(),
            mapping_type: mapping_id(info.mapping_type).into(),
            buffer_size_bytes: buffer_size,
            gpu_page_size_bytes: u64::from(info.page_size),
        }
    }

    /// The lines every report starts with: device, library, buffer and mapping. Lines start
    /// with `#`, so that tools reading the table can skip them.
    pub fn print_preamble(
        &self,
        out: &mut dyn Write,
        setup: &Setup,
        buf: &DeviceBuffer,
        info: &Info,
    ) -> Result<()> {
        let bus = setup.pci_bus_id.as_deref().unwrap_or("unknown bus");
        let drv = setup
            .gpu_driver_version
            .map_or_else(|| "unknown".to_string(), |v| v.to_string());
        let mapping = gdr::mapping_type_name(self.gdr.api, info.mapping_type);
        writeln!(
            out,
            "# device {}: {} ({bus}), MUSA driver {drv}",
            setup.device_index, setup.device_name
        )?;
        writeln!(
            out,
            "# libgdrapi {} (copy variant {}), mtgdrdrv {}",
            setup.gdrapi_version, setup.copy_variant, setup.mtgdrdrv_version
        )?;
        writeln!(
            out,
            "# buffer: {} bytes from {} at 0x{:x} (aligned to the {}-byte GPU page: 0x{:x})",
            buf.size, setup.alloc_fn, buf.raw, GPU_PAGE, buf.ptr
        )?;
        writeln!(
            out,
            "# mapping: {mapping} (requested {}); info: va=0x{:x} mapped_size={} page_size={} \
             mapped={} wc_mapping={}",
            setup.mapping_requested,
            info.va,
            info.mapped_size,
            info.page_size,
            u8::from(info.mapped),
            u8::from(info.wc),
        )?;
        Ok(())
    }
}

/// The short name of a `gdr_mapping_type_t` used in the JSON: none, wc, caching, device.
pub fn mapping_id(t: c_int) -> &'static str {
    match u32::try_from(t).ok().and_then(MappingType::from_raw) {
        Some(MappingType::None) => "none",
        Some(MappingType::WriteCombining) => "wc",
        Some(MappingType::Caching) => "caching",
        Some(MappingType::Device) => "device",
        None => "unknown",
    }
}

/// A device buffer, aligned to the GPU page (mappings must start on one). Freed on drop.
pub struct DeviceBuffer<'a> {
    gpu: &'a dyn Gpu,
    /// What the allocator returned.
    pub raw: DevicePtr,
    /// The aligned start: `raw` rounded up to [`GPU_PAGE`].
    pub ptr: DevicePtr,
    /// Usable bytes from `ptr`.
    pub size: u64,
}

impl<'a> DeviceBuffer<'a> {
    /// `size` bytes starting on a GPU page. Like upstream, it over-allocates by a page less one
    /// byte when the allocator's address is not aligned, and asks for SYNC_MEMOPS (a failure is
    /// a warning).
    pub fn alloc(gpu: &'a dyn Gpu, size: u64, term: &Term) -> Result<DeviceBuffer<'a>> {
        let bytes = usize::try_from(size).context("buffer size")?;
        let mut raw = gpu
            .alloc(bytes)
            .with_context(|| format!("allocating {size} bytes of device memory"))?;
        if raw % GPU_PAGE != 0 {
            gpu.free(raw)?;
            let padded = bytes + (GPU_PAGE as usize - 1);
            raw = gpu
                .alloc(padded)
                .with_context(|| format!("allocating {padded} bytes of device memory"))?;
        }
        let buf = DeviceBuffer {
            gpu,
            raw,
            ptr: round_up(raw, GPU_PAGE),
            size,
        };
        if let Err(e) = gpu.set_sync_memops(buf.ptr) {
            term.warn(format_args!("cannot set SYNC_MEMOPS on the buffer: {e:#}"));
        }
        Ok(buf)
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // Nothing useful to do with a failure at teardown.
        let _ = self.gpu.free(self.raw);
    }
}

/// `gdr_get_info_v2`, decoded.
#[derive(Clone, Copy, Debug)]
pub struct Info {
    pub va: u64,
    pub mapped_size: u64,
    pub page_size: u32,
    pub mapped: bool,
    pub wc: bool,
    pub mapping_type: c_int,
}

pub use crate::gdr::Gdr;

impl Gdr {
    /// `gdr_pin_buffer` of `size` bytes at `addr`, with no P2P token.
    pub fn pin(&self, addr: DevicePtr, size: u64) -> Result<Pin<'_>> {
        let mut mh = gdr_mh_t::default();
        let len = usize::try_from(size).context("pin size")?;
        // SAFETY: `g` is open and `mh` a valid out pointer; the address is only validated.
        let rc = unsafe { (self.api.pin_buffer)(self.g, addr as c_ulong, len, 0, 0, &mut mh) };
        gdr::check(rc).with_context(|| format!("gdr_pin_buffer of {size} bytes at 0x{addr:x}"))?;
        Ok(Pin {
            gdr: self,
            mh,
            pinned: true,
        })
    }
}

/// A pinned range, unpinned on drop unless [`Pin::unpin`] did it.
pub struct Pin<'g> {
    gdr: &'g Gdr,
    mh: gdr_mh_t,
    pinned: bool,
}

impl<'g> Pin<'g> {
    /// `gdr_get_info_v2`.
    pub fn info(&self) -> Result<Info> {
        let mut i = gdr_info_v2::default();
        // SAFETY: `g` is open, `mh` pinned, `i` a valid out pointer.
        let rc = unsafe { (self.gdr.api.get_info_v2)(self.gdr.g, self.mh, &mut i) };
        gdr::check(rc).context("gdr_get_info_v2")?;
        Ok(Info {
            va: i.va,
            mapped_size: i.mapped_size,
            page_size: i.page_size,
            mapped: i.flags & 1 != 0,
            wc: i.flags & 2 != 0,
            mapping_type: i.mapping_type,
        })
    }

    /// `gdr_map_v2` of `size` bytes, asking for `request`.
    pub fn map(&self, size: u64, request: MapType) -> Result<Mapping<'_>> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        let len = usize::try_from(size).context("map size")?;
        let flag = request.flag();
        // SAFETY: `g` is open, `mh` pinned, `ptr` a valid out pointer.
        let rc = unsafe { (self.gdr.api.map_v2)(self.gdr.g, self.mh, &mut ptr, len, flag) };
        gdr::check(rc).with_context(|| {
            let hint = match request {
                MapType::Cache => ": mtgpu maps its PCIe BAR write-combined, never cached",
                _ => "",
            };
            format!("gdr_map_v2 of {size} bytes, -M {}{hint}", request.name())
        })?;
        Ok(Mapping {
            pin: self,
            ptr,
            len,
            mapped: true,
        })
    }

    /// `gdr_unpin_buffer`, reporting its error.
    pub fn unpin(mut self) -> Result<()> {
        self.pinned = false;
        // SAFETY: `mh` is pinned and no mapping of it is left (they borrow self).
        let rc = unsafe { (self.gdr.api.unpin_buffer)(self.gdr.g, self.mh) };
        gdr::check(rc).context("gdr_unpin_buffer")?;
        Ok(())
    }
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        if self.pinned {
            // SAFETY: as in unpin.
            unsafe { (self.gdr.api.unpin_buffer)(self.gdr.g, self.mh) };
        }
    }
}

/// A CPU mapping of a pin, unmapped on drop unless [`Mapping::unmap`] did it.
pub struct Mapping<'p> {
    pin: &'p Pin<'p>,
    ptr: *mut c_void,
    len: usize,
    mapped: bool,
}

impl Mapping<'_> {
    /// The user-space address of the mapping.
    pub fn addr(&self) -> usize {
        self.ptr as usize
    }

    fn check_range(&self, offset: u64, n: usize) -> Result<usize> {
        let off = usize::try_from(offset).context("offset")?;
        match off.checked_add(n) {
            Some(end) if end <= self.len => Ok(off),
            _ => bail!(
                "{n} bytes at offset {offset} do not fit the {}-byte mapping",
                self.len
            ),
        }
    }

    /// `gdr_copy_to_mapping` of `src` to `offset` bytes into the mapping.
    #[inline]
    pub fn copy_to(&self, offset: u64, src: &[u8]) -> Result<()> {
        let off = self.check_range(offset, src.len())?;
        // SAFETY: the destination range lies inside the live mapping (checked above) and
        // `src` is readable for its length.
        let rc = unsafe {
            (self.pin.gdr.api.copy_to_mapping)(
                self.pin.mh,
                self.ptr.cast::<u8>().add(off).cast(),
                src.as_ptr().cast(),
                src.len(),
            )
        };
        gdr::check(rc).context("gdr_copy_to_mapping")?;
        Ok(())
    }

    /// `gdr_copy_from_mapping` of `dst.len()` bytes from `offset` bytes into the mapping.
    #[inline]
    pub fn copy_from(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let off = self.check_range(offset, dst.len())?;
        // SAFETY: the source range lies inside the live mapping (checked above) and `dst` is
        // writable for its length.
        let rc = unsafe {
            (self.pin.gdr.api.copy_from_mapping)(
                self.pin.mh,
                dst.as_mut_ptr().cast(),
                self.ptr.cast::<u8>().add(off).cast_const().cast(),
                dst.len(),
            )
        };
        gdr::check(rc).context("gdr_copy_from_mapping")?;
        Ok(())
    }

    /// `gdr_unmap`, reporting its error.
    pub fn unmap(mut self) -> Result<()> {
        self.mapped = false;
        // SAFETY: `ptr`/`len` are what gdr_map_v2 returned; no access follows (self is gone).
        let rc =
            unsafe { (self.pin.gdr.api.unmap)(self.pin.gdr.g, self.pin.mh, self.ptr, self.len) };
        gdr::check(rc).context("gdr_unmap")?;
        Ok(())
    }
}

impl Drop for Mapping<'_> {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: as in unmap.
            unsafe { (self.pin.gdr.api.unmap)(self.pin.gdr.g, self.pin.mh, self.ptr, self.len) };
        }
    }
}

/// Upstream's data pattern (a walking bit over a constant, per 32-bit word), with `seed`
/// mixed in so that successive checks cannot pass on stale data.
pub fn pattern(seed: u32, len: usize) -> Vec<u8> {
    let base = 0x3F4C_5E6A ^ seed;
    (0..len.div_ceil(4))
        .flat_map(|w| (base ^ (1u32 << (w % 32))).to_le_bytes())
        .take(len)
        .collect()
}

/// Fails unless `got == expected`, naming the first differing byte.
pub fn verify(what: &str, expected: &[u8], got: &[u8]) -> Result<()> {
    if expected == got {
        return Ok(());
    }
    let first = expected
        .iter()
        .zip(got)
        .position(|(a, b)| a != b)
        .unwrap_or(expected.len().min(got.len()));
    let differing = expected.iter().zip(got).filter(|(a, b)| a != b).count();
    bail!(
        "{what}: the data read back differs from what was written: byte {first} of {} is \
         {:#04x}, expected {:#04x} ({differing} bytes differ)",
        expected.len(),
        got.get(first).copied().unwrap_or(0),
        expected.get(first).copied().unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_rounding() {
        assert_eq!(round_up(1, GPU_PAGE), GPU_PAGE);
        assert_eq!(round_up(GPU_PAGE, GPU_PAGE), GPU_PAGE);
        assert_eq!(round_up(0, GPU_PAGE), 0);
        assert_eq!(pow2_floor(1), 1);
        assert_eq!(pow2_floor(131072), 131072);
        assert_eq!(pow2_floor(100_000), 65536);
        assert_eq!(pow2_sizes(1), vec![1]);
        assert_eq!(pow2_sizes(8), vec![1, 2, 4, 8]);
        assert_eq!(pow2_sizes(10), vec![1, 2, 4, 8]);
        assert_eq!(pow2_sizes(0), Vec::<u64>::new());
        assert_eq!(pow2_sizes(u64::MAX).len(), 64);
    }

    #[test]
    fn pattern_is_upstreams_walking_bit() {
        let p = pattern(0, 10);
        assert_eq!(&p[..4], &(0x3F4C_5E6Au32 ^ 1).to_le_bytes());
        assert_eq!(&p[4..8], &(0x3F4C_5E6Au32 ^ 2).to_le_bytes());
        assert_eq!(&p[8..], &(0x3F4C_5E6Au32 ^ 4).to_le_bytes()[..2]);
        assert_ne!(pattern(1, 8), pattern(2, 8));
    }

    #[test]
    fn verify_names_the_first_difference() {
        assert!(verify("x", &[1, 2, 3], &[1, 2, 3]).is_ok());
        let e = verify("write", &[1, 2, 3, 4], &[1, 9, 3, 8]).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("byte 1 of 4"), "{msg}");
        assert!(msg.contains("2 bytes differ"), "{msg}");
    }
}
