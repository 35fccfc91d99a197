//! The kernel-level fuzzer: one process issuing random and boundary sequences of open/close/dup,
//! all nine ioctls (valid, garbage, truncated, read-only and unmapped argument buffers, unknown
//! commands), mmap/munmap/mremap/mprotect/madvise, CPU reads and writes through the mappings,
//! fork and exit at random points, against /dev/mtgdrdrv and the emulated provider, with the
//! provider's fault injection switched on at random.
//!
//! It keeps a model of what it did (files, allocations, pins, VMAs) and checks every result
//! against it: each call must return exactly what the model predicts, /proc/self/maps must show
//! the VMAs it predicts, a page must be readable by the kernel iff the model says it is mapped and
//! its pin is live, and every allocation's contents (read back through the emulator's own DMA
//! path) must equal a shadow copy of what this process wrote there, through its mappings or the
//! emulator: a byte that changed otherwise was written by someone who had no mapping of it.
//! In `exact` mode (one fuzzing process system-wide) the module's and the emulator's global
//! counters must equal the model's counts too.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use mtgdrdrv::emu::*;

/// mtgdrdrv asks mtgpu for a pin in chunks of this much GPU VA, aligned to it.
const PIN_CHUNK: u64 = 8 << 20;
use mtgdrdrv::*;

use crate::emu::{bytes_of, Emu};
use crate::rng::Rng;
use crate::sys::{self, ename, Errno};

const DEV: &str = "/dev/mtgdrdrv";
const K64: u64 = 0x10000;
const MAX_PIN: u64 = 1 << 40;
const MAX_FILES: usize = 4;
const MAX_EMUS: usize = 2;
const MAX_ALLOCS: usize = 6;
const MAX_ALLOC_BYTES: u64 = 12 << 20;
const PROTS: [i32; 3] = [
    libc::PROT_NONE,
    libc::PROT_READ,
    libc::PROT_READ | libc::PROT_WRITE,
];

/// Knobs of one fuzzing process.
#[derive(Clone, Debug)]
pub struct Config {
    pub name: String,
    pub seed: u64,
    pub ops: u64,
    /// Inject provider faults at random.
    pub faults: bool,
    /// Nothing else pins or maps system-wide: global counters must match the model.
    pub exact: bool,
    /// Allocations the driver process holds in the emulator (sentinels).
    pub foreign_allocs: u64,
    /// Fork children at random.
    pub fork: bool,
    pub verbose: bool,
    /// File that receives every operation before it runs, so a death by signal can be told.
    pub trace: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PinState {
    /// Pinned; its mappings work.
    Live,
    /// Unpinned while mapped: the handle is gone, the pages zapped, the pin lingers until its
    /// last VMA closes.
    Zapped,
    /// Gone: pages put.
    Dead,
}

struct File {
    fds: Vec<i32>,
    readable: bool,
    writable: bool,
    dead: bool,
    /// Lowest handle the next pin may get (handles never repeat).
    next_handle: u64,
    /// Whether `next_handle` is exact (a pin undone by a failed copy-out consumes handles).
    next_exact: bool,
}

struct Alloc {
    emu: usize,
    va: u64,
    size: u64,
    page_size: u32,
    managed: bool,
    /// Not freed (its VA resolves; the emulator can read it).
    live: bool,
    /// What this process wrote there; compared with the emulator's READ.
    shadow: Vec<u8>,
}

struct Pin {
    file: usize,
    handle: u64,
    alloc: usize,
    /// Pinned range (rounded) and granule, as GET_INFO reports them.
    va: u64,
    size: u64,
    granule: u32,
    /// The pinned address was the rounded one: mmap accepts it.
    mappable: bool,
    req: u32,
    map_type: u32,
    state: PinState,
}

#[derive(Clone, Debug)]
struct Vma {
    start: usize,
    len: usize,
    pin: usize,
    /// Byte offset of `start` in the pin.
    pin_off: u64,
    prot: i32,
}

/// Where an ioctl's argument points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arg {
    Good,
    ReadOnly,
    /// The struct runs into a PROT_NONE page after `k` bytes.
    Truncated(usize),
    Null,
    ProtNone,
    Kernel,
    NonCanonical,
    /// Inside one of our live, writable device mappings.
    DevLive(usize),
    /// Inside a mapping whose pin was unpinned (zapped): faults.
    DevZapped(usize),
}

/// Fields of a structured ioctl.
#[derive(Clone, Copy, Debug, Default)]
struct Fields {
    addr: u64,
    size: u64,
    token: u64,
    va_space: u32,
    flags: u32,
    handle: u64,
    attr: u32,
    mtype: u32,
}

/// The scratch pages ioctl arguments live in: [RW][RO][RW][NONE].
struct Scratch {
    base: usize,
    page: usize,
}

impl Scratch {
    fn new(page: usize) -> anyhow::Result<Scratch> {
        let base = sys::anon(4 * page, libc::PROT_READ | libc::PROT_WRITE)
            .map_err(|e| anyhow::anyhow!("scratch mmap: {}", ename(e)))?;
        let s = Scratch { base, page };
        sys::mprotect(base + page, page, libc::PROT_READ).map_err(|e| anyhow::anyhow!("{e}"))?;
        sys::mprotect(base + 3 * page, page, libc::PROT_NONE)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(s)
    }
    fn good(&self) -> usize {
        self.base
    }
    fn ro(&self) -> usize {
        self.base + self.page
    }
    fn before_guard(&self) -> usize {
        self.base + 3 * self.page
    }
    fn none(&self) -> usize {
        self.base + 3 * self.page
    }
    /// Writes `bytes` at `addr` (inside the scratch pages, made writable for the moment).
    fn put(&self, addr: usize, bytes: &[u8]) {
        let ro = self.ro();
        let in_ro = addr >= ro && addr < ro + self.page;
        if in_ro {
            let _ = sys::mprotect(ro, self.page, libc::PROT_READ | libc::PROT_WRITE);
        }
        // SAFETY: `addr .. addr + len` lies in the scratch pages, writable now.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
        if in_ro {
            let _ = sys::mprotect(ro, self.page, libc::PROT_READ);
        }
    }
    fn get(&self, addr: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        // SAFETY: `addr .. addr + len` lies in the readable scratch pages.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, v.as_mut_ptr(), len) };
        v
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = sys::munmap(self.base, 4 * self.page);
    }
}

/// An expected result: success and/or a set of errnos.
#[derive(Clone, Debug)]
struct Expect {
    ok: bool,
    errs: Vec<Errno>,
}

impl Expect {
    fn ok() -> Expect {
        Expect {
            ok: true,
            errs: Vec::new(),
        }
    }
    fn err(e: Errno) -> Expect {
        Expect {
            ok: false,
            errs: vec![e],
        }
    }
    fn also(mut self, e: Errno) -> Expect {
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

pub struct Worker {
    cfg: Config,
    rng: Rng,
    page: usize,
    files: Vec<File>,
    emus: Vec<Option<Emu>>,
    allocs: Vec<Alloc>,
    pins: Vec<Pin>,
    vmas: Vec<Vma>,
    scratch: Scratch,
    prober: sys::Prober,
    ops: u64,
    shared_ops: &'static AtomicU64,
    log: VecDeque<String>,
    /// Set when some other process may have an injected fault pending.
    faults_possible: bool,
    in_child: bool,
    trace_fd: i32,
}

/// A model violation: printed with the recent operations, then the process fails.
pub struct Finding(pub String);

type Step = Result<(), Finding>;

macro_rules! finding {
    ($($t:tt)*) => { return Err(Finding(format!($($t)*))) };
}

impl Worker {
    pub fn new(cfg: Config, shared_ops: &'static AtomicU64) -> anyhow::Result<Worker> {
        let page = sys::page_size();
        let trace_fd = cfg.trace.as_deref().map_or(-1, |path| {
            sys::open(
                path,
                libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_APPEND | libc::O_CLOEXEC,
            )
            .unwrap_or(-1)
        });
        Ok(Worker {
            trace_fd,
            rng: Rng::new(cfg.seed),
            faults_possible: cfg.faults || !cfg.exact,
            cfg,
            page,
            files: Vec::new(),
            emus: Vec::new(),
            allocs: Vec::new(),
            pins: Vec::new(),
            vmas: Vec::new(),
            scratch: Scratch::new(page)?,
            prober: sys::Prober::new().map_err(|e| anyhow::anyhow!("pipe: {}", ename(e)))?,
            ops: 0,
            shared_ops,
            log: VecDeque::new(),
            in_child: false,
        })
    }

    fn note(&mut self, what: String) {
        if self.cfg.verbose {
            eprintln!("[{}] #{} {what}", self.cfg.name, self.ops);
        }
        if self.log.len() == 48 {
            self.log.pop_front();
        }
        let line = format!("#{} {what}", self.ops);
        sys::append(self.trace_fd, &line);
        self.log.push_back(line);
    }

    fn check(&self, what: &str, exp: &Expect, got: Result<(), Errno>) -> Step {
        if exp.matches(got) {
            return Ok(());
        }
        let got = match got {
            Ok(()) => "OK".to_string(),
            Err(e) => format!("{} ({e})", ename(e)),
        };
        finding!("{what}: got {got}, expected {}", exp.describe())
    }

    /// Runs `cfg.ops` operations, then the final checks; returns the findings report, if any.
    pub fn run(&mut self) -> Result<(), String> {
        let result = self.run_inner();
        match result {
            Ok(()) => Ok(()),
            Err(Finding(msg)) => {
                let mut report = format!(
                    "FINDING in {} (seed {:#x}) at op #{}: {msg}\nlast operations:\n",
                    self.cfg.name, self.cfg.seed, self.ops
                );
                for l in &self.log {
                    let _ = writeln!(report, "  {l}");
                }
                Err(report)
            }
        }
    }

    fn run_inner(&mut self) -> Step {
        // Start with something to work on.
        self.op_open_dev()?;
        self.op_emu_open()?;
        while self.ops < self.cfg.ops {
            self.step()?;
        }
        self.verify_all()?;
        self.check_maps()?;
        if self.cfg.exact {
            self.check_counters()?;
        }
        Ok(())
    }

    /// Tears everything down the careful way; `exact` workers then see the counters at their
    /// baseline.
    pub fn teardown(&mut self) -> Result<(), String> {
        let r = (|| -> Step {
            self.verify_all()?;
            while let Some(v) = self.vmas.first().cloned() {
                self.note(format!("teardown munmap {:#x}+{:#x}", v.start, v.len));
                sys::munmap(v.start, v.len)
                    .map_err(|e| Finding(format!("munmap: {}", ename(e))))?;
                self.unmap_model(v.start, v.start + v.len);
            }
            for i in 0..self.pins.len() {
                if self.pins[i].state == PinState::Live {
                    let (f, h) = (self.pins[i].file, self.pins[i].handle);
                    if let Some(&fd) = self.files[f].fds.first() {
                        let r = unpin_raw(fd, h);
                        self.check("teardown unpin", &Expect::ok(), r)?;
                        self.pins[i].state = PinState::Dead;
                    }
                }
            }
            for f in 0..self.files.len() {
                for fd in std::mem::take(&mut self.files[f].fds) {
                    sys::close(fd);
                }
            }
            self.settle();
            for a in 0..self.allocs.len() {
                if self.allocs[a].live {
                    self.free_alloc(a)?;
                }
            }
            self.emus.clear();
            if self.cfg.exact {
                self.check_counters()?;
            }
            Ok(())
        })();
        r.map_err(|Finding(m)| format!("FINDING in {} teardown: {m}", self.cfg.name))
    }

    fn step(&mut self) -> Step {
        self.ops += 1;
        self.shared_ops.fetch_add(1, Ordering::Relaxed);
        let fork = if self.cfg.fork && !self.in_child {
            3
        } else {
            0
        };
        let faults = if self.cfg.faults { 6 } else { 0 };
        let exact = if self.cfg.exact { 4 } else { 0 };
        let weights = [
            12, 6, 4, 4, 2, 25, 8, 25, 55, 30, 110, 30, 55, 25, 18, 18, 6, 50, 35, 25, fork,
            faults, 4, exact, 4, 10,
        ];
        match self.rng.weighted(&weights) {
            0 => self.op_open_dev(),
            1 => self.op_close_fd(),
            2 => self.op_dup(),
            3 => self.op_emu_open(),
            4 => self.op_emu_close(),
            5 => self.op_alloc(),
            6 => self.op_free(),
            7 => self.op_emu_rw(),
            8 => self.op_pin(),
            9 => self.op_unpin(),
            10 => self.op_ioctl(),
            11 => self.op_ioctl_garbage(),
            12 => self.op_mmap(),
            13 => self.op_munmap(),
            14 => self.op_mprotect(),
            15 => self.op_mremap(),
            16 => self.op_madvise(),
            17 => self.op_write(),
            18 => self.op_read(),
            19 => self.op_probe(),
            20 => self.op_fork(),
            21 => self.op_inject(),
            22 => self.check_maps(),
            23 => self.check_counters(),
            24 => self.op_emu_garbage(),
            _ => self.op_fd_misc(),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Model helpers

    fn usable_files(&self) -> Vec<usize> {
        (0..self.files.len())
            .filter(|&f| !self.files[f].fds.is_empty())
            .collect()
    }

    fn pick_fd(&mut self) -> Option<(usize, i32)> {
        let files = self.usable_files();
        let &f = self.rng.pick(&files)?;
        let fds = self.files[f].fds.clone();
        let &fd = self.rng.pick(&fds)?;
        Some((f, fd))
    }

    fn live_pin(&self, file: usize, handle: u64) -> Option<usize> {
        (0..self.pins.len()).find(|&p| {
            let pin = &self.pins[p];
            pin.file == file && pin.handle == handle && pin.state == PinState::Live
        })
    }

    fn pin_vmas(&self, pin: usize) -> usize {
        self.vmas.iter().filter(|v| v.pin == pin).count()
    }

    /// Live, pinnable allocation of this process that holds all of `[addr, addr + size)`.
    fn alloc_holding(&self, addr: u64, size: u64) -> Option<usize> {
        let end = addr.checked_add(size)?;
        (0..self.allocs.len()).find(|&a| {
            let al = &self.allocs[a];
            al.live && addr >= al.va && end <= al.va + al.size
        })
    }

    /// Settles pins and files after mappings or descriptors went away.
    fn settle(&mut self) {
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
    fn unmap_model(&mut self, start: usize, end: usize) {
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

    fn split_at(&mut self, addr: usize) {
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
    fn resync_splits(&mut self, start: usize, end: usize) {
        for (s, e, _, _) in sys::device_vmas() {
            for b in [s, e] {
                if b >= start && b <= end {
                    self.split_at(b);
                }
            }
        }
    }

    fn vma_at(&self, addr: usize) -> Option<usize> {
        self.vmas
            .iter()
            .position(|v| v.start <= addr && addr < v.start + v.len)
    }

    fn accessible(&self, v: &Vma, write: bool) -> bool {
        // x86 has no write-only pages: PROT_WRITE alone reads too.
        let need = if write {
            libc::PROT_WRITE
        } else {
            libc::PROT_READ | libc::PROT_WRITE
        };
        v.prot & need != 0 && self.pins[v.pin].state == PinState::Live
    }

    /// Shadow index of byte `off` of VMA `v`, if its allocation is tracked.
    fn shadow_of(&self, v: &Vma, off: usize) -> Option<(usize, usize)> {
        let pin = &self.pins[v.pin];
        let a = &self.allocs[pin.alloc];
        if !a.live {
            return None;
        }
        let idx = (pin.va - a.va) + v.pin_off + off as u64;
        Some((pin.alloc, idx as usize))
    }

    fn rand_page_range(&mut self, v: &Vma) -> (usize, usize) {
        let pages = v.len / self.page;
        let first = self.rng.index(pages);
        let n = 1 + self.rng.index(pages - first);
        (v.start + first * self.page, n * self.page)
    }

    // -----------------------------------------------------------------------------------------
    // Files

    fn op_open_dev(&mut self) -> Step {
        if self.usable_files().len() >= MAX_FILES {
            return Ok(());
        }
        let (mode, readable, writable) = match self.rng.weighted(&[85, 10, 5]) {
            0 => (libc::O_RDWR, true, true),
            1 => (libc::O_RDONLY, true, false),
            _ => (libc::O_WRONLY, false, true),
        };
        self.note(format!("open {DEV} mode {mode}"));
        match sys::open(DEV, mode | libc::O_CLOEXEC) {
            Ok(fd) => {
                self.files.push(File {
                    fds: vec![fd],
                    readable,
                    writable,
                    dead: false,
                    next_handle: 0,
                    next_exact: true,
                });
                Ok(())
            }
            Err(e) => finding!("open {DEV}: {}", ename(e)),
        }
    }

    fn op_close_fd(&mut self) -> Step {
        let Some((f, fd)) = self.pick_fd() else {
            return Ok(());
        };
        self.note(format!(
            "close fd {fd} (file {f}, {} vmas)",
            self.vmas.len()
        ));
        sys::close(fd);
        self.files[f].fds.retain(|&x| x != fd);
        self.settle();
        Ok(())
    }

    fn op_dup(&mut self) -> Step {
        let Some((f, fd)) = self.pick_fd() else {
            return Ok(());
        };
        if self.files[f].fds.len() >= 3 {
            return Ok(());
        }
        self.note(format!("dup fd {fd}"));
        match sys::dup(fd) {
            Ok(n) => {
                self.files[f].fds.push(n);
                Ok(())
            }
            Err(e) => finding!("dup: {}", ename(e)),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Emulator: allocations, DMA reads and writes, faults

    fn op_emu_open(&mut self) -> Step {
        if self.emus.iter().flatten().count() >= MAX_EMUS {
            return Ok(());
        }
        self.note("open emulator".into());
        match Emu::open() {
            Ok(e) => {
                self.emus.push(Some(e));
                Ok(())
            }
            Err(e) => finding!("open {}: {}", crate::emu::PATH, ename(e)),
        }
    }

    fn op_emu_close(&mut self) -> Step {
        let open: Vec<usize> = (0..self.emus.len())
            .filter(|&i| self.emus[i].is_some())
            .collect();
        let Some(&i) = self.rng.pick(&open) else {
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

    fn emu(&self, i: usize) -> Option<&Emu> {
        self.emus.get(i).and_then(|e| e.as_ref())
    }

    fn op_alloc(&mut self) -> Step {
        let open: Vec<usize> = (0..self.emus.len())
            .filter(|&i| self.emus[i].is_some())
            .collect();
        let Some(&ei) = self.rng.pick(&open) else {
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
        let va = match emu.alloc(size, align, page_size, flags) {
            Ok(va) => va,
            Err(libc::ENOMEM) => return Ok(()),
            Err(e) => finding!("emu alloc: {}", ename(e)),
        };
        let rounded = size.div_ceil(u64::from(page_size)) * u64::from(page_size);
        // The emulator zeroes new memory; then the canary pattern replaces the zeros.
        let mut head = vec![0u8; (rounded as usize).min(4096)];
        if let Err(e) = emu.read(va, &mut head) {
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
        if let Err(e) = emu.write(va, &shadow) {
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

    /// Reads allocation `a` through the emulator and compares it with the shadow.
    fn verify_alloc(&mut self, a: usize) -> Step {
        let (ei, va, size) = (self.allocs[a].emu, self.allocs[a].va, self.allocs[a].size);
        let Some(emu) = self.emu(ei) else {
            return Ok(());
        };
        let mut buf = vec![0u8; size as usize];
        if let Err(e) = emu.read(va, &mut buf) {
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

    fn verify_all(&mut self) -> Step {
        for a in 0..self.allocs.len() {
            if self.allocs[a].live {
                self.verify_alloc(a)?;
            }
        }
        Ok(())
    }

    fn free_alloc(&mut self, a: usize) -> Step {
        self.verify_alloc(a)?;
        let (ei, va) = (self.allocs[a].emu, self.allocs[a].va);
        self.note(format!("emu free {va:#x}"));
        let Some(emu) = self.emu(ei) else {
            return Ok(());
        };
        let r = emu.free(va);
        self.check("emu free", &Expect::ok(), r)?;
        self.allocs[a].live = false;
        self.allocs[a].shadow = Vec::new();
        Ok(())
    }

    fn op_free(&mut self) -> Step {
        let live: Vec<usize> = (0..self.allocs.len())
            .filter(|&a| self.allocs[a].live)
            .collect();
        let Some(&a) = self.rng.pick(&live) else {
            return Ok(());
        };
        if self.rng.chance(100) {
            let (ei, va) = (self.allocs[a].emu, self.allocs[a].va + 4096);
            self.note(format!("emu free of a non-start {va:#x}"));
            let Some(emu) = self.emu(ei) else {
                return Ok(());
            };
            let r = emu.free(va);
            return self.check(
                "emu free inside an allocation",
                &Expect::err(libc::EINVAL),
                r,
            );
        }
        self.free_alloc(a)
    }

    fn op_emu_rw(&mut self) -> Step {
        let live: Vec<usize> = (0..self.allocs.len())
            .filter(|&a| self.allocs[a].live)
            .collect();
        let Some(&a) = self.rng.pick(&live) else {
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
            let r = emu.write(va + off, &data);
            self.check("emu write", &Expect::ok(), r)?;
            self.allocs[a].shadow[o..o + l].copy_from_slice(&data);
        } else {
            let mut data = vec![0u8; l];
            self.note(format!("emu read {:#x}+{len:#x}", va + off));
            let Some(emu) = self.emu(ei) else {
                return Ok(());
            };
            let r = emu.read(va + off, &mut data);
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

    fn op_inject(&mut self) -> Step {
        let open: Vec<usize> = (0..self.emus.len())
            .filter(|&i| self.emus[i].is_some())
            .collect();
        let Some(&ei) = self.rng.pick(&open) else {
            return Ok(());
        };
        let kind = self.rng.below(u64::from(MTGPU_EMU_FAULT_MAX) + 3) as u32;
        let count = self.rng.range(0, 3) as u32;
        self.note(format!("inject fault kind {kind} count {count}"));
        let Some(emu) = self.emu(ei) else {
            return Ok(());
        };
        let r = emu.inject(kind, count);
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

    fn op_emu_garbage(&mut self) -> Step {
        let open: Vec<usize> = (0..self.emus.len())
            .filter(|&i| self.emus[i].is_some())
            .collect();
        let Some(&ei) = self.rng.pick(&open) else {
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
        let r = sys::ioctl(emu.fd, cmd, arg);
        self.check("emu garbage ioctl", &exp, r)
    }

    // -----------------------------------------------------------------------------------------
    // Pins

    /// A pin request: mostly inside an allocation, sometimes off its edges or absurd.
    fn pin_range(&mut self) -> (u64, u64) {
        let Some(a) = self
            .rng
            .pick(&(0..self.allocs.len()).collect::<Vec<_>>())
            .copied()
        else {
            return (self.rng.edge_u64(), self.rng.edge_u64());
        };
        let (va, size) = (self.allocs[a].va, self.allocs[a].size);
        let gran = if self.allocs[a].page_size >= 65536 {
            K64
        } else {
            4096
        };
        match self.rng.weighted(&[30, 30, 25, 15]) {
            0 => (va, size),
            1 => {
                let units = size / gran;
                if units == 0 {
                    return (va, size);
                }
                let first = self.rng.below(units);
                let n = 1 + self.rng.below(units - first);
                (va + first * gran, n * gran)
            }
            2 => {
                let off = self.rng.below(size);
                (va + off, 1 + self.rng.below(size - off))
            }
            _ => match self.rng.below(8) {
                0 => (0, size),
                1 => (va, 0),
                2 => (va, size + 1),
                3 => (va.wrapping_sub(4096), 8192),
                4 => (va, u64::MAX),
                5 => (u64::MAX - 4095, 8192),
                6 => (va, MAX_PIN + 1),
                _ => (self.rng.edge_u64(), self.rng.edge_u64()),
            },
        }
    }

    /// Result of a pin of `[addr, addr+size)` on file `f`, were its argument readable and
    /// writable: Ok((alloc, rounded va, rounded size, granule)) or the errno.
    fn pin_outcome(&self, f: &Fields, v2: bool) -> Result<(usize, u64, u64, u32), Vec<Errno>> {
        if v2 && f.flags != 0 || !v2 && (f.token != 0 || f.va_space != 0) {
            return Err(vec![libc::EINVAL]);
        }
        if f.addr == 0 || f.size == 0 || f.size > MAX_PIN || f.addr.checked_add(f.size).is_none() {
            return Err(vec![libc::EINVAL]);
        }
        // From here on the provider decides: an injected ENOMEM comes before its checks. The
        // module asks for 8 MiB chunks in turn, so a pin the provider refuses in a later chunk
        // may first get an earlier chunk's table with an injected bad version (EPROTO).
        let refused = if self.faults_possible {
            vec![libc::EINVAL, libc::ENOMEM, libc::EPROTO]
        } else {
            vec![libc::EINVAL]
        };
        let Some(a) = self.alloc_holding(f.addr, f.size) else {
            return Err(refused);
        };
        if self.allocs[a].managed {
            return Err(refused);
        }
        // Pins are rounded to the host page, whatever the allocation's page size.
        let end = f.addr + f.size;
        let (s, e) = (f.addr & !4095, end.div_ceil(4096) * 4096);
        Ok((a, s, e - s, 4096))
    }

    /// Errnos a pin that should succeed may show when faults may be pending.
    fn fault_errs(&self) -> Vec<Errno> {
        if self.faults_possible {
            vec![libc::ENOMEM, libc::EINVAL, libc::EPROTO]
        } else {
            Vec::new()
        }
    }

    /// Records a successful pin and checks what GET_INFO says about it.
    fn record_pin(&mut self, file: usize, fd: i32, f: &Fields, handle: u64, v2: bool) -> Step {
        let Ok((alloc, va, size, granule)) = self.pin_outcome(f, v2) else {
            finding!(
                "pin {:#x}+{:#x} succeeded, the model says it must fail",
                f.addr,
                f.size
            );
        };
        let fl = &self.files[file];
        if handle < fl.next_handle || (fl.next_exact && handle != fl.next_handle) {
            finding!(
                "pin got handle {handle:#x}, expected {}{:#x}",
                if fl.next_exact { "" } else { ">= " },
                fl.next_handle
            );
        }
        let mut info = GDRDRV_IOC_GET_INFO_V2_PARAMS {
            handle,
            ..Default::default()
        };
        let r = sys::ioctl(fd, GDRDRV_IOC_GET_INFO_V2, &mut info as *mut _ as usize);
        self.check("GET_INFO_V2 of a new pin", &Expect::ok(), r)?;
        if (info.va, info.mapped_size, info.page_size, info.mapping_type) != (va, size, granule, 0)
        {
            finding!(
                "GET_INFO_V2 of pin {:#x}+{:#x}: va {:#x} size {:#x} page {:#x} type {}, \
                 expected {va:#x} {size:#x} {granule:#x} 0",
                f.addr,
                f.size,
                info.va,
                info.mapped_size,
                info.page_size,
                info.mapping_type
            );
        }
        let fl = &mut self.files[file];
        fl.next_handle = handle + (size / self.page as u64).max(1);
        fl.next_exact = true;
        self.pins.push(Pin {
            file,
            handle,
            alloc,
            va,
            size,
            granule,
            mappable: f.addr == va,
            req: 0,
            map_type: 0,
            state: PinState::Live,
        });
        Ok(())
    }

    fn op_pin(&mut self) -> Step {
        let Some((file, fd)) = self.pick_fd() else {
            return Ok(());
        };
        let (addr, size) = self.pin_range();
        let v2 = self.rng.chance(700);
        let mut f = Fields {
            addr,
            size,
            ..Default::default()
        };
        if self.rng.chance(40) {
            if v2 {
                f.flags = self.rng.next_u64() as u32 | 1;
            } else {
                f.token = self.rng.edge_u64() | 1;
                f.va_space = self.rng.next_u64() as u32;
            }
        }
        self.do_ioctl(
            file,
            fd,
            if v2 {
                GDRDRV_IOC_PIN_BUFFER_V2
            } else {
                GDRDRV_IOC_PIN_BUFFER
            },
            f,
            Arg::Good,
        )
    }

    fn pick_handle(&mut self, file: usize) -> u64 {
        let own: Vec<u64> = self
            .pins
            .iter()
            .filter(|p| p.file == file)
            .map(|p| p.handle)
            .collect();
        let live: Vec<u64> = self
            .pins
            .iter()
            .filter(|p| p.file == file && p.state == PinState::Live)
            .map(|p| p.handle)
            .collect();
        match self.rng.weighted(&[70, 10, 10, 10]) {
            0 if !live.is_empty() => live[self.rng.index(live.len())],
            1 if !own.is_empty() => own[self.rng.index(own.len())],
            2 => self.rng.below(64) * 16,
            _ => self.rng.edge_u64(),
        }
    }

    fn op_unpin(&mut self) -> Step {
        let Some((file, fd)) = self.pick_fd() else {
            return Ok(());
        };
        let handle = self.pick_handle(file);
        self.do_ioctl(
            file,
            fd,
            GDRDRV_IOC_UNPIN_BUFFER,
            Fields {
                handle,
                ..Default::default()
            },
            Arg::Good,
        )
    }

    fn pick_arg(&mut self) -> Arg {
        match self.rng.weighted(&[70, 8, 6, 3, 3, 2, 2, 4, 2]) {
            0 => Arg::Good,
            1 => Arg::ReadOnly,
            2 => Arg::Truncated(self.rng.range(1, 7) as usize),
            3 => Arg::Null,
            4 => Arg::ProtNone,
            5 => Arg::Kernel,
            6 => Arg::NonCanonical,
            7 => {
                let live: Vec<usize> = (0..self.vmas.len())
                    .filter(|&i| self.accessible(&self.vmas[i], true) && self.vmas[i].len >= 64)
                    .collect();
                match self.rng.pick(&live) {
                    Some(&i) => {
                        let v = &self.vmas[i];
                        let off = (self.rng.below((v.len - 64) as u64) as usize) & !7;
                        Arg::DevLive(v.start + off)
                    }
                    None => Arg::Good,
                }
            }
            _ => {
                let zapped: Vec<usize> = (0..self.vmas.len())
                    .filter(|&i| self.pins[self.vmas[i].pin].state == PinState::Zapped)
                    .collect();
                match self.rng.pick(&zapped) {
                    Some(&i) => Arg::DevZapped(self.vmas[i].start),
                    None => Arg::Null,
                }
            }
        }
    }

    fn op_ioctl(&mut self) -> Step {
        let Some((file, fd)) = self.pick_fd() else {
            return Ok(());
        };
        let cmd = IOCTLS[self.rng.index(IOCTLS.len())].1;
        let mut f = Fields::default();
        match cmd {
            GDRDRV_IOC_PIN_BUFFER | GDRDRV_IOC_PIN_BUFFER_V2 => {
                (f.addr, f.size) = self.pin_range();
                if self.rng.chance(100) {
                    f.flags = self.rng.next_u64() as u32;
                    f.token = self.rng.edge_u64();
                    f.va_space = self.rng.next_u64() as u32;
                }
            }
            GDRDRV_IOC_GET_ATTR => {
                f.attr = if self.rng.chance(700) {
                    self.rng.range(1, 2) as u32
                } else {
                    self.rng.edge_u64() as u32
                };
            }
            GDRDRV_IOC_REQ_MAPPING_TYPE => {
                f.handle = self.pick_handle(file);
                f.mtype = if self.rng.chance(900) {
                    self.rng.below(4) as u32
                } else {
                    self.rng.edge_u64() as u32
                };
            }
            _ => f.handle = self.pick_handle(file),
        }
        let arg = self.pick_arg();
        self.do_ioctl(file, fd, cmd, f, arg)
    }

    /// The bytes of command `cmd`'s struct with fields `f`.
    fn encode(cmd: u32, f: &Fields) -> Vec<u8> {
        match cmd {
            GDRDRV_IOC_PIN_BUFFER => bytes_of(&GDRDRV_IOC_PIN_BUFFER_PARAMS {
                addr: f.addr,
                size: f.size,
                p2p_token: f.token,
                va_space: f.va_space,
                _pad: 0,
                handle: 0xdead_beef,
            }),
            GDRDRV_IOC_PIN_BUFFER_V2 => bytes_of(&GDRDRV_IOC_PIN_BUFFER_V2_PARAMS {
                addr: f.addr,
                size: f.size,
                flags: f.flags,
                pad: 0,
                handle: 0xdead_beef,
            }),
            GDRDRV_IOC_UNPIN_BUFFER => {
                bytes_of(&GDRDRV_IOC_UNPIN_BUFFER_PARAMS { handle: f.handle })
            }
            GDRDRV_IOC_GET_CB_FLAG => bytes_of(&GDRDRV_IOC_GET_CB_FLAG_PARAMS {
                handle: f.handle,
                flag: 7,
                _pad: 0,
            }),
            GDRDRV_IOC_GET_INFO => bytes_of(&GDRDRV_IOC_GET_INFO_PARAMS {
                handle: f.handle,
                ..Default::default()
            }),
            GDRDRV_IOC_GET_INFO_V2 => bytes_of(&GDRDRV_IOC_GET_INFO_V2_PARAMS {
                handle: f.handle,
                ..Default::default()
            }),
            GDRDRV_IOC_GET_ATTR => bytes_of(&GDRDRV_IOC_GET_ATTR_PARAMS {
                attr: f.attr,
                val: 77,
            }),
            GDRDRV_IOC_REQ_MAPPING_TYPE => bytes_of(&GDRDRV_IOC_REQ_MAPPING_TYPE_PARAMS {
                handle: f.handle,
                mapping_type: f.mtype,
                _pad: 0,
            }),
            _ => bytes_of(&GDRDRV_IOC_GET_VERSION_PARAMS::default()),
        }
    }

    /// Places the argument; returns its address and how to read the result back.
    fn place_arg(&mut self, arg: Arg, bytes: &[u8]) -> usize {
        match arg {
            Arg::Good => {
                let off = (self.rng.below(64) as usize) * 8;
                let addr = self.scratch.good() + off;
                self.scratch.put(addr, bytes);
                addr
            }
            Arg::ReadOnly => {
                let addr = self.scratch.ro() + (self.rng.below(64) as usize) * 8;
                self.scratch.put(addr, bytes);
                addr
            }
            Arg::Truncated(k) => {
                let k = k.min(bytes.len() - 1);
                let addr = self.scratch.before_guard() - k;
                self.scratch.put(addr, &bytes[..k]);
                addr
            }
            Arg::Null => 0,
            Arg::ProtNone => self.scratch.none() + 8,
            Arg::Kernel => 0xffff_ffff_8100_0000,
            Arg::NonCanonical => 0x0000_8000_0000_0000,
            Arg::DevLive(addr) => {
                // SAFETY: `addr .. +64` lies in a live, writable device mapping (pick_arg).
                unsafe { sys::store(addr, bytes) };
                self.sync_shadow(addr, bytes.len());
                addr
            }
            Arg::DevZapped(addr) => addr,
        }
    }

    /// After the kernel (or we) wrote `len` bytes at `addr` of a live device mapping, copies
    /// them into the shadow: writes there are legitimate.
    fn sync_shadow(&mut self, addr: usize, len: usize) {
        let Some(i) = self.vma_at(addr) else { return };
        let v = self.vmas[i].clone();
        let mut now = vec![0u8; len];
        // SAFETY: `addr .. addr + len` lies in a live, readable device mapping.
        unsafe { sys::load(&mut now, addr) };
        if let Some((a, idx)) = self.shadow_of(&v, addr - v.start) {
            self.allocs[a].shadow[idx..idx + len].copy_from_slice(&now);
        }
    }

    fn read_arg(&self, arg: Arg, addr: usize, len: usize) -> Vec<u8> {
        match arg {
            Arg::DevLive(_) => {
                let mut v = vec![0u8; len];
                // SAFETY: a live, readable device mapping (pick_arg).
                unsafe { sys::load(&mut v, addr) };
                v
            }
            _ => self.scratch.get(addr, len),
        }
    }

    /// Issues one of the nine ioctls and checks its result and effects against the model.
    fn do_ioctl(&mut self, file: usize, fd: i32, cmd: u32, f: Fields, arg: Arg) -> Step {
        let bytes = Self::encode(cmd, &f);
        let name = IOCTLS.iter().find(|c| c.1 == cmd).map_or("?", |c| c.0);
        self.note(format!("ioctl fd {fd} {name} {f:?} arg {arg:?}"));
        // The logical outcome, were the argument memory fine.
        let mut pin_ok = None;
        let logical: Result<(), Vec<Errno>> = match cmd {
            GDRDRV_IOC_PIN_BUFFER | GDRDRV_IOC_PIN_BUFFER_V2 => {
                match self.pin_outcome(&f, cmd == GDRDRV_IOC_PIN_BUFFER_V2) {
                    Ok(o) => {
                        pin_ok = Some(o);
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            GDRDRV_IOC_UNPIN_BUFFER
            | GDRDRV_IOC_GET_CB_FLAG
            | GDRDRV_IOC_GET_INFO
            | GDRDRV_IOC_GET_INFO_V2 => match self.live_pin(file, f.handle) {
                Some(_) => Ok(()),
                None => Err(vec![libc::EINVAL]),
            },
            GDRDRV_IOC_GET_ATTR => {
                if f.attr == 1 || f.attr == 2 {
                    Ok(())
                } else {
                    Err(vec![libc::EINVAL])
                }
            }
            GDRDRV_IOC_REQ_MAPPING_TYPE => {
                if f.mtype > 3 {
                    Err(vec![libc::EINVAL])
                } else {
                    match self.live_pin(file, f.handle) {
                        None => Err(vec![libc::EINVAL]),
                        Some(p) if self.pin_vmas(p) > 0 => Err(vec![libc::EBUSY]),
                        Some(_) if f.mtype == 2 => Err(vec![libc::EOPNOTSUPP]),
                        Some(_) => Ok(()),
                    }
                }
            }
            _ => Ok(()),
        };
        let copies_out = !matches!(cmd, GDRDRV_IOC_UNPIN_BUFFER | GDRDRV_IOC_REQ_MAPPING_TYPE);
        let readable_arg = matches!(arg, Arg::Good | Arg::ReadOnly | Arg::DevLive(_));
        let writable_arg = matches!(arg, Arg::Good | Arg::DevLive(_));
        let mut exp = if cmd == GDRDRV_IOC_GET_VERSION {
            if writable_arg {
                Expect::ok()
            } else {
                Expect::err(libc::EFAULT)
            }
        } else if !readable_arg {
            Expect::err(libc::EFAULT)
        } else {
            match &logical {
                Err(errs) => Expect {
                    ok: false,
                    errs: errs.clone(),
                },
                Ok(()) if copies_out && !writable_arg => Expect::err(libc::EFAULT),
                Ok(()) => Expect::ok(),
            }
        };
        let is_pin = pin_ok.is_some() && readable_arg;
        if is_pin {
            exp.errs.extend(self.fault_errs());
        }
        let addr = self.place_arg(arg, &bytes);
        let r = sys::ioctl(fd, cmd, addr);
        // Commands that copy out wrote into the mapping: legitimate writes. (UNPIN may just have
        // zapped the very mapping its argument lives in: it only reads it.)
        if let (Arg::DevLive(a), true) = (arg, copies_out) {
            self.sync_shadow(a, bytes.len());
        }
        self.check(name, &exp, r)?;
        // A pin that was made and undone (copy-out failed) consumed handles.
        if is_pin && !writable_arg {
            self.files[file].next_exact = false;
        }
        if r.is_err() {
            return Ok(());
        }
        let out = if copies_out {
            self.read_arg(arg, addr, bytes.len())
        } else {
            bytes.clone()
        };
        let u64_at = |o: usize| u64::from_ne_bytes(out[o..o + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |o: usize| u32::from_ne_bytes(out[o..o + 4].try_into().unwrap_or([0; 4]));
        match cmd {
            GDRDRV_IOC_PIN_BUFFER | GDRDRV_IOC_PIN_BUFFER_V2 => {
                let handle = if cmd == GDRDRV_IOC_PIN_BUFFER {
                    u64_at(32)
                } else {
                    u64_at(24)
                };
                self.record_pin(file, fd, &f, handle, cmd == GDRDRV_IOC_PIN_BUFFER_V2)?;
            }
            GDRDRV_IOC_UNPIN_BUFFER => {
                if let Some(p) = self.live_pin(file, f.handle) {
                    self.pins[p].state = if self.pin_vmas(p) > 0 {
                        PinState::Zapped
                    } else {
                        PinState::Dead
                    };
                }
            }
            GDRDRV_IOC_GET_CB_FLAG => {
                if u32_at(8) != 0 {
                    finding!("GET_CB_FLAG returned flag {}", u32_at(8));
                }
            }
            GDRDRV_IOC_GET_INFO | GDRDRV_IOC_GET_INFO_V2 => {
                let Some(p) = self.live_pin(file, f.handle) else {
                    return Ok(());
                };
                let pin = &self.pins[p];
                let mapped = self.pin_vmas(p) > 0;
                let want_type = if mapped { pin.map_type } else { 0 };
                let got = (u64_at(8), u64_at(16), u32_at(24));
                if got != (pin.va, pin.size, pin.granule) {
                    finding!(
                        "{name}: (va, size, page) {got:x?}, expected ({:#x}, {:#x}, {:#x})",
                        pin.va,
                        pin.size,
                        pin.granule
                    );
                }
                if cmd == GDRDRV_IOC_GET_INFO {
                    let flags = (u32_at(40), u32_at(44));
                    let want = (u32::from(mapped), u32::from(want_type == 1));
                    if flags != want {
                        finding!("GET_INFO (mapped, wc) {flags:?}, expected {want:?}");
                    }
                } else if u32_at(40) != want_type {
                    finding!(
                        "GET_INFO_V2 mapping_type {}, expected {want_type}",
                        u32_at(40)
                    );
                }
            }
            GDRDRV_IOC_GET_ATTR => {
                let want = u32::from(f.attr == 1);
                if u32_at(4) != want {
                    finding!("GET_ATTR {} = {}, expected {want}", f.attr, u32_at(4));
                }
            }
            GDRDRV_IOC_REQ_MAPPING_TYPE => {
                if let Some(p) = self.live_pin(file, f.handle) {
                    self.pins[p].req = f.mtype;
                }
            }
            _ => {
                if (u32_at(0), u32_at(4)) != (MTGDRDRV_VERSION, MINIMUM_GDR_API_VERSION) {
                    finding!("GET_VERSION {:#x} {:#x}", u32_at(0), u32_at(4));
                }
            }
        }
        Ok(())
    }

    fn op_ioctl_garbage(&mut self) -> Step {
        let Some((_, fd)) = self.pick_fd() else {
            return Ok(());
        };
        let known: Vec<u32> = IOCTLS.iter().map(|c| c.1).collect();
        let (cmd, exp) = match self.rng.below(4) {
            0 => {
                // Our magic, a number no command has.
                let nr = [0u32, 9, 10, 100, 254][self.rng.index(5)];
                let dir = self.rng.below(4) as u32;
                let size = self.rng.below(1 << 14) as u32;
                (
                    dir << 30 | size << 16 | GDRDRV_IOCTL << 8 | nr,
                    Expect::err(libc::ENOTTY),
                )
            }
            1 => {
                // A known number with another size or direction (truncated or oversized).
                let c = known[self.rng.index(known.len())];
                let size = [0u32, 1, 4, 7, 8, 16, 39, 41, 48, 4096, 16383][self.rng.index(11)];
                let dir = self.rng.below(4) as u32;
                let cmd = dir << 30 | size << 16 | (c & 0xffff);
                let exp = if known.contains(&cmd) {
                    return Ok(());
                } else {
                    Expect::err(libc::ENOTTY)
                };
                (cmd, exp)
            }
            2 => {
                // Another magic: refused before anything else. Magics the VFS or the block
                // layer handle themselves (FIO*, FS_IOC_*, FIFREEZE, FICLONE, FIBMAP) are left out.
                let magic = loop {
                    let m = self.rng.below(256) as u32;
                    if ![0x00, 0x12, 0x15, 0x54, 0x58, 0x66, 0x94, GDRDRV_IOCTL].contains(&m) {
                        break m;
                    }
                };
                let cmd = (self.rng.next_u64() as u32 & 0xffff_00ff) | magic << 8;
                (cmd, Expect::err(libc::EINVAL))
            }
            _ => {
                // A known command with a random argument address.
                let c = known[self.rng.index(known.len())];
                (
                    c,
                    Expect::err(libc::EFAULT)
                        .also(libc::EINVAL)
                        .also(libc::ENOTTY),
                )
            }
        };
        let arg = match self.rng.below(4) {
            0 => self.scratch.good(),
            1 => 0,
            2 => self.scratch.none(),
            _ => self.rng.edge_u64() as usize | 0xffff_0000_0000_0000,
        };
        self.note(format!(
            "garbage ioctl fd {fd} cmd {cmd:#010x} arg {arg:#x}"
        ));
        if arg == self.scratch.good() {
            let mut junk = vec![0u8; 48];
            self.rng.fill(&mut junk);
            // Garbage that cannot be a live handle of ours: handles are small.
            junk[7] |= 0x80;
            junk[15] |= 0x80;
            self.scratch.put(arg, &junk);
        }
        let r = sys::ioctl(fd, cmd, arg);
        let exp = if exp.errs.contains(&libc::EFAULT) && r.is_ok() {
            // GET_VERSION / GET_ATTR with a valid attr may legitimately succeed on good memory.
            Expect::ok().also(libc::EFAULT)
        } else {
            exp
        };
        self.check("garbage ioctl", &exp, r)
    }

    /// File system calls the module does not implement, through the VFS paths that see its
    /// private address space (read, write, seek, fsync, fadvise, fallocate, readahead, poll):
    /// any clean error, never a kernel problem.
    fn op_fd_misc(&mut self) -> Step {
        let Some((_, fd)) = self.pick_fd() else {
            return Ok(());
        };
        let buf = self.scratch.good();
        let which = self.rng.below(10);
        let len = self.rng.below(2 * self.page as u64) as usize;
        let off = self.rng.edge_u64() as i64 & i64::MAX;
        self.note(format!("fd misc {which} fd {fd} len {len:#x} off {off:#x}"));
        // SAFETY: each call reads or writes at most `len` bytes of the scratch pages (2 pages
        // writable from `buf`), or none; the rest only take numbers.
        let r = unsafe {
            match which {
                0 => libc::read(fd, buf as *mut libc::c_void, len.min(self.page)) as i64,
                1 => libc::write(fd, buf as *const libc::c_void, len.min(self.page)) as i64,
                2 => libc::lseek(fd, off, (self.rng.below(5)) as i32),
                3 => i64::from(libc::fsync(fd)),
                4 => i64::from(libc::fdatasync(fd)),
                5 => {
                    let e = libc::posix_fadvise(fd, off, len as i64, self.rng.below(6) as i32);
                    if e != 0 {
                        *libc::__errno_location() = e;
                        -1
                    } else {
                        0
                    }
                }
                6 => i64::from(libc::fallocate(
                    fd,
                    self.rng.below(4) as i32,
                    off,
                    len as i64 + 1,
                )),
                7 => libc::syscall(libc::SYS_readahead, fd, off, len),
                8 => {
                    let mut p = libc::pollfd {
                        fd,
                        events: libc::POLLIN | libc::POLLOUT,
                        revents: 0,
                    };
                    i64::from(libc::poll(&mut p, 1, 0))
                }
                _ => i64::from(libc::ftruncate(fd, off)),
            }
        };
        let r = if r < 0 { Err(sys::errno()) } else { Ok(()) };
        let exp = Expect::ok()
            .also(libc::EINVAL)
            .also(libc::ESPIPE)
            .also(libc::EBADF)
            .also(libc::ENODEV)
            .also(libc::EOPNOTSUPP)
            .also(libc::EROFS)
            .also(libc::EPERM)
            .also(libc::EACCES)
            .also(libc::EFBIG);
        self.check("fd syscall", &exp, r)
    }

    // -----------------------------------------------------------------------------------------
    // Mappings

    fn op_mmap(&mut self) -> Step {
        let Some((file, fd)) = self.pick_fd() else {
            return Ok(());
        };
        let own: Vec<usize> = (0..self.pins.len())
            .filter(|&p| self.pins[p].file == file)
            .collect();
        let target = self.rng.pick(&own).copied();
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
        self.pins[p].map_type = if self.pins[p].req == 3 { 3 } else { 1 };
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

    fn pick_vma(&mut self) -> Option<Vma> {
        let n = self.vmas.len();
        if n == 0 {
            return None;
        }
        Some(self.vmas[self.rng.index(n)].clone())
    }

    fn op_munmap(&mut self) -> Step {
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

    fn op_mprotect(&mut self) -> Step {
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

    fn op_mremap(&mut self) -> Step {
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

    fn op_madvise(&mut self) -> Step {
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

    // -----------------------------------------------------------------------------------------
    // CPU access through the mappings

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

    fn op_write(&mut self) -> Step {
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

    fn op_read(&mut self) -> Step {
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
    fn op_probe(&mut self) -> Step {
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

    /// /proc/self/maps shows exactly the modelled device VMAs.
    fn check_maps(&mut self) -> Step {
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
    fn check_counters(&mut self) -> Step {
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
        let emu = Emu::open().map_err(|e| Finding(format!("emu open: {}", ename(e))))?;
        let s = emu
            .stats()
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

    // -----------------------------------------------------------------------------------------
    // Processes

    fn op_fork(&mut self) -> Step {
        // 0: isolation checks; 1: a short run of its own, then exit with everything live;
        // 2: the same, SIGKILLed at a random time; 3: threads racing on one file.
        let mode = self.rng.weighted(&[40, 30, 12, 18]);
        let child_seed = self.rng.next_u64();
        let kill_after_us = self.rng.below(20_000);
        self.note(format!("fork (mode {mode}, child seed {child_seed:#x})"));
        // SAFETY: this process is single-threaded; the child only runs the fuzzer's own code
        // and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            finding!("fork: {}", ename(sys::errno()));
        }
        if pid == 0 {
            let code = match mode {
                0 => self.child_isolation(),
                3 => crate::storm::run(child_seed, self.shared_ops),
                _ => self.child_mini(child_seed, mode == 2),
            };
            // SAFETY: leaving the child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        if mode == 2 {
            std::thread::sleep(std::time::Duration::from_micros(kill_after_us));
            // SAFETY: kills our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is writable.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let exited_ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        let killed = libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL;
        if !(exited_ok || mode == 2 && killed) {
            if let Some(t) = &self.cfg.trace {
                eprintln!("{}", crate::trace_tail(&format!("{t}.child"), 40));
            }
            finding!("child (mode {mode}, seed {child_seed:#x}) ended with status {status:#x}");
        }
        Ok(())
    }

    /// In a forked child: nothing of the parent's works or is mapped here.
    fn child_isolation(&mut self) -> i32 {
        self.in_child = true;
        let r = (|| -> Step {
            for f in 0..self.files.len() {
                for fd in self.files[f].fds.clone() {
                    let mut v = GDRDRV_IOC_GET_VERSION_PARAMS::default();
                    let r = sys::ioctl(fd, GDRDRV_IOC_GET_VERSION, &mut v as *mut _ as usize);
                    self.check("child GET_VERSION", &Expect::err(libc::EACCES), r)?;
                    let handle = self.pick_handle(f);
                    let mut u = GDRDRV_IOC_UNPIN_BUFFER_PARAMS { handle };
                    let r = sys::ioctl(fd, GDRDRV_IOC_UNPIN_BUFFER, &mut u as *mut _ as usize);
                    self.check("child UNPIN", &Expect::err(libc::EACCES), r)?;
                    if let Some(p) = self.pins.iter().find(|p| p.file == f) {
                        let r = sys::mmap(
                            0,
                            self.page,
                            libc::PROT_READ,
                            libc::MAP_SHARED,
                            fd,
                            p.handle * self.page as u64,
                        );
                        let exp = if self.files[f].readable {
                            Expect::err(libc::EACCES)
                        } else {
                            Expect::err(libc::EACCES).also(libc::EINVAL)
                        };
                        self.check("child mmap", &exp, r.map(drop))?;
                    }
                }
            }
            for v in self.vmas.clone() {
                if self.prober.probe(v.start, 1).is_ok() {
                    finding!(
                        "the parent's mapping {:#x} is readable in the child",
                        v.start
                    );
                }
            }
            for a in 0..self.allocs.len() {
                if let (true, Some(emu)) = (self.allocs[a].live, self.emu(self.allocs[a].emu)) {
                    let mut b = [0u8; 8];
                    let r = emu.read(self.allocs[a].va, &mut b);
                    self.check(
                        "child emu read of the parent's VA",
                        &Expect::err(libc::EINVAL),
                        r,
                    )?;
                }
            }
            Ok(())
        })();
        match r {
            Ok(()) => 0,
            Err(Finding(m)) => {
                eprintln!("FINDING in {} child: {m}", self.cfg.name);
                1
            }
        }
    }

    /// In a forked child: a short fuzzing run of its own, then an exit with everything live
    /// (or a SIGKILL from the parent).
    fn child_mini(&mut self, seed: u64, long: bool) -> i32 {
        let cfg = Config {
            name: format!("{}/child", self.cfg.name),
            trace: self.cfg.trace.as_ref().map(|t| format!("{t}.child")),
            seed,
            ops: if long { 1_000_000 } else { 20 + seed % 150 },
            exact: false,
            fork: false,
            foreign_allocs: 0,
            ..self.cfg.clone()
        };
        let Ok(mut w) = Worker::new(cfg, self.shared_ops) else {
            return 2;
        };
        w.in_child = true;
        match w.run() {
            Ok(()) => {
                if seed % 2 == 0 {
                    if let Err(m) = w.teardown() {
                        eprintln!("{m}");
                        return 1;
                    }
                }
                0
            }
            Err(report) => {
                eprintln!("{report}");
                1
            }
        }
    }
}

const GDR_MR_NONE_U32: u32 = 0;

fn unpin_raw(fd: i32, handle: u64) -> Result<(), Errno> {
    let mut u = GDRDRV_IOC_UNPIN_BUFFER_PARAMS { handle };
    sys::ioctl(fd, GDRDRV_IOC_UNPIN_BUFFER, &mut u as *mut _ as usize)
}
