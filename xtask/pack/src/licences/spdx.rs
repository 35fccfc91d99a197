//! A crate's SPDX licence expression (Cargo.toml `license`) in DEP-5 syntax with Debian's short
//! names (`MIT OR Apache-2.0` is `Expat or Apache-2.0`), and each short name's text. Anything not
//! in [`LICENCES`] fails: a licence nobody has looked at must not slip into the copyright file.

use anyhow::{bail, ensure, Context, Result};
use spdx::expression::{ExprNode, Operator};
use spdx::{Expression, ParseMode};

/// SPDX licence (with its exception, if any), DEP-5 short name (Debian's where copyright-format
/// 1.0 has one, SPDX's otherwise), and the file in /usr/share/common-licenses if Debian ships the
/// text; the SPDX licence list's text is reproduced otherwise.
const LICENCES: &[(&str, &str, Option<&str>)] = &[
    ("MIT", "Expat", None),
    ("Apache-2.0", "Apache-2.0", Some("Apache-2.0")),
    (
        "Apache-2.0 WITH LLVM-exception",
        "Apache-2.0 with LLVM exception",
        Some("Apache-2.0"),
    ),
    ("ISC", "ISC", None),
    ("BSD-2-Clause", "BSD-2-clause", None),
    ("BSD-3-Clause", "BSD-3-clause", None),
    ("Zlib", "Zlib", None),
    ("BSL-1.0", "BSL-1.0", None),
    ("0BSD", "0BSD", None),
    ("MPL-2.0", "MPL-2.0", Some("MPL-2.0")),
    ("CC0-1.0", "CC0-1.0", Some("CC0-1.0")),
    ("Unicode-3.0", "Unicode-3.0", None),
    ("Unicode-DFS-2016", "Unicode-DFS-2016", None),
    ("Unlicense", "Unlicense", None),
    ("GPL-2.0-only", "GPL-2", Some("GPL-2")),
    ("GPL-2.0", "GPL-2", Some("GPL-2")),
    ("GPL-2.0-or-later", "GPL-2+", Some("GPL-2")),
];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dep5 {
    /// The DEP-5 `License:` expression.
    pub expression: String,
    /// The short names in it, sorted, each once: each needs a standalone License paragraph.
    pub names: Vec<&'static str>,
}

/// How the `spdx` crate reads a `license` field: the SPDX grammar with case-sensitive
/// identifiers (`mit` is no licence), but GNU's deprecated forms taken: `GPL-2.0`, and
/// `GPL-2.0+`, which it reads as `GPL-2.0-or-later`.
const MODE: ParseMode = ParseMode {
    allow_deprecated: true,
    allow_postfix_plus_on_gpl: true,
    ..ParseMode::STRICT
};

pub fn to_dep5(spdx: &str) -> Result<Dep5> {
    let mut mode = MODE;
    // Cargo's old `MIT/Apache-2.0` syntax meant "either"; mixed with operators it is ambiguous.
    if spdx.contains('/') {
        let operators = ["AND", "OR", "WITH", "and", "or", "with"];
        ensure!(
            !spdx.contains(['(', ')']) && !spdx.split_whitespace().any(|w| operators.contains(&w)),
            "mixes the old `A/B` syntax with SPDX operators"
        );
        mode.allow_slash_as_or_operator = true;
    }
    let parsed = Expression::parse_mode(spdx, mode)?;
    // The expression is in postfix order: rebuild the tree, an operator's operands of the same
    // operator merged (`(A OR B) OR C` is `A OR B OR C`).
    let mut stack = Vec::new();
    let mut names = Vec::new();
    for node in parsed.iter() {
        let expr = match node {
            ExprNode::Req(req) => {
                let req = req.req.to_string();
                let Some((_, short, _)) = LICENCES.iter().find(|(id, _, _)| *id == req) else {
                    bail!("no DEP-5 name for licence {req}");
                };
                names.push(*short);
                Expr::Licence(short)
            }
            ExprNode::Op(op) => {
                let (Some(right), Some(left)) = (stack.pop(), stack.pop()) else {
                    bail!("{spdx}: an operator without operands");
                };
                let terms = |e| match (op, e) {
                    (Operator::And, Expr::And(t)) | (Operator::Or, Expr::Or(t)) => t,
                    (_, e) => vec![e],
                };
                let both = [terms(left), terms(right)].into_iter().flatten().collect();
                match op {
                    Operator::And => Expr::And(both),
                    Operator::Or => Expr::Or(both),
                }
            }
        };
        stack.push(expr);
    }
    let (Some(expr), None) = (stack.pop(), stack.pop()) else {
        bail!("{spdx}: not one expression");
    };
    names.sort_unstable();
    names.dedup();
    Ok(Dep5 {
        expression: expr.render(true)?,
        names,
    })
}

enum Expr {
    Licence(&'static str),
    And(Vec<Expr>),
    Or(Vec<Expr>),
}

impl Expr {
    /// DEP-5: `and` binds tighter than `or`, and a comma ends an `or` group: `A or B, and C`
    /// is (A or B) and C, at the `top` only. Nothing else can be grouped.
    fn render(&self, top: bool) -> Result<String> {
        let join = |terms: &[&Expr], sep| -> Result<String> {
            let terms = terms.iter().map(|t| t.render(false));
            Ok(terms.collect::<Result<Vec<_>>>()?.join(sep))
        };
        match self {
            Expr::Licence(name) => Ok(name.to_string()),
            Expr::Or(terms) => join(&terms.iter().collect::<Vec<_>>(), " or "),
            Expr::And(terms) => {
                let (ors, rest): (Vec<&Expr>, Vec<&Expr>) =
                    terms.iter().partition(|t| matches!(t, Expr::Or(_)));
                match ors.as_slice() {
                    [] => join(&rest, " and "),
                    [or] if top => Ok(format!(
                        "{}, and {}",
                        or.render(false)?,
                        join(&rest, " and ")?
                    )),
                    _ => bail!("OR groups under AND: DEP-5 syntax cannot express it"),
                }
            }
        }
    }
}

/// The text of short name `short`'s standalone License paragraph: Debian's usual pointer to
/// /usr/share/common-licenses for a licence Debian ships, the SPDX licence list's text
/// otherwise, with its template copyright line (`Copyright (c) <year> <owner>`) left out.
pub fn text(short: &str) -> Result<Vec<String>> {
    let (spdx, _, common) = LICENCES
        .iter()
        .find(|(_, s, _)| *s == short)
        .with_context(|| format!("no licence {short}"))?;
    let (id, exception) = match spdx.split_once(" WITH ") {
        Some((id, exception)) => (id, Some(exception)),
        None => (*spdx, None),
    };
    let licence = spdx::license_id(id).with_context(|| format!("no SPDX licence {id}"))?;
    let mut text = match common {
        Some(file) => format!(
            "On Debian systems, the complete text of the {} can be found in \
             /usr/share/common-licenses/{file}.",
            licence.full_name
        ),
        None => licence.text().to_string(),
    };
    if let Some(e) = exception {
        let exception = spdx::exception_id(e).with_context(|| format!("no SPDX exception {e}"))?;
        text = format!("{text}\n\n{}", exception.text());
    }
    let template =
        |l: &str| l.starts_with("Copyright") && (l.contains("<year>") || l.contains("YEAR"));
    let mut lines: Vec<String> = Vec::new();
    for line in text.lines().map(str::trim_end).filter(|l| !template(l)) {
        // Blank lines squeezed: the template line leaves two.
        if !(line.is_empty() && lines.last().is_none_or(String::is_empty)) {
            lines.push(line.to_string());
        }
    }
    if lines.last().is_some_and(String::is_empty) {
        lines.pop();
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dep5(spdx: &str) -> String {
        match to_dep5(spdx) {
            Ok(d) => d.expression,
            Err(e) => panic!("{spdx}: {e:#}"),
        }
    }

    /// Every key of the table parses (strict SPDX, deprecated GNU forms) to itself; the short
    /// names Debian spells differently are asserted in the other tests.
    #[test]
    fn single_licences_take_debian_short_names() {
        for (spdx, short, _) in LICENCES {
            assert_eq!(dep5(spdx), *short, "{spdx}");
            assert_eq!(to_dep5(spdx).unwrap().names, [*short], "{spdx}");
        }
        assert_eq!(dep5("BSD-2-Clause"), "BSD-2-clause");
        assert_eq!(dep5("GPL-2.0-only"), "GPL-2");
    }

    #[test]
    fn operators_become_dep5_syntax() {
        assert_eq!(dep5("MIT OR Apache-2.0"), "Expat or Apache-2.0");
        assert_eq!(dep5("Apache-2.0 OR MIT"), "Apache-2.0 or Expat");
        assert_eq!(dep5("MIT AND BSD-3-Clause"), "Expat and BSD-3-clause");
        assert_eq!(dep5("(MIT OR Apache-2.0)"), "Expat or Apache-2.0");
        assert_eq!(dep5("Unlicense OR (MIT)"), "Unlicense or Expat");
        assert_eq!(
            dep5("Apache-2.0 WITH LLVM-exception OR Apache-2.0 OR MIT"),
            "Apache-2.0 with LLVM exception or Apache-2.0 or Expat"
        );
        assert_eq!(
            dep5("MIT OR Apache-2.0 AND Zlib"),
            "Expat or Apache-2.0 and Zlib"
        );
        // An OR group under AND: DEP-5's comma form, the group first.
        assert_eq!(
            dep5("(MIT OR Apache-2.0) AND Unicode-3.0"),
            "Expat or Apache-2.0, and Unicode-3.0"
        );
        assert_eq!(
            dep5("Unicode-3.0 AND (MIT OR Apache-2.0)"),
            "Expat or Apache-2.0, and Unicode-3.0"
        );
        let names = to_dep5("(MIT OR Apache-2.0) AND Unicode-3.0 AND MIT").unwrap();
        assert_eq!(names.names, ["Apache-2.0", "Expat", "Unicode-3.0"]);
    }

    #[test]
    fn deprecated_gnu_forms_take_the_same_names() {
        assert_eq!(dep5("GPL-2.0"), "GPL-2");
        assert_eq!(dep5("GPL-2.0+"), "GPL-2+");
        assert_eq!(dep5("GPL-2.0+ OR MIT"), "GPL-2+ or Expat");
    }

    #[test]
    fn the_old_slash_syntax_means_or() {
        assert_eq!(dep5("MIT/Apache-2.0"), "Expat or Apache-2.0");
        assert_eq!(dep5("MIT / Apache-2.0 / ISC"), "Expat or Apache-2.0 or ISC");
    }

    #[test]
    fn unknown_or_inexpressible_licences_fail() {
        for bad in [
            "WTFPL",
            "LicenseRef-proprietary",
            "GPL-3.0-only",
            "mit",
            "MIT+",
            "MIT WITH Classpath-exception-2.0",
            "Apache-2.0 WITH",
            "MIT OR",
            "(MIT OR Apache-2.0",
            "MIT Apache-2.0",
            "",
            "MIT/Apache-2.0 OR ISC",
            "(MIT OR Apache-2.0) AND (Zlib OR ISC)",
            "ISC OR (Zlib AND (MIT OR Apache-2.0))",
        ] {
            assert!(to_dep5(bad).is_err(), "{bad:?} was accepted");
        }
        let e = to_dep5("MIT OR WTFPL").unwrap_err();
        assert!(format!("{e:#}").contains("WTFPL"), "{e:#}");
    }

    #[test]
    fn every_licence_has_a_text() {
        for (_, short, common) in LICENCES {
            let text = text(short).unwrap().join("\n");
            assert!(
                !text.contains("<year>") && !text.contains("\n\n\n"),
                "{text}"
            );
            let pointer = text.contains("/usr/share/common-licenses/");
            assert_eq!(pointer, common.is_some(), "{short}: {text}");
        }
        let expat = text("Expat").unwrap();
        assert_eq!(expat[..2], ["MIT License", ""]);
        assert!(expat[2].starts_with("Permission is hereby granted, free of charge"));
        let llvm = text("Apache-2.0 with LLVM exception").unwrap().join("\n");
        assert!(llvm.starts_with("On Debian systems, the complete text of the Apache License"));
        assert!(llvm.contains("Sections 4(a), 4(b) and 4(d)"), "{llvm}");
    }
}
