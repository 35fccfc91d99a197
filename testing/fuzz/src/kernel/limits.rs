//! The module's limits and the host states that change what a mapping gets (issue 30): the
//! per-file byte limit (`max_bytes_per_file`, by default the BARs' size), the cap on runs per
//! pin (`max_runs_per_pin`), and a kernel mapping of the whole BAR that the emulator keeps
//! (`bar_kernel_map`), which with x86 PAT decides the cache mode of every later mapping of its
//! pages, and so what GET_INFO must report. The parameters are global: only the `exact` worker
//! (the one fuzzing process system-wide) changes them, and puts the defaults back at the end.

use super::{Finding, PinState, Step, Worker};
use crate::emu::Emu;
use crate::sys::{self, ename};

const MOD_PARAMS: &str = "/sys/module/mtgdrdrv/parameters";
const EMU_PARAMS: &str = "/sys/module/mtgpu_emu/parameters";
const DEFAULT_RUNS: u32 = 1 << 20;
const PIN_CHUNK: u64 = 8 << 20;

/// What the limits and the BAR's kernel mapping are now, as the model knows them.
pub(super) struct Limits {
    /// `max_bytes_per_file`; 0 means the BARs' size.
    pub(super) bytes_param: u64,
    pub(super) bar_size: u64,
    pub(super) max_runs: u32,
    /// `bar_kernel_map`: "none", "uc" or "wc".
    pub(super) kmap: String,
}

fn read_param(dir: &str, name: &str) -> Option<String> {
    std::fs::read_to_string(format!("{dir}/{name}"))
        .ok()
        .map(|s| s.trim().to_string())
}

fn write_param(dir: &str, name: &str, value: &str) -> Result<(), String> {
    std::fs::write(format!("{dir}/{name}"), value).map_err(|e| format!("{name}={value}: {e}"))
}

impl Limits {
    /// The state the module and the emulator are in (their defaults when nothing changed them).
    pub(super) fn read() -> Limits {
        let bar_size = Emu::open()
            .ok()
            .and_then(|e| e.stats().ok())
            .map_or(u64::MAX, |s| s.bar_size);
        Limits {
            bytes_param: read_param(MOD_PARAMS, "max_bytes_per_file")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            bar_size,
            max_runs: read_param(MOD_PARAMS, "max_runs_per_pin")
                .and_then(|v| v.parse().ok())
                .unwrap_or(DEFAULT_RUNS),
            kmap: read_param(EMU_PARAMS, "bar_kernel_map").unwrap_or_else(|| "none".into()),
        }
    }

    /// The byte limit of one file.
    pub(super) fn max_bytes(&self) -> u64 {
        if self.bytes_param == 0 {
            self.bar_size
        } else {
            self.bytes_param
        }
    }
}

impl Worker {
    /// Bytes file `f` holds pinned: its pins not yet put (unpinned but still mapped ones too).
    pub(super) fn file_pinned_bytes(&self, f: usize) -> u64 {
        self.pins
            .iter()
            .filter(|p| p.file == f && p.state != PinState::Dead)
            .map(|p| p.size)
            .sum()
    }

    /// Whether a pin of `[addr, addr + size)` of allocation `a` may have more runs than the
    /// cap: it has at most one per provider page it touches, plus one per chunk boundary.
    pub(super) fn may_pass_run_cap(&self, a: usize, addr: u64, size: u64) -> bool {
        let ps = u64::from(self.allocs[a].page_size);
        let pages = (addr + size).div_ceil(ps) - addr / ps;
        let chunks = (addr + size - 1) / PIN_CHUNK - addr / PIN_CHUNK + 1;
        pages + chunks - 1 > u64::from(self.limits.max_runs)
    }

    /// The mapping type a new mapping of pin `p` gets, if the model can tell: the BAR's kernel
    /// mapping wins (it is only changed while nothing is mapped, so every later reservation
    /// takes its type). Without it, a WC request is WC unless a live mapping made under an
    /// uncached kernel mapping still holds an uncached reservation; a DEVICE request takes,
    /// page by page, whatever x86 PAT has reserved there (WC for pages another mapping
    /// reserved WC, which the model cannot always tell: the memtype lookup of a page may see
    /// its neighbour's). Where the model cannot tell, the type is read back and must be WC or
    /// DEVICE.
    pub(super) fn predicted_map_type(&self, p: usize) -> Option<u32> {
        let uc_reserved = self.vmas.iter().any(|v| {
            let q = &self.pins[v.pin];
            v.pin != p && q.req != 3 && q.map_type == 3
        });
        match self.limits.kmap.as_str() {
            "uc" => Some(3),
            "wc" => Some(1),
            _ if self.pins[p].req == 3 || uc_reserved => None,
            _ => Some(1),
        }
    }

    /// Changes one limit or the BAR's kernel mapping (exact worker only).
    pub(super) fn op_limits(&mut self) -> Step {
        if !self.cfg.exact {
            return Ok(());
        }
        match self.rng.below(3) {
            0 => {
                let value = match self.rng.below(3) {
                    0 => 0,
                    1 => self.rng.range(1, 64 << 20),
                    _ => {
                        let f = self.rng.index(self.files.len().max(1));
                        self.file_pinned_bytes(f) + self.rng.below(16 << 20)
                    }
                };
                self.set_limit("max_bytes_per_file", value.to_string())?;
                self.limits.bytes_param = value;
            }
            1 => {
                let value = if self.rng.chance(400) {
                    DEFAULT_RUNS
                } else {
                    self.rng.range(1, 64) as u32
                };
                self.set_limit("max_runs_per_pin", value.to_string())?;
                self.limits.max_runs = value;
            }
            _ => {
                // A kernel mapping takes the type of reservations that exist already (a live WC
                // user mapping makes an "uc" one WC): only changed while nothing is mapped.
                let want = if self.vmas.is_empty() {
                    ["none", "uc", "wc"][self.rng.index(3)]
                } else {
                    "none"
                };
                self.note(format!("emulator bar_kernel_map={want}"));
                let r = write_param(EMU_PARAMS, "bar_kernel_map", want);
                let now = read_param(EMU_PARAMS, "bar_kernel_map").unwrap_or_default();
                if r.is_err() || now != want {
                    finding!("bar_kernel_map={want}: {r:?}, now {now}");
                }
                self.limits.kmap = now;
            }
        }
        Ok(())
    }

    fn set_limit(&mut self, name: &str, value: String) -> Step {
        self.note(format!("mtgdrdrv {name}={value}"));
        write_param(MOD_PARAMS, name, &value).map_err(Finding)
    }

    /// Puts the defaults back (exact worker): the steps after the fuzzer expect them.
    pub(super) fn restore_limits(&mut self) -> Result<(), String> {
        if !self.cfg.exact {
            return Ok(());
        }
        write_param(MOD_PARAMS, "max_bytes_per_file", "0")?;
        write_param(MOD_PARAMS, "max_runs_per_pin", &DEFAULT_RUNS.to_string())?;
        write_param(EMU_PARAMS, "bar_kernel_map", "none")?;
        self.limits = Limits::read();
        Ok(())
    }

    /// Reads the type the module reports for a new mapping of pin `p` (handle `h`, on `fd`)
    /// where the model cannot predict it; any but WC or DEVICE is a finding.
    pub(super) fn observed_map_type(&mut self, fd: i32, h: u64) -> Result<u32, Finding> {
        let mut info = mtgdrdrv::GDRDRV_IOC_GET_INFO_V2_PARAMS {
            handle: h,
            ..Default::default()
        };
        sys::ioctl(
            fd,
            mtgdrdrv::GDRDRV_IOC_GET_INFO_V2,
            &mut info as *mut _ as usize,
        )
        .map_err(|e| Finding(format!("GET_INFO_V2 after mmap: {}", ename(e))))?;
        match info.mapping_type {
            t @ (1 | 3) => Ok(t),
            t => Err(Finding(format!("a new mapping reports type {t}"))),
        }
    }
}
