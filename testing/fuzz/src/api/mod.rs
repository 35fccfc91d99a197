//! The C API fuzzer: seeded random sequences of every gdrapi.h call with hostile arguments (NULL
//! pointers, size 0, sizes that overflow, unaligned pins, wrong, stale and foreign handles,
//! double unpin and unmap, bad flags and attributes), against the real device, checked against a
//! model: each call must return exactly the documented result, and after every call the module's
//! counters must show exactly the pins and mappings the model holds (so a failed call left
//! nothing pinned or mapped). Runs alone: the counters are system-wide.
//!
//! This file holds the model (allocations, handles and their mappings), the run loop, the
//! report and the counters check; the calls by what they exercise are in `allocs` (the
//! emulator allocations behind the pins), `pins`, `maps` (map, unmap, copy) and `queries`
//! (info, callback flag, attributes, versions, mapping type strings).

use std::collections::VecDeque;
use std::ffi::c_int;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use gdrapi::capi::*;

use crate::emu::{Emu, Raw};
use crate::rng::Rng;
use crate::sys::{self, ename};

struct Finding(String);
type Step = Result<(), Finding>;

macro_rules! finding {
    ($($t:tt)*) => { return Err(Finding(format!($($t)*))) };
}

mod allocs;
mod maps;
mod pins;
mod queries;

/// An emulator allocation of the model, with the shadow of what was written there.
struct Alloc {
    va: u64,
    size: u64,
    live: bool,
    shadow: Vec<u8>,
}

/// A handle of the model: its gdr_t, the pin it stands for and its mapping.
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
        let emu = Emu::open()
            .raw()
            .map_err(|e| anyhow::anyhow!("open emulator: {}", ename(e)))?;
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

    /// One of the live allocations, at random.
    fn live_alloc(&mut self) -> Option<usize> {
        self.rng
            .pick_index(self.allocs.len(), |a| self.allocs[a].live)
    }

    fn pick_g(&mut self) -> Option<usize> {
        self.rng
            .pick_index(self.gs.len(), |i| !self.gs[i].is_null())
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

/// An out-parameter for a call under test: `value`'s address, or NULL when the fuzzer passes
/// none.
fn out_ptr<T>(value: &mut T, null: bool) -> *mut T {
    if null {
        std::ptr::null_mut()
    } else {
        value
    }
}
