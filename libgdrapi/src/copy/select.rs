//! Which variant a process copies with: the architecture's preferred supported one, or the one
//! `GDRCOPY_COPY_VARIANT` names. A function of the variable's value (and the CPU), so that
//! tests can ask what a value selects without setting the process's environment.

use std::ffi::OsStr;

use super::{variants, Variant, GENERIC, VARIANT_ENV};

/// The variant used when nothing is forced: the first supported one not kept for requests.
pub fn default_variant() -> &'static Variant {
    variants()
        .iter()
        .find(|v| !v.on_request && v.is_supported())
        .unwrap_or(&GENERIC)
}

/// The variant `GDRCOPY_COPY_VARIANT=forced` (`None`: unset) selects on this CPU, and the
/// warning to print when the value selects nothing.
pub(super) fn choose(forced: Option<&OsStr>) -> (&'static Variant, Option<String>) {
    let best = default_variant();
    let Some(value) = forced else {
        return (best, None);
    };
    let warning = match value.to_str() {
        Some(name) => match variants().iter().find(|v| v.name == name) {
            Some(v) if v.is_supported() => return (v, None),
            Some(_) => format!(
                "{VARIANT_ENV}={name}: this CPU lacks the features it needs; using {}",
                best.name
            ),
            None => format!(
                "{VARIANT_ENV}={name}: unknown variant (known: {}); using {}",
                variant_names(),
                best.name
            ),
        },
        None => format!(
            "{VARIANT_ENV}={}: not UTF-8, so no variant (known: {}); using {}",
            value.to_string_lossy(),
            variant_names(),
            best.name
        ),
    };
    (best, Some(warning))
}

/// Reads `GDRCOPY_COPY_VARIANT` and chooses. Runs once per process.
pub(super) fn select() -> &'static Variant {
    let (chosen, warning) = choose(std::env::var_os(VARIANT_ENV).as_deref());
    // A value that selects nothing is ignored with one warning, logging on or off: a tuning
    // knob that silently does nothing costs users hours.
    if let Some(warning) = warning {
        crate::log::warn_always(format_args!("{warning}"));
    }
    crate::log::info(format_args!("copy variant: {}", chosen.name));
    chosen
}

fn variant_names() -> String {
    variants()
        .iter()
        .map(|v| v.name)
        .collect::<Vec<_>>()
        .join(", ")
}
