//! The checks: expected results of a call, the allocations' contents against their shadows,
//! /proc/self/maps against the modelled VMAs, and (in `exact` mode) the global counters
//! against the model's counts.

use super::{Finding, Pin, PinState, Step, Worker};
use crate::emu::{Emu, Raw};
use crate::sys::{self, ename, Errno};

/// mtgdrdrv asks mtgpu for a pin in chunks of this much GPU VA, aligned to it.
const PIN_CHUNK: u64 = 8 << 20;

/// An expected result: success and/or a set of errnos.
#[derive(Clone, Debug)]
pub(super) struct Expect {
    pub(super) ok: bool,
    pub(super) errs: Vec<Errno>,
}

impl Expect {
    pub(super) fn ok() -> Expect {
        Expect {
            ok: true,
            errs: Vec::new(),
        }
    }
    pub(super) fn err(e: Errno) -> Expect {
        Expect {
            ok: false,
            errs: vec![e],
        }
    }
    pub(super) fn also(mut self, e: Errno) -> Expect {
        self.errs.push(e);
        self
    }
    fn matches(&self, got: Result<(), Errno>) -> bool {
        match got {
            Ok(()) => self.ok,
            Err(e) => self.errs.contains(&e),
        }
    }
    fn describe(&self) -> String {
        let mut s: Vec<&str> = self.errs.iter().map(|&e| ename(e)).collect();
        if self.ok {
            s.insert(0, "OK");
        }
        s.join("|")
    }
}

impl Worker {
    pub(super) fn check(&self, what: &str, exp: &Expect, got: Result<(), Errno>) -> Step {
        if exp.matches(got) {
            return Ok(());
        }
        let got = match got {
            Ok(()) => "OK".to_string(),
            Err(e) => format!("{} ({e})", ename(e)),
        };
        finding!("{what}: got {got}, expected {}", exp.describe())
    }

    /// Reads allocation `a` through the emulator and compares it with the shadow.
    pub(super) fn verify_alloc(&mut self, a: usize) -> Step {
        let (ei, va, size) = (self.allocs[a].emu, self.allocs[a].va, self.allocs[a].size);
        let Some(emu) = self.emu(ei) else {
            return Ok(());
        };
        let mut buf = vec![0u8; size as usize];
        if let Err(e) = emu.read(va, &mut buf).raw() {
            finding!("emu read of allocation {va:#x}+{size:#x}: {}", ename(e));
        }
        if let Some(i) = (0..buf.len()).find(|&i| buf[i] != self.allocs[a].shadow[i]) {
            finding!(
                "allocation {va:#x} byte {i:#x} is {:#04x}, this process wrote {:#04x}: memory \
                 was written by someone with no mapping of it",
                buf[i],
                self.allocs[a].shadow[i]
            );
        }
        Ok(())
    }

    pub(super) fn verify_all(&mut self) -> Step {
        for a in 0..self.allocs.len() {
            if self.allocs[a].live {
                self.verify_alloc(a)?;
            }
        }
        Ok(())
    }

    /// /proc/self/maps shows exactly the modelled device VMAs.
    pub(super) fn check_maps(&mut self) -> Step {
        let page = self.page as u64;
        let mut kernel: Vec<(usize, usize, bool, bool, u64)> = sys::device_vmas()
            .into_iter()
            .map(|(s, e, perms, off)| {
                (
                    s,
                    e,
                    perms.starts_with('r'),
                    perms.as_bytes().get(1) == Some(&b'w'),
                    off,
                )
            })
            .collect();
        let mut model: Vec<(usize, usize, bool, bool, u64)> = self
            .vmas
            .iter()
            .map(|v| {
                (
                    v.start,
                    v.start + v.len,
                    v.prot & libc::PROT_READ != 0,
                    v.prot & libc::PROT_WRITE != 0,
                    self.pins[v.pin].handle + v.pin_off / page,
                )
            })
            .collect();
        kernel.sort_unstable();
        model.sort_unstable();
        if kernel != model {
            finding!("/proc/self/maps device VMAs {kernel:x?} differ from the model {model:x?}");
        }
        Ok(())
    }

    /// Global counters equal the model's counts (only meaningful when nothing else pins).
    pub(super) fn check_counters(&mut self) -> Step {
        if !self.cfg.exact {
            return Ok(());
        }
        let pins: Vec<&Pin> = self
            .pins
            .iter()
            .filter(|p| p.state != PinState::Dead)
            .collect();
        let want_pins = pins.len() as i64;
        // The provider holds one table per 8 MiB chunk of GPU VA a pin spans.
        let want_tables: u64 = pins
            .iter()
            .map(|p| (p.va + p.size - 1) / PIN_CHUNK - p.va / PIN_CHUNK + 1)
            .sum();
        let c = sys::module_counters_settled(want_pins)
            .map_err(|e| Finding(format!("counters: {e}")))?;
        let want_bytes: i64 = pins.iter().map(|p| p.size as i64).sum();
        let want_maps = self.vmas.len() as i64;
        if (c.pins_outstanding, c.bytes_pinned, c.mappings) != (want_pins, want_bytes, want_maps)
            // A pin holds one table per 8 MiB chunk it spans, at least one.
            || c.get_pages_calls - c.put_pages_calls < c.pins_outstanding
            || (c.pins_outstanding == 0 && c.get_pages_calls != c.put_pages_calls)
        {
            finding!(
                "module counters {c:?}, model: pins {want_pins} bytes {want_bytes} mappings {want_maps}"
            );
        }
        let emu = Emu::open()
            .raw()
            .map_err(|e| Finding(format!("emu open: {}", ename(e))))?;
        let s = emu
            .stats()
            .raw()
            .map_err(|e| Finding(format!("emu stats: {}", ename(e))))?;
        let lingering = (0..self.allocs.len())
            .filter(|&a| {
                !self.allocs[a].live
                    && self
                        .pins
                        .iter()
                        .any(|p| p.alloc == a && p.state != PinState::Dead)
            })
            .count() as u64;
        let live = self.allocs.iter().filter(|a| a.live).count() as u64;
        let want_allocs = live + lingering + self.cfg.foreign_allocs;
        if s.pins_outstanding != want_tables || s.allocations != want_allocs {
            finding!(
                "emulator stats {s:?}, model: tables {want_tables}, allocations {want_allocs} \
                 ({live} live, {lingering} freed while pinned, {} foreign)",
                self.cfg.foreign_allocs
            );
        }
        Ok(())
    }
}
