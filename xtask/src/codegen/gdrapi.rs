//! `libgdrapi/include/gdrapi.h`: prototypes and `#define`s by cbindgen from `libgdrapi/src/capi.rs`;
//! the enums from `capi::C_ENUMS` and the info structs (C bitfields, which cbindgen cannot
//! express) written here. Their layouts are asserted on both sides: `capi.rs` at compile time
//! and the C/C++ header test with `_Static_assert`/`static_assert`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use gdrapi::capi::C_ENUMS;

use cbindgen::ItemType;
use xtask_base::generated::Generated;

const OVERVIEW: &str = r#"/*
 * gdrapi.h: GDRCopy for Moore Threads GPUs, API @API_VERSION@.
 *
 * Pin MUSA device memory (gdr_pin_buffer_v2), map it into the process (gdr_map) and copy with
 * CPU loads and stores (gdr_copy_to_mapping / gdr_copy_from_mapping). Every int-returning
 * function returns 0 on success or a positive errno.
 *
 * Differences from NVIDIA GDRCopy 2.x that callers may notice:
 *  - Device node /dev/mtgdrdrv (module mtgdrdrv 0.x); library 1.x works with every driver 0.x
 *    whose minor is at least MINIMUM_GDRDRV_MINOR_VERSION. gdr_open fails with EPROTO when the
 *    versions do not accept each other (with GDRCOPY_ENABLE_LOGGING set it names both).
 *  - Threads: a gdr_t may be used from many threads at once. Copies take no lock and make no
 *    system call. A copy racing gdr_unmap/gdr_unpin_buffer/gdr_close of its handle in another
 *    thread either completes before the mapping goes (the unmap waits for it) or returns EINVAL;
 *    it never faults and never touches the address once the unmap has returned.
 *  - Handles: gdr_mh_t.h is an opaque, never-zero value. A handle of another gdr_t, or one that
 *    was unpinned, is refused with EINVAL; a copy whose device range is not inside the handle's
 *    live mapping is refused with EINVAL.
 *  - Pins never get invalidated: mtgpu has no free callback, so a pin holds its memory until it
 *    is unpinned, even if the allocation is freed (GDR_ATTR_USE_PERSISTENT_MAPPING is 1 and
 *    gdr_get_callback_flag always reports 0). GDR_PIN_FLAG_FORCE_PCIE is not supported (EINVAL).
 *  - Pin granule: a pin is rounded to the host page, not to 64 KiB GPU pages (info.va rounded
 *    down, info.mapped_size rounded up, info.page_size = the host page, 4096 on x86), whatever
 *    page size backs the allocation: mtgpu pins unaligned ranges, and its default GPU page is
 *    the host page. gdr_map needs the pinned address to be aligned to info.page_size (else
 *    EINVAL), and map_ptr + (addr - info.va) addresses addr. A 64 KiB aligned pin, as
 *    upstream's callers make, is unchanged by the rounding.
 *  - Pins fail with ENODEV while the mtgpu driver is loaded but not initialised
 *    (disable_driver=1), and with EINVAL when mtgpu's page table holds an address outside its
 *    devices' memory BARs; a file holds at most max_pins_per_file pins (module parameter,
 *    default 65536; ENOSPC beyond). An exec that keeps the device fd open loses its pins
 *    (EACCES), as a forked child does.
 *  - Mappings are write-combining by default; GDR_MAP_FLAG_REQ_DEVICE_MAPPING gives an uncached
 *    mapping, GDR_MAP_FLAG_REQ_CACHE_MAPPING is refused (EOPNOTSUPP: BAR memory is not coherent).
 *    One mapping per handle (EAGAIN); gdr_unmap needs the address and size given to gdr_map.
 *  - gdr_close unmaps and unpins everything the gdr_t still owns and always frees it.
 *  - fork: the child inherits no mapping (its copies through inherited handles return EINVAL)
 *    and the driver refuses its ioctls (EACCES). The child may call gdr_close on an inherited
 *    gdr_t (it frees the child's copy without touching the parent's pins) and gdr_open for its
 *    own; nothing else.
 *  - Copies touch device memory only with naturally aligned 1-64 byte accesses and end with a
 *    fence: after writes a store fence (x86 sfence), after reads a load fence (x86 lfence:
 *    every read is complete before anything later starts). Neither orders earlier writes
 *    before later reads: write a doorbell, then read, with a full fence (mfence) between, as
 *    with upstream. They give no ordering guarantee towards GPU work already running.
 *    GDRCOPY_COPY_VARIANT forces a CPU variant.
 *  - Logging: GDRCOPY_ENABLE_LOGGING (set = on) and GDRCOPY_LOG_LEVEL (1 debug .. 4 error).
 *
 * Two backends, chosen by gdr_open: the mtgdrdrv module when /dev/mtgdrdrv can be opened, else
 * (or always, with GDRCOPY_USE_DMABUF_MMAP=1, that exact value) the dma-buf backend, which
 * needs no module: each pin holds a dma-buf of the range from the MUSA driver
 * (muMemGetHandleForAddressRange, libmusa.so.1 loaded at run time) and gdr_map mmaps it.
 * gdr_get_attribute(GDR_ATTR_USING_DMA_BUF_MMAP) reads 1 there. What differs on it from the
 * module backend described above:
 *  - Mapping type is fixed at pin: write-combining. GDR_MAP_FLAG_DEFAULT and
 *    GDR_MAP_FLAG_REQ_WC_MAPPING map; CACHE and DEVICE requests fail with EINVAL.
 *  - No callback flag: gdr_get_callback_flag reports 0 (the dma-buf keeps the memory until
 *    unpin); GDR_ATTR_USE_PERSISTENT_MAPPING is 1; GDR_PIN_FLAG_FORCE_PCIE fails with EINVAL.
 *  - gdr_driver_get_version fails with EOPNOTSUPP (there is no module); tm_cycles and
 *    cycles_per_ms are 0.
 *  - Each pin holds one close-on-exec file descriptor until gdr_unpin_buffer or gdr_close
 *    (it counts against RLIMIT_NOFILE).
 *  - MUSA errors are returned as errno (never raw MUSA codes); the log names the MUSA error.
 *  - A dma-buf whose mmap the driver refuses fails gdr_map with the kernel's errno, and one log
 *    line says so. mtgpu 2.7.0-era drivers refuse CPU mmap of their dma-bufs (ENOSYS): there,
 *    use the module.
 *  - fork: as above (EACCES for the parent's pins; gdr_close in the child closes its copies of
 *    the fds only).
 *  - The range is exported in the calling thread's current MUSA context, else in the primary
 *    context of the first dma-buf capable device: with several GPUs, make the owning device's
 *    context current.
 */"#;

pub fn header(root: &Path) -> Result<Generated> {
    let api_version = format!(
        "{}.{}",
        gdrapi::capi::GDR_API_MAJOR_VERSION,
        gdrapi::capi::GDR_API_MINOR_VERSION
    );
    let mut config = super::config(
        "GDRAPI_H",
        "libgdrapi/src/capi.rs (prototypes, versions, enums)",
        &OVERVIEW.replace("@API_VERSION@", &api_version),
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
