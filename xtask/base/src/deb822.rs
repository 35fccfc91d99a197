//! Debian control-file syntax (deb822), as debian/control and the DEP-5 debian/copyright use
//! it: paragraphs separated by blank lines, `Name: value` fields, continuation lines starting
//! with a space, ` .` for an empty line of a multi-line value, `#` comment lines. Strict where
//! dpkg is (a stray line, a duplicate field), so that what passes here passes dpkg-source.

use anyhow::{bail, Result};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paragraph {
    /// 1-based line of the paragraph's first field, for error messages.
    pub line: usize,
    /// (name, value) in file order. A multi-line value is its first line, then each
    /// continuation line without its leading space (` .` becomes an empty line).
    pub fields: Vec<(String, String)>,
}

impl Paragraph {
    /// A field's value; names compare case-insensitively, as in dpkg.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }
}

pub fn parse(text: &str) -> Result<Vec<Paragraph>> {
    let mut paragraphs = Vec::new();
    let mut current: Option<Paragraph> = None;
    for (index, raw) in text.lines().enumerate() {
        let number = index + 1;
        let line = raw.trim_end();
        if line.starts_with('#') {
            continue;
        }
        if line.is_empty() {
            paragraphs.extend(current.take());
            continue;
        }
        if let Some(rest) = line.strip_prefix([' ', '\t']) {
            let Some((_, value)) = current.as_mut().and_then(|p| p.fields.last_mut()) else {
                bail!("line {number}: continuation line outside a field: {raw:?}");
            };
            value.push('\n');
            if rest.trim() != "." {
                value.push_str(rest);
            }
            continue;
        }
        let Some((name, value)) = line.split_once(':') else {
            bail!("line {number}: neither `Name: value` nor a continuation line: {raw:?}");
        };
        if name.is_empty() || name.contains(char::is_whitespace) || name.starts_with('-') {
            bail!("line {number}: bad field name {name:?}");
        }
        let paragraph = current.get_or_insert_with(|| Paragraph {
            line: number,
            fields: Vec::new(),
        });
        if paragraph.has(name) {
            bail!("line {number}: duplicate field {name}");
        }
        paragraph
            .fields
            .push((name.to_string(), value.trim().to_string()));
    }
    paragraphs.extend(current);
    Ok(paragraphs)
}

/// A multi-line field value as deb822 writes it: continuation lines indented by one space, an
/// empty line as ` .`, no trailing whitespace, tabs expanded (lintian: tab-in-license-text).
pub fn continuation(lines: impl IntoIterator<Item = impl AsRef<str>>) -> String {
    let mut out = String::new();
    for line in lines {
        let line = line.as_ref().replace('\t', "        ");
        let line = line.trim_end();
        out.push('\n');
        if line.is_empty() {
            out.push_str(" .");
        } else {
            out.push(' ');
            out.push_str(line);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paragraphs_fields_and_continuations() {
        let text = "# comment\nSource: x\nMaintainer: A <a@b.c>\n\n\n\
                    License: ISC\n Permission\n .\n THE SOFTWARE\n# inside\nComment: c\n";
        let paragraphs = parse(text).unwrap();
        assert_eq!(paragraphs.len(), 2);
        assert_eq!(paragraphs[0].line, 2);
        assert_eq!(paragraphs[0].get("maintainer"), Some("A <a@b.c>"));
        assert_eq!(
            paragraphs[1].get("License"),
            Some("ISC\nPermission\n\nTHE SOFTWARE")
        );
        assert_eq!(paragraphs[1].get("Comment"), Some("c"));
    }

    #[test]
    fn syntax_errors_are_refused() {
        assert!(parse(" stray\n").is_err());
        assert!(parse("Files: *\nfiles: x\n").is_err());
        assert!(parse("Files *\n").is_err());
        assert!(parse("-Files: *\n").is_err());
    }

    #[test]
    fn continuation_lines_round_trip() {
        let value = format!("ISC{}", continuation(["a\tb ", "", "c"]));
        assert_eq!(value, "ISC\n a        b\n .\n c");
        let parsed = parse(&format!("License: {value}\n")).unwrap();
        assert_eq!(parsed[0].get("License"), Some("ISC\na        b\n\nc"));
    }
}
