//! A crate's SPDX licence expression (Cargo.toml `license`) in DEP-5 syntax with Debian's short
//! names: `MIT OR Apache-2.0` is `Expat or Apache-2.0`. Anything not in the table fails: a
//! licence nobody has looked at must not slip into the copyright file under a guessed name.

use anyhow::{bail, ensure, Result};

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
    ("GPL-2.0+", None, "GPL-2+"),
    ("GPL-2.0-or-later", None, "GPL-2+"),
];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dep5 {
    /// The DEP-5 `License:` expression.
    pub expression: String,
    /// The short names in it, sorted, each once: each needs a standalone License paragraph.
    pub names: Vec<&'static str>,
}

pub fn to_dep5(spdx: &str) -> Result<Dep5> {
    let mut parser = Parser {
        tokens: tokens(&old_syntax(spdx)?),
        pos: 0,
    };
    let expr = parser.or()?;
    if let Some(extra) = parser.tokens.get(parser.pos) {
        bail!("unexpected {extra:?}");
    }
    let expr = expr.flatten();
    let mut names = Vec::new();
    expr.names(&mut names);
    names.sort_unstable();
    names.dedup();
    Ok(Dep5 {
        expression: expr.render_top()?,
        names,
    })
}

/// Cargo's old `MIT/Apache-2.0` syntax meant "either".
fn old_syntax(spdx: &str) -> Result<String> {
    if !spdx.contains('/') {
        return Ok(spdx.to_string());
    }
    let words: Vec<&str> = spdx.split_whitespace().collect();
    ensure!(
        !spdx.contains(['(', ')']) && !words.iter().any(|w| ["AND", "OR", "WITH"].contains(w)),
        "mixes the old `A/B` syntax with SPDX operators"
    );
    Ok(spdx
        .split('/')
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" OR "))
}

fn tokens(spdx: &str) -> Vec<String> {
    spdx.replace('(', " ( ")
        .replace(')', " ) ")
        .split_whitespace()
        .map(String::from)
        .collect()
}

#[derive(Debug, PartialEq, Eq)]
enum Expr {
    Licence(&'static str),
    And(Vec<Expr>),
    Or(Vec<Expr>),
}

struct Parser {
    tokens: Vec<String>,
    pos: usize,
}

impl Parser {
    fn eat(&mut self, token: &str) -> bool {
        let hit = self.tokens.get(self.pos).is_some_and(|t| t == token);
        self.pos += usize::from(hit);
        hit
    }

    fn word(&mut self) -> Result<String> {
        match self.tokens.get(self.pos) {
            Some(t) if !["(", ")", "AND", "OR", "WITH"].contains(&t.as_str()) => {
                self.pos += 1;
                Ok(t.clone())
            }
            Some(t) => bail!("expected a licence identifier, found {t:?}"),
            None => bail!("expected a licence identifier, found the end"),
        }
    }

    fn or(&mut self) -> Result<Expr> {
        let mut terms = vec![self.and()?];
        while self.eat("OR") {
            terms.push(self.and()?);
        }
        Ok(one_or(terms, Expr::Or))
    }

    fn and(&mut self) -> Result<Expr> {
        let mut terms = vec![self.atom()?];
        while self.eat("AND") {
            terms.push(self.atom()?);
        }
        Ok(one_or(terms, Expr::And))
    }

    fn atom(&mut self) -> Result<Expr> {
        if self.eat("(") {
            let inner = self.or()?;
            ensure!(self.eat(")"), "unbalanced parenthesis");
            return Ok(inner);
        }
        let id = self.word()?;
        let exception = if self.eat("WITH") {
            Some(self.word()?)
        } else {
            None
        };
        match SHORT_NAMES
            .iter()
            .find(|(i, e, _)| *i == id && *e == exception.as_deref())
        {
            Some((_, _, short)) => Ok(Expr::Licence(short)),
            None => match exception {
                Some(e) => bail!("no DEP-5 name for licence {id} WITH {e}"),
                None => bail!("no DEP-5 name for licence {id}"),
            },
        }
    }
}

fn one_or(mut terms: Vec<Expr>, many: fn(Vec<Expr>) -> Expr) -> Expr {
    if terms.len() == 1 {
        terms.remove(0)
    } else {
        many(terms)
    }
}

impl Expr {
    /// `(A OR B) OR C` is `A OR B OR C`; the same for AND.
    fn flatten(self) -> Expr {
        match self {
            Expr::Licence(_) => self,
            Expr::Or(terms) => Expr::Or(
                terms
                    .into_iter()
                    .flat_map(|t| match t.flatten() {
                        Expr::Or(inner) => inner,
                        other => vec![other],
                    })
                    .collect(),
            ),
            Expr::And(terms) => Expr::And(
                terms
                    .into_iter()
                    .flat_map(|t| match t.flatten() {
                        Expr::And(inner) => inner,
                        other => vec![other],
                    })
                    .collect(),
            ),
        }
    }

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
