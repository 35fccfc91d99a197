//! Operations on the emulated provider: opening and closing it, allocations, DMA reads and
//! writes, fault injection and garbage ioctls.

use mtgpu_emu_abi::*;

use super::{Alloc, Expect, Finding, Step, Worker};
use crate::emu::{Emu, Raw};
use crate::sys::{self, ename};

const MAX_EMUS: usize = 2;
const MAX_ALLOCS: usize = 6;
const MAX_ALLOC_BYTES: u64 = 12 << 20;

impl Worker {
    pub(super) fn op_emu_open(&mut self) -> Step {
        if self.emus.iter().flatten().count() >= MAX_EMUS {
            return Ok(());
        }
        self.note("open emulator".into());
        match Emu::open().raw() {
            Ok(e) => {
                self.emus.push(Some(e));
                Ok(())
            }
            Err(e) => finding!("open {}: {}", mtgpu_emu_abi::device_path(), ename(e)),
        }
    }

    pub(super) fn op_emu_close(&mut self) -> Step {
        let Some(i) = self.pick_open_emu() else {
            return Ok(());
        };
        for a in 0..self.allocs.len() {
            if self.allocs[a].emu == i && self.allocs[a].live {
                self.verify_alloc(a)?;
            }
        }
        self.note(format!("close emulator {i}"));
        self.emus[i] = None;
        for a in self.allocs.iter_mut().filter(|a| a.emu == i) {
            a.live = false;
            a.shadow = Vec::new();
        }
        Ok(())
    }

    pub(super) fn emu(&self, i: usize) -> Option<&Emu> {
        self.emus.get(i).and_then(|e| e.as_ref())
    }

    /// One of the live allocations, at random.
    fn live_alloc(&mut self) -> Option<usize> {
        self.rng
            .pick_index(self.allocs.len(), |a| self.allocs[a].live)
    }

    /// One of the open emulator descriptors, at random.
    fn pick_open_emu(&mut self) -> Option<usize> {
        self.rng
            .pick_index(self.emus.len(), |i| self.emus[i].is_some())
    }

    pub(super) fn op_alloc(&mut self) -> Step {
        let Some(ei) = self.pick_open_emu() else {
            return Ok(());
        };
        let live: Vec<&Alloc> = self.allocs.iter().filter(|a| a.live).collect();
        let bytes: u64 = live.iter().map(|a| a.size).sum();
        if live.len() >= MAX_ALLOCS {
            return Ok(());
        }
        let (page_size, npages) = match self.rng.weighted(&[40, 45, 15]) {
            0 => (MTGPU_EMU_PAGE_4K, self.rng.range(1, 64)),
            1 => (MTGPU_EMU_PAGE_64K, self.rng.range(1, 24)),
            _ => (MTGPU_EMU_PAGE_2M, 1),
        };
        let mut size = u64::from(page_size) * npages;
        if self.rng.chance(300) {
            size -= self.rng.below(u64::from(page_size));
        }
        if bytes + size > MAX_ALLOC_BYTES {
            return Ok(());
        }
        let mut flags = 0;
        if self.rng.chance(250) {
            flags |= MTGPU_EMU_ALLOC_SCATTER;
        }
        let managed = self.rng.chance(50);
        if managed {
            flags |= MTGPU_EMU_ALLOC_MANAGED;
        }
        let align = if self.rng.chance(100) {
            1 << self.rng.range(12, 22)
        } else {
            0
        };
        self.note(format!(
            "emu alloc {size:#x} page {page_size:#x} flags {flags} align {align:#x}"
        ));
        let Some(emu) = self.emu(ei) else {
            return Ok(());
        };
        let va = match emu.alloc_flags(size, align, page_size, flags).raw() {
            Ok(va) => va,
            Err(libc::ENOMEM) => return Ok(()),
            Err(e) => finding!("emu alloc: {}", ename(e)),
        };
        let rounded = size.div_ceil(u64::from(page_size)) * u64::from(page_size);
        // The emulator zeroes new memory; then the canary pattern replaces the zeros.
        let mut head = vec![0u8; (rounded as usize).min(4096)];
        if let Err(e) = emu.read(va, &mut head).raw() {
            finding!("emu read of a new allocation: {}", ename(e));
        }
        if head.iter().any(|&b| b != 0) {
            finding!("new allocation {va:#x} is not zeroed");
        }
        let mut shadow = vec![0u8; rounded as usize];
        self.rng.fill(&mut shadow);
        let Some(emu) = self.emu(ei) else {
            return Ok(());
        };
        if let Err(e) = emu.write(va, &shadow).raw() {
            finding!("emu write of the canary: {}", ename(e));
        }
        self.allocs.push(Alloc {
            emu: ei,
            va,
            size: rounded,
            page_size,
            managed,
            live: true,
            shadow,
        });
        Ok(())
    }

    pub(super) fn free_alloc(&mut self, a: usize) -> Step {
        self.verify_alloc(a)?;
        let (ei, va) = (self.allocs[a].emu, self.allocs[a].va);
        self.note(format!("emu free {va:#x}"));
        let Some(emu) = self.emu(ei) else {
            return Ok(());
        };
        let r = emu.free(va).raw();
        self.check("emu free", &Expect::ok(), r)?;
        self.allocs[a].live = false;
        self.allocs[a].shadow = Vec::new();
        Ok(())
    }

    pub(super) fn op_free(&mut self) -> Step {
        let Some(a) = self.live_alloc() else {
            return Ok(());
        };
        if self.rng.chance(100) {
            let (ei, va) = (self.allocs[a].emu, self.allocs[a].va + 4096);
            self.note(format!("emu free of a non-start {va:#x}"));
            let Some(emu) = self.emu(ei) else {
                return Ok(());
            };
            let r = emu.free(va).raw();
            return self.check(
                "emu free inside an allocation",
                &Expect::err(libc::EINVAL),
                r,
            );
        }
        self.free_alloc(a)
    }

    pub(super) fn op_emu_rw(&mut self) -> Step {
        let Some(a) = self.live_alloc() else {
            return Ok(());
        };
        if self.rng.chance(100) {
            return self.verify_alloc(a);
        }
        let size = self.allocs[a].size;
        let off = self.rng.below(size);
        let len = 1 + self.rng.below((size - off).min(8192));
        let (ei, va) = (self.allocs[a].emu, self.allocs[a].va);
        let (o, l) = (off as usize, len as usize);
        if self.rng.chance(500) {
            let mut data = vec![0u8; l];
            self.rng.fill(&mut data);
            self.note(format!("emu write {:#x}+{len:#x}", va + off));
            let Some(emu) = self.emu(ei) else {
                return Ok(());
            };
            let r = emu.write(va + off, &data).raw();
            self.check("emu write", &Expect::ok(), r)?;
            self.allocs[a].shadow[o..o + l].copy_from_slice(&data);
        } else {
            let mut data = vec![0u8; l];
            self.note(format!("emu read {:#x}+{len:#x}", va + off));
            let Some(emu) = self.emu(ei) else {
                return Ok(());
            };
            let r = emu.read(va + off, &mut data).raw();
            self.check("emu read", &Expect::ok(), r)?;
            if data != self.allocs[a].shadow[o..o + l] {
                finding!(
                    "emu read of {:#x}+{len:#x} differs from what this process wrote",
                    va + off
                );
            }
        }
        Ok(())
    }

    pub(super) fn op_inject(&mut self) -> Step {
        let Some(ei) = self.pick_open_emu() else {
            return Ok(());
        };
        let kind = self.rng.below(u64::from(MTGPU_EMU_FAULT_MAX) + 3) as u32;
        let count = self.rng.range(0, 3) as u32;
        self.note(format!("inject fault kind {kind} count {count}"));
        let Some(emu) = self.emu(ei) else {
            return Ok(());
        };
        let r = emu.inject_fault_raw(kind, count).raw();
        let exp = if kind > MTGPU_EMU_FAULT_MAX {
            Expect::err(libc::EINVAL)
        } else {
            Expect::ok()
        };
        self.check("inject fault", &exp, r)?;
        if kind != 0 && count != 0 {
            self.faults_possible = true;
        }
        Ok(())
    }

    pub(super) fn op_emu_garbage(&mut self) -> Step {
        let Some(ei) = self.pick_open_emu() else {
            return Ok(());
        };
        let (cmd, exp) = match self.rng.below(4) {
            0 => {
                // An unknown command of the emulator's magic.
                let nr = self.rng.range(8, 255) as u32;
                (
                    (self.rng.below(4) as u32) << 30 | 8 << 16 | MTGPU_EMU_IOCTL << 8 | nr,
                    Expect::err(libc::ENOTTY),
                )
            }
            1 => (MTGPU_EMU_IOC_GET_STATS, Expect::err(libc::EFAULT)),
            2 => (MTGPU_EMU_IOC_ALLOC, Expect::err(libc::EFAULT)),
            _ => (MTGPU_EMU_IOC_READ, Expect::err(libc::EFAULT)),
        };
        let arg = if self.rng.chance(500) {
            0
        } else {
            self.scratch.none()
        };
        self.note(format!("emu garbage ioctl {cmd:#x} arg {arg:#x}"));
        let Some(emu) = self.emu(ei) else {
            return Ok(());
        };
        let r = sys::ioctl(emu.fd(), cmd, arg);
        self.check("emu garbage ioctl", &exp, r)
    }
}
