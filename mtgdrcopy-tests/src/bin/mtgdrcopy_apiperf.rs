//! mtgdrcopy_apiperf: latency of the gdrapi calls around a copy (pin, map, get_info, unmap,
//! unpin) for pin sizes 64 KiB, 128 KiB, … up to a maximum. The options are upstream
//! gdrcopy_apiperf's.

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use mtgdrcopy_tests::bench::cli::MapType;
use mtgdrcopy_tests::bench::result::{BenchResult, Operation, Tool};
use mtgdrcopy_tests::bench::session::{round_up, DeviceBuffer, Env, Gdr, Output, GPU_PAGE};
use mtgdrcopy_tests::bench::stats::{histogram, summarize};
use mtgdrcopy_tests::bench::{self, upstream, Term};
use mtgdrcopy_tests::cli::apiperf::Args;
use mtgdrcopy_tests::gpu::DevicePtr;
use mtgdrcopy_tests::tool;

/// Histogram bins, as upstream (there is no option for it).
const HISTOGRAM_BINS: usize = 10;

fn run(args: &Args, term: Term) -> Result<()> {
    if args.max_size == 0 {
        bail!(tool::usage("the maximum size (-s) must be at least 1 byte"));
    }
    let max = round_up(args.max_size, GPU_PAGE);
    let sizes: Vec<u64> = std::iter::successors(Some(GPU_PAGE), |&s| s.checked_mul(2))
        .take_while(|&s| s <= max)
        .collect();
    let Output { mut out, export } = Output::open(&args.common)?;
    let env = Env::open(&args.common)?;
    let buf = DeviceBuffer::alloc(&*env.gpu, max, &term)?;
    let request = args.common.mapping;

    // One untimed cycle to learn what mapping the driver gives, for the report.
    let info = {
        let pin = env.gdr.pin(buf.ptr, GPU_PAGE)?;
        let map = pin.map(GPU_PAGE, request)?;
        let info = pin.info()?;
        map.unmap()?;
        pin.unpin()?;
        info
    };
    let setup = env.setup(Tool::Apiperf, max, &info);
    env.print_preamble(&mut out, &setup, &buf, &info)?;
    writeln!(
        out,
        "# latency per call in us over {} timed cycles per size, after {} warm-up cycles",
        args.iters, args.warmup
    )?;
    writeln!(
        out,
        "{:>10} {:<18} {:>12} {:>12} {:>12} {:>12}",
        "size(B)", "call", "mean(us)", "min(us)", "P50(us)", "max(us)"
    )?;

    let mut results = Vec::new();
    for (k, &size) in sizes.iter().enumerate() {
        for i in 0..args.warmup {
            term.progress(format_args!(
                "size {size} B ({}/{}): warm-up {}/{}",
                k + 1,
                sizes.len(),
                i + 1,
                args.warmup
            ));
            cycle(&env.gdr, buf.ptr, size, request)?;
        }
        let mut times: [Vec<f64>; 5] = Default::default();
        for i in 0..args.iters {
            if i % 10 == 0 {
                term.progress(format_args!(
                    "size {size} B ({}/{}): cycle {}/{}",
                    k + 1,
                    sizes.len(),
                    i + 1,
                    args.iters
                ));
            }
            let t = cycle(&env.gdr, buf.ptr, size, request)?;
            for (samples, us) in times.iter_mut().zip(t) {
                samples.push(us);
            }
        }
        term.clear_progress();
        for (op, samples) in Operation::APIPERF_CYCLE.into_iter().zip(&times) {
            let s = summarize(samples).context("no cycle was timed")?;
            let row = BenchResult {
                warmup_iterations: Some(args.warmup),
                min_us: Some(s.min),
                median_us: Some(s.median),
                max_us: Some(s.max),
                histogram: (op == Operation::Pin).then(|| histogram(samples, HISTOGRAM_BINS)),
                ..BenchResult::new(&setup, op, size, args.iters, s.mean)
            };
            writeln!(
                out,
                "{:>10} {:<18} {:>12.4} {:>12.4} {:>12.4} {:>12.4}",
                size,
                op.function(),
                s.mean,
                s.min,
                s.median,
                s.max
            )?;
            results.push(row);
        }
    }

    // Upstream's header and rows of means, for the scripts that parse them (bench/upstream.rs).
    write!(out, "\n{}", upstream::apiperf(&results))?;
    for row in results.iter().filter(|r| r.histogram.is_some()) {
        let bins = row.histogram.as_deref().unwrap_or_default();
        writeln!(out)?;
        writeln!(
            out,
            "Histogram of {} latency for {} bytes ({} calls; bins [from, to) us, the last one \
             closed):",
            row.operation.function(),
            row.size_bytes,
            row.iterations
        )?;
        writeln!(out, "{:>12} {:>12} {:>8}", "from(us)", "to(us)", "calls")?;
        for b in bins {
            writeln!(out, "{:>12.4} {:>12.4} {:>8}", b.low_us, b.high_us, b.count)?;
        }
    }
    drop(buf);
    Output { out, export }.finish(Tool::Apiperf, results)
}

/// One pin, map, get_info, unmap, unpin of `size` bytes at `ptr`; each call's time in µs.
fn cycle(gdr: &Gdr, ptr: DevicePtr, size: u64, request: MapType) -> Result<[f64; 5]> {
    let us = |t: Instant| t.elapsed().as_secs_f64() * 1e6;
    let t = Instant::now();
    let pin = gdr.pin(ptr, size)?;
    let pin_us = us(t);
    let t = Instant::now();
    let map = pin.map(size, request)?;
    let map_us = us(t);
    let t = Instant::now();
    let info = pin.info()?;
    let info_us = us(t);
    if !info.mapped {
        bail!("gdr_get_info_v2 says the buffer is not mapped right after gdr_map_v2");
    }
    let t = Instant::now();
    map.unmap()?;
    let unmap_us = us(t);
    let t = Instant::now();
    pin.unpin()?;
    let unpin_us = us(t);
    Ok([pin_us, map_us, info_us, unmap_us, unpin_us])
}

fn main() -> ExitCode {
    let args = Args::parse();
    bench::main("mtgdrcopy_apiperf", &args.common, |term| run(&args, term))
}
