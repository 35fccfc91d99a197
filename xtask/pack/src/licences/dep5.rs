//! The DEP-5 rules lintian's debian/copyright/dep5 check enforces on a source package, checked
//! on the file itself so that a bad copyright fails `cargo xtask codegen` here rather than
//! lintian on a source package later: header first with Format; every Files paragraph with
//! Files, Copyright and License; every short name a Files paragraph uses has exactly one
//! standalone License paragraph with text; no standalone paragraph nobody uses; no Files
//! pattern twice; `*` only in the first Files paragraph.

use std::collections::BTreeMap;

use anyhow::{bail, Result};

use xtask_base::deb822::{self, Paragraph};

const FORMAT: &str = "https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/";

/// The short names of a License field's first line, as lintian splits them: lower-cased,
/// commas and parentheses ignored, split at `and`/`or`.
pub fn short_names(first_line: &str) -> Vec<String> {
    let cleaned = first_line.to_lowercase().replace([',', '(', ')'], " ");
    let mut names = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    for word in cleaned.split_whitespace() {
        if word == "and" || word == "or" {
            names.push(current.join(" "));
            current.clear();
        } else {
            current.push(word);
        }
    }
    names.push(current.join(" "));
    names.retain(|n| !n.is_empty());
    names
}

/// The standalone License paragraphs' short names (lower-cased) of `paragraphs`.
pub fn standalone(paragraphs: &[Paragraph]) -> Vec<String> {
    paragraphs
        .iter()
        .skip(1)
        .filter(|p| !p.has("Files"))
        .filter_map(|p| p.get("License"))
        .filter_map(|l| l.split_once('\n'))
        .map(|(name, _)| name.trim().to_lowercase())
        .collect()
}

pub fn check(text: &str) -> Result<()> {
    let paragraphs = deb822::parse(text)?;
    let mut problems = Vec::new();
    let Some((header, rest)) = paragraphs.split_first() else {
        bail!("no paragraphs");
    };
    if header.get("Format") != Some(FORMAT) {
        problems.push(format!("the header's Format is not {FORMAT}"));
    }

    let mut required: BTreeMap<String, usize> = BTreeMap::new();
    let mut found: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut patterns: BTreeMap<&str, usize> = BTreeMap::new();
    let mut files_paragraphs = 0;
    for p in rest {
        let at = p.line;
        let licence = p.get("License").unwrap_or("");
        let (first, text) = licence.split_once('\n').unwrap_or((licence, ""));
        let names = short_names(first);
        for name in &names {
            let words: Vec<&str> = name.split(' ').collect();
            let exception_ok =
                words.len() >= 4 && words[1] == "with" && words.last() == Some(&"exception");
            if words.len() > 1 && !exception_ok {
                problems.push(format!(
                    "line {at}: short name {name:?}: neither one word nor `X with Y exception`"
                ));
            }
        }
        if let Some(files) = p.get("Files") {
            files_paragraphs += 1;
            for field in ["Copyright", "License"] {
                if p.get(field).is_none_or(|v| v.trim().is_empty()) {
                    problems.push(format!("line {at}: Files paragraph without {field}"));
                }
            }
            if files.trim().is_empty() {
                problems.push(format!("line {at}: empty Files"));
            }
            for pattern in files.split_whitespace() {
                if pattern == "*" && files_paragraphs > 1 {
                    problems.push(format!("line {at}: `*` after the first Files paragraph"));
                }
                if let Some(first) = patterns.insert(pattern, at) {
                    problems.push(format!(
                        "line {at}: pattern {pattern} already in the paragraph of line {first}"
                    ));
                }
            }
            if text.trim().is_empty() {
                for name in names {
                    required.entry(name).or_insert(at);
                }
            }
        } else if p.has("License") {
            if p.has("Copyright") {
                problems.push(format!(
                    "line {at}: License and Copyright without Files (ambiguous paragraph)"
                ));
            }
            if text.trim().is_empty() || names.is_empty() {
                problems.push(format!(
                    "line {at}: standalone License paragraph without text"
                ));
            } else {
                found
                    .entry(first.trim().to_lowercase())
                    .or_default()
                    .push(at);
            }
        } else {
            problems.push(format!(
                "line {at}: neither a Files nor a License paragraph"
            ));
        }
    }
    for (name, at) in &required {
        if !found.contains_key(name) {
            problems.push(format!(
                "line {at}: licence {name:?} has no standalone License paragraph"
            ));
        }
    }
    for (name, lines) in &found {
        if lines.len() > 1 {
            problems.push(format!(
                "lines {lines:?}: licence {name:?} has more than one standalone paragraph"
            ));
        }
        if !required.contains_key(name) {
            problems.push(format!(
                "line {}: standalone License paragraph {name:?} is not used",
                lines[0]
            ));
        }
    }
    if !problems.is_empty() {
        bail!("invalid DEP-5:\n  {}", problems.join("\n  "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str =
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
                          Upstream-Name: x\n\n";

    #[test]
    fn names_split_like_lintian() {
        assert_eq!(short_names("Expat or Apache-2.0"), ["expat", "apache-2.0"]);
        assert_eq!(
            short_names("Expat or Apache-2.0, and Unicode-3.0"),
            ["expat", "apache-2.0", "unicode-3.0"]
        );
        assert_eq!(
            short_names("Apache-2.0 with LLVM exception or Expat"),
            ["apache-2.0 with llvm exception", "expat"]
        );
    }

    #[test]
    fn a_valid_file_passes() {
        let text = format!(
            "{HEADER}Files: *\nCopyright: me\nLicense: Expat or ISC\n\n\
             Files: vendor/a-1.0.0/*\nCopyright: a\nLicense: ISC\n\n\
             License: Expat\n text\n\nLicense: ISC\n text\n"
        );
        check(&text).unwrap();
    }

    #[test]
    fn each_rule_is_enforced() {
        let base = "Files: *\nCopyright: me\nLicense: Expat\n\nLicense: Expat\n text\n";
        for (bad, expect) in [
            ("Files: *\nCopyright: me\nLicense: ISC\n", "no standalone"),
            (
                "Files: *\nCopyright: me\nLicense: Expat\n\nLicense: Expat\n t\n\nLicense: Expat\n u\n",
                "more than one",
            ),
            (&format!("{base}\nLicense: ISC\n text\n"), "not used"),
            ("Files: *\nLicense: Expat\n\nLicense: Expat\n t\n", "without Copyright"),
            (
                &format!("{base}\nFiles: a/*\nCopyright: x\nLicense: Expat\n\nFiles: a/*\nCopyright: y\nLicense: Expat\n"),
                "already",
            ),
            (&format!("{base}\nFiles: a/* *\nCopyright: x\nLicense: Expat\n"), "`*` after"),
            (&format!("{base}\nLicense: GPL\n"), "without text"),
            (&format!("{base}\nComment: x\n"), "neither a Files"),
            (&format!("{base}\nLicense: Foo\n t\nCopyright: x\n"), "ambiguous"),
            (
                "Files: *\nCopyright: me\nLicense: Apache-2.0 with LLVM\n\nLicense: Apache-2.0 with LLVM\n t\n",
                "neither one word",
            ),
        ] {
            let e = check(&format!("{HEADER}{bad}")).unwrap_err();
            assert!(format!("{e:#}").contains(expect), "{bad:?}: {e:#}");
        }
        assert!(check("Format: other\n\nLicense: x\n t\n").is_err());
    }
}
