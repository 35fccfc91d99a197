//! `libgdrapi/include/gdrapi.h`: prototypes and `#define`s by cbindgen from `libgdrapi/src/capi.rs`;
//! the enums from `capi::C_ENUMS` and the info structs (C bitfields, which cbindgen cannot
//! express) written here. Their layouts are asserted on both sides: `capi.rs` at compile time
//! and the C/C++ header test with `_Static_assert`/`static_assert`. The opening comment is the
//! C API's contract, `libgdrapi/src/capi/overview.md`.

use fs_err as fs;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use gdrapi::capi::C_ENUMS;

use cbindgen::ItemType;
use xtask_base::generated::Generated;

pub fn header(root: &Path) -> Result<Generated> {
    let api_version = format!(
        "{}.{}",
        gdrapi::capi::GDR_API_MAJOR_VERSION,
        gdrapi::capi::GDR_API_MINOR_VERSION
    );
    // The C API's contract, kept beside its implementation (capi.rs's documentation too).
    let overview_path = root.join("libgdrapi/src/capi/overview.md");
    let overview = fs::read_to_string(&overview_path)?;
    let mut intro =
        format!("/*\n * gdrapi.h: GDRCopy for Moore Threads GPUs, API {api_version}.\n *\n");
    for line in overview.lines() {
        writeln!(intro, "{}", format!(" * {line}").trim_end())?;
    }
    intro += " */";
    let mut config = super::config(
        "GDRAPI_H",
        "libgdrapi/src/capi.rs (prototypes, versions, enums)",
        &intro,
    );
    config.style = cbindgen::Style::Type;
    config.usize_is_size_t = true;
    config.cpp_compat = true;
    config.sys_includes = vec!["stddef.h".into(), "stdint.h".into()];
    config.after_includes = Some(types()?);
    config.function.must_use = None;
    // Every type is written by `types()`, as upstream's header declares it.
    config.export.item_types = vec![ItemType::Constants, ItemType::Functions];
    config.export.exclude = [
        // Written by `types()` as upstream's header has them.
        "GPU_PAGE_SHIFT",
        "GPU_PAGE_SIZE",
        "GPU_PAGE_OFFSET",
        "GPU_PAGE_MASK",
        "MAJOR_VERSION_SHIFT",
        "MINOR_VERSION_MASK",
        // A `#define` of gdr_get_info_v2 (below); the v1 symbol is for old binaries only.
        "gdr_get_info",
    ]
    .map(String::from)
    .to_vec();
    config
        .export
        .rename
        .insert("gdr_info_v2".into(), "gdr_info_v2_t".into());
    super::c_header(
        &root.join("libgdrapi/include/gdrapi.h"),
        &root.join("libgdrapi"),
        config,
        "\n/* The v2 layout is the default; the v1 symbol stays exported for old binaries. */\n\
         #define gdr_get_info gdr_get_info_v2\n",
    )
}

/// Types and constants cbindgen cannot write as upstream declares them: code written against
/// upstream's header names `struct gdr_mh_s` and prints `GPU_PAGE_SIZE` with `%lu`.
fn types() -> Result<String> {
    use gdrapi::capi::{GPU_PAGE_SHIFT, GPU_PAGE_SIZE, MAJOR_VERSION_SHIFT, MINOR_VERSION_MASK};
    // The expressions below must mean what the Rust constants say.
    const _: () = assert!(GPU_PAGE_SIZE == 1 << GPU_PAGE_SHIFT);
    const _: () = assert!(MINOR_VERSION_MASK == (1 << MAJOR_VERSION_SHIFT) - 1);
    let mut out = format!(
        "\n#define GPU_PAGE_SHIFT   {GPU_PAGE_SHIFT}\n\
         #define GPU_PAGE_SIZE    (1UL << GPU_PAGE_SHIFT)\n\
         #define GPU_PAGE_OFFSET  (GPU_PAGE_SIZE - 1)\n\
         #define GPU_PAGE_MASK    (~GPU_PAGE_OFFSET)\n\
         \n#define MAJOR_VERSION_SHIFT {MAJOR_VERSION_SHIFT}\n\
         #define MINOR_VERSION_MASK  (((uint32_t)1 << MAJOR_VERSION_SHIFT) - 1)\n\
         \n/* The library's version: libgdrapi's crate version, major.minor. */\n\
         #define GDR_API_MAJOR_VERSION {}\n\
         #define GDR_API_MINOR_VERSION {}\n",
        gdrapi::GDR_API_MAJOR_VERSION,
        gdrapi::GDR_API_MINOR_VERSION
    );
    out.push_str("\nstruct gdr;\n/* An open device; safe to use from several threads at once. */\ntypedef struct gdr *gdr_t;\n");
    out.push_str(
        "\n/* A pinned-buffer handle, passed by value. 0 is never a valid handle. */\n\
         typedef struct gdr_mh_s {\n    unsigned long h;\n} gdr_mh_t;\n",
    );
    for (typedef, tag, enumerators) in C_ENUMS {
        writeln!(out, "\ntypedef enum {tag} {{")?;
        for (name, value) in enumerators.iter() {
            writeln!(out, "    {name} = {value},")?;
        }
        writeln!(out, "}} {typedef};")?;
    }
    out.push_str(
        r#"
/* What gdr_get_info reports about a pin. */
typedef struct gdr_info_v2 {
    uint64_t va;            /* pinned start, rounded down to page_size */
    uint64_t mapped_size;   /* pinned length, rounded up to page_size */
    uint32_t page_size;     /* the pin granule: the host page (see above) */
    uint64_t tm_cycles;     /* deprecated */
    uint32_t cycles_per_ms; /* deprecated */
    unsigned mapped:1;
    unsigned wc_mapping:1;
    gdr_mapping_type_t mapping_type;
} gdr_info_v2_t;
typedef gdr_info_v2_t gdr_info_t;
"#,
    );
    Ok(out)
}

/// The names upstream's gdrapi.h defines without a `gdr_`/`GDR_` prefix; ours may define these
/// and prefixed names only, so that no definition clashes with another header (MUSA's, say).
#[cfg(test)]
const UPSTREAM_UNPREFIXED: [&str; 9] = [
    "GPU_PAGE_SHIFT",
    "GPU_PAGE_SIZE",
    "GPU_PAGE_OFFSET",
    "GPU_PAGE_MASK",
    "MAJOR_VERSION_SHIFT",
    "MINOR_VERSION_MASK",
    "MINIMUM_GDRDRV_MAJOR_VERSION",
    "MINIMUM_GDRDRV_MINOR_VERSION",
    "MINIMUM_GDRDRV_VERSION",
];

/// Every name a C header declares at file scope: macros, struct and enum tags, typedef names,
/// enumerators and functions (comments and parameter lists aside).
#[cfg(test)]
fn declared_names(header: &str) -> Vec<String> {
    let comments = regex_lite::Regex::new(r"(?s)/\*.*?\*/|//[^\n]*").expect("a valid pattern");
    let code = comments.replace_all(header, "");
    // In order: a macro, a tag, the name that closes a typedef's body, a one-line typedef, an
    // enumerator, a prototype's function.
    let declaration = regex_lite::Regex::new(
        r"(?m)#define\s+(\w+)|\b(?:struct|enum)\s+(\w+)|^\}\s*(\w+);|^typedef\b[^{;]*\b(\w+);|^\s+(\w+) = |^\w[^(\n#]*\b(\w+)\(",
    )
    .expect("a valid pattern");
    let mut names: Vec<String> = declaration
        .captures_iter(&code)
        .filter_map(|c| c.iter().skip(1).flatten().next())
        .map(|name| name.as_str().to_string())
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_public_header_defines_only_upstreams_and_prefixed_names() {
        let header =
            std::fs::read_to_string(xtask_base::paths::root().join("libgdrapi/include/gdrapi.h"))
                .expect("gdrapi.h");
        let names = declared_names(&header);
        for expected in [
            "gdr_mh_s",
            "gdr_mh_t",
            "gdr_copy_to_mapping",
            "GPU_PAGE_SIZE",
            "GDR_ATTR_MAX",
        ] {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} not found in {names:?}"
            );
        }
        let foreign: Vec<&String> = names
            .iter()
            .filter(|n| {
                !(n.starts_with("gdr_")
                    || n.starts_with("GDR_")
                    || *n == "gdr"
                    || *n == "GDRAPI_H"
                    || UPSTREAM_UNPREFIXED.contains(&n.as_str()))
            })
            .collect();
        assert!(
            foreign.is_empty(),
            "gdrapi.h defines names of its own: {foreign:?}"
        );
    }

    #[test]
    fn names_are_found_in_every_kind_of_declaration() {
        let header = "#define MU_X 1 /* c */\n/* #define HIDDEN 2 */\ntypedef struct tag_s {\n    \
                      unsigned long h;\n} type_t;\ntypedef enum e_tag {\n    ENUM_A = 0,\n} e_t;\n\
                      typedef uint32_t alias_t;\nint some_fn(int x, void *p);\n";
        assert_eq!(
            declared_names(header),
            ["ENUM_A", "MU_X", "alias_t", "e_t", "e_tag", "some_fn", "tag_s", "type_t"]
        );
    }
}
