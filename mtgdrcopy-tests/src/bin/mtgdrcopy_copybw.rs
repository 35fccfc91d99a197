//! mtgdrcopy_copybw: bandwidth of copies through a GDRCopy mapping, host → device ("write",
//! gdr_copy_to_mapping) and device → host ("read", gdr_copy_from_mapping). The options are
//! upstream gdrcopy_copybw's.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::Parser;
use mtgdrcopy_tests::bench::result::{BenchResult, Operation, Tool};
use mtgdrcopy_tests::bench::session::{
    pattern, pow2_sizes, round_up, verify, DeviceBuffer, Env, Output, GPU_PAGE,
};
use mtgdrcopy_tests::bench::{self, mib_per_s, time_calls, upstream, Term};
use mtgdrcopy_tests::cli::copybw::Args;
use mtgdrcopy_tests::tool;

/// What to measure, checked before anything is opened.
#[derive(Debug)]
struct Plan {
    buffer: u64,
    offset: u64,
    sizes: Vec<u64>,
}

fn plan(args: &Args) -> Result<Plan> {
    if args.size == 0 {
        bail!("the buffer size (-s) must be at least 1 byte");
    }
    let buffer = round_up(args.size, GPU_PAGE);
    let copy_size = args.copy_size.unwrap_or(args.size);
    if copy_size == 0 {
        bail!("the copy size (-c) must be at least 1 byte");
    }
    if args.offset % 4 != 0 {
        bail!(
            "the offset (-o) must be a multiple of 4 bytes, got {}",
            args.offset
        );
    }
    if args
        .offset
        .checked_add(copy_size)
        .is_none_or(|end| end > buffer)
    {
        bail!(
            "offset {} + copy size {copy_size} does not fit the {buffer}-byte buffer (-s {} \
             rounded up to the {GPU_PAGE}-byte GPU page)",
            args.offset,
            args.size
        );
    }
    let sizes = if args.sweep {
        pow2_sizes(copy_size)
    } else {
        vec![copy_size]
    };
    Ok(Plan {
        buffer,
        offset: args.offset,
        sizes,
    })
}

fn run(args: &Args, term: Term) -> Result<()> {
    // Every error of plan() is in the command line.
    let plan = plan(args).map_err(|e| tool::usage(format!("{e:#}")))?;
    let Output { mut out, export } = Output::open(&args.common)?;
    let env = Env::open(&args.common)?;
    let gpu = &*env.gpu;
    let buf = DeviceBuffer::alloc(gpu, plan.buffer, &term)?;
    let pin = env.gdr.pin(buf.ptr, plan.buffer)?;
    let map = pin.map(plan.buffer, args.common.mapping)?;
    let info = pin.info()?;
    let setup = env.setup(Tool::Copybw, plan.buffer, &info);
    env.print_preamble(&mut out, &setup, &buf, &info)?;
    writeln!(
        out,
        "# user-space pointer 0x{:x}; bandwidth in MiB/s = bytes / seconds / 2^20",
        map.addr()
    )?;
    writeln!(
        out,
        "{:<6} {:>10} {:>10} {:>8} {:>12} {:>12}",
        "op", "size(B)", "offset(B)", "iters", "us/copy", "MiB/s"
    )?;

    let mut results = Vec::new();
    let largest = plan.sizes.iter().copied().max().unwrap_or(1);
    let mut host = vec![0u8; usize::try_from(largest)?];
    let n_sizes = plan.sizes.len();
    let dev = buf.ptr + plan.offset;
    for (op, iters) in [
        (Operation::CopyToMapping, args.write_iters),
        (Operation::CopyFromMapping, args.read_iters),
    ] {
        for (i, &size) in plan.sizes.iter().enumerate() {
            let n = usize::try_from(size)?;
            term.progress(format_args!(
                "{} {size} B at offset {} ({}/{n_sizes})",
                label(op),
                plan.offset,
                i + 1
            ));
            let host = &mut host[..n];
            let mean_us = if op == Operation::CopyToMapping {
                host.copy_from_slice(&pattern(0x1000 ^ size as u32, n));
                // One untimed copy first, so that faulting in the mapping is not timed.
                map.copy_to(plan.offset, host)?;
                let us = time_calls(iters, || map.copy_to(plan.offset, host))?;
                let mut back = vec![0u8; n];
                gpu.memcpy_dtoh(&mut back, dev)?;
                verify(&format!("write of {size} bytes"), host, &back)?;
                us
            } else {
                let expected = pattern(0x2000 ^ size as u32, n);
                gpu.memcpy_htod(dev, &expected)?;
                host.fill(0);
                map.copy_from(plan.offset, host)?;
                host.fill(0);
                let us = time_calls(iters, || map.copy_from(plan.offset, host))?;
                verify(&format!("read of {size} bytes"), &expected, host)?;
                us
            };
            let row = BenchResult {
                offset_bytes: plan.offset,
                bandwidth_mib_s: mib_per_s(size, mean_us),
                ..BenchResult::new(&setup, op, size, iters, mean_us)
            };
            term.clear_progress();
            writeln!(
                out,
                "{:<6} {:>10} {:>10} {:>8} {:>12.4} {:>12.2}",
                label(op),
                size,
                plan.offset,
                iters,
                mean_us,
                row.bandwidth_mib_s.unwrap_or(f64::INFINITY)
            )?;
            results.push(row);
        }
    }
    // Upstream's lines, for the scripts that grep them (bench/upstream.rs).
    write!(out, "\n{}", upstream::copybw(&results))?;
    map.unmap()?;
    pin.unpin()?;
    drop(buf);
    Output { out, export }.finish(Tool::Copybw, results)
}

fn label(op: Operation) -> &'static str {
    if op == Operation::CopyToMapping {
        "write"
    } else {
        "read"
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    bench::main("mtgdrcopy_copybw", &args.common, |term| run(&args, term))
}

#[cfg(test)]
mod plan_tests {
    use clap::Parser;

    fn plan(argv: &[&str]) -> Result<super::Plan, String> {
        let args =
            super::Args::try_parse_from(std::iter::once("copybw").chain(argv.iter().copied()))
                .map_err(|e| e.to_string())?;
        super::plan(&args).map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn defaults_are_upstreams() {
        let p = plan(&[]).unwrap();
        assert_eq!(
            (p.buffer, p.offset, p.sizes.clone()),
            (131072, 0, vec![131072])
        );
        let args = super::Args::try_parse_from(["copybw"]).unwrap();
        assert_eq!((args.write_iters, args.read_iters), (10000, 100));
    }

    #[test]
    fn sweep_goes_up_to_the_copy_size() {
        let p = plan(&["-s", "64K", "-c", "100", "-l"]).unwrap();
        assert_eq!(p.sizes, vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(p.buffer, 65536);
        let p = plan(&["-l"]).unwrap();
        assert_eq!(p.sizes.last(), Some(&131072));
    }

    #[test]
    fn offset_and_fit_are_checked() {
        assert!(plan(&["-o", "6"]).unwrap_err().contains("multiple of 4"));
        assert!(plan(&["-o", "4"]).unwrap_err().contains("does not fit"));
        let p = plan(&["-s", "1000", "-o", "4"]).unwrap();
        assert_eq!((p.buffer, p.sizes.clone()), (65536, vec![1000]));
        assert!(plan(&["-s", "0"]).unwrap_err().contains("at least 1"));
        assert!(plan(&["-w", "0"]).unwrap_err().contains("at least 1"));
        assert!(plan(&["-a", "cuMemCreate"]).is_ok());
        assert!(plan(&["-a", "malloc"]).unwrap_err().contains("muMemCreate"));
        assert!(plan(&["-M", "bogus"]).is_err());
        assert!(plan(&["-c", "64K", "-o", "64K"]).is_ok());
    }
}
