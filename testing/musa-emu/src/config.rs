//! How allocations are backed, from the environment (read once, by `muInit`):
//!
//! - `MTGPU_EMU_PAGE_SIZE`: page size of every allocation, 4096, 65536 or 2097152 (default:
//!   the host page, as mtgpu's own default GPU page);
//!   `4K`, `64K`, `2M` and hex (`0x10000`) are accepted too.
//! - `MTGPU_EMU_ALLOC_ALIGN`: GPU VA alignment of every allocation, a power of two up to 1 TiB
//!   (default: the page size; the emulator raises a smaller one to the page size).
//! - `MTGPU_EMU_DMABUF`: what dma-buf export (`muMemGetHandleForAddressRange`) does: `on`
//!   (default), `off` (the device reports `MU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` 0 and export
//!   fails with `MUSA_ERROR_NOT_SUPPORTED`), or `no-mmap` (export works, but the dma-buf
//!   refuses CPU mmap, as an exporter without CPU access would).
//! - `MTGPU_EMU_VMM_RDMA`: what `MU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_MUSA_VMM_SUPPORTED`
//!   reads: `on` (default, 1) or `off` (0, as a device whose VMM memory cannot be pinned). The
//!   VMM calls themselves work either way; whether a pin of VMM memory works is the kernel
//!   emulator's choice (its `p2p_vmm_*` parameters).

use mtgpu_emu_abi::{MTGPU_EMU_PAGE_2M, MTGPU_EMU_PAGE_4K, MTGPU_EMU_PAGE_64K};

pub const PAGE_SIZE_ENV: &str = "MTGPU_EMU_PAGE_SIZE";
pub const ALLOC_ALIGN_ENV: &str = "MTGPU_EMU_ALLOC_ALIGN";
pub const DMABUF_ENV: &str = "MTGPU_EMU_DMABUF";
pub const VMM_RDMA_ENV: &str = "MTGPU_EMU_VMM_RDMA";

/// What dma-buf export does (`MTGPU_EMU_DMABUF`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DmaBuf {
    #[default]
    On,
    Off,
    NoMmap,
}

impl DmaBuf {
    pub fn parse(s: Option<&str>) -> Result<DmaBuf, String> {
        match s.map(str::trim) {
            None | Some("on") => Ok(DmaBuf::On),
            Some("off") => Ok(DmaBuf::Off),
            Some("no-mmap") => Ok(DmaBuf::NoMmap),
            Some(other) => Err(format!(
                "{DMABUF_ENV}={other:?} is not one of on, off, no-mmap"
            )),
        }
    }
}
const MAX_ALIGN: u64 = 1 << 40;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub page_size: u32,
    pub align: u64,
    pub dmabuf: DmaBuf,
    /// `MTGPU_EMU_VMM_RDMA`: the GPUDirect-RDMA-with-VMM attribute reads 1.
    pub vmm_rdma: bool,
}

impl Config {
    pub fn from_env() -> Result<Config, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let mut config = Config::parse(
            var(PAGE_SIZE_ENV).as_deref(),
            var(ALLOC_ALIGN_ENV).as_deref(),
        )?;
        config.dmabuf = DmaBuf::parse(var(DMABUF_ENV).as_deref())?;
        config.vmm_rdma = match var(VMM_RDMA_ENV).as_deref().map(str::trim) {
            None | Some("on") => true,
            Some("off") => false,
            Some(other) => return Err(format!("{VMM_RDMA_ENV}={other:?} is not one of on, off")),
        };
        Ok(config)
    }

    pub fn parse(page_size: Option<&str>, align: Option<&str>) -> Result<Config, String> {
        let page_size = match page_size {
            None => host_page(),
            Some(s) => match parse_size(s) {
                Some(v)
                    if [MTGPU_EMU_PAGE_4K, MTGPU_EMU_PAGE_64K, MTGPU_EMU_PAGE_2M]
                        .iter()
                        .any(|&p| u64::from(p) == v) =>
                {
                    v as u32
                }
                _ => {
                    return Err(format!(
                        "{PAGE_SIZE_ENV}={s:?} is not one of 4096, 65536, 2097152"
                    ))
                }
            },
        };
        let align = match align {
            None => u64::from(page_size),
            Some(s) => match parse_size(s) {
                Some(v) if v.is_power_of_two() && v <= MAX_ALIGN => v,
                _ => {
                    return Err(format!(
                        "{ALLOC_ALIGN_ENV}={s:?} is not a power of two up to 1 TiB"
                    ))
                }
            },
        };
        Ok(Config {
            page_size,
            align,
            dmabuf: DmaBuf::On,
            vmm_rdma: true,
        })
    }
}

/// `4096`, `0x1000`, `4K`, `64k`, `2M`, `1G` (binary units).
fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return u64::from_str_radix(hex, 16).ok();
    }
    let (digits, shift) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 10),
        b'm' | b'M' => (&s[..s.len() - 1], 20),
        b'g' | b'G' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// The host page size, which mtgpu backs allocations with by default (`mtgpu_page_size=0`).
fn host_page() -> u32 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| u32::try_from(p).ok())
        .filter(|&p| p == MTGPU_EMU_PAGE_4K || p == MTGPU_EMU_PAGE_64K)
        .unwrap_or(MTGPU_EMU_PAGE_4K)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_to_host_pages_aligned_to_the_page() {
        let c = Config::parse(None, None).unwrap();
        let host = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .unwrap()
            .unwrap() as u32;
        assert_eq!((c.page_size, c.align), (host, u64::from(host)));
        let c = Config::parse(Some("2M"), None).unwrap();
        assert_eq!((c.page_size, c.align), (2 << 20, 2 << 20));
    }

    #[test]
    fn parses_sizes_and_rejects_others() {
        assert_eq!(Config::parse(Some("4096"), None).unwrap().page_size, 4096);
        assert_eq!(
            Config::parse(Some("0x10000"), None).unwrap().page_size,
            65536
        );
        assert_eq!(
            Config::parse(Some("4k"), Some("1G")).unwrap().align,
            1 << 30
        );
        assert!(Config::parse(Some("8192"), None).is_err());
        assert!(Config::parse(Some("lots"), None).is_err());
        assert!(Config::parse(None, Some("3000")).is_err());
        assert!(Config::parse(None, Some("2048G")).is_err());
        assert!(Config::parse(None, Some("99999999999999999999")).is_err());
    }

    #[test]
    fn dmabuf_modes() {
        assert_eq!(DmaBuf::parse(None), Ok(DmaBuf::On));
        assert_eq!(DmaBuf::parse(Some("off")), Ok(DmaBuf::Off));
        assert_eq!(DmaBuf::parse(Some("no-mmap")), Ok(DmaBuf::NoMmap));
        assert!(DmaBuf::parse(Some("yes")).is_err());
    }
}
