//! `mtgdrcopy_sanity`: upstream GDRCopy's sanity suite, ported to Moore Threads GPUs, plus the
//! cases for what differs here (page sizes, persistent pins, refused flags and mapping types,
//! the version handshake, provider faults, managed memory), and the dma-buf backend's own
//! cases (`dmabuf_*`, which force that backend themselves). The cases that drive the emulated
//! provider (`dmabuf_*`, `fault_*`) are built only with the `emulator` feature: the test
//! suite's tools have them, the packaged ones do not.
//!
//! The suite runs against whichever backend `gdr_open` picks: with mtgdrdrv loaded, the module
//! (unless `GDRCOPY_USE_DMABUF_MMAP=1`), else the dma-buf backend. Cases about what only the
//! module does skip on the dma-buf backend, saying so.
//!
//! Every case is a plain function of a [`Ctx`] that returns `Ok(())` (passed), an error
//! (failed) or a [`Skip`] error (skipped, with the reason). [`runner`] runs each one in its own
//! forked process group with a timeout, as upstream does. The case process starts without a
//! MUSA context: a case opens the GPU itself ([`Ctx::gpu`]), after any fork it needs, because
//! a driver API initialised before `fork` is not usable in the child.
//!
//! Upstream's `_vmmalloc` variants run the `_mumemalloc` case bodies on memory from MUSA's VMM
//! API (`muMemCreate` with `gpuDirectRDMACapable`, reserved, mapped, read-write: upstream's
//! `gpu_vmm_alloc`): [`Ctx::alloc`] says which memory a case's [`Ctx::gpu`] allocates. They are
//! skipped where the device reports no GPUDirect RDMA with VMM memory, as upstream waives them.
//! Upstream cases left out on purpose would be named in [`NOT_PORTED`], listed by `-l` and
//! reported as skipped when asked for by name; none is.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;

use crate::gpu::{AllocFn, Gpu};

mod attributes;
mod basic;
mod data_validation;
#[cfg(feature = "emulator")]
mod dmabuf;
#[cfg(feature = "emulator")]
mod faults;
mod invalidation;
mod leakage;
pub mod names;
pub mod report;
pub mod runner;
pub use support::{emulated, Counters};
mod support;

/// Ends the case as skipped with a formatted reason.
macro_rules! skip {
    ($($arg:tt)*) => {
        return Err($crate::sanity::Skip(format!($($arg)*)).into())
    };
}
use skip;

/// What every case gets: the device to use, and how its buffers are allocated.
#[derive(Clone, Debug)]
pub struct Ctx {
    /// MUSA device ordinal (`-d`).
    pub device: i32,
    /// `muMemAlloc` for the `_mumemalloc` cases, the VMM API for the `_vmmalloc` ones.
    pub alloc: AllocFn,
}

impl Ctx {
    /// Opens the case's GPU (MUSA driver API) in the calling process; its `alloc` is
    /// [`Ctx::alloc`]'s. A device without pinnable VMM memory skips a VMM case.
    pub fn gpu(&self) -> Result<Box<dyn Gpu>> {
        let gpu = crate::musa::open(self.device)?;
        if self.alloc == AllocFn::MuMemCreate {
            if let Err(e) = gpu.vmm_supported() {
                skip!("no VMM memory to pin here: {e:#}");
            }
        }
        crate::gpu::with_alloc_fn(gpu, self.alloc)
    }

    /// The same case on VMM memory.
    fn vmm(&self) -> Ctx {
        Ctx {
            alloc: AllocFn::MuMemCreate,
            ..self.clone()
        }
    }
}

/// A case that cannot run here; the reason says why (missing emulator, VMM, privileges).
#[derive(Debug)]
pub struct Skip(pub String);

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Skip {}

static VERBOSE: AtomicBool = AtomicBool::new(false);

/// Turns the cases' progress messages (`-v`) on or off for this process and its children.
pub fn set_verbose(on: bool) {
    VERBOSE.store(on, Ordering::Relaxed);
}

pub fn verbose() -> bool {
    VERBOSE.load(Ordering::Relaxed)
}

/// A progress message of a case, printed to stderr with `-v` (upstream's `print_dbg`).
macro_rules! note {
    ($($arg:tt)*) => {
        if $crate::sanity::verbose() {
            eprintln!("  {}", format_args!($($arg)*));
        }
    };
}
use note;

/// One registered case.
#[derive(Clone, Copy)]
pub struct Case {
    pub name: &'static str,
    pub run: fn(&Ctx) -> Result<()>,
    /// Extended cases run only with `-e` or when named with `-t`.
    pub extended: bool,
    /// Cases that drive the emulated provider (fault injection, the emulated libmusa's dma-buf
    /// modes), built only with the `emulator` feature: listed and run only where
    /// /dev/mtgpu_emu exists; named with `-t` elsewhere, they are reported skipped.
    pub emulator_only: bool,
}

macro_rules! case {
    ($module:ident :: $f:ident) => {
        case!(@ $module::$f, false, false)
    };
    (extended $module:ident :: $f:ident) => {
        case!(@ $module::$f, true, false)
    };
    (emulated $module:ident :: $f:ident) => {
        case!(@ $module::$f, false, true)
    };
    (@ $module:ident :: $f:ident, $extended:expr, $emulator_only:expr) => {
        Case {
            name: stringify!($f),
            run: $module::$f,
            extended: $extended,
            emulator_only: $emulator_only,
        }
    };
}

/// Upstream's `_vmmalloc` cases: `$vmm` runs the body of `$mum` on VMM memory.
macro_rules! vmm_cases {
    ($($module:ident :: $vmm:ident => $mum:ident),* $(,)?) => {
        $(
            /// Upstream's case of this name: the `_mumemalloc` case's body on memory from the
            /// VMM API (muMemCreate, reserved, mapped, read-write).
            pub fn $vmm(ctx: &Ctx) -> Result<()> {
                $module::$mum(&ctx.vmm())
            }
        )*
        /// The `_vmmalloc` cases, registered as the others.
        fn vmm_case_list() -> Vec<Case> {
            vec![$(Case {
                name: stringify!($vmm),
                run: $vmm,
                extended: false,
                emulator_only: false,
            }),*]
        }
    };
}

vmm_cases! {
    basic::basic_vmmalloc => basic_mumemalloc,
    basic::basic_v2_vmmalloc => basic_v2_mumemalloc,
    basic::basic_v2_forcepci_vmmalloc => basic_v2_forcepci_mumemalloc,
    basic::basic_child_thread_pins_buffer_vmmalloc => basic_child_thread_pins_buffer_mumemalloc,
    data_validation::data_validation_vmmalloc => data_validation_mumemalloc,
    invalidation::invalidation_access_after_free_vmmalloc => invalidation_access_after_free_mumemalloc,
    invalidation::invalidation_access_after_gdr_close_vmmalloc =>
        invalidation_access_after_gdr_close_mumemalloc,
    invalidation::invalidation_fork_access_after_free_vmmalloc =>
        invalidation_fork_access_after_free_mumemalloc,
    invalidation::invalidation_fork_after_gdr_map_vmmalloc => invalidation_fork_after_gdr_map_mumemalloc,
    invalidation::invalidation_fork_child_gdr_map_parent_vmmalloc =>
        invalidation_fork_child_gdr_map_parent_mumemalloc,
    invalidation::invalidation_fork_map_and_free_vmmalloc => invalidation_fork_map_and_free_mumemalloc,
    invalidation::invalidation_two_mappings_vmmalloc => invalidation_two_mappings_mumemalloc,
    invalidation::invalidation_unix_sock_shared_fd_gdr_map_vmmalloc =>
        invalidation_unix_sock_shared_fd_gdr_map_mumemalloc,
    invalidation::invalidation_unix_sock_shared_fd_gdr_pin_buffer_vmmalloc =>
        invalidation_unix_sock_shared_fd_gdr_pin_buffer_mumemalloc,
}

/// Every case, regular ones first, each group in alphabetical order (upstream's order).
pub fn cases() -> Vec<Case> {
    let mut all = vec![
        case!(attributes::attributes_sanity),
        case!(attributes::version_handshake_unsupported_major),
        case!(basic::basic_child_thread_pins_buffer_mumemalloc),
        case!(basic::basic_host_page_granule_mumemalloc),
        case!(basic::basic_managed_memory_refused),
        case!(basic::basic_mumemalloc),
        case!(basic::basic_pin_granule_mumemalloc),
        case!(basic::basic_pin_spanning_two_allocations_mumemalloc),
        case!(basic::basic_small_buffers_mapping),
        case!(basic::basic_unaligned_mapping),
        case!(basic::basic_v2_forcepci_mumemalloc),
        case!(basic::basic_v2_mumemalloc),
        case!(basic::basic_with_tokens),
        case!(data_validation::data_validation_device_mapping_mumemalloc),
        case!(data_validation::data_validation_mix_mappings_mumemalloc),
        case!(data_validation::data_validation_mumemalloc),
        case!(data_validation::data_validation_v2_forcepci_mumemalloc),
        case!(data_validation::data_validation_v2_mumemalloc),
        case!(invalidation::invalidation_access_after_free_mumemalloc),
        case!(invalidation::invalidation_access_after_gdr_close_mumemalloc),
        case!(invalidation::invalidation_access_after_unpin_mumemalloc),
        case!(invalidation::invalidation_callback_flag_after_free_mumemalloc),
        case!(invalidation::invalidation_fork_access_after_free_mumemalloc),
        case!(invalidation::invalidation_fork_after_gdr_map_mumemalloc),
        case!(invalidation::invalidation_fork_child_gdr_map_parent_mumemalloc),
        case!(invalidation::invalidation_fork_child_gdr_pin_parent_with_tokens),
        case!(invalidation::invalidation_fork_map_and_free_mumemalloc),
        case!(invalidation::invalidation_two_mappings_mumemalloc),
        case!(invalidation::invalidation_unix_sock_shared_fd_gdr_map_mumemalloc),
        case!(invalidation::invalidation_unix_sock_shared_fd_gdr_pin_buffer_mumemalloc),
        case!(extended leakage::leakage_pin_pages_fork_mumemalloc),
    ];
    all.extend(vmm_case_list());
    all.extend(emulated_cases());
    all.sort_by_key(|c| (c.extended, c.name));
    all
}

/// The cases that drive the emulated provider: built only with the `emulator` feature (the
/// test suite's tools), so the packaged sanity has none of them and links no test crate.
#[cfg(feature = "emulator")]
fn emulated_cases() -> Vec<Case> {
    vec![
        case!(emulated dmabuf::dmabuf_backend_differences),
        case!(emulated dmabuf::dmabuf_close_ordering),
        case!(emulated dmabuf::dmabuf_fd_closed_on_gdr_close),
        case!(emulated dmabuf::dmabuf_fd_closed_on_unpin),
        case!(emulated dmabuf::dmabuf_fork),
        case!(emulated dmabuf::dmabuf_host_page_granule),
        case!(emulated dmabuf::dmabuf_refused_mmap),
        case!(emulated dmabuf::dmabuf_unsupported_device),
        case!(emulated faults::fault_get_pages_bad_page_size),
        case!(emulated faults::fault_get_pages_bad_version),
        case!(emulated faults::fault_get_pages_einval),
        case!(emulated faults::fault_get_pages_enomem),
    ]
}

#[cfg(not(feature = "emulator"))]
fn emulated_cases() -> Vec<Case> {
    Vec::new()
}

/// Upstream cases left out on purpose, each with the reason: none since the `_vmmalloc` cases
/// were ported (issue 31).
pub const NOT_PORTED: &[(&str, &str)] = &[];

/// The reason `name` is not ported, if it is one of [`NOT_PORTED`].
pub fn not_ported(name: &str) -> Option<&'static str> {
    NOT_PORTED
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, why)| *why)
}

/// Known names closest to `name` (for "unknown test" errors): substring matches first, then
/// small edit distances.
pub fn close_names<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut scored: Vec<(usize, &str)> = known
        .into_iter()
        .filter_map(|k| {
            let d = if k.contains(name) || name.contains(k) {
                0
            } else {
                edit_distance(name, k)
            };
            (d <= (name.len() / 3).max(3)).then_some((d, k))
        })
        .collect();
    scored.sort();
    scored.into_iter().take(5).map(|(_, k)| k).collect()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_sorted_and_not_also_unported() {
        let all = cases();
        let names: Vec<&str> = all.iter().map(|c| c.name).collect();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "duplicate names");
        for c in &all {
            assert!(not_ported(c.name).is_none(), "{} is both", c.name);
        }
        let regular: Vec<&str> = all.iter().filter(|c| !c.extended).map(|c| c.name).collect();
        let mut r = regular.clone();
        r.sort();
        assert_eq!(r, regular, "regular cases run in alphabetical order");
    }

    /// Upstream's 14 `_vmmalloc` cases exist under upstream's names, each beside the
    /// `_mumemalloc` case whose body it runs.
    #[test]
    fn every_upstream_vmmalloc_case_is_ported() {
        let names: Vec<&str> = cases().iter().map(|c| c.name).collect();
        let vmm: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| n.ends_with("_vmmalloc"))
            .collect();
        assert_eq!(vmm.len(), 14, "{vmm:?}");
        for n in [
            "basic_vmmalloc",
            "basic_v2_vmmalloc",
            "basic_v2_forcepci_vmmalloc",
            "basic_child_thread_pins_buffer_vmmalloc",
            "data_validation_vmmalloc",
            "invalidation_access_after_free_vmmalloc",
            "invalidation_access_after_gdr_close_vmmalloc",
            "invalidation_fork_access_after_free_vmmalloc",
            "invalidation_fork_after_gdr_map_vmmalloc",
            "invalidation_fork_child_gdr_map_parent_vmmalloc",
            "invalidation_fork_map_and_free_vmmalloc",
            "invalidation_two_mappings_vmmalloc",
            "invalidation_unix_sock_shared_fd_gdr_map_vmmalloc",
            "invalidation_unix_sock_shared_fd_gdr_pin_buffer_vmmalloc",
        ] {
            assert!(vmm.contains(&n), "{n} missing");
            let mum = n.replace("_vmmalloc", "_mumemalloc");
            assert!(names.contains(&mum.as_str()), "{n} has no {mum}");
        }
        assert!(NOT_PORTED.is_empty());
    }

    #[test]
    fn close_names_suggests_typos_and_substrings() {
        let known = [
            "basic_mumemalloc",
            "basic_v2_mumemalloc",
            "attributes_sanity",
        ];
        assert_eq!(
            close_names("basic_cumemalloc", known),
            ["basic_mumemalloc", "basic_v2_mumemalloc"]
        );
        assert_eq!(close_names("attributes", known), ["attributes_sanity"]);
        assert!(close_names("zzzzzzzzzz", known).is_empty());
    }
}
