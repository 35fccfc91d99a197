//! A crate's SPDX licence expression (Cargo.toml `license`) in DEP-5 syntax with Debian's short
//! names: `MIT OR Apache-2.0` is `Expat or Apache-2.0`. Anything not in the table fails: a
//! licence nobody has looked at must not slip into the copyright file under a guessed name.

use anyhow::{bail, ensure, Result};
use spdx::expression::{ExprNode, Operator};
use spdx::{Expression, LicenseReq, ParseMode};

/// SPDX identifier (with its exception, if any) to DEP-5 short name. Debian's names where
/// copyright-format 1.0 has one (Expat, BSD-n-clause, GPL-2), SPDX's otherwise.
const SHORT_NAMES: &[(&str, Option<&str>, &str)] = &[
    ("MIT", None, "Expat"),
    ("Apache-2.0", None, "Apache-2.0"),
    (
        "Apache-2.0",
        Some("LLVM-exception"),
        "Apache-2.0 with LLVM exception",
    ),
    ("ISC", None, "ISC"),
    ("BSD-2-Clause", None, "BSD-2-clause"),
    ("BSD-3-Clause", None, "BSD-3-clause"),
    ("Zlib", None, "Zlib"),
    ("BSL-1.0", None, "BSL-1.0"),
    ("0BSD", None, "0BSD"),
    ("MPL-2.0", None, "MPL-2.0"),
    ("CC0-1.0", None, "CC0-1.0"),
    ("Unicode-3.0", None, "Unicode-3.0"),
    ("Unicode-DFS-2016", None, "Unicode-DFS-2016"),
    ("Unlicense", None, "Unlicense"),
    ("GPL-2.0", None, "GPL-2"),
    ("GPL-2.0-only", None, "GPL-2"),
    ("GPL-2.0-or-later", None, "GPL-2+"),
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
    for node in parsed.iter() {
        let expr = match node {
            ExprNode::Req(req) => Expr::Licence(short_name(&req.req)?),
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
    let mut names = Vec::new();
    expr.names(&mut names);
    names.sort_unstable();
    names.dedup();
    Ok(Dep5 {
        expression: expr.render_top()?,
        names,
    })
}

fn short_name(req: &LicenseReq) -> Result<&'static str> {
    let id = req.license.to_string();
    let exception = req.addition.as_ref().map(ToString::to_string);
    match SHORT_NAMES
        .iter()
        .find(|(i, e, _)| *i == id && *e == exception.as_deref())
    {
        Some((_, _, short)) => Ok(short),
        None => bail!("no DEP-5 name for licence {req}"),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Expr {
    Licence(&'static str),
    And(Vec<Expr>),
    Or(Vec<Expr>),
}

impl Expr {
    fn names(&self, out: &mut Vec<&'static str>) {
        match self {
            Expr::Licence(name) => out.push(name),
            Expr::And(terms) | Expr::Or(terms) => terms.iter().for_each(|t| t.names(out)),
        }
    }

    /// DEP-5: `and` binds tighter than `or`, and a comma ends an `or` group:
    /// `A or B, and C` is (A or B) and C. Nothing else can be grouped.
    fn render_top(&self) -> Result<String> {
        let Expr::And(terms) = self else {
            return self.render();
        };
        let (ors, rest): (Vec<&Expr>, Vec<&Expr>) =
            terms.iter().partition(|t| matches!(t, Expr::Or(_)));
        match ors.as_slice() {
            [] => self.render(),
            [or] => {
                let rest = rest
                    .iter()
                    .map(|t| t.render())
                    .collect::<Result<Vec<_>>>()?;
                Ok(format!("{}, and {}", or.render()?, rest.join(" and ")))
            }
            _ => bail!("more than one OR group under AND: DEP-5 syntax cannot express it"),
        }
    }

    fn render(&self) -> Result<String> {
        match self {
            Expr::Licence(name) => Ok(name.to_string()),
            Expr::Or(terms) => Ok(terms
                .iter()
                .map(Expr::render)
                .collect::<Result<Vec<_>>>()?
                .join(" or ")),
            Expr::And(terms) => {
                ensure!(
                    terms.iter().all(|t| matches!(t, Expr::Licence(_))),
                    "an OR group nested under AND under OR: DEP-5 syntax cannot express it"
                );
                Ok(terms
                    .iter()
                    .map(Expr::render)
                    .collect::<Result<Vec<_>>>()?
                    .join(" and "))
            }
        }
    }
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

    #[test]
    fn single_licences_take_debian_short_names() {
        for (spdx, short) in [
            ("MIT", "Expat"),
            ("Apache-2.0", "Apache-2.0"),
            ("ISC", "ISC"),
            ("BSD-2-Clause", "BSD-2-clause"),
            ("BSD-3-Clause", "BSD-3-clause"),
            ("Zlib", "Zlib"),
            ("BSL-1.0", "BSL-1.0"),
            ("0BSD", "0BSD"),
            ("MPL-2.0", "MPL-2.0"),
            ("CC0-1.0", "CC0-1.0"),
            ("Unicode-3.0", "Unicode-3.0"),
            ("Unicode-DFS-2016", "Unicode-DFS-2016"),
            ("Unlicense", "Unlicense"),
            ("GPL-2.0-only", "GPL-2"),
            ("GPL-2.0-or-later", "GPL-2+"),
            (
                "Apache-2.0 WITH LLVM-exception",
                "Apache-2.0 with LLVM exception",
            ),
        ] {
            assert_eq!(dep5(spdx), short, "{spdx}");
            assert_eq!(to_dep5(spdx).unwrap().names, [short], "{spdx}");
        }
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
}
