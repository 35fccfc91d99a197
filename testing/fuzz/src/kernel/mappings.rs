//! Operations on the device mappings: mmap with right and wrong offsets, lengths, protections
//! and flags, munmap, mprotect, mremap and madvise, followed in the model.

use super::{Expect, Finding, PinState, Step, Vma, Worker};
use crate::sys;

const PROTS: [i32; 3] = [
    libc::PROT_NONE,
    libc::PROT_READ,
    libc::PROT_READ | libc::PROT_WRITE,
];

impl Worker {
    pub(super) fn op_mmap(&mut self) -> Step {
        let Some((file, fd)) = self.pick_fd() else {
            return Ok(());
        };
        let target = self
            .rng
            .pick_index(self.pins.len(), |p| self.pins[p].file == file);
        let page = self.page as u64;
        let (pin_size, handle) = match target {
            Some(p) => (self.pins[p].size, self.pins[p].handle),
            None => (page * self.rng.range(1, 16), self.rng.below(64) * 16),
        };
        let off = match self.rng.weighted(&[85, 5, 3, 2, 5]) {
            0 => handle * page,
            1 => (handle + 1 + self.rng.below(4)) * page,
            2 => handle * page + 1 + self.rng.below(page - 1),
            3 => self.rng.edge_u64() & !(page - 1),
            _ => self.rng.below(1 << 20) * page,
        };
        // Offsets the mm core may refuse before the driver sees them.
        let weird_off = off / page >= 1 << 40;
        let len = match self.rng.weighted(&[60, 25, 10, 5]) {
            0 => pin_size,
            1 => page * self.rng.range(1, (pin_size / page).max(1)),
            2 => pin_size + page * self.rng.range(1, 4),
            _ => [0, 1, page - 1, page + 1][self.rng.index(4)],
        } as usize;
        let prot = match self.rng.weighted(&[75, 15, 5, 5]) {
            0 => libc::PROT_READ | libc::PROT_WRITE,
            1 => libc::PROT_READ,
            2 => libc::PROT_NONE,
            _ => libc::PROT_WRITE,
        };
        let mut flags = match self.rng.weighted(&[92, 5, 3]) {
            0 => libc::MAP_SHARED,
            1 => libc::MAP_PRIVATE,
            _ => libc::MAP_SHARED_VALIDATE,
        };
        if self.rng.chance(50) {
            flags |= libc::MAP_POPULATE;
        }
        if self.rng.chance(20) {
            flags |= libc::MAP_LOCKED;
        }
        let rounded = len.div_ceil(self.page) * self.page;
        // Sometimes at a fixed address: over a reservation of our own.
        let mut fixed_resv = None;
        if self.rng.chance(100) && rounded > 0 {
            if let Ok(r) = sys::anon(rounded, libc::PROT_NONE) {
                fixed_resv = Some(r);
                flags |= libc::MAP_FIXED;
            }
        }
        // Expected outcome, in the order the kernel checks.
        let fl = &self.files[file];
        // MAP_SHARED_VALIDATE is 3: it contains MAP_PRIVATE's bit.
        let shared = matches!(flags & 3, libc::MAP_SHARED | libc::MAP_SHARED_VALIDATE);
        let lookup = (!weird_off && off % page == 0)
            .then(|| self.live_pin(file, off / page))
            .flatten();
        let exp = if len == 0 || off % page != 0 {
            Expect::err(libc::EINVAL)
        } else if weird_off {
            // EOVERFLOW past the file size limit; below it, the access checks, then the driver.
            Expect::err(libc::EINVAL)
                .also(libc::EOVERFLOW)
                .also(libc::EACCES)
        } else if !fl.readable || (shared && prot & libc::PROT_WRITE != 0 && !fl.writable) {
            Expect::err(libc::EACCES)
        } else if !shared {
            Expect::err(libc::EINVAL)
        } else {
            match lookup {
                None => Expect::err(libc::EINVAL),
                Some(p) if self.pin_vmas(p) > 0 => Expect::err(libc::EBUSY),
                Some(p) if !self.pins[p].mappable => Expect::err(libc::EINVAL),
                Some(p) if rounded as u64 > self.pins[p].size => Expect::err(libc::EINVAL),
                Some(p) => {
                    let mut e = Expect::ok();
                    if self.alias_conflict(p) {
                        e = e.also(libc::EINVAL).also(libc::EAGAIN).also(libc::EBUSY);
                    }
                    if prot == libc::PROT_NONE {
                        // x86's L1TF guard may refuse PROT_NONE PFN mappings of high addresses.
                        e = e.also(libc::EACCES);
                    }
                    e
                }
            }
        };
        let addr = fixed_resv.unwrap_or(0);
        self.note(format!(
            "mmap fd {fd} off {off:#x} len {len:#x} prot {prot} flags {flags:#x} at {addr:#x}"
        ));
        let r = sys::mmap(addr, len, prot, flags, fd, off);
        if r.is_err() {
            if let Some(resv) = fixed_resv {
                let _ = sys::munmap(resv, rounded);
            }
        }
        self.check("mmap", &exp, r.map(drop))?;
        let Ok(start) = r else { return Ok(()) };
        let Some(p) = lookup else {
            finding!("mmap at offset {off:#x} succeeded without a pin");
        };
        if fixed_resv.is_some_and(|a| a != start) {
            finding!("MAP_FIXED mmap moved");
        }
        // The type the pages really got (issue 30, item 19).
        self.pins[p].map_type = match self.predicted_map_type(p) {
            Some(t) => t,
            None => self.observed_map_type(fd, self.pins[p].handle)?,
        };
        self.vmas.push(Vma {
            start,
            len: rounded,
            pin: p,
            pin_off: 0,
            prot,
        });
        Ok(())
    }

    /// Whether another mapped pin shares physical memory with pin `p` (x86 refuses aliases
    /// with another memory type, so mmap may fail or the type may be adjusted).
    fn alias_conflict(&self, p: usize) -> bool {
        let pin = &self.pins[p];
        (0..self.pins.len()).any(|q| {
            let o = &self.pins[q];
            q != p
                && o.state != PinState::Dead
                && o.alloc == pin.alloc
                && self.pin_vmas(q) > 0
                && o.va < pin.va + pin.size
                && pin.va < o.va + o.size
        })
    }

    pub(super) fn pick_vma(&mut self) -> Option<Vma> {
        let n = self.vmas.len();
        if n == 0 {
            return None;
        }
        Some(self.vmas[self.rng.index(n)].clone())
    }

    pub(super) fn op_munmap(&mut self) -> Step {
        let Some(v) = self.pick_vma() else {
            return Ok(());
        };
        let (start, len) = if self.rng.chance(500) {
            (v.start, v.len)
        } else {
            self.rand_page_range(&v)
        };
        self.note(format!(
            "munmap {start:#x}+{len:#x} of vma {:#x}+{:#x}",
            v.start, v.len
        ));
        let r = sys::munmap(start, len);
        self.check("munmap", &Expect::ok(), r)?;
        self.unmap_model(start, start + len);
        Ok(())
    }

    pub(super) fn op_mprotect(&mut self) -> Step {
        let Some(v) = self.pick_vma() else {
            return Ok(());
        };
        let (start, len) = self.rand_page_range(&v);
        let prot = PROTS[self.rng.index(3)];
        let fl = &self.files[self.pins[v.pin].file];
        let exp = if prot & libc::PROT_WRITE != 0 && !fl.writable {
            Expect::err(libc::EACCES)
        } else if prot == libc::PROT_NONE && v.prot != prot {
            Expect::ok().also(libc::EACCES)
        } else {
            Expect::ok()
        };
        self.note(format!("mprotect {start:#x}+{len:#x} {prot}"));
        let r = sys::mprotect(start, len, prot);
        self.check("mprotect", &exp, r)?;
        if r.is_ok() && prot != v.prot {
            self.split_at(start);
            self.split_at(start + len);
            for w in self.vmas.iter_mut() {
                if w.start >= start && w.start < start + len {
                    w.prot = prot;
                }
            }
        }
        Ok(())
    }

    pub(super) fn op_mremap(&mut self) -> Step {
        let Some(v) = self.pick_vma() else {
            return Ok(());
        };
        let (old, old_len) = self.rand_page_range(&v);
        let page = self.page;
        match self.rng.weighted(&[35, 15, 35, 8, 7]) {
            0 => {
                // Shrink in place.
                if old_len == page {
                    return Ok(());
                }
                let new_len = page * self.rng.range(1, (old_len / page - 1) as u64) as usize;
                self.note(format!(
                    "mremap shrink {old:#x}+{old_len:#x} -> {new_len:#x}"
                ));
                let r = sys::mremap(old, old_len, new_len, 0, 0);
                self.check("mremap shrink", &Expect::ok(), r.map(drop))?;
                if r != Ok(old) {
                    finding!("mremap shrink moved the mapping");
                }
                self.unmap_model(old + new_len, old + old_len);
            }
            1 => {
                // Grow: refused (VM_DONTEXPAND).
                let new_len = old_len + page * self.rng.range(1, 4) as usize;
                let flags = if self.rng.chance(500) {
                    libc::MREMAP_MAYMOVE
                } else {
                    0
                };
                self.note(format!("mremap grow {old:#x}+{old_len:#x} -> {new_len:#x}"));
                let r = sys::mremap(old, old_len, new_len, flags, 0);
                self.check("mremap grow", &Expect::err(libc::EFAULT), r.map(drop))?;
            }
            2 => {
                // Move (all or part of a VMA) onto a reservation of ours.
                let new_len = page * self.rng.range(1, (old_len / page) as u64) as usize;
                let Ok(dest) = sys::anon(new_len, libc::PROT_NONE) else {
                    return Ok(());
                };
                self.note(format!(
                    "mremap move {old:#x}+{old_len:#x} -> {dest:#x}+{new_len:#x}"
                ));
                let r = sys::mremap(
                    old,
                    old_len,
                    new_len,
                    libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                    dest,
                );
                if r.is_err() {
                    let _ = sys::munmap(dest, new_len);
                }
                self.check("mremap move", &Expect::ok(), r.map(drop))?;
                if r != Ok(dest) {
                    finding!("mremap MREMAP_FIXED went elsewhere");
                }
                let moved = Vma {
                    start: dest,
                    len: new_len,
                    pin_off: v.pin_off + (old - v.start) as u64,
                    ..v.clone()
                };
                self.vmas.push(moved);
                self.unmap_model(old, old + old_len);
            }
            3 => {
                let Ok(dest) = sys::anon(old_len, libc::PROT_NONE) else {
                    return Ok(());
                };
                self.note(format!("mremap DONTUNMAP {old:#x}+{old_len:#x}"));
                let r = sys::mremap(
                    old,
                    old_len,
                    old_len,
                    libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP,
                    dest,
                );
                let _ = sys::munmap(dest, old_len);
                self.check("mremap DONTUNMAP", &Expect::err(libc::EINVAL), r.map(drop))?;
            }
            _ => {
                self.note(format!("mremap old_len 0 {old:#x}"));
                let r = sys::mremap(old, 0, old_len, libc::MREMAP_MAYMOVE, 0);
                self.check(
                    "mremap duplicate",
                    &Expect::err(libc::EFAULT).also(libc::EINVAL),
                    r.map(drop),
                )?;
            }
        }
        Ok(())
    }

    pub(super) fn op_madvise(&mut self) -> Step {
        let Some(v) = self.pick_vma() else {
            return Ok(());
        };
        let (start, len) = self.rand_page_range(&v);
        const ADVICE: [i32; 19] = [
            libc::MADV_NORMAL,
            libc::MADV_RANDOM,
            libc::MADV_SEQUENTIAL,
            libc::MADV_WILLNEED,
            libc::MADV_DONTNEED,
            libc::MADV_DONTFORK,
            libc::MADV_DOFORK,
            libc::MADV_DONTDUMP,
            libc::MADV_DODUMP,
            libc::MADV_MERGEABLE,
            libc::MADV_HUGEPAGE,
            libc::MADV_NOHUGEPAGE,
            20, // MADV_COLD
            21, // MADV_PAGEOUT
            libc::MADV_REMOVE,
            libc::MADV_FREE,
            libc::MADV_WIPEONFORK,
            22, // MADV_POPULATE_READ
            23, // MADV_POPULATE_WRITE
        ];
        let advice = ADVICE[self.rng.index(ADVICE.len())];
        self.note(format!("madvise {start:#x}+{len:#x} {advice}"));
        let r = sys::madvise(start, len, advice);
        let exp = Expect::ok()
            .also(libc::EINVAL)
            .also(libc::EFAULT)
            .also(libc::EPERM)
            .also(libc::EACCES)
            .also(libc::EOPNOTSUPP)
            .also(libc::ENOMEM)
            .also(libc::EAGAIN)
            .also(libc::ENODEV);
        self.check("madvise", &exp, r)?;
        // Some advice changes VMA flags and so splits the VMA: follow the kernel.
        self.resync_splits(start, start + len);
        Ok(())
    }
}
