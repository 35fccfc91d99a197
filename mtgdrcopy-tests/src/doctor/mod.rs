//! mtgdrcopy_doctor's checks: the whole chain a copy needs on this host or in this container,
//! one line each, `OK`, `WARN` or `FAIL` with the fix.
//!
//! Every check reads what it needs from files under a root ([`Host`]: `/` for the tool, a
//! fabricated tree in the unit tests) and from the facts of this process ([`Process`]); the
//! decisions are plain functions of those, so that each one is tested on the host. The checks
//! never call into the mtgpu driver: loaded with `disable_driver=1` it crashes its callers, so
//! its state is read from sysfs only, and libmusa is initialised only when mtgpu is live.

pub mod cpu;
pub mod gpus;
pub mod host;
pub mod modules;
pub mod musa;
pub mod node;
pub mod report;

pub use host::{Host, Process};
pub use report::{Level, Line};

use crate::cli::doctor::Args;

/// What the checks found, in the contract's order, and whether there was anything to check.
pub struct Outcome {
    pub lines: Vec<Line>,
    /// None of the mtgpu driver, mtgdrdrv and libmusa is on this system.
    pub nothing_to_check: bool,
}

/// Runs every check on this system.
pub fn run(args: &Args) -> Outcome {
    let host = Host::system();
    let process = Process::current();
    let provider = modules::provider_name();
    let provider_state = modules::provider(&host, &provider);
    let driver = modules::mtgdrdrv(&host);
    // libmusa's own initialisation talks to mtgpu: never while mtgpu is not live.
    let library = musa::probe(provider_state.is_live());
    let nothing_to_check = matches!(provider_state, modules::Provider::Missing)
        && driver.is_none()
        && library.is_none();
    if nothing_to_check {
        return Outcome {
            lines: Vec::new(),
            nothing_to_check,
        };
    }
    let mut lines = vec![
        modules::mtgpu_line(&provider, &provider_state),
        modules::mtgdrdrv_line(driver.as_ref(), &modules::LoadedLibrary::probe()),
    ];
    let node_state = node::probe(&host, node::DEVICE);
    lines.push(node::device_line(
        &host,
        &process,
        &node_state,
        driver.is_some(),
    ));
    if let Some(kind) = node::container_kind(&host) {
        lines.push(node::container_line(
            &host,
            &process,
            &kind,
            driver.is_some(),
            match (
                provider_state.is_live(),
                provider == modules::DEFAULT_PROVIDER,
            ) {
                (false, _) => node::Gpu::None,
                (true, true) => node::Gpu::Real,
                (true, false) => node::Gpu::Emulated,
            },
        ));
    }
    lines.push(musa::library_line(library.as_ref()));
    let gpus = gpus::find(&host, library.as_ref(), provider_state.is_live());
    let selected = gpus::select(&gpus, args.device);
    lines.extend(gpus::gpu_lines(&gpus, args.device, &selected));
    if cfg!(any(target_arch = "x86", target_arch = "x86_64")) {
        lines.push(cpu::pat_line(&cpu::Pat::probe(&host)));
    }
    if !selected.is_empty() {
        lines.push(gpus::numa_line(&host, &process, &selected));
    }
    lines.push(cpu::variant_line(
        gdrapi::copy::selected(),
        std::env::var(gdrapi::copy::VARIANT_ENV).ok().as_deref(),
    ));
    let module_usable = lines
        .iter()
        .filter(|l| l.check == "mtgdrdrv" || l.check == node::DEVICE)
        .all(|l| l.level != Level::Fail);
    lines.push(musa::dmabuf_line(
        library.as_ref(),
        &selected,
        module_usable,
    ));
    Outcome {
        lines,
        nothing_to_check,
    }
}
