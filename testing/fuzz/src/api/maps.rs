//! gdr_map(_v2), gdr_unmap and gdr_copy_to/from_mapping with hostile arguments, the copies
//! checked against the allocations' shadows.

use std::ffi::{c_int, c_void};

use gdrapi::capi::*;

use super::{out_ptr, ApiFuzzer, Finding, Step};

impl ApiFuzzer {
    fn alias_conflict(&self, i: usize) -> bool {
        let m = &self.mhs[i];
        self.mhs.iter().enumerate().any(|(j, o)| {
            j != i
                && o.live
                && o.alloc == m.alloc
                && o.map.is_some()
                && o.va < m.va + m.size
                && m.va < o.va + o.size
        })
    }

    pub(super) fn op_map(&mut self) -> Step {
        let g = self.pick_g_or_null();
        let (h, mine) = self.pick_mh(g);
        let v2 = self.rng.chance(600);
        let flags: c_int = if !v2 {
            0
        } else if self.rng.chance(900) {
            self.rng.below(4) as c_int
        } else {
            self.rng.edge_u64() as c_int
        };
        let msize = mine.map_or(65536, |i| self.mhs[i].size) as usize;
        let size = match self.rng.weighted(&[60, 20, 8, 6, 6]) {
            0 => msize,
            1 => 1 + self.rng.index(msize),
            2 => 0,
            3 => msize + 1 + self.rng.index(self.page * 4),
            _ => usize::MAX - self.rng.index(self.page),
        };
        let null_out = self.rng.chance(30);
        let mut va: *mut c_void = std::ptr::null_mut();
        let out = out_ptr(&mut va, null_out);
        self.note(format!(
            "gdr_map{}(g{g:?}, {:#x}, size {size:#x}, flags {flags}, out null {null_out})",
            if v2 { "_v2" } else { "" },
            h.h
        ));
        // SAFETY: NULL or a live gdr_t; `out` is NULL or points to `va`.
        let rc = unsafe {
            if v2 {
                gdr_map_v2(self.g_ptr(g), h, out, size, flags)
            } else {
                gdr_map(self.g_ptr(g), h, out, size)
            }
        };
        let page = self.page;
        let want: Vec<c_int> = if g.is_none() || null_out || !(0..=3).contains(&flags) {
            vec![libc::EINVAL]
        } else if let Some(i) = mine {
            let m = &self.mhs[i];
            let len = size.checked_add(page - 1).map(|s| s & !(page - 1));
            if m.map.is_some() {
                vec![libc::EAGAIN]
            } else if flags == 2 {
                vec![libc::EOPNOTSUPP]
            } else if len.is_none_or(|l| l == 0 || l as u64 > m.size) || !m.mappable {
                vec![libc::EINVAL]
            } else if self.alias_conflict(i) {
                vec![0, libc::EINVAL, libc::EAGAIN, libc::EBUSY]
            } else {
                vec![0]
            }
        } else {
            vec![libc::EINVAL]
        };
        self.expect("gdr_map", rc, &want)?;
        if rc == 0 {
            let Some(i) = mine else {
                finding!("gdr_map succeeded on a handle not of this gdr_t")
            };
            if va.is_null() || !(va as usize).is_multiple_of(page) {
                finding!("gdr_map returned {va:p}");
            }
            let len = size.div_ceil(page) * page;
            let t = if flags == 3 { 3 } else { 1 };
            self.mhs[i].map = Some((va as usize, len, t));
        }
        Ok(())
    }

    pub(super) fn op_unmap(&mut self) -> Step {
        let g = self.pick_g_or_null();
        let (h, mine) = self.pick_mh(g);
        let map = mine.and_then(|i| self.mhs[i].map);
        let page = self.page;
        let (ptr, len) = map.map_or((0x7000_0000usize, 65536usize), |(p, l, _)| (p, l));
        let (va, size) = match self.rng.weighted(&[70, 10, 10, 10]) {
            0 => (ptr, len - self.rng.index(page)),
            1 => (ptr + page, len),
            2 => (ptr, len + page),
            _ => (ptr, 0),
        };
        self.note(format!("gdr_unmap(g{g:?}, {:#x}, {va:#x}, {size:#x})", h.h));
        // SAFETY: NULL or a live gdr_t; no access through the mapping follows if it goes.
        let rc = unsafe { gdr_unmap(self.g_ptr(g), h, va as *mut c_void, size) };
        let rounded = size.div_ceil(page) * page;
        let want = if g.is_some() && map.is_some() && va == ptr && rounded == len {
            0
        } else {
            libc::EINVAL
        };
        self.expect("gdr_unmap", rc, &[want])?;
        if let (0, Some(i)) = (rc, mine) {
            self.mhs[i].map = None;
        }
        Ok(())
    }

    pub(super) fn op_copy(&mut self, to: bool) -> Step {
        let pick = self
            .rng
            .pick_index(self.mhs.len(), |i| self.mhs[i].map.is_some());
        let (h, map) = match pick {
            Some(i) if self.rng.chance(850) => (self.mhs[i].h, self.mhs[i].map),
            _ => {
                let g = self.pick_g();
                let (h, i) = self.pick_mh(g);
                (h, i.and_then(|i| self.mhs[i].map))
            }
        };
        let (base, len) = map.map_or((0x7000_0000usize, 65536usize), |(p, l, _)| (p, l));
        let (off, size) = match self.rng.weighted(&[80, 6, 6, 4, 4]) {
            0 => {
                let off = self.rng.index(len);
                (off as isize, 1 + self.rng.index((len - off).min(4096)))
            }
            1 => (self.rng.index(len) as isize, 0),
            2 => ((len - self.rng.index(8)) as isize, 16),
            3 => (-(1 + self.rng.index(64) as isize), 8),
            _ => (
                self.rng.index(len) as isize,
                usize::MAX - self.rng.index(64),
            ),
        };
        let null_host = self.rng.chance(20);
        let dptr = base.wrapping_add_signed(off);
        let mut host = vec![0u8; size.min(4096)];
        self.rng.fill(&mut host);
        let hptr: *mut u8 = if null_host {
            std::ptr::null_mut()
        } else {
            host.as_mut_ptr()
        };
        self.note(format!(
            "gdr_copy_{}_mapping({:#x}, {dptr:#x}, {size:#x}, null host {null_host})",
            if to { "to" } else { "from" },
            h.h
        ));
        let inside =
            map.is_some() && off >= 0 && (off as usize).checked_add(size).is_some_and(|e| e <= len);
        let want = if size == 0 {
            0
        } else if null_host || !inside {
            libc::EINVAL
        } else {
            0
        };
        // A copy the library would perform must have a host buffer that large.
        if want == 0 && size > host.len() {
            return Ok(());
        }
        // SAFETY: the host buffer holds `size` bytes whenever the library may copy (checked
        // just above); the device range is validated by the library (that is the test).
        let rc = unsafe {
            if to {
                gdr_copy_to_mapping(h, dptr as *mut c_void, hptr as *const c_void, size)
            } else {
                gdr_copy_from_mapping(h, hptr as *mut c_void, dptr as *const c_void, size)
            }
        };
        self.expect("gdr_copy", rc, &[want])?;
        if rc != 0 || size == 0 {
            return Ok(());
        }
        let Some(i) = (0..self.mhs.len()).find(|&i| self.mhs[i].h == h && self.mhs[i].live) else {
            return Ok(());
        };
        let m = &self.mhs[i];
        let a = m.alloc;
        if !self.allocs[a].live {
            return Ok(());
        }
        let idx = (m.va - self.allocs[a].va) as usize + off as usize;
        if to {
            self.allocs[a].shadow[idx..idx + size].copy_from_slice(&host[..size]);
        } else if host[..size] != self.allocs[a].shadow[idx..idx + size] {
            finding!("gdr_copy_from_mapping read other bytes than the shadow");
        }
        Ok(())
    }
}
