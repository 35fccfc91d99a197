//! `--json FILE|-`: the [`Report`] as JSON. The file is created when the option is parsed,
//! before anything is measured, so a bad path fails at once and the message names it.

use std::fs::File;
use std::io::{self, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};

use super::result::Report;

/// Where the JSON goes.
pub enum JsonExport {
    Stdout,
    File { path: PathBuf, file: File },
}

impl JsonExport {
    /// Opens (creates or truncates) `target`; `-` means standard output.
    pub fn open(target: &str) -> Result<JsonExport> {
        if target == "-" {
            return Ok(JsonExport::Stdout);
        }
        let path = PathBuf::from(target);
        let file = File::create(&path)
            .with_context(|| format!("cannot create the --json file {}", path.display()))?;
        Ok(JsonExport::File { path, file })
    }

    /// Whether the JSON takes standard output (the human-readable report then goes to
    /// standard error, so that stdout stays one JSON document).
    pub fn is_stdout(&self) -> bool {
        matches!(self, JsonExport::Stdout)
    }

    /// Writes `report`, pretty-printed, with a final newline.
    pub fn write(self, report: &Report) -> Result<()> {
        match self {
            JsonExport::Stdout => {
                let mut out = io::stdout().lock();
                write_json(&mut out, report).context("writing the JSON report to stdout")
            }
            JsonExport::File { path, file } => {
                let mut out = io::BufWriter::new(file);
                write_json(&mut out, report)
                    .with_context(|| format!("writing the JSON report to {}", path.display()))
            }
        }
    }
}

fn write_json(out: &mut impl Write, report: &Report) -> Result<()> {
    serde_json::to_writer_pretty(&mut *out, report)?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::result::{Tool, SCHEMA_VERSION};

    #[test]
    fn bad_path_fails_when_opened_and_names_the_file() {
        let err = JsonExport::open("/nonexistent-dir/x.json")
            .err()
            .expect("a missing directory is an error");
        assert!(
            format!("{err:#}").contains("/nonexistent-dir/x.json"),
            "{err:#}"
        );
    }

    #[test]
    fn writes_a_report_that_reads_back() {
        let dir = std::env::temp_dir().join(format!("mtgdrcopy-export-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.json");
        let export = JsonExport::open(path.to_str().unwrap()).unwrap();
        assert!(!export.is_stdout());
        assert!(path.exists(), "created before anything is measured");
        let report = Report {
            schema_version: SCHEMA_VERSION,
            tool: Tool::Apiperf,
            results: Vec::new(),
        };
        export.write(&report).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with("}\n"));
        let back: Report = serde_json::from_str(&text).unwrap();
        assert_eq!(back, report);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
