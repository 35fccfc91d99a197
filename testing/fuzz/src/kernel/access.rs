//! CPU reads and writes through the mappings, and kernel reads of them (the probe): a page is
//! readable iff the model says it is mapped and its pin is live.

use super::{Finding, Step, Vma, Worker};
use crate::sys::{self, ename};

impl Worker {
    fn access_target(&mut self, write: bool) -> Option<(Vma, usize, usize)> {
        let ok: Vec<usize> = (0..self.vmas.len())
            .filter(|&i| self.accessible(&self.vmas[i], write))
            .collect();
        let &i = self.rng.pick(&ok)?;
        let v = self.vmas[i].clone();
        let off = self.rng.index(v.len);
        let len = 1 + self.rng.index((v.len - off).min(512));
        Some((v, off, len))
    }

    pub(super) fn op_write(&mut self) -> Step {
        let Some((v, off, len)) = self.access_target(true) else {
            return Ok(());
        };
        let mut data = vec![0u8; len];
        self.rng.fill(&mut data);
        self.note(format!("cpu write {:#x}+{len:#x}", v.start + off));
        // SAFETY: the model says this range is mapped writable with a live pin (checked by the
        // probe and maps oracles all along).
        unsafe { sys::store(v.start + off, &data) };
        if let Some((a, idx)) = self.shadow_of(&v, off) {
            self.allocs[a].shadow[idx..idx + len].copy_from_slice(&data);
        }
        Ok(())
    }

    pub(super) fn op_read(&mut self) -> Step {
        let Some((v, off, len)) = self.access_target(false) else {
            return Ok(());
        };
        let mut data = vec![0u8; len];
        self.note(format!("cpu read {:#x}+{len:#x}", v.start + off));
        // SAFETY: as in op_write, readable.
        unsafe { sys::load(&mut data, v.start + off) };
        if let Some((a, idx)) = self.shadow_of(&v, off) {
            if data != self.allocs[a].shadow[idx..idx + len] {
                finding!(
                    "cpu read of {:#x}+{len:#x} differs from the shadow",
                    v.start + off
                );
            }
        }
        Ok(())
    }

    /// The kernel may read a page iff the model says it is mapped readable with a live pin.
    pub(super) fn op_probe(&mut self) -> Step {
        let Some(v) = self.pick_vma() else {
            return Ok(());
        };
        let off = self.rng.index(v.len);
        let len = 1 + self.rng.index((v.len - off).min(64));
        let want = self.accessible(&v, false);
        self.note(format!(
            "probe {:#x}+{len:#x} (expect {})",
            v.start + off,
            if want { "readable" } else { "EFAULT" }
        ));
        match self.prober.probe(v.start + off, len) {
            Ok(data) => {
                if !want {
                    finding!(
                        "kernel read {:#x} though its pin is {:?} / prot {}: the mapping was \
                         not zapped",
                        v.start + off,
                        self.pins[v.pin].state,
                        v.prot
                    );
                }
                if let Some((a, idx)) = self.shadow_of(&v, off) {
                    if data[..] != self.allocs[a].shadow[idx..idx + data.len()] {
                        finding!("probe of {:#x} differs from the shadow", v.start + off);
                    }
                }
            }
            Err(libc::EFAULT) if !want => {}
            Err(e) => finding!("probe of {:#x}: {}", v.start + off, ename(e)),
        }
        Ok(())
    }
}
