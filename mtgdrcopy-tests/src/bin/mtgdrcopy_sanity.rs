//! mtgdrcopy_sanity: checks that GDRCopy works on this machine (library, module, GPU memory):
//! upstream GDRCopy's sanity cases ported to Moore Threads GPUs, plus mtgpu's own.
//!
//! Each case runs in its own forked process group with a timeout. The run ends with upstream
//! GDRCopy's line `Total: N, Passed: N, Failed: N, Waived: N`, ours, `N passed, N failed`
//! (`, N skipped` when any were skipped), and the lists of failed and skipped cases (none of
//! it with `-s`), or with TAP or JSON lines (`--format`). With `-v`, upstream's banners
//! (`&&&& RUNNING name`, then `&&&& PASSED|FAILED|WAIVED name`) go to standard error, as
//! upstream's do. Upstream's case names are accepted by `-t` (sanity/names.rs). Exit status: 0 when no case failed,
//! 1 when one did, 2 for a usage error, 77 when the machine cannot run the cases (no
//! libgdrapi, MUSA driver, GPU or backend).

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Parser;

use mtgdrcopy_tests::cli::sanity::Args;
use mtgdrcopy_tests::gdr;
use mtgdrcopy_tests::sanity::report::{self, Report};
use mtgdrcopy_tests::sanity::runner::{run_case, run_isolated, Outcome};
use mtgdrcopy_tests::sanity::{self, names, Case, Ctx};
use mtgdrcopy_tests::tool::{self, Status};

const PROGRAM: &str = "mtgdrcopy_sanity";

/// One case to run, or an upstream case that is not ported here (reported as skipped), each
/// with the name it is reported under: the one given to `-t` (ours or upstream's).
enum Selected {
    Run(String, Case),
    NotPorted(String, &'static str),
    NotHere(String),
}

impl Selected {
    fn name(&self) -> &str {
        match self {
            Selected::Run(n, _) | Selected::NotPorted(n, _) | Selected::NotHere(n) => n,
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    tool::main(PROGRAM, &args.version, |_| {
        run(&args).inspect_err(|e| {
            let status = tool::status_of(e);
            if status != Status::Usage {
                // The machine-readable formats say why nothing ran, on stdout too.
                let _ = Report::bail_out(
                    args.format,
                    std::io::stdout().lock(),
                    &format!("{e:#}"),
                    status.code(),
                );
            }
        })
    })
}

/// Runs the selection.
fn run(args: &Args) -> Result<Status> {
    let all = sanity::cases();
    let emulated = sanity::emulated();
    if args.list {
        list(&all, emulated);
        return Ok(Status::Passed);
    }
    let selection = select(&all, args, emulated)?;
    sanity::set_verbose(args.verbose);
    let ctx = Ctx {
        device: args.device,
        alloc: Default::default(),
    };
    let timeout = Duration::from_secs(args.timeout);
    preflight(&ctx, timeout)?;

    let start = Instant::now();
    let mut report = Report::start(args.format, std::io::stdout().lock(), selection.len())?;
    if args.no_summary {
        report = report.without_summary();
    }
    for sel in &selection {
        let name = sel.name();
        if args.verbose {
            eprintln!("&&&& RUNNING {name}");
        }
        let pins_before = sanity::Counters::read().ok();
        let case_start = Instant::now();
        let outcome = match sel {
            Selected::Run(_, case) => run_case(case, &ctx, timeout)?,
            Selected::NotPorted(_, why) => Outcome::Skipped(why.to_string()),
            Selected::NotHere(_) => Outcome::Skipped(
                "drives the emulated provider (/dev/mtgpu_emu), which only the tests have".into(),
            ),
        };
        let seconds = case_start.elapsed().as_secs_f64();
        if let (Some(before), Some(after)) = (pins_before, sanity::Counters::read().ok()) {
            if after != before {
                eprintln!(
                    "warning: {name}: the module's counters went from {before:?} to {after:?} \
                     (a leak, or another process using the device)"
                );
            }
        }
        match &outcome {
            Outcome::Failed(why) => eprintln!("{name}: {why}"),
            Outcome::Skipped(why) if args.verbose => eprintln!("{name}: skipped: {why}"),
            _ => {}
        }
        if args.verbose {
            eprintln!("{}", report::upstream_banner(name, &outcome));
        }
        report.case(name, outcome, seconds)?;
    }
    if args.verbose {
        eprintln!(
            "ran {} cases in {:.1} s",
            selection.len(),
            start.elapsed().as_secs_f64()
        );
    }
    Ok(if report.finish()? {
        Status::Passed
    } else {
        Status::Failed
    })
}

/// The cases, in upstream's groups and headings, each with upstream's name where it differs
/// (`basic_mumemalloc (upstream: basic_cumemalloc)`); those that drive the emulator only
/// where it exists.
fn list(all: &[Case], emulated: bool) {
    let mut out = std::io::stdout().lock();
    let listed = |c: &&Case| emulated || !c.emulator_only;
    let line = |c: &Case| match names::upstream_alias(c.name) {
        Some(upstream) => format!("    {} (upstream: {upstream})", c.name),
        None => format!("    {}", c.name),
    };
    let _ = writeln!(out, "List of all available tests:");
    for c in all.iter().filter(listed).filter(|c| !c.extended) {
        let _ = writeln!(out, "{}", line(c));
    }
    let _ = writeln!(out, "\nList of all available extended tests:");
    for c in all.iter().filter(listed).filter(|c| c.extended) {
        let _ = writeln!(out, "{}", line(c));
    }
    if !sanity::NOT_PORTED.is_empty() {
        let _ = writeln!(out, "\nNot ported:");
        for (n, why) in sanity::NOT_PORTED {
            let _ = writeln!(out, "    {n} ({why})");
        }
    }
}

/// The cases to run: those named with -t (in the order given), else every regular case and,
/// with -e, the extended ones; cases that drive the emulator only where it exists.
fn select(all: &[Case], args: &Args, emulated: bool) -> Result<Vec<Selected>> {
    if args.tests.is_empty() {
        return Ok(all
            .iter()
            .filter(|c| args.extended || !c.extended)
            .filter(|c| emulated || !c.emulator_only)
            .map(|c| Selected::Run(c.name.to_string(), *c))
            .collect());
    }
    let mut out: Vec<Selected> = Vec::new();
    for given in &args.tests {
        if out.iter().any(|s| s.name() == given) {
            continue;
        }
        let known = |n: &str| all.iter().any(|c| c.name == n) || sanity::not_ported(n).is_some();
        let name = names::resolve(given, known).unwrap_or(given.into());
        let shown = given.clone();
        if let Some(c) = all.iter().find(|c| c.name == name) {
            out.push(if emulated || !c.emulator_only {
                Selected::Run(shown, *c)
            } else {
                Selected::NotHere(shown)
            });
        } else if let Some(why) = sanity::not_ported(&name) {
            out.push(Selected::NotPorted(shown, why));
        } else {
            let known = all
                .iter()
                .filter(|c| emulated || !c.emulator_only)
                .map(|c| c.name)
                .chain(sanity::NOT_PORTED.iter().map(|(n, _)| *n));
            let close = sanity::close_names(given, known);
            if close.is_empty() {
                bail!(tool::usage(format!(
                    "unknown test {given:?} (-l lists them)"
                )));
            }
            bail!(tool::usage(format!(
                "unknown test {given:?}; did you mean: {}? (-l lists them)",
                close.join(", ")
            )));
        }
    }
    Ok(out)
}

/// Checks, in a forked process (the harness itself never initialises MUSA, which would not
/// survive fork), that libgdrapi loads, the device opens and a backend answers. A failure is
/// one line and means the machine cannot run the cases (exit status 77).
fn preflight(ctx: &Ctx, timeout: Duration) -> Result<()> {
    let device = ctx.device;
    let outcome = run_isolated(
        || {
            mtgdrcopy_tests::gdr::api()?;
            let gpu = ctx.gpu()?;
            let using_dmabuf = gdr::Gdr::open()?.using_dmabuf();
            if let Some(warning) = gdr::fallback_warning(using_dmabuf) {
                eprintln!("{PROGRAM}: warning: {warning}");
            }
            if sanity::verbose() {
                eprint!("{}", tool::versions(PROGRAM));
                eprintln!(
                    "GPU {device}:      {} ({})",
                    gpu.name(),
                    gpu.pci_bus_id().unwrap_or_else(|| "bus id unknown".into()),
                );
            }
            Ok(())
        },
        timeout,
    )?;
    match outcome {
        Outcome::Passed => Ok(()),
        Outcome::Failed(why) | Outcome::Skipped(why) => {
            Err(tool::unavailable(anyhow::anyhow!(why)))
        }
    }
}
