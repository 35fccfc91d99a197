//! `mtgdrdrv_fuzz`: the adversarial suite's fuzzer (test-only, never packaged). Runs inside the
//! test VM, where /dev/mtgdrdrv and the emulated provider (/dev/mtgpu_emu) exist.
//!
//! Three phases, each in processes of their own:
//! 1. `exact`: one fuzzing process, alone on the system, so the module's and the emulator's
//!    global counters must equal its model after its operations;
//! 2. `concurrent`: several fuzzing processes at once (pins, maps, faults and exits racing);
//! 3. `api`: the gdrapi C API with hostile arguments, checked call by call.
//!
//! Then the oracles over the whole run: the driver process's sentinel allocations (a canary
//! pattern spread through the BAR, never pinned or mapped) are unchanged; once every fuzzing
//! process has exited and its files are closed, the module's counters (pins, bytes, mappings)
//! are zero with get_pages == put_pages, and the emulator has no pin and no allocation left; the
//! kernel log since the start holds no message of the module or the emulator that signals a
//! broken invariant (read as it is written, klog.rs, so that none is lost). The VM harness adds its own: no WARN/BUG/Oops/KFENCE line, and a clean
//! rmmod of both modules afterwards.
//!
//! Every choice comes from `--seed` (printed first): the same seed replays the same operations.
//! `--phase` runs one phase alone; a finding names its process, seed and operation number.

mod api;
mod emu;
mod kernel;
mod klog;
mod rng;
mod storm;
mod sys;
mod trace;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;

use crate::emu::{Emu, Raw};
use crate::rng::Rng;

#[derive(Parser)]
#[command(
    name = "mtgdrdrv_fuzz",
    about = "Seeded adversarial fuzzer of mtgdrdrv, the emulated provider and the gdrapi C API"
)]
struct Args {
    /// Seed of every random choice (default: from the clock; printed either way).
    #[arg(long, value_parser = parse_u64)]
    seed: Option<u64>,
    /// Kernel-level operations in all (30% in the exact phase, 70% split over the workers).
    #[arg(long, default_value_t = 100_000)]
    ops: u64,
    /// C API calls of the api phase.
    #[arg(long, default_value_t = 20_000)]
    api_ops: u64,
    /// Concurrent fuzzing processes of the concurrent phase.
    #[arg(long, default_value_t = 4)]
    workers: u64,
    /// Run only this phase.
    #[arg(long, value_parser = ["exact", "concurrent", "api"])]
    phase: Option<String>,
    /// Never inject provider faults.
    #[arg(long)]
    no_faults: bool,
    /// Never fork children.
    #[arg(long)]
    no_fork: bool,
    /// Print every operation (to stderr).
    #[arg(long, short)]
    verbose: bool,
    /// Only check the kernel log reader: a line logged first must be caught although this many
    /// filler lines then overwrite it in the ring buffer.
    #[arg(long, value_name = "FLOOD", num_args = 0..=1, default_missing_value = "5000")]
    klog_selftest: Option<u64>,
}

fn parse_u64(s: &str) -> Result<u64, String> {
    let t = s.trim();
    match t.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    }
    .map_err(|e| format!("{s}: {e}"))
}

/// An operation counter in memory shared by every process of the run.
fn shared_counter() -> Result<&'static AtomicU64> {
    let p = sys::mmap(
        0,
        sys::page_size(),
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_SHARED | libc::MAP_ANONYMOUS,
        -1,
        0,
    )
    .map_err(|e| anyhow::anyhow!("mmap: {}", sys::ename(e)))?;
    // SAFETY: a fresh, zeroed, page-aligned shared mapping that is never unmapped; an AtomicU64
    // is valid for any bit pattern.
    Ok(unsafe { &*(p as *const AtomicU64) })
}

/// Runs `body` in a forked process; its exit status 0 means success.
fn spawn(body: impl FnOnce() -> i32) -> Result<libc::pid_t> {
    // SAFETY: the driver is single-threaded; the child runs `body` and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        bail!("fork: {}", sys::ename(sys::errno()));
    }
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(101);
        // SAFETY: leaving the child without the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    Ok(pid)
}

fn wait(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    status
}

fn describe(status: i32) -> String {
    if libc::WIFEXITED(status) {
        format!("exit {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!("signal {}", libc::WTERMSIG(status))
    } else {
        format!("status {status:#x}")
    }
}

fn worker_body(cfg: kernel::Config, ops: &'static AtomicU64, careful_end: bool) -> i32 {
    let mut w = match kernel::Worker::new(cfg, ops) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("worker setup: {e:#}");
            return 2;
        }
    };
    if let Err(report) = w.run() {
        eprintln!("{report}");
        return 1;
    }
    // Half the runs end carefully, the other half exit with everything live.
    if careful_end {
        if let Err(report) = w.teardown() {
            eprintln!("{report}");
            return 1;
        }
    }
    0
}

/// The sentinels: allocations spread through the BAR (scattered pages, with workers'
/// allocations landing in the holes), holding a canary, never pinned or mapped.
struct Sentinels {
    emu: Emu,
    allocs: Vec<(u64, Vec<u8>)>,
}

impl Sentinels {
    fn new(rng: &mut Rng) -> Result<Sentinels> {
        let emu = Emu::open().raw().map_err(|e| {
            anyhow::anyhow!("open {}: {}", mtgpu_emu_abi::device_path(), sys::ename(e))
        })?;
        let mut allocs = Vec::new();
        for (size, page, flags) in [
            (4u64 << 20, 65536u32, mtgpu_emu_abi::MTGPU_EMU_ALLOC_SCATTER),
            (1 << 20, 4096, mtgpu_emu_abi::MTGPU_EMU_ALLOC_SCATTER),
            (2 << 20, 2 << 20, 0),
        ] {
            let va = emu
                .alloc_flags(size, 0, page, flags)
                .raw()
                .map_err(|e| anyhow::anyhow!("sentinel alloc: {}", sys::ename(e)))?;
            let mut canary = vec![0u8; size as usize];
            rng.fill(&mut canary);
            emu.write(va, &canary)
                .raw()
                .map_err(|e| anyhow::anyhow!("sentinel write: {}", sys::ename(e)))?;
            allocs.push((va, canary));
        }
        Ok(Sentinels { emu, allocs })
    }

    fn check(&self) -> Result<()> {
        for (va, canary) in &self.allocs {
            let mut now = vec![0u8; canary.len()];
            self.emu
                .read(*va, &mut now)
                .raw()
                .map_err(|e| anyhow::anyhow!("sentinel read: {}", sys::ename(e)))?;
            if let Some(i) = (0..now.len()).find(|&i| now[i] != canary[i]) {
                bail!(
                    "sentinel allocation {va:#x} byte {i:#x} changed ({:#04x} -> {:#04x}): some process wrote device memory it never mapped",
                    canary[i],
                    now[i]
                );
            }
        }
        Ok(())
    }
}

/// Messages that mean a broken invariant of the module or the emulator (the harness already
/// fails on WARN/BUG/Oops/KFENCE/list corruption). Expected noise, such as a refused pin or an
/// injected bad page table, is not among them.
const BAD_LOG: &[&str] = &[
    "no mapped pin",
    "still has",
    "mtgpu_p2p_put_pages(",
    "was not handed out",
    "invalid version",
    "page tables leaked",
    "leak at unload",
    "freeing invalid memtype",
];

fn main() {
    match run() {
        Ok(()) => {}
        Err(e) => {
            eprintln!("mtgdrdrv_fuzz: FAILED: {e:#}");
            std::process::exit(1);
        }
    }
}

fn run() -> Result<()> {
    let args = Args::parse();
    if let Some(flood) = args.klog_selftest {
        return klog::selftest(flood);
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    println!("mtgdrdrv_fuzz: seed {seed:#x} (rerun with --seed {seed:#x})");
    for path in [
        "/dev/mtgdrdrv",
        &mtgpu_emu_abi::device_path(),
        mtgdrdrv::procfs::COUNTERS_PATH,
    ] {
        if !std::path::Path::new(path).exists() {
            bail!("{path} is missing: load mtgpu_emu and mtgdrdrv (cargo xtask vm)");
        }
    }
    let before = sys::module_counters()?;
    if before.pins_outstanding != 0 || before.mappings != 0 {
        bail!("the module is not idle before the run: {before:?}");
    }
    let klog = klog::KernelLog::start()?;
    let ops_counter = shared_counter()?;
    let mut rng = Rng::new(seed);
    let sentinels = Sentinels::new(&mut rng).context("sentinel allocations")?;
    let foreign = sentinels.allocs.len() as u64;
    let run_phase = |p: &str| args.phase.as_deref().is_none_or(|only| only == p);
    let faults = !args.no_faults;
    let mut failures = Vec::new();
    let start = Instant::now();

    if run_phase("exact") {
        let t = Instant::now();
        let cfg = kernel::Config {
            name: "exact".into(),
            seed: Rng::derive(seed, 1000),
            ops: args.ops * 3 / 10,
            faults,
            exact: true,
            foreign_allocs: foreign,
            fork: !args.no_fork,
            verbose: args.verbose,
            trace: Some(trace::path("exact")),
        };
        println!(
            "phase exact: 1 process, {} ops, seed {:#x}",
            cfg.ops, cfg.seed
        );
        let pid = spawn(|| worker_body(cfg, ops_counter, true))?;
        let status = wait(pid);
        if status != 0 {
            if !libc::WIFEXITED(status) {
                eprintln!("{}", trace::tail(&trace::path("exact"), 40));
            }
            failures.push(format!("exact phase: {}", describe(status)));
        }
        println!("phase exact: {:.1} s", t.elapsed().as_secs_f64());
    }

    if run_phase("concurrent") {
        let t = Instant::now();
        let n = args.workers.max(1);
        let per = args.ops * 7 / 10 / n;
        println!("phase concurrent: {n} processes, {per} ops each");
        let mut pids = Vec::new();
        for i in 0..n {
            let cfg = kernel::Config {
                name: format!("worker{i}"),
                seed: Rng::derive(seed, 2000 + i),
                ops: per,
                faults,
                exact: false,
                foreign_allocs: 0,
                fork: !args.no_fork,
                verbose: args.verbose,
                trace: Some(trace::path(&format!("worker{i}"))),
            };
            let careful = rng.chance(500);
            println!(
                "  worker{i}: seed {:#x}, {} end",
                cfg.seed,
                if careful { "careful" } else { "abrupt" }
            );
            pids.push((i, spawn(move || worker_body(cfg, ops_counter, careful))?));
        }
        for (i, pid) in pids {
            let status = wait(pid);
            if status != 0 {
                if !libc::WIFEXITED(status) {
                    eprintln!("{}", trace::tail(&trace::path(&format!("worker{i}")), 40));
                }
                failures.push(format!("worker{i}: {}", describe(status)));
            }
        }
        println!("phase concurrent: {:.1} s", t.elapsed().as_secs_f64());
    }

    // Faults a killed process injected and nobody consumed must not leak into the api phase.
    let _ = sentinels.emu.inject_fault_raw(0, 0).raw();

    if run_phase("api") {
        let t = Instant::now();
        let aseed = Rng::derive(seed, 3000);
        println!("phase api: {} calls, seed {aseed:#x}", args.api_ops);
        let api_ops = args.api_ops;
        let verbose = args.verbose;
        let pid = spawn(
            move || match api::ApiFuzzer::new(aseed, api_ops, ops_counter, verbose) {
                Ok(mut f) => match f.run() {
                    Ok(()) => 0,
                    Err(report) => {
                        eprintln!("{report}");
                        1
                    }
                },
                Err(e) => {
                    eprintln!("api setup: {e:#}");
                    2
                }
            },
        )?;
        let status = wait(pid);
        if status != 0 {
            failures.push(format!("api phase: {}", describe(status)));
        }
        println!("phase api: {:.1} s", t.elapsed().as_secs_f64());
    }

    // Oracles over the whole run.
    if let Err(e) = sentinels.check() {
        failures.push(format!("{e:#}"));
    }
    drop(sentinels);
    let c = sys::module_counters()?;
    println!(
        "module counters: pins_outstanding {} bytes_pinned {} mappings {} get_pages_calls {} put_pages_calls {}",
        c.pins_outstanding, c.bytes_pinned, c.mappings, c.get_pages_calls, c.put_pages_calls
    );
    if c.pins_outstanding != 0
        || c.bytes_pinned != 0
        || c.mappings != 0
        || c.get_pages_calls != c.put_pages_calls
    {
        failures.push(format!("module counters not back to zero: {c:?}"));
    }
    let emu = Emu::open()
        .raw()
        .map_err(|e| anyhow::anyhow!("open {}: {}", mtgpu_emu_abi::device_path(), sys::ename(e)))?;
    let s = emu
        .stats()
        .raw()
        .map_err(|e| anyhow::anyhow!("stats: {}", sys::ename(e)))?;
    println!(
        "emulator stats: pins_outstanding {} allocations {} bytes_allocated {} get_pages_calls {} put_pages_calls {} freed_while_pinned {}",
        s.pins_outstanding, s.allocations, s.bytes_allocated, s.get_pages_calls, s.put_pages_calls, s.freed_while_pinned
    );
    if s.pins_outstanding != 0 || s.allocations != 0 || s.bytes_allocated != 0 {
        failures.push(format!("emulator not back to zero: {s:?}"));
    }
    let log = klog.finish()?;
    if log.lost > 0 {
        failures.push(format!(
            "kernel log: {} records were overwritten before the fuzzer read them",
            log.lost
        ));
    }
    for line in log.lines {
        if BAD_LOG.iter().any(|b| line.contains(b)) {
            failures.push(format!("kernel log: {line}"));
        }
    }
    let total = ops_counter.load(Ordering::Relaxed);
    println!(
        "mtgdrdrv_fuzz: {total} operations in {:.1} s, seed {seed:#x}: {}",
        start.elapsed().as_secs_f64(),
        if failures.is_empty() {
            "no findings"
        } else {
            "FINDINGS"
        }
    );
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    Ok(())
}
