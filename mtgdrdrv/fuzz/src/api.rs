//! The C API fuzzer: seeded random sequences of every gdrapi.h call with hostile arguments (NULL
//! pointers, size 0, sizes that overflow, unaligned pins, wrong, stale and foreign handles,
//! double unpin and unmap, bad flags and attributes), against the real device, checked against a
//! model: each call must return exactly the documented result, and after every call the module's
//! counters must show exactly the pins and mappings the model holds (so a failed call left
//! nothing pinned or mapped). Runs alone: the counters are system-wide.

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use gdrapi::capi::*;
use mtgdrdrv::emu::{MTGPU_EMU_PAGE_4K, MTGPU_EMU_PAGE_64K};

use crate::emu::Emu;
use crate::rng::Rng;
use crate::sys::{self, ename};

const K64: u64 = 0x10000;
const MAX_PIN: u64 = 1 << 40;

struct Alloc {
    va: u64,
    size: u64,
    live: bool,
    shadow: Vec<u8>,
}

struct Mh {
    g: usize,
    h: gdr_mh_t,
    alloc: usize,
    va: u64,
    size: u64,
    granule: u32,
    mappable: bool,
    /// (address, length, mapping type) of the live mapping.
    map: Option<(usize, usize, c_int)>,
    live: bool,
}

pub struct ApiFuzzer {
    rng: Rng,
    seed: u64,
    page: usize,
    emu: Emu,
    gs: Vec<gdr_t>,
    allocs: Vec<Alloc>,
    mhs: Vec<Mh>,
    ops: u64,
    budget: u64,
    shared_ops: &'static AtomicU64,
    log: VecDeque<String>,
    verbose: bool,
}

struct Finding(String);
type Step = Result<(), Finding>;

macro_rules! finding {
    ($($t:tt)*) => { return Err(Finding(format!($($t)*))) };
}

fn rc_name(rc: c_int) -> String {
    if rc == 0 {
        "0".into()
    } else {
        format!("{} ({rc})", ename(rc))
    }
}

impl ApiFuzzer {
    pub fn new(
        seed: u64,
        budget: u64,
        shared_ops: &'static AtomicU64,
        verbose: bool,
    ) -> anyhow::Result<Self> {
        let emu = Emu::open().map_err(|e| anyhow::anyhow!("open emulator: {}", ename(e)))?;
        Ok(ApiFuzzer {
            rng: Rng::new(seed),
            seed,
            page: sys::page_size(),
            emu,
            gs: Vec::new(),
            allocs: Vec::new(),
            mhs: Vec::new(),
            ops: 0,
            budget,
            shared_ops,
            log: VecDeque::new(),
            verbose,
        })
    }

    fn note(&mut self, s: String) {
        if self.verbose {
            eprintln!("[api] #{} {s}", self.ops);
        }
        if self.log.len() == 48 {
            self.log.pop_front();
        }
        self.log.push_back(format!("#{} {s}", self.ops));
    }

    fn expect(&self, what: &str, rc: c_int, want: &[c_int]) -> Step {
        if want.contains(&rc) {
            Ok(())
        } else {
            let w: Vec<String> = want.iter().map(|&r| rc_name(r)).collect();
            finding!(
                "{what} returned {}, documented: {}",
                rc_name(rc),
                w.join(" or ")
            )
        }
    }

    pub fn run(&mut self) -> Result<(), String> {
        let r = (|| -> Step {
            while self.ops < self.budget {
                self.ops += 1;
                self.shared_ops.fetch_add(1, Ordering::Relaxed);
                self.step()?;
                self.check_counters()?;
            }
            // Close everything: nothing may stay pinned or mapped.
            self.verify()?;
            for i in 0..self.gs.len() {
                if !self.gs[i].is_null() {
                    self.close(i)?;
                }
            }
            self.check_counters()
        })();
        r.map_err(|Finding(m)| {
            let mut s = format!(
                "FINDING in api (seed {:#x}) at op #{}: {m}\nlast operations:\n",
                self.seed, self.ops
            );
            for l in &self.log {
                let _ = writeln!(s, "  {l}");
            }
            s
        })
    }

    fn step(&mut self) -> Step {
        match self
            .rng
            .weighted(&[5, 3, 6, 3, 25, 15, 20, 15, 15, 15, 12, 8, 3])
        {
            0 => self.op_open(),
            1 => {
                let i = self.pick_g();
                match i {
                    Some(i) => self.close(i),
                    None => {
                        self.note("gdr_close(NULL)".into());
                        // SAFETY: NULL is documented to fail with EINVAL.
                        let rc = unsafe { gdr_close(std::ptr::null_mut()) };
                        self.expect("gdr_close(NULL)", rc, &[libc::EINVAL])
                    }
                }
            }
            2 => self.op_alloc(),
            3 => self.op_free(),
            4 => self.op_pin(),
            5 => self.op_unpin(),
            6 => self.op_map(),
            7 => self.op_unmap(),
            8 => self.op_info(),
            9 => self.op_copy(true),
            10 => self.op_copy(false),
            11 => self.op_misc(),
            _ => self.verify(),
        }
    }

    fn pick_g(&mut self) -> Option<usize> {
        let live: Vec<usize> = (0..self.gs.len())
            .filter(|&i| !self.gs[i].is_null())
            .collect();
        self.rng.pick(&live).copied()
    }

    /// A live gdr_t index, or None standing for a NULL gdr_t (rarely).
    fn pick_g_or_null(&mut self) -> Option<usize> {
        if self.rng.chance(30) {
            None
        } else {
            self.pick_g()
        }
    }

    fn g_ptr(&self, g: Option<usize>) -> gdr_t {
        g.map_or(std::ptr::null_mut(), |i| self.gs[i])
    }

    fn op_open(&mut self) -> Step {
        if self.gs.iter().filter(|g| !g.is_null()).count() >= 3 {
            return Ok(());
        }
        self.note("gdr_open".into());
        let g = gdr_open();
        if g.is_null() {
            finding!("gdr_open failed: {}", ename(sys::errno()));
        }
        self.gs.push(g);
        Ok(())
    }

    fn close(&mut self, i: usize) -> Step {
        self.note(format!("gdr_close(g{i})"));
        // SAFETY: a live gdr_t of ours, never used again.
        let rc = unsafe { gdr_close(self.gs[i]) };
        self.gs[i] = std::ptr::null_mut();
        for m in self.mhs.iter_mut().filter(|m| m.g == i) {
            m.live = false;
            m.map = None;
        }
        self.expect("gdr_close", rc, &[0])
    }

    fn op_alloc(&mut self) -> Step {
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
        let va = match self.emu.alloc(size, 0, ps, 0) {
            Ok(va) => va,
            Err(libc::ENOMEM) => return Ok(()),
            Err(e) => finding!("emu alloc: {}", ename(e)),
        };
        let mut shadow = vec![0u8; size as usize];
        self.rng.fill(&mut shadow);
        if let Err(e) = self.emu.write(va, &shadow) {
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

    fn verify(&mut self) -> Step {
        for a in self.allocs.iter().filter(|a| a.live) {
            let mut buf = vec![0u8; a.size as usize];
            if let Err(e) = self.emu.read(a.va, &mut buf) {
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

    fn op_free(&mut self) -> Step {
        let live: Vec<usize> = (0..self.allocs.len())
            .filter(|&a| self.allocs[a].live)
            .collect();
        let Some(&a) = self.rng.pick(&live) else {
            return Ok(());
        };
        self.verify()?;
        self.note(format!("emu free {:#x}", self.allocs[a].va));
        if let Err(e) = self.emu.free(self.allocs[a].va) {
            finding!("emu free: {}", ename(e));
        }
        self.allocs[a].live = false;
        self.allocs[a].shadow = Vec::new();
        Ok(())
    }

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

    fn op_pin(&mut self) -> Step {
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
        let out: *mut gdr_mh_t = if null_out {
            std::ptr::null_mut()
        } else {
            &mut mh
        };
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
        let want = if g.is_none() || null_out || bad_flags || outcome.is_none() {
            libc::EINVAL
        } else {
            0
        };
        self.expect("gdr_pin_buffer", rc, &[want])?;
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
    fn pick_mh(&mut self, g: Option<usize>) -> (gdr_mh_t, Option<usize>) {
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

    fn op_unpin(&mut self) -> Step {
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

    fn op_map(&mut self) -> Step {
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
        let out: *mut *mut c_void = if null_out {
            std::ptr::null_mut()
        } else {
            &mut va
        };
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
            if va.is_null() || (va as usize) % page != 0 {
                finding!("gdr_map returned {va:p}");
            }
            let len = size.div_ceil(page) * page;
            let t = if flags == 3 { 3 } else { 1 };
            self.mhs[i].map = Some((va as usize, len, t));
        }
        Ok(())
    }

    fn op_unmap(&mut self) -> Step {
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

    fn op_info(&mut self) -> Step {
        let g = self.pick_g_or_null();
        let (h, mine) = self.pick_mh(g);
        let null_out = self.rng.chance(50);
        let which = self.rng.below(3);
        self.note(format!(
            "info {which} (g{g:?}, {:#x}, null {null_out})",
            h.h
        ));
        let want = if g.is_some() && mine.is_some() && !null_out {
            0
        } else {
            libc::EINVAL
        };
        let gp = self.g_ptr(g);
        match which {
            0 => {
                let mut info = gdr_info_v2::default();
                let out: *mut gdr_info_v2 = if null_out {
                    std::ptr::null_mut()
                } else {
                    &mut info
                };
                // SAFETY: NULL or a live gdr_t; `out` NULL or writable.
                let rc = unsafe { gdr_get_info_v2(gp, h, out) };
                self.expect("gdr_get_info_v2", rc, &[want])?;
                if rc == 0 {
                    self.check_info(
                        mine,
                        info.va,
                        info.mapped_size,
                        info.page_size,
                        info.flags,
                        Some(info.mapping_type),
                    )?;
                }
            }
            1 => {
                let mut info = gdr_info_v1::default();
                let out: *mut gdr_info_v1 = if null_out {
                    std::ptr::null_mut()
                } else {
                    &mut info
                };
                // SAFETY: as above.
                let rc = unsafe { gdr_get_info_v1(gp, h, out) };
                self.expect("gdr_get_info", rc, &[want])?;
                if rc == 0 {
                    self.check_info(
                        mine,
                        info.va,
                        info.mapped_size,
                        info.page_size,
                        info.flags,
                        None,
                    )?;
                }
            }
            _ => {
                let mut flag: c_int = 5;
                let out: *mut c_int = if null_out {
                    std::ptr::null_mut()
                } else {
                    &mut flag
                };
                // SAFETY: as above.
                let rc = unsafe { gdr_get_callback_flag(gp, h, out) };
                self.expect("gdr_get_callback_flag", rc, &[want])?;
                if rc == 0 && flag != 0 {
                    finding!("callback flag {flag}");
                }
            }
        }
        Ok(())
    }

    fn check_info(
        &self,
        mine: Option<usize>,
        va: u64,
        size: u64,
        page: u32,
        flags: u32,
        t: Option<c_int>,
    ) -> Step {
        let Some(i) = mine else { return Ok(()) };
        let m = &self.mhs[i];
        let mt = m.map.map_or(0, |(_, _, t)| t);
        let want_flags = u32::from(mt != 0) | u32::from(mt == 1) << 1;
        if (va, size, page, flags & 3) != (m.va, m.size, m.granule, want_flags)
            || t.is_some_and(|t| t != mt)
        {
            finding!(
                "info: va {va:#x} size {size:#x} page {page:#x} flags {flags:#x} type {t:?}, \
                 expected {:#x} {:#x} {:#x} {want_flags:#x} {mt}",
                m.va,
                m.size,
                m.granule
            );
        }
        Ok(())
    }

    fn op_copy(&mut self, to: bool) -> Step {
        let mapped: Vec<usize> = (0..self.mhs.len())
            .filter(|&i| self.mhs[i].map.is_some())
            .collect();
        let pick = self.rng.pick(&mapped).copied();
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

    fn op_misc(&mut self) -> Step {
        let g = self.pick_g_or_null();
        let gp = self.g_ptr(g);
        match self.rng.below(4) {
            0 => {
                let attr = if self.rng.chance(700) {
                    self.rng.range(0, 4) as c_int
                } else {
                    self.rng.edge_u64() as c_int
                };
                let null = self.rng.chance(100);
                let mut v: c_int = 9;
                let out: *mut c_int = if null { std::ptr::null_mut() } else { &mut v };
                self.note(format!("gdr_get_attribute(g{g:?}, {attr}, null {null})"));
                // SAFETY: NULL or a live gdr_t; `out` NULL or writable.
                let rc = unsafe { gdr_get_attribute(gp, attr, out) };
                let want = if g.is_none() || null || !(1..=3).contains(&attr) {
                    libc::EINVAL
                } else {
                    0
                };
                self.expect("gdr_get_attribute", rc, &[want])?;
                if rc == 0 && v != c_int::from(attr == 1) {
                    finding!("attribute {attr} = {v}");
                }
            }
            1 => {
                let (mut ma, mut mi) = (-1, -1);
                let nulls = self.rng.below(4);
                let pa: *mut c_int = if nulls & 1 != 0 {
                    std::ptr::null_mut()
                } else {
                    &mut ma
                };
                let pb: *mut c_int = if nulls & 2 != 0 {
                    std::ptr::null_mut()
                } else {
                    &mut mi
                };
                self.note(format!("gdr_driver_get_version(g{g:?}, nulls {nulls})"));
                // SAFETY: NULL or a live gdr_t; pointers NULL or writable.
                let rc = unsafe { gdr_driver_get_version(gp, pa, pb) };
                let want = if g.is_none() || nulls != 0 {
                    libc::EINVAL
                } else {
                    0
                };
                self.expect("gdr_driver_get_version", rc, &[want])?;
                if rc == 0 && (ma, mi) != (0, 1) {
                    finding!("driver version {ma}.{mi}");
                }
                // SAFETY: NULLs are allowed.
                unsafe { gdr_runtime_get_version(pa, std::ptr::null_mut()) };
            }
            _ => {
                let t = if self.rng.chance(700) {
                    self.rng.range(0, 4) as c_int
                } else {
                    self.rng.edge_u64() as c_int
                };
                let null = self.rng.chance(100);
                let mut s: *const c_char = std::ptr::null();
                let out: *mut *const c_char = if null { std::ptr::null_mut() } else { &mut s };
                self.note(format!("gdr_get_mapping_type_string({t}, null {null})"));
                // SAFETY: `out` NULL or writable.
                let rc = unsafe { gdr_get_mapping_type_string(t, out) };
                let want = if null || !(0..=3).contains(&t) {
                    libc::EINVAL
                } else {
                    0
                };
                self.expect("gdr_get_mapping_type_string", rc, &[want])?;
                if rc == 0 && s.is_null() {
                    finding!("NULL mapping type string");
                }
            }
        }
        Ok(())
    }

    /// The module holds exactly the model's pins and mappings: a failed call left nothing.
    fn check_counters(&self) -> Step {
        let pins = self.mhs.iter().filter(|m| m.live).count() as i64;
        let c =
            sys::module_counters_settled(pins).map_err(|e| Finding(format!("counters: {e}")))?;
        let maps = self
            .mhs
            .iter()
            .filter(|m| m.live && m.map.is_some())
            .count() as i64;
        if (c.pins_outstanding, c.mappings) != (pins, maps) {
            finding!("module counters {c:?}, model: {pins} pins, {maps} mappings");
        }
        Ok(())
    }
}
