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
//!
//! The worker (this file) runs the operations and reports a finding with the operations before
//! it; the model lives in `model`, the checks in `oracle`, and the operations by what they
//! attack: `files`, `emulator`, `pins`, `ioctl`, `mappings`, `access` (CPU and kernel access
//! through the mappings) and `process` (fork, exit, kill).

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::emu::Emu;
use crate::rng::Rng;
use crate::sys::{self, ename};

/// A model violation: printed with the recent operations, then the process fails.
pub struct Finding(pub String);

type Step = Result<(), Finding>;

macro_rules! finding {
    ($($t:tt)*) => { return Err(Finding(format!($($t)*))) };
}

mod access;
mod emulator;
mod files;
mod ioctl;
mod limits;
mod mappings;
mod model;
mod oracle;
mod pins;
mod process;

use ioctl::{unpin_raw, Scratch};
use model::{Alloc, File, Pin, PinState, Vma};
use oracle::Expect;

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
    /// The module's limits and the BAR's kernel mapping, as the model knows them.
    limits: limits::Limits,
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
            limits: limits::Limits::read(),
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

    /// Runs `cfg.ops` operations, then the final checks; returns the findings report, if any.
    pub fn run(&mut self) -> Result<(), String> {
        let result = self.run_inner();
        if result.is_err() {
            let _ = self.restore_limits();
        }
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
        self.restore_limits()?;
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
        let limits = if self.cfg.exact { 3 } else { 0 };
        let weights = [
            12, 6, 4, 4, 2, 25, 8, 25, 55, 30, 110, 30, 55, 25, 18, 18, 6, 50, 35, 25, fork,
            faults, 4, exact, 4, 10, limits,
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
            25 => self.op_fd_misc(),
            _ => self.op_limits(),
        }
    }
}
