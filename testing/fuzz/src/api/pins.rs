//! gdr_pin_buffer(_v2) and gdr_unpin_buffer with hostile arguments: the ranges asked for, the
//! outcome the documentation predicts, and the handles passed (own, foreign, stale, garbage).

use gdrapi::capi::*;

use super::{out_ptr, ApiFuzzer, Finding, Mh, Step};

const K64: u64 = 0x10000;
const MAX_PIN: u64 = 1 << 40;

impl ApiFuzzer {
    fn pin_args(&mut self) -> (u64, u64) {
        let all: Vec<usize> = (0..self.allocs.len()).collect();
        let Some(&a) = self.rng.pick(&all) else {
            return (self.rng.edge_u64(), self.rng.edge_u64());
        };
        let (va, size) = (self.allocs[a].va, self.allocs[a].size);
        match self.rng.weighted(&[40, 25, 20, 15]) {
            0 => (va, size),
            1 => {
                let units = size / K64;
                if units == 0 {
                    return (va, size);
                }
                let first = self.rng.below(units);
                (va + first * K64, (1 + self.rng.below(units - first)) * K64)
            }
            2 => {
                let off = self.rng.below(size);
                (va + off, 1 + self.rng.below(size - off))
            }
            _ => match self.rng.below(6) {
                0 => (va, 0),
                1 => (0, size),
                2 => (va, u64::MAX),
                3 => (va, size + 1),
                4 => (u64::MAX - 4095, 8192),
                _ => (self.rng.edge_u64(), self.rng.edge_u64()),
            },
        }
    }

    /// Whether a pin of `[addr, addr + size)` would take gdr_t `g`'s file past the module's
    /// byte limit (max_bytes_per_file, 0: the emulator's BAR size).
    fn over_byte_limit(&self, g: usize, addr: u64, size: u64) -> bool {
        let Some(end) = addr.checked_add(size) else {
            return false;
        };
        if addr == 0 || size == 0 || size > MAX_PIN || end > !4095 {
            return false;
        }
        let param = std::fs::read_to_string("/sys/module/mtgdrdrv/parameters/max_bytes_per_file")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        let limit = if param != 0 {
            param
        } else {
            crate::emu::Emu::open()
                .ok()
                .and_then(|e| e.stats().ok())
                .map_or(u64::MAX, |s| s.bar_size)
        };
        let held: u64 = self
            .mhs
            .iter()
            .filter(|m| m.live && m.g == g)
            .map(|m| m.size)
            .sum();
        let span = end.div_ceil(4096) * 4096 - (addr & !4095);
        held + span > limit
    }

    /// (alloc, va, size, granule) of a pin that must succeed, or None.
    fn pin_outcome(&self, addr: u64, size: u64) -> Option<(usize, u64, u64, u32)> {
        if addr == 0 || size == 0 || size > MAX_PIN {
            return None;
        }
        let end = addr.checked_add(size)?;
        let a = (0..self.allocs.len()).find(|&a| {
            let al = &self.allocs[a];
            al.live && addr >= al.va && end <= al.va + al.size
        })?;
        // Pins are rounded to the host page, whatever the allocation's page size.
        let (s, e) = (addr & !4095, end.div_ceil(4096) * 4096);
        Some((a, s, e - s, 4096))
    }

    pub(super) fn op_pin(&mut self) -> Step {
        let g = self.pick_g_or_null();
        let (addr, size) = self.pin_args();
        let v2 = self.rng.chance(600);
        let (flags, token, va_space) = if self.rng.chance(50) {
            (
                self.rng.next_u64() as u32 | 1,
                self.rng.edge_u64() | 1,
                self.rng.next_u64() as u32,
            )
        } else {
            (0, 0, 0)
        };
        let null_out = self.rng.chance(30);
        let mut mh = gdr_mh_t { h: 0xdead };
        let out = out_ptr(&mut mh, null_out);
        self.note(format!(
            "gdr_pin_buffer{}(g{g:?}, {addr:#x}, {size:#x}, flags {flags:#x}, out null {null_out})",
            if v2 { "_v2" } else { "" }
        ));
        let gp = self.g_ptr(g);
        // SAFETY: `gp` is NULL or a live gdr_t; `out` is NULL or points to `mh`.
        let rc = unsafe {
            if v2 {
                gdr_pin_buffer_v2(gp, addr as _, size as usize, flags, out)
            } else {
                gdr_pin_buffer(gp, addr as _, size as usize, token, va_space, out)
            }
        };
        let outcome = self.pin_outcome(addr, size);
        let bad_flags = if v2 {
            flags != 0
        } else {
            token != 0 || va_space != 0
        };
        let want = if g.is_none() || null_out || bad_flags {
            vec![libc::EINVAL]
        } else if g.is_some_and(|g| self.over_byte_limit(g, addr, size)) {
            // The module's per-file byte limit (issue 30, item 14) comes before the provider.
            vec![libc::ENOSPC, libc::EINVAL]
        } else if outcome.is_none() {
            vec![libc::EINVAL]
        } else {
            vec![0]
        };
        self.expect("gdr_pin_buffer", rc, &want)?;
        let (Some(g), Some((alloc, va, size, granule))) = (g, outcome) else {
            return Ok(());
        };
        if rc != 0 {
            return Ok(());
        }
        if mh.h == 0 || self.mhs.iter().any(|m| m.live && m.h == mh) {
            finding!(
                "gdr_pin_buffer returned handle {:#x}, zero or already live",
                mh.h
            );
        }
        self.mhs.push(Mh {
            g,
            h: mh,
            alloc,
            va,
            size,
            granule,
            mappable: addr == va,
            map: None,
            live: true,
        });
        Ok(())
    }

    /// A handle: mostly one of `g`'s, else another gdr_t's, a stale one or garbage. Returns the
    /// index of the model's entry when it belongs to `g` and is live.
    pub(super) fn pick_mh(&mut self, g: Option<usize>) -> (gdr_mh_t, Option<usize>) {
        let own: Vec<usize> = (0..self.mhs.len())
            .filter(|&i| self.mhs[i].live && Some(self.mhs[i].g) == g)
            .collect();
        let any: Vec<usize> = (0..self.mhs.len()).collect();
        match self.rng.weighted(&[75, 15, 10]) {
            0 if !own.is_empty() => {
                let i = own[self.rng.index(own.len())];
                (self.mhs[i].h, Some(i))
            }
            1 if !any.is_empty() => {
                let i = any[self.rng.index(any.len())];
                let mine = self.mhs[i].live && Some(self.mhs[i].g) == g;
                (self.mhs[i].h, mine.then_some(i))
            }
            _ => {
                let h = gdr_mh_t {
                    h: self.rng.edge_u64() as _,
                };
                let i = (0..self.mhs.len())
                    .find(|&i| self.mhs[i].live && Some(self.mhs[i].g) == g && self.mhs[i].h == h);
                (h, i)
            }
        }
    }

    pub(super) fn op_unpin(&mut self) -> Step {
        let g = self.pick_g_or_null();
        let (h, mine) = self.pick_mh(g);
        self.note(format!("gdr_unpin_buffer(g{g:?}, {:#x})", h.h));
        // SAFETY: NULL or a live gdr_t.
        let rc = unsafe { gdr_unpin_buffer(self.g_ptr(g), h) };
        let want = if g.is_some() && mine.is_some() {
            0
        } else {
            libc::EINVAL
        };
        self.expect("gdr_unpin_buffer", rc, &[want])?;
        if let (0, Some(i)) = (rc, mine) {
            self.mhs[i].live = false;
            self.mhs[i].map = None;
        }
        Ok(())
    }
}
