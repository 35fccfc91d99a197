//! What the module shows under `/proc/driver/mtgdrdrv`: its parameters and its counters, one
//! `name value` line each. The files are part of the module's interface (tests, the tools and
//! bug reports read them), so their paths, the counters' names and the one parser live here.

/// The module's parameters and version.
pub const PARAMS_PATH: &str = "/proc/driver/mtgdrdrv/params";
/// The module's counters, [`COUNTER_NAMES`] in that order.
pub const COUNTERS_PATH: &str = "/proc/driver/mtgdrdrv/counters";

/// The counters, in the order the module prints them (`mtgdrdrv_counters_show`).
pub const COUNTER_NAMES: [&str; 13] = [
    "pins_outstanding",
    "bytes_pinned",
    "mappings",
    "get_pages_calls",
    "put_pages_calls",
    "get_pages_refused",
    "bad_tables",
    "provider_unavailable",
    "deferred_puts",
    "pins_over_limit",
    "stale_maps",
    "wc_came_out_uc",
    "device_came_out_wc",
];

/// The counters that return to 0 when nothing is pinned or mapped.
pub const LIVE_COUNTERS: [&str; 3] = ["pins_outstanding", "bytes_pinned", "mappings"];

/// Every `name value` line of a counters text (a `name:` spelling accepted); lines that are not
/// a name and a number are skipped.
pub fn parse_counters(text: &str) -> impl Iterator<Item = (&str, i64)> + '_ {
    text.lines().filter_map(|line| {
        let mut fields = line.split_whitespace();
        let name = fields.next()?.trim_end_matches(':');
        let value = fields.next()?.parse().ok()?;
        Some((name, value))
    })
}

/// The value of counter `name` in a counters text.
pub fn counter(text: &str, name: &str) -> Option<i64> {
    parse_counters(text).find_map(|(n, v)| (n == name).then_some(v))
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn lines_are_parsed_and_noise_is_skipped() {
        let text = "pins_outstanding 2\nbytes_pinned: 131072\nnot a line\nmappings -1\n";
        let all: std::vec::Vec<_> = parse_counters(text).collect();
        assert_eq!(
            all,
            [
                ("pins_outstanding", 2),
                ("bytes_pinned", 131072),
                ("mappings", -1)
            ]
        );
        assert_eq!(counter(text, "bytes_pinned"), Some(131072));
        assert_eq!(counter(text, "deferred_puts"), None);
    }

    #[test]
    fn the_module_prints_these_counters_in_this_order() {
        let source = include_str!("../kmod/mtgdrdrv_main.c");
        let printed: std::vec::Vec<&str> = source
            .lines()
            .filter_map(|l| {
                let call = l.trim().strip_prefix("mtgdrdrv_show_counter(m, c, ")?;
                call.strip_suffix(");")
            })
            .collect();
        assert_eq!(printed, COUNTER_NAMES);
        assert!(LIVE_COUNTERS.iter().all(|n| COUNTER_NAMES.contains(n)));
    }
}
