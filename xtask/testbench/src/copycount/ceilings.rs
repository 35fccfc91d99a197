//! The committed instruction ceilings of the copy calls and the goals they must stay within
//! (`libgdrapi/copy-ceilings.txt`). A ceiling is lowered when the code gets faster; the goals
//! come from the figures upstream GDRCopy 2.6 was measured at, so no ceiling can be raised past
//! them without the check failing.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::{size_label, Row, SIZES};

pub const PATH: &str = "libgdrapi/copy-ceilings.txt";

/// (variant, direction) → size → instructions.
type Table = BTreeMap<(String, String), BTreeMap<usize, u64>>;

#[derive(Debug, Default)]
pub struct Ceilings {
    ceilings: Table,
    goals: Table,
}

impl Ceilings {
    pub fn load(path: &Path) -> Result<Ceilings> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    /// Lines `ceiling|goal VARIANT to|from SIZE=N ...`; `#` starts a comment.
    pub fn parse(text: &str) -> Result<Ceilings> {
        let mut c = Ceilings::default();
        for (number, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(kind), Some(variant), Some(dir)) = (words.next(), words.next(), words.next())
            else {
                bail!(
                    "line {}: expected `ceiling|goal VARIANT to|from SIZE=N...`",
                    number + 1
                );
            };
            if dir != "to" && dir != "from" {
                bail!(
                    "line {}: direction {dir:?} is neither to nor from",
                    number + 1
                );
            }
            let table = match kind {
                "ceiling" => &mut c.ceilings,
                "goal" => &mut c.goals,
                other => bail!("line {}: {other:?} is neither ceiling nor goal", number + 1),
            };
            let cells = table.entry((variant.into(), dir.into())).or_default();
            for cell in words {
                let (size, n) = cell
                    .split_once('=')
                    .with_context(|| format!("line {}: {cell:?} is not SIZE=N", number + 1))?;
                let size = parse_size(size)
                    .with_context(|| format!("line {}: size {size:?}", number + 1))?;
                cells.insert(
                    size,
                    n.parse().with_context(|| format!("line {}", number + 1))?,
                );
            }
        }
        Ok(c)
    }

    /// Every goal has a ceiling at or below it.
    pub fn check_goals(&self) -> Result<()> {
        let mut failures = Vec::new();
        for ((variant, dir), goals) in &self.goals {
            for (&size, &goal) in goals {
                match self.ceiling(variant, dir, size) {
                    Some(c) if c <= goal => {}
                    Some(c) => failures.push(format!(
                        "{variant} {dir} {}: ceiling {c} is above the goal {goal}",
                        size_label(size)
                    )),
                    None => failures.push(format!(
                        "{variant} {dir} {}: the goal {goal} has no ceiling",
                        size_label(size)
                    )),
                }
            }
        }
        if !failures.is_empty() {
            bail!(
                "{PATH} lets the copies miss their goals:\n{}",
                failures.join("\n")
            );
        }
        Ok(())
    }

    fn ceiling(&self, variant: &str, dir: &str, size: usize) -> Option<u64> {
        self.ceilings
            .get(&(variant.to_string(), dir.to_string()))?
            .get(&size)
            .copied()
    }

    /// The measured rows that exceed their ceiling, or have none.
    pub fn check(&self, rows: &[Row]) -> Vec<String> {
        let mut failures = Vec::new();
        for r in rows {
            let dir = if r.to_device { "to" } else { "from" };
            match self.ceiling(&r.variant, dir, r.size) {
                Some(c) if r.instructions <= c => {}
                Some(c) => failures.push(format!(
                    "{} {dir} {}: {} instructions, ceiling {c}",
                    r.variant,
                    size_label(r.size),
                    r.instructions
                )),
                None => failures.push(format!(
                    "{} {dir} {}: no ceiling in {PATH} (measured {})",
                    r.variant,
                    size_label(r.size),
                    r.instructions
                )),
            }
        }
        failures
    }
}

/// `ceiling` lines for measured rows: each figure rounded up to a multiple of 5 (of 50 from
/// 1,000), so that a toolchain's small code-generation changes do not fail the check.
pub fn suggest(rows: &[Row]) -> String {
    let mut lines: BTreeMap<(usize, bool), (String, Vec<String>)> = BTreeMap::new();
    for r in rows {
        let order = gdrapi::copy::variants()
            .iter()
            .position(|v| v.name == r.variant)
            .unwrap_or(usize::MAX);
        let step = if r.instructions >= 1000 { 50 } else { 5 };
        let ceiling = (r.instructions / step + 1) * step;
        lines
            .entry((order, !r.to_device))
            .or_insert_with(|| {
                (
                    format!(
                        "ceiling {} {}",
                        r.variant,
                        if r.to_device { "to" } else { "from" }
                    ),
                    Vec::new(),
                )
            })
            .1
            .push(format!("{}={ceiling}", size_label(r.size)));
    }
    lines
        .into_values()
        .map(|(head, cells)| format!("{head} {}\n", cells.join(" ")))
        .collect()
}

fn parse_size(text: &str) -> Result<usize> {
    let size = match text.strip_suffix('K') {
        Some(k) => k.parse::<usize>()? * 1024,
        None => text.parse()?,
    };
    if !SIZES.contains(&size) {
        bail!("not one of the measured sizes {SIZES:?}");
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(variant: &str, size: usize, instructions: u64) -> Row {
        Row {
            variant: variant.into(),
            to_device: true,
            size,
            instructions,
            emulated: 0,
        }
    }

    #[test]
    fn ceilings_above_goals_and_rows_above_ceilings_fail() {
        let c = Ceilings::parse(
            "# comment\nceiling avx2 to 1=50 64K=900 # why\ngoal avx2 to 1=60 64K=800\n",
        )
        .unwrap();
        let err = c.check_goals().unwrap_err().to_string();
        assert!(
            err.contains("64K: ceiling 900 is above the goal 800"),
            "{err}"
        );
        assert!(!err.contains(" 1: "), "{err}");
        assert!(c.check(&[row("avx2", 1, 50)]).is_empty());
        assert_eq!(c.check(&[row("avx2", 1, 51)]).len(), 1);
        assert!(c.check(&[row("avx2", 8, 1)])[0].contains("no ceiling"));
    }

    #[test]
    fn malformed_lines_are_refused() {
        assert!(Ceilings::parse("ceiling avx2 up 1=5").is_err());
        assert!(Ceilings::parse("ceiling avx2 to 3=5").is_err());
        assert!(Ceilings::parse("limit avx2 to 1=5").is_err());
        assert!(Ceilings::parse("ceiling avx2 to 1:5").is_err());
    }

    #[test]
    fn the_committed_file_parses_and_meets_its_goals() {
        let c = Ceilings::load(&xtask_base::paths::root().join(PATH)).unwrap();
        c.check_goals().unwrap();
        assert!(!c.goals.is_empty());
    }
}
