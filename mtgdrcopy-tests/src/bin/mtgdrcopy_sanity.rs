//! mtgdrcopy_sanity: checks that GDRCopy works on this machine (library, module, GPU memory):
//! upstream GDRCopy's sanity cases ported to Moore Threads GPUs, plus mtgpu's own.
//!
//! Each case runs in its own forked process group with a timeout. The run ends with the line
//! `N passed, N failed` (`, N skipped` when any were skipped) and the lists of failed and
//! skipped cases; the exit status is nonzero when any case failed.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Parser;

use mtgdrcopy_tests::sanity::runner::{run_case, run_isolated, Outcome};
use mtgdrcopy_tests::sanity::{self, Case, Ctx};

/// Sanity checks of GDRCopy for Moore Threads GPUs (libgdrapi, mtgdrdrv and MUSA memory).
#[derive(Parser, Debug)]
#[command(name = "mtgdrcopy_sanity", version)]
struct Args {
    /// Run only this case (repeatable; regular and extended names).
    #[arg(short = 't', long = "test", value_name = "NAME")]
    tests: Vec<String>,
    /// List the cases and exit.
    #[arg(short = 'l', long)]
    list: bool,
    /// Print a banner per case (&&&& RUNNING|PASSED|FAILED|SKIPPED name) and the cases'
    /// progress messages.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// MUSA device ordinal.
    #[arg(short = 'd', long, value_name = "N", default_value_t = 0)]
    device: i32,
    /// Also run the extended cases.
    #[arg(short = 'e', long)]
    extended: bool,
    /// Per-case timeout; the case's whole process group is killed after it.
    #[arg(long, value_name = "SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
}

/// One case to run, or an upstream case that is not ported here (reported as skipped).
enum Selected {
    Run(Case),
    NotPorted(&'static str, &'static str),
}

impl Selected {
    fn name(&self) -> &'static str {
        match self {
            Selected::Run(c) => c.name,
            Selected::NotPorted(n, _) => n,
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("mtgdrcopy_sanity: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the selection; `Ok(false)` when a case failed.
fn run(args: &Args) -> Result<bool> {
    let all = sanity::cases();
    if args.list {
        list(&all);
        return Ok(true);
    }
    let selection = select(&all, args)?;
    sanity::set_verbose(args.verbose);
    let ctx = Ctx {
        device: args.device,
    };
    let timeout = Duration::from_secs(args.timeout);
    preflight(&ctx, timeout)?;

    let start = Instant::now();
    let mut results: Vec<(&'static str, Outcome)> = Vec::new();
    for sel in &selection {
        let name = sel.name();
        if args.verbose {
            eprintln!("&&&& RUNNING {name}");
        }
        let pins_before = pins_and_mappings();
        let outcome = match sel {
            Selected::Run(case) => run_case(case, &ctx, timeout)?,
            Selected::NotPorted(_, why) => Outcome::Skipped(why.to_string()),
        };
        if let (Some(before), Some(after)) = (pins_before, pins_and_mappings()) {
            if after != before {
                eprintln!(
                    "warning: {name}: module pins/mappings went from {before:?} to {after:?} \
                     (a leak, or another process using the device)"
                );
            }
        }
        match &outcome {
            Outcome::Passed if args.verbose => eprintln!("&&&& PASSED {name}"),
            Outcome::Passed => {}
            Outcome::Failed(why) => {
                eprintln!("{name}: {why}");
                if args.verbose {
                    eprintln!("&&&& FAILED {name}");
                }
            }
            Outcome::Skipped(why) if args.verbose => eprintln!("&&&& SKIPPED {name} ({why})"),
            Outcome::Skipped(_) => {}
        }
        results.push((name, outcome));
    }
    if args.verbose {
        eprintln!(
            "ran {} cases in {:.1} s",
            results.len(),
            start.elapsed().as_secs_f64()
        );
    }
    Ok(summary(&results))
}

fn list(all: &[Case]) {
    println!("Tests:");
    for c in all.iter().filter(|c| !c.extended) {
        println!("    {}", c.name);
    }
    println!("Extended tests:");
    for c in all.iter().filter(|c| c.extended) {
        println!("    {}", c.name);
    }
    println!("Not ported ({}):", sanity::VMM_REASON);
    let mut names: Vec<&str> = sanity::NOT_PORTED.iter().map(|(n, _)| *n).collect();
    names.sort();
    for n in names {
        println!("    {n}");
    }
}

/// The cases to run: those named with -t (in the order given), else every regular case and,
/// with -e, the extended ones.
fn select(all: &[Case], args: &Args) -> Result<Vec<Selected>> {
    if args.tests.is_empty() {
        return Ok(all
            .iter()
            .filter(|c| args.extended || !c.extended)
            .map(|c| Selected::Run(*c))
            .collect());
    }
    let mut out: Vec<Selected> = Vec::new();
    for name in &args.tests {
        if out.iter().any(|s| s.name() == name) {
            continue;
        }
        if let Some(c) = all.iter().find(|c| c.name == name) {
            out.push(Selected::Run(*c));
        } else if let Some((n, why)) = sanity::NOT_PORTED.iter().find(|(n, _)| n == name) {
            out.push(Selected::NotPorted(n, why));
        } else {
            let known = all
                .iter()
                .map(|c| c.name)
                .chain(sanity::NOT_PORTED.iter().map(|(n, _)| *n));
            let close = sanity::close_names(name, known);
            if close.is_empty() {
                bail!("unknown test {name:?} (-l lists them)");
            }
            bail!(
                "unknown test {name:?}; did you mean: {}? (-l lists them)",
                close.join(", ")
            );
        }
    }
    Ok(out)
}

/// Checks, in a forked process (the harness itself never initialises MUSA, which would not
/// survive fork), that libgdrapi loads, the device opens and the driver answers. Any failure is
/// one line.
fn preflight(ctx: &Ctx, timeout: Duration) -> Result<()> {
    let device = ctx.device;
    let outcome = run_isolated(
        || {
            let api = mtgdrcopy_tests::gdr::api()?;
            let gpu = ctx.gpu()?;
            let gdr = api_open(api)?;
            if sanity::verbose() {
                let (mut maj, mut min) = (0, 0);
                // SAFETY: both are valid out pointers.
                unsafe { (api.runtime_get_version)(&mut maj, &mut min) };
                let mut dmaj = -1;
                let mut dmin = -1;
                // SAFETY: `gdr` is live; both are valid out pointers.
                unsafe { (api.driver_get_version)(gdr, &mut dmaj, &mut dmin) };
                eprintln!(
                    "GPU {device}: {} ({}), MUSA driver {}; libgdrapi {maj}.{min}, mtgdrdrv \
                     {dmaj}.{dmin}",
                    gpu.name(),
                    gpu.pci_bus_id().unwrap_or_else(|| "bus id unknown".into()),
                    gpu.driver_version()
                        .map(|v| v.to_string())
                        .unwrap_or_else(|_| "?".into()),
                );
            }
            // SAFETY: `gdr` is live and not used afterwards.
            unsafe { (api.close)(gdr) };
            Ok(())
        },
        timeout,
    )?;
    match outcome {
        Outcome::Passed => Ok(()),
        Outcome::Failed(why) | Outcome::Skipped(why) => bail!(why),
    }
}

/// `gdr_open`, with the reason on failure.
fn api_open(api: &mtgdrcopy_tests::gdr::Api) -> Result<mtgdrcopy_tests::gdr::gdr_t> {
    // SAFETY: gdr_open takes no arguments.
    let g = unsafe { (api.open)() };
    if g.is_null() {
        let e = std::io::Error::last_os_error();
        bail!(
            "gdr_open failed: {e} (is the mtgdrdrv module loaded and {} accessible? \
             GDRCOPY_ENABLE_LOGGING=1 says more)",
            gdrapi::DEVICE_PATH
        );
    }
    Ok(g)
}

/// The module's outstanding pins and mappings, when its counters are readable.
fn pins_and_mappings() -> Option<(i64, i64)> {
    let text = std::fs::read_to_string("/proc/driver/mtgdrdrv/counters").ok()?;
    let get = |name: &str| {
        text.lines().find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next()? == name).then(|| f.next()?.parse::<i64>().ok())?
        })
    };
    Some((get("pins_outstanding")?, get("mappings")?))
}

/// Prints the summary; true when nothing failed.
fn summary(results: &[(&str, Outcome)]) -> bool {
    let count = |f: fn(&Outcome) -> bool| results.iter().filter(|(_, o)| f(o)).count();
    let passed = count(|o| matches!(o, Outcome::Passed));
    let failed = count(|o| matches!(o, Outcome::Failed(_)));
    let skipped = count(|o| matches!(o, Outcome::Skipped(_)));
    let mut line = format!("{passed} passed, {failed} failed");
    if skipped > 0 {
        line += &format!(", {skipped} skipped");
    }
    println!("{line}");
    if failed > 0 {
        println!("Failed:");
        for (name, o) in results {
            if let Outcome::Failed(why) = o {
                println!("    {name}: {}", first_line(why));
            }
        }
    }
    if skipped > 0 {
        println!("Skipped:");
        for (name, o) in results {
            if let Outcome::Skipped(why) = o {
                println!("    {name}: {why}");
            }
        }
    }
    failed == 0
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}
