//! `--json FILE|-`: the [`Report`] as JSON. The JSON is written to a temporary file beside
//! FILE, created when the option is parsed (so a bad path fails before anything is measured and
//! the message names it), and renamed to FILE when the run succeeds; a failed or interrupted run
//! leaves FILE as it was, never empty or half-written.
//!
//! The temporary file is ours rather than the tempfile crate's: it is one `create` and one
//! `rename`, and the crate would add five crates to the vendored Debian source package.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::result::Report;

/// Where the JSON goes.
pub enum JsonExport {
    Stdout,
    File { path: PathBuf, temp: TempFile },
}

/// A file that is removed when dropped, unless `persist` renamed it.
pub struct TempFile {
    path: PathBuf,
    file: File,
    persisted: bool,
}

impl TempFile {
    /// `.<name>.<pid>.tmp` in `target`'s directory: the same file system, so the rename is
    /// atomic.
    fn beside(target: &Path) -> io::Result<TempFile> {
        let name = target
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?;
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".{}.tmp", std::process::id()));
        let path = target.with_file_name(temp_name);
        let file = File::create(&path)?;
        Ok(TempFile {
            path,
            file,
            persisted: false,
        })
    }

    fn persist(mut self, to: &Path) -> io::Result<()> {
        self.file.sync_all()?;
        std::fs::rename(&self.path, to)?;
        self.persisted = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.persisted {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl JsonExport {
    /// Creates the temporary file for `target`; `-` means standard output.
    pub fn open(target: &str) -> Result<JsonExport> {
        if target == "-" {
            return Ok(JsonExport::Stdout);
        }
        let path = PathBuf::from(target);
        // A file that cannot be created is a wrong command line (exit status 2).
        let temp = TempFile::beside(&path).map_err(|e| {
            crate::status::usage(format!(
                "cannot create the --json file {}: {e}",
                path.display()
            ))
        })?;
        Ok(JsonExport::File { path, temp })
    }

    /// Whether the JSON takes standard output (the human-readable report then goes to
    /// standard error, so that stdout stays one JSON document).
    pub fn is_stdout(&self) -> bool {
        matches!(self, JsonExport::Stdout)
    }

    /// Writes `report`, pretty-printed, with a final newline, and puts the file in place.
    pub fn write(self, report: &Report) -> Result<()> {
        match self {
            JsonExport::Stdout => {
                let mut out = io::stdout().lock();
                write_json(&mut out, report).context("writing the JSON report to stdout")
            }
            JsonExport::File { path, mut temp } => {
                let what = || format!("writing the JSON report to {}", path.display());
                write_json(&mut io::BufWriter::new(&mut temp.file), report).with_context(what)?;
                temp.persist(&path).with_context(what)
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
    use std::path::Path;

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

    fn report() -> Report {
        Report {
            schema_version: SCHEMA_VERSION,
            tool: Tool::Apiperf,
            results: Vec::new(),
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("mtgdrcopy-export-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn writes_a_report_that_reads_back() {
        let dir = scratch("ok");
        let path = dir.join("r.json");
        let export = JsonExport::open(path.to_str().unwrap()).unwrap();
        assert!(!export.is_stdout());
        assert!(
            !path.exists(),
            "only the temporary file exists until the run succeeds"
        );
        assert_eq!(entries(&dir).len(), 1);
        export.write(&report()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with("}\n"));
        let back: Report = serde_json::from_str(&text).unwrap();
        assert_eq!(back, report());
        assert_eq!(entries(&dir), ["r.json"], "no temporary file left");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_run_leaves_the_file_as_it_was() {
        let dir = scratch("failed");
        let path = dir.join("r.json");
        std::fs::write(&path, "previous run\n").unwrap();
        let export = JsonExport::open(path.to_str().unwrap()).unwrap();
        drop(export); // the run failed before write()
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "previous run\n");
        assert_eq!(entries(&dir), ["r.json"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
