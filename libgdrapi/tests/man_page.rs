//! gdrapi(3), man/gdrapi.3, is written by hand; this ties it to the library so that they cannot
//! drift apart: it names, shows and describes exactly the functions gdrapi.h declares, lists
//! the environment variables the library reads, carries the crate's version, and its example
//! compiles against gdrapi.h. Whether it is valid roff is `cargo xtask test`'s groff and
//! `man --warnings` step.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    let path = Path::new(MANIFEST_DIR).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The functions gdrapi.h declares (`gdr_name(` at the start of a prototype or after its
/// return type), and `gdr_get_info`, which it defines as a macro and the library exports.
fn header_functions() -> BTreeSet<String> {
    let header = read("include/gdrapi.h");
    let mut names: BTreeSet<String> = header
        .lines()
        .filter(|l| !l.starts_with([' ', '/', '#', '*']) && l.contains('('))
        .flat_map(gdr_names)
        .collect();
    assert!(
        header.contains("#define gdr_get_info gdr_get_info_v2"),
        "gdrapi.h no longer maps gdr_get_info to gdr_get_info_v2: update gdrapi.3"
    );
    names.insert("gdr_get_info".into());
    names
}

/// Every `gdr_…` identifier in `text`.
fn gdr_names(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("gdr_") && !w.ends_with("_t"))
        .map(str::to_owned)
        .collect()
}

/// The page's sections: (title, raw lines).
fn sections(page: &str) -> Vec<(String, Vec<&str>)> {
    let mut out: Vec<(String, Vec<&str>)> = Vec::new();
    for line in page.lines() {
        if let Some(title) = line.strip_prefix(".SH ") {
            out.push((title.trim_matches('"').to_owned(), Vec::new()));
        } else if let Some((_, lines)) = out.last_mut() {
            lines.push(line);
        }
    }
    out
}

fn section<'a>(all: &'a [(String, Vec<&'a str>)], title: &str) -> &'a [&'a str] {
    all.iter()
        .find(|(t, _)| t == title)
        .map(|(_, l)| l.as_slice())
        .unwrap_or_else(|| panic!("gdrapi.3 has no {title} section"))
}

/// The tags of the `.TP` paragraphs among `lines`.
fn tags<'a>(lines: &[&'a str]) -> Vec<&'a str> {
    lines
        .windows(2)
        .filter(|w| w[0] == ".TP")
        .map(|w| w[1])
        .collect()
}

#[test]
fn the_page_documents_exactly_the_headers_functions() {
    let functions = header_functions();
    assert!(functions.len() >= 17, "{functions:?}");
    let page = read("man/gdrapi.3");
    let all = sections(&page);
    let name: BTreeSet<String> = gdr_names(&section(&all, "NAME").join(" "))
        .into_iter()
        .collect();
    assert_eq!(name, functions, "NAME against gdrapi.h");
    let synopsis: BTreeSet<String> = section(&all, "SYNOPSIS")
        .iter()
        .filter(|l| l.contains('('))
        .flat_map(|l| gdr_names(l))
        .collect();
    assert_eq!(synopsis, functions, "SYNOPSIS against gdrapi.h");
    let described: BTreeSet<String> = tags(section(&all, "DESCRIPTION"))
        .into_iter()
        .flat_map(gdr_names)
        .collect();
    assert_eq!(
        described, functions,
        "DESCRIPTION's entries against gdrapi.h"
    );
}

#[test]
fn the_page_has_the_sections_the_version_and_the_environment() {
    let page = read("man/gdrapi.3");
    let version = format!("\"libgdrapi {}\"", env!("CARGO_PKG_VERSION"));
    let th = page
        .lines()
        .find(|l| l.starts_with(".TH "))
        .unwrap_or_default();
    assert!(
        th.starts_with(".TH GDRAPI 3 ") && th.contains(&version),
        "{th}: not {version}"
    );
    let all = sections(&page);
    for title in [
        "NAME",
        "LIBRARY",
        "SYNOPSIS",
        "DESCRIPTION",
        "RETURN VALUE",
        "ENVIRONMENT",
        "FILES",
        "ATTRIBUTES",
        "NOTES",
        "EXAMPLES",
        "SEE ALSO",
    ] {
        section(&all, title);
    }
    let environment: BTreeSet<&str> = tags(section(&all, "ENVIRONMENT"))
        .into_iter()
        .map(|t| t.trim_start_matches(".B "))
        .collect();
    let read_by_the_library = BTreeSet::from([
        gdrapi::log::ENABLE_ENV,
        gdrapi::log::LEVEL_ENV,
        gdrapi::USE_DMABUF_ENV,
        gdrapi::copy::VARIANT_ENV,
        gdrapi::musa::MUSA_HOME_ENV,
    ]);
    assert_eq!(environment, read_by_the_library, "ENVIRONMENT");
    // The names GDRCOPY_COPY_VARIANT accepts, where a reader looks them up.
    let environment = section(&all, "ENVIRONMENT").join("\n").replace("\\-", "-");
    for variant in gdrapi::copy::variants() {
        assert!(
            environment.contains(&format!(".BR {} ", variant.name)),
            "ENVIRONMENT does not list the copy variant {}",
            variant.name
        );
    }
    let files = section(&all, "FILES").join("\n");
    for path in [
        gdrapi::DEVICE_PATH,
        "libmusa.so.1",
        gdrapi::musa::DEFAULT_MUSA_HOME,
    ] {
        assert!(files.contains(path), "FILES lacks {path}");
    }
    // Every copy variant of this architecture, by the name GDRCOPY_COPY_VARIANT takes.
    let description = section(&all, "DESCRIPTION").join("\n").replace("\\-", "-");
    for variant in gdrapi::copy::variants()
        .iter()
        .chain([&gdrapi::copy::GENERIC])
    {
        let name = variant.name;
        assert!(
            description.contains(&format!(".BR {name} "))
                || description.contains(&format!(".B {name}\n")),
            "DESCRIPTION does not name the copy variant {name}"
        );
    }
}

/// The EXAMPLES program, as the reader sees it, compiles against gdrapi.h with every warning
/// an error.
#[test]
fn the_example_compiles() {
    let page = read("man/gdrapi.3");
    let start = page.find(".EX\n").expect(".EX in gdrapi.3") + 4;
    let end = start + page[start..].find(".EE\n").expect(".EE after .EX");
    let program = page[start..end].replace("\\-", "-").replace("\\e", "\\");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("man-example");
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("example.c");
    std::fs::write(&source, program).unwrap();
    let out = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-c"])
        .arg(format!("-I{MANIFEST_DIR}/include"))
        .arg(&source)
        .arg("-o")
        .arg(dir.join("example.o"))
        .output()
        .expect("running cc");
    assert!(
        out.status.success(),
        "gdrapi.3's example does not compile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
