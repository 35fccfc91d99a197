//! mtgdrcopy_copylat: latency of copies through a GDRCopy mapping for sizes 1, 2, 4, … bytes
//! up to the buffer size, with the runtime's memcpy for comparison. The options are upstream
//! gdrcopy_copylat's.

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{fence, Ordering};

use anyhow::{bail, Context, Result};
use clap::Parser;
use gdrapi::MappingType;
use mtgdrcopy_tests::bench::cli::MapType;
use mtgdrcopy_tests::bench::result::{BenchResult, Direction, Operation, Setup, Tool};
use mtgdrcopy_tests::bench::session::{
    pattern, pow2_sizes, round_up, verify, DeviceBuffer, Env, Mapping, Output, GPU_PAGE,
};
use mtgdrcopy_tests::bench::stats::{summarize, BucketPlan};
use mtgdrcopy_tests::bench::{self, time_calls, upstream, Term};
use mtgdrcopy_tests::cli::copylat::Args;
use mtgdrcopy_tests::gdr;
use mtgdrcopy_tests::gpu::{DevicePtr, Gpu};
use mtgdrcopy_tests::tool;

/// What the cold-cache memset writes.
const MEMSET_VALUE: u8 = 0xA5;

fn run(args: &Args, term: Term) -> Result<()> {
    if args.size == 0 {
        bail!(tool::usage("the buffer size (-s) must be at least 1 byte"));
    }
    if args.cold_cache && matches!(args.common.mapping, MapType::Wc | MapType::Device) {
        bail!(tool::usage(format!(
            "cold cache (-C) needs a CACHING mapping: use -M cache or -M default, not -M {}",
            args.common.mapping.name()
        )));
    }
    let write = BucketPlan::new(args.write_iters);
    let read = BucketPlan::new(args.read_iters);
    for (opt, requested, plan) in [
        ("-w", args.write_iters, write),
        ("-r", args.read_iters, read),
    ] {
        if plan.raised(requested) {
            term.warn(format_args!(
                "{opt} {requested} raised to {} (a multiple of the {} buckets)",
                plan.iterations, plan.buckets
            ));
        }
    }
    let buffer = round_up(args.size, GPU_PAGE);
    let Output { mut out, export } = Output::open(&args.common)?;
    let env = Env::open(&args.common)?;
    let gpu = &*env.gpu;
    let buf = DeviceBuffer::alloc(gpu, buffer, &term)?;
    let pin = env.gdr.pin(buf.ptr, buffer)?;
    let map = pin.map(buffer, args.common.mapping)?;
    let info = pin.info()?;
    if args.cold_cache && info.mapping_type != MappingType::Caching as i32 {
        bail!(
            "cold cache (-C) needs a CACHING mapping, but gdr_map_v2 gave {}: CPU caches never \
             hold device data behind a write-combined or uncached mapping, so there is nothing \
             to make cold. mtgpu maps its PCIe BAR write-combined, never CACHING.",
            gdr::mapping_type_name(env.gdr.api(), info.mapping_type)
        );
    }
    let setup = env.setup(Tool::Copylat, buffer, &info);
    env.print_preamble(&mut out, &setup, &buf, &info)?;
    writeln!(
        out,
        "# latency per copy in us: P50 (median) and P0 (minimum) of the mean per copy of {} \
         buckets of {} writes / {} buckets of {} reads{}",
        write.buckets,
        write.per_bucket,
        read.buckets,
        read.per_bucket,
        if args.cold_cache {
            "; cold cache, memset cost subtracted"
        } else {
            ""
        }
    )?;
    writeln!(
        out,
        "# only the CPU side is timed: a write may not be visible to the GPU when the call returns"
    )?;
    writeln!(
        out,
        "{:<24} {:>10} {:>12} {:>12}",
        "test", "size(B)", "P50(us)", "P0(us)"
    )?;

    let sizes = pow2_sizes(buffer);
    let mut ops = vec![
        (Operation::CopyToMapping, write),
        (Operation::CopyFromMapping, read),
    ];
    if args.memcpy {
        ops.push((Operation::MemcpyHtod, write));
        ops.push((Operation::MemcpyDtoh, read));
    }
    let bench = Bench {
        gpu,
        map: &map,
        dev: buf.ptr,
        cold: args.cold_cache,
        setup: &setup,
    };
    let mut host = vec![0u8; usize::try_from(buffer)?];
    let mut results = Vec::new();
    for (k, &(op, plan)) in ops.iter().enumerate() {
        if k > 0 {
            writeln!(out)?;
        }
        for (i, &size) in sizes.iter().enumerate() {
            term.progress(format_args!(
                "{} {size} B ({}/{})",
                op.function(),
                i + 1,
                sizes.len()
            ));
            let host = &mut host[..usize::try_from(size)?];
            let row = bench.measure(op, size, plan, host)?;
            term.clear_progress();
            writeln!(
                out,
                "{:<24} {:>10} {:>12.4} {:>12.4}",
                op.function(),
                size,
                row.median_us.unwrap_or(row.mean_us),
                row.min_us.unwrap_or(row.mean_us)
            )?;
            results.push(row);
        }
    }
    // Upstream's table, for the scripts that parse it (bench/upstream.rs).
    write!(out, "{}", upstream::copylat(&results))?;
    map.unmap()?;
    pin.unpin()?;
    drop(buf);
    Output { out, export }.finish(Tool::Copylat, results)
}

struct Bench<'a> {
    gpu: &'a dyn Gpu,
    map: &'a Mapping<'a>,
    dev: DevicePtr,
    cold: bool,
    setup: &'a Setup,
}

impl Bench<'_> {
    /// Times `plan.iterations` copies of `op` of `host.len()` bytes in `plan.buckets` buckets,
    /// then checks the data.
    fn measure(
        &self,
        op: Operation,
        size: u64,
        plan: BucketPlan,
        host: &mut [u8],
    ) -> Result<BenchResult> {
        let n = host.len();
        let cold = self.cold && matches!(op, Operation::CopyToMapping | Operation::CopyFromMapping);
        // What the device must hold after a write, or what a read must return.
        let expected = if op.direction() == Some(Direction::HostToDevice) {
            let p = pattern(0x3000 ^ size as u32 ^ op as u32, n);
            host.copy_from_slice(&p);
            p
        } else if cold {
            // Every read follows a memset, so the memset's value is what it returns.
            vec![MEMSET_VALUE; n]
        } else {
            let p = pattern(0x4000 ^ size as u32 ^ op as u32, n);
            self.gpu.memcpy_htod(self.dev, &p)?;
            host.fill(0);
            p
        };
        let mut samples = Vec::with_capacity(plan.buckets as usize);
        let mut memset_total = 0.0;
        for _ in 0..plan.buckets {
            let per_copy = match op {
                Operation::CopyToMapping if cold => {
                    let with = time_calls(plan.per_bucket, || {
                        self.cold_memset(n)?;
                        self.map.copy_to(0, host)
                    })?;
                    let memset = time_calls(plan.per_bucket, || self.cold_memset(n))?;
                    memset_total += memset;
                    (with - memset).max(0.0)
                }
                Operation::CopyFromMapping if cold => {
                    let with = time_calls(plan.per_bucket, || {
                        self.cold_memset(n)?;
                        self.map.copy_from(0, host)
                    })?;
                    let memset = time_calls(plan.per_bucket, || self.cold_memset(n))?;
                    memset_total += memset;
                    (with - memset).max(0.0)
                }
                Operation::CopyToMapping => {
                    time_calls(plan.per_bucket, || self.map.copy_to(0, host))?
                }
                Operation::CopyFromMapping => {
                    time_calls(plan.per_bucket, || self.map.copy_from(0, host))?
                }
                Operation::MemcpyHtod => {
                    time_calls(plan.per_bucket, || self.gpu.memcpy_htod(self.dev, host))?
                }
                Operation::MemcpyDtoh => {
                    time_calls(plan.per_bucket, || self.gpu.memcpy_dtoh(host, self.dev))?
                }
                other => bail!("copylat does not time {}", other.function()),
            };
            samples.push(per_copy);
        }
        match op.direction() {
            Some(Direction::HostToDevice) => {
                let mut back = vec![0u8; n];
                self.gpu.memcpy_dtoh(&mut back, self.dev)?;
                verify(
                    &format!("{} of {size} bytes", op.function()),
                    &expected,
                    &back,
                )?;
            }
            _ => verify(
                &format!("{} of {size} bytes", op.function()),
                &expected,
                host,
            )?,
        }
        let s = summarize(&samples).context("no bucket was timed")?;
        Ok(BenchResult {
            buckets: Some(plan.buckets),
            min_us: Some(s.min),
            median_us: Some(s.median),
            max_us: Some(s.max),
            cold_cache: cold,
            memset_us: cold.then(|| memset_total / plan.buckets as f64),
            ..BenchResult::new(self.setup, op, size, plan.iterations, s.mean)
        })
    }

    /// The cold-cache step: overwrite the range through the driver, then fence so that the
    /// copy that follows cannot start before it.
    fn cold_memset(&self, n: usize) -> Result<()> {
        self.gpu.memset_d8(self.dev, MEMSET_VALUE, n)?;
        fence(Ordering::SeqCst);
        Ok(())
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    bench::main("mtgdrcopy_copylat", &args.common, |term| run(&args, term))
}
