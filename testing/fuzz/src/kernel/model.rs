//! The model of what the fuzzing process did: its files, allocations, pins and VMAs, and the
//! bookkeeping that keeps it in step with the kernel (pins and files settling when mappings or
//! descriptors go, VMAs splitting where the kernel splits them).

use super::Worker;
use crate::sys;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PinState {
    /// Pinned; its mappings work.
    Live,
    /// Unpinned while mapped: the handle is gone, the pages zapped, the pin lingers until its
    /// last VMA closes.
    Zapped,
    /// Gone: pages put.
    Dead,
}

pub(super) struct File {
    pub(super) fds: Vec<i32>,
    pub(super) readable: bool,
    pub(super) writable: bool,
    pub(super) dead: bool,
    /// Lowest handle the next pin may get (handles never repeat).
    pub(super) next_handle: u64,
    /// Whether `next_handle` is exact (a pin undone by a failed copy-out consumes handles).
    pub(super) next_exact: bool,
}

pub(super) struct Alloc {
    pub(super) emu: usize,
    pub(super) va: u64,
    pub(super) size: u64,
    pub(super) page_size: u32,
    pub(super) managed: bool,
    /// Not freed (its VA resolves; the emulator can read it).
    pub(super) live: bool,
    /// What this process wrote there; compared with the emulator's READ.
    pub(super) shadow: Vec<u8>,
}

pub(super) struct Pin {
    pub(super) file: usize,
    pub(super) handle: u64,
    pub(super) alloc: usize,
    /// Pinned range (rounded) and granule, as GET_INFO reports them.
    pub(super) va: u64,
    pub(super) size: u64,
    pub(super) granule: u32,
    /// The pinned address was the rounded one: mmap accepts it.
    pub(super) mappable: bool,
    pub(super) req: u32,
    pub(super) map_type: u32,
    pub(super) state: PinState,
}

#[derive(Clone, Debug)]
pub(super) struct Vma {
    pub(super) start: usize,
    pub(super) len: usize,
    pub(super) pin: usize,
    /// Byte offset of `start` in the pin.
    pub(super) pin_off: u64,
    pub(super) prot: i32,
}

const GDR_MR_NONE_U32: u32 = 0;

impl Worker {
    pub(super) fn usable_files(&self) -> Vec<usize> {
        (0..self.files.len())
            .filter(|&f| !self.files[f].fds.is_empty())
            .collect()
    }

    pub(super) fn pick_fd(&mut self) -> Option<(usize, i32)> {
        let files = self.usable_files();
        let &f = self.rng.pick(&files)?;
        let fds = self.files[f].fds.clone();
        let &fd = self.rng.pick(&fds)?;
        Some((f, fd))
    }

    pub(super) fn live_pin(&self, file: usize, handle: u64) -> Option<usize> {
        (0..self.pins.len()).find(|&p| {
            let pin = &self.pins[p];
            pin.file == file && pin.handle == handle && pin.state == PinState::Live
        })
    }

    pub(super) fn pin_vmas(&self, pin: usize) -> usize {
        self.vmas.iter().filter(|v| v.pin == pin).count()
    }

    /// Live, pinnable allocation of this process that holds all of `[addr, addr + size)`.
    pub(super) fn alloc_holding(&self, addr: u64, size: u64) -> Option<usize> {
        let end = addr.checked_add(size)?;
        (0..self.allocs.len()).find(|&a| {
            let al = &self.allocs[a];
            al.live && addr >= al.va && end <= al.va + al.size
        })
    }

    /// Settles pins and files after mappings or descriptors went away.
    pub(super) fn settle(&mut self) {
        let mut vmas_of = vec![0usize; self.pins.len()];
        let mut file_mapped = vec![false; self.files.len()];
        for v in &self.vmas {
            vmas_of[v.pin] += 1;
            file_mapped[self.pins[v.pin].file] = true;
        }
        for (p, pin) in self.pins.iter_mut().enumerate() {
            if pin.state == PinState::Dead || vmas_of[p] > 0 {
                continue;
            }
            if pin.state == PinState::Zapped {
                pin.state = PinState::Dead;
            }
            pin.map_type = GDR_MR_NONE_U32;
        }
        let mut released = vec![false; self.files.len()];
        for (f, file) in self.files.iter_mut().enumerate() {
            if !file.dead && file.fds.is_empty() && !file_mapped[f] {
                file.dead = true;
                released[f] = true;
            }
        }
        for pin in self.pins.iter_mut().filter(|p| released[p.file]) {
            pin.state = PinState::Dead;
        }
    }

    /// Removes `[start, end)` from the modelled VMAs, splitting the ones it cuts.
    pub(super) fn unmap_model(&mut self, start: usize, end: usize) {
        let mut out = Vec::new();
        for v in self.vmas.drain(..) {
            let (vs, ve) = (v.start, v.start + v.len);
            if ve <= start || vs >= end {
                out.push(v);
                continue;
            }
            if vs < start {
                out.push(Vma {
                    len: start - vs,
                    ..v.clone()
                });
            }
            if ve > end {
                out.push(Vma {
                    start: end,
                    len: ve - end,
                    pin_off: v.pin_off + (end - vs) as u64,
                    ..v.clone()
                });
            }
        }
        self.vmas = out;
        self.settle();
    }

    pub(super) fn split_at(&mut self, addr: usize) {
        if let Some(i) = self
            .vmas
            .iter()
            .position(|v| v.start < addr && addr < v.start + v.len)
        {
            let v = self.vmas[i].clone();
            let head = addr - v.start;
            self.vmas[i].len = head;
            self.vmas.push(Vma {
                start: addr,
                len: v.len - head,
                pin_off: v.pin_off + head as u64,
                ..v
            });
        }
    }

    /// Splits the modelled VMAs in `[start, end)` where the kernel's are split.
    pub(super) fn resync_splits(&mut self, start: usize, end: usize) {
        for (s, e, _, _) in sys::device_vmas() {
            for b in [s, e] {
                if b >= start && b <= end {
                    self.split_at(b);
                }
            }
        }
    }

    pub(super) fn vma_at(&self, addr: usize) -> Option<usize> {
        self.vmas
            .iter()
            .position(|v| v.start <= addr && addr < v.start + v.len)
    }

    pub(super) fn accessible(&self, v: &Vma, write: bool) -> bool {
        // x86 has no write-only pages: PROT_WRITE alone reads too.
        let need = if write {
            libc::PROT_WRITE
        } else {
            libc::PROT_READ | libc::PROT_WRITE
        };
        v.prot & need != 0 && self.pins[v.pin].state == PinState::Live
    }

    /// Shadow index of byte `off` of VMA `v`, if its allocation is tracked.
    pub(super) fn shadow_of(&self, v: &Vma, off: usize) -> Option<(usize, usize)> {
        let pin = &self.pins[v.pin];
        let a = &self.allocs[pin.alloc];
        if !a.live {
            return None;
        }
        let idx = (pin.va - a.va) + v.pin_off + off as u64;
        Some((pin.alloc, idx as usize))
    }

    pub(super) fn rand_page_range(&mut self, v: &Vma) -> (usize, usize) {
        let pages = v.len / self.page;
        let first = self.rng.index(pages);
        let n = 1 + self.rng.index(pages - first);
        (v.start + first * self.page, n * self.page)
    }
}
