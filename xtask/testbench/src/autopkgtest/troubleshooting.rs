//! README.md's troubleshooting table against what the packages print: every message a user
//! may search for is quoted there.

use std::fs;

use anyhow::{ensure, Context, Result};

use xtask_base::paths;

/// The messages README.md's troubleshooting table quotes, as the gpu test printed them on the
/// VM testbed: the library's (logging on), insmod.sh's and mtgdrdrv-load's (with mtgpu for the
/// emulated provider's name) and the kernel's. Each must be in the table word for word, so that
/// a user who searches the README for the message finds its cause and fix.
pub(super) fn check_quotes(console: &str) -> Result<()> {
    let readme =
        fs::read_to_string(paths::root().join("README.md")).context("reading README.md")?;
    let table = troubleshooting_table(&readme)?;
    let mut quoted = 0;
    for line in console.lines() {
        // Kernel lines carry a `[   4.5]` timestamp first.
        let text = match line.split_once("] ") {
            Some((stamp, rest)) if stamp.starts_with('[') => rest,
            _ => line,
        };
        let text = text.trim_end();
        let wanted = text.starts_with("ERR:  ")
            || (text.starts_with("DBG:  ") && text.contains("mmap"))
            || text.starts_with("insmod.sh: ")
            || text.starts_with("mtgdrdrv: Unknown symbol")
            || (text.starts_with("mtgdrdrv: ")
                && (text.contains("driver is not loaded")
                    || text.contains("loaded with disable_driver=1")));
        if !wanted {
            continue;
        }
        // mtgdrdrv-load names the provider, the emulated one here; README.md names mtgpu.
        let text = &text.replace("mtgpu_emu", "mtgpu");
        ensure!(
            table.iter().any(|row| row.contains(text.as_str())),
            "README.md's troubleshooting table does not quote this message the gpu test \
             printed:\n{text}"
        );
        quoted += 1;
    }
    ensure!(
        quoted >= 7,
        "the gpu test printed only {quoted} of the messages README.md quotes"
    );
    Ok(())
}

/// The body rows of the table under README.md's "## Troubleshooting" (symptom, cause, fix).
fn troubleshooting_table(readme: &str) -> Result<Vec<&str>> {
    let section = readme
        .split_once("\n## Troubleshooting\n")
        .context("README.md has no \"## Troubleshooting\"")?
        .1;
    let section = section.split("\n## ").next().unwrap_or(section);
    let rows: Vec<&str> = section
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(2)
        .collect();
    ensure!(
        !rows.is_empty(),
        "README.md's \"## Troubleshooting\" has no table"
    );
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_troubleshooting_table_quotes_the_guests_messages() {
        let readme = fs::read_to_string(paths::root().join("README.md")).unwrap();
        let rows = troubleshooting_table(&readme).unwrap();
        assert!(
            rows.iter().all(|r| r.matches(" | ").count() == 2),
            "{rows:#?}"
        );
        // A guest that printed the same messages as a passing run, kernel timestamps and
        // the emulated provider's name included.
        let console = rows
            .iter()
            .flat_map(|r| r.split('`'))
            .filter(|q| q.starts_with("ERR:  ") || q.starts_with("mtgdrdrv: "))
            .map(|q| {
                format!(
                    "[  4.5] {}",
                    q.replace("mtgpu is loaded", "mtgpu_emu is loaded")
                )
            })
            .collect::<Vec<_>>()
            .join("\n");
        check_quotes(&console).unwrap();
        let unknown = format!("{console}\nERR:  something the README does not say");
        assert!(check_quotes(&unknown).is_err());
        assert!(troubleshooting_table("# x\n\n## Troubleshooting\n\ntext\n").is_err());
    }
}
