//! The emulator allocations the API calls pin: allocation with a random shadow, the check of
//! every live allocation against its shadow, and free.

use crate::emu::Raw;
use mtgpu_emu_abi::{MTGPU_EMU_PAGE_4K, MTGPU_EMU_PAGE_64K};

use super::{Alloc, ApiFuzzer, Finding, Step};
use crate::sys::ename;

impl ApiFuzzer {
    pub(super) fn op_alloc(&mut self) -> Step {
        if self.allocs.iter().filter(|a| a.live).count() >= 4 {
            return Ok(());
        }
        let (ps, n) = if self.rng.chance(500) {
            (MTGPU_EMU_PAGE_4K, self.rng.range(1, 48))
        } else {
            (MTGPU_EMU_PAGE_64K, self.rng.range(1, 16))
        };
        let size = u64::from(ps) * n;
        self.note(format!("emu alloc {size:#x} page {ps:#x}"));
        let va = match self.emu.alloc_flags(size, 0, ps, 0).raw() {
            Ok(va) => va,
            Err(libc::ENOMEM) => return Ok(()),
            Err(e) => finding!("emu alloc: {}", ename(e)),
        };
        let mut shadow = vec![0u8; size as usize];
        self.rng.fill(&mut shadow);
        if let Err(e) = self.emu.write(va, &shadow).raw() {
            finding!("emu write: {}", ename(e));
        }
        self.allocs.push(Alloc {
            va,
            size,
            live: true,
            shadow,
        });
        Ok(())
    }

    pub(super) fn verify(&mut self) -> Step {
        for a in self.allocs.iter().filter(|a| a.live) {
            let mut buf = vec![0u8; a.size as usize];
            if let Err(e) = self.emu.read(a.va, &mut buf).raw() {
                finding!("emu read: {}", ename(e));
            }
            if let Some(i) = (0..buf.len()).find(|&i| buf[i] != a.shadow[i]) {
                finding!(
                    "allocation {:#x} byte {i:#x} is {:#04x}, expected {:#04x}",
                    a.va,
                    buf[i],
                    a.shadow[i]
                );
            }
        }
        Ok(())
    }

    pub(super) fn op_free(&mut self) -> Step {
        let Some(a) = self.live_alloc() else {
            return Ok(());
        };
        self.verify()?;
        self.note(format!("emu free {:#x}", self.allocs[a].va));
        if let Err(e) = self.emu.free(self.allocs[a].va).raw() {
            finding!("emu free: {}", ename(e));
        }
        self.allocs[a].live = false;
        self.allocs[a].shadow = Vec::new();
        Ok(())
    }
}
