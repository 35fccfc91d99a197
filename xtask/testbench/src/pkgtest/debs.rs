//! The .debs as the package tests take them: built once for all the steps, picked by package;
//! and the architecture they are built for.

use std::cell::RefCell;
use std::rc::Rc;

use anyhow::{Context, Result};
use xshell::Shell;

use xtask_base::workspace::Workspace;
use xtask_pack::deb::{self, Built};
use xtask_pack::stage::Package;

/// The .debs, built on first use.
pub(super) fn built(sh: &Shell, cache: &Rc<RefCell<Option<Vec<Built>>>>) -> Result<Vec<Built>> {
    if let Some(debs) = cache.borrow().as_ref() {
        return Ok(debs.clone());
    }
    let ws = Workspace::load()?;
    let debs = deb::build_everything(sh, &ws)?;
    for d in &debs {
        eprintln!("    {}", d.path.display());
    }
    *cache.borrow_mut() = Some(debs.clone());
    Ok(debs)
}

pub(super) fn find(debs: &[Built], package: Package) -> Result<&Built> {
    debs.iter()
        .find(|d| d.package == package)
        .with_context(|| format!("no .deb was built for {package:?}"))
}

/// The Debian architecture and multiarch tuple of the machine we build on (native builds only).
#[derive(Clone, Copy, Debug)]
pub struct Arch {
    pub debian: &'static str,
    pub multiarch: &'static str,
}

pub(super) fn host_arch() -> Result<Arch> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(Arch {
            debian: "amd64",
            multiarch: "x86_64-linux-gnu",
        }),
        "aarch64" => Ok(Arch {
            debian: "arm64",
            multiarch: "aarch64-linux-gnu",
        }),
        other => anyhow::bail!("packaging for {other} is not set up (amd64 and arm64 are)"),
    }
}
