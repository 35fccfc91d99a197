//! Upstream GDRCopy's case names, accepted by `-t` beside ours and shown by `-l`.
//!
//! Upstream names the cases of memory from `cuMemAlloc` `*_cumemalloc`; ours allocate with
//! `muMemAlloc` and say `*_mumemalloc`. Every other upstream name (`basic_with_tokens`,
//! `attributes_sanity`, the `*_vmmalloc` cases, ...) is ours as well, so it passes through
//! unchanged. A case asked for by its upstream name is reported under that name, since a script
//! greps for what it asked.

/// Every case of upstream's gdrcopy_sanity (GDRCopy 2.6): 36 regular ones and the extended
/// `leakage_pin_pages_fork_cumemalloc`, in its order.
pub const UPSTREAM: [&str; 37] = [
    "attributes_sanity",
    "basic_child_thread_pins_buffer_cumemalloc",
    "basic_child_thread_pins_buffer_vmmalloc",
    "basic_cumemalloc",
    "basic_small_buffers_mapping",
    "basic_unaligned_mapping",
    "basic_v2_cumemalloc",
    "basic_v2_forcepci_cumemalloc",
    "basic_v2_forcepci_vmmalloc",
    "basic_v2_vmmalloc",
    "basic_vmmalloc",
    "basic_with_tokens",
    "data_validation_cumemalloc",
    "data_validation_mix_mappings_cumemalloc",
    "data_validation_v2_cumemalloc",
    "data_validation_v2_forcepci_cumemalloc",
    "data_validation_vmmalloc",
    "invalidation_access_after_free_cumemalloc",
    "invalidation_access_after_free_vmmalloc",
    "invalidation_access_after_gdr_close_cumemalloc",
    "invalidation_access_after_gdr_close_vmmalloc",
    "invalidation_fork_access_after_free_cumemalloc",
    "invalidation_fork_access_after_free_vmmalloc",
    "invalidation_fork_after_gdr_map_cumemalloc",
    "invalidation_fork_after_gdr_map_vmmalloc",
    "invalidation_fork_child_gdr_map_parent_cumemalloc",
    "invalidation_fork_child_gdr_map_parent_vmmalloc",
    "invalidation_fork_child_gdr_pin_parent_with_tokens",
    "invalidation_fork_map_and_free_cumemalloc",
    "invalidation_fork_map_and_free_vmmalloc",
    "invalidation_two_mappings_cumemalloc",
    "invalidation_two_mappings_vmmalloc",
    "invalidation_unix_sock_shared_fd_gdr_map_cumemalloc",
    "invalidation_unix_sock_shared_fd_gdr_map_vmmalloc",
    "invalidation_unix_sock_shared_fd_gdr_pin_buffer_cumemalloc",
    "invalidation_unix_sock_shared_fd_gdr_pin_buffer_vmmalloc",
    "leakage_pin_pages_fork_cumemalloc",
];

const UPSTREAM_SUFFIX: &str = "_cumemalloc";
const OUR_SUFFIX: &str = "_mumemalloc";

/// Our name for `name`: itself when `known` (a name of ours), else the `_mumemalloc` case that
/// an upstream `_cumemalloc` name stands for, if that is known.
pub fn resolve<'a>(
    name: &'a str,
    known: impl Fn(&str) -> bool,
) -> Option<std::borrow::Cow<'a, str>> {
    if known(name) {
        return Some(name.into());
    }
    let ours = format!("{}{OUR_SUFFIX}", name.strip_suffix(UPSTREAM_SUFFIX)?);
    known(&ours).then_some(ours.into())
}

/// Upstream's name for our case `ours`, where it differs from ours (for `-l`).
pub fn upstream_alias(ours: &str) -> Option<String> {
    let upstream = format!("{}{UPSTREAM_SUFFIX}", ours.strip_suffix(OUR_SUFFIX)?);
    UPSTREAM.contains(&upstream.as_str()).then_some(upstream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sanity::{cases, not_ported};

    fn ours(name: &str) -> bool {
        cases().iter().any(|c| c.name == name) || not_ported(name).is_some()
    }

    #[test]
    fn every_upstream_name_is_one_of_our_cases() {
        let mut sorted = UPSTREAM.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 37);
        for name in UPSTREAM {
            let ours_name = resolve(name, ours).unwrap_or_else(|| panic!("{name} is not ours"));
            if name.ends_with("_cumemalloc") {
                assert_eq!(upstream_alias(&ours_name).as_deref(), Some(name));
            }
        }
        let extended: Vec<&str> = cases()
            .iter()
            .filter(|c| c.extended)
            .map(|c| c.name)
            .collect();
        assert!(extended.contains(
            &resolve("leakage_pin_pages_fork_cumemalloc", ours)
                .unwrap()
                .as_ref()
        ));
    }

    #[test]
    fn names_of_ours_pass_through_and_unknown_ones_do_not_resolve() {
        let known = |n: &str| ["basic_mumemalloc", "basic_vmmalloc", "x_cumemalloc"].contains(&n);
        assert_eq!(
            resolve("basic_mumemalloc", known).as_deref(),
            Some("basic_mumemalloc")
        );
        assert_eq!(
            resolve("basic_cumemalloc", known).as_deref(),
            Some("basic_mumemalloc")
        );
        assert_eq!(
            resolve("basic_vmmalloc", known).as_deref(),
            Some("basic_vmmalloc")
        );
        // A name of ours that happens to end like upstream's is ours.
        assert_eq!(
            resolve("x_cumemalloc", known).as_deref(),
            Some("x_cumemalloc")
        );
        assert_eq!(resolve("basic_v2_cumemalloc", known), None);
        assert_eq!(resolve("nothing", known), None);
    }

    #[test]
    fn only_cases_upstream_has_get_an_alias() {
        assert_eq!(
            upstream_alias("basic_mumemalloc").as_deref(),
            Some("basic_cumemalloc")
        );
        assert_eq!(upstream_alias("basic_host_page_granule_mumemalloc"), None);
        assert_eq!(upstream_alias("basic_with_tokens"), None);
        assert_eq!(upstream_alias("basic_vmmalloc"), None);
    }
}
