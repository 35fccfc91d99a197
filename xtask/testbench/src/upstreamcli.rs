//! The tools as a user of NVIDIA GDRCopy calls them: a corpus of upstream-style invocations
//! (upstream's README examples and the options its own scripts use, with our program names),
//! each with what a script of theirs greps for, run in the test VM against the emulated GPU.
//!
//! The corpus is `upstreamcli/corpus.txt`, one check per line:
//! `COMMAND ==> KIND PATTERN`. KIND is `out~` / `err~` (a line of standard output / error
//! matches the extended regular expression PATTERN, as `grep -E`), `out!~` / `err!~` (no line
//! matches) or `exit` (PATTERN is the exit status). `\t` in PATTERN is a tab. Each distinct
//! command runs once; every check of it is then made on what it printed.

use std::fmt::Write as _;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use xshell::Shell;

use crate::step::{timed, Step};
use crate::vmtest::{self, print_guest_steps};
use crate::{kernel, vm};
use xtask_base::{host, paths};

pub const STEP: &str = "upstream GDRCopy's invocations and output lines, in QEMU (Debian 6.1)";

const CORPUS: &str = include_str!("upstreamcli/corpus.txt");

/// What one check looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Some line of the stream matches.
    Matches(Stream),
    /// No line of the stream matches.
    Lacks(Stream),
    /// The exit status.
    Exit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stream {
    Out,
    Err,
}

impl Stream {
    fn file(self) -> &'static str {
        match self {
            Stream::Out => "out",
            Stream::Err => "err",
        }
    }
}

/// One line of the corpus.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Check {
    /// 1-based line number in corpus.txt.
    line: usize,
    command: String,
    kind: Kind,
    /// The regular expression (tabs expanded) or the exit status.
    pattern: String,
}

fn parse(corpus: &str) -> Result<Vec<Check>> {
    let mut checks = Vec::new();
    for (i, raw) in corpus.lines().enumerate() {
        let line = raw.trim_end();
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let (command, check) = line
            .split_once(" ==> ")
            .with_context(|| format!("corpus.txt:{}: no ` ==> ` in {line:?}", i + 1))?;
        let (kind, pattern) = check.split_once(' ').unwrap_or((check, ""));
        let kind = match kind {
            "out~" => Kind::Matches(Stream::Out),
            "err~" => Kind::Matches(Stream::Err),
            "out!~" => Kind::Lacks(Stream::Out),
            "err!~" => Kind::Lacks(Stream::Err),
            "exit" => Kind::Exit,
            other => bail!("corpus.txt:{}: unknown check {other:?}", i + 1),
        };
        ensure!(!pattern.is_empty(), "corpus.txt:{}: empty pattern", i + 1);
        ensure!(
            kind != Kind::Exit || pattern.parse::<u8>().is_ok(),
            "corpus.txt:{}: exit wants a status, got {pattern:?}",
            i + 1
        );
        checks.push(Check {
            line: i + 1,
            command: command.trim().to_string(),
            kind,
            pattern: pattern.replace("\\t", "\t"),
        });
    }
    Ok(checks)
}

/// Single-quotes `s` for the guest's shell.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The guest script: each distinct command once, its output and status kept and shown; then
/// the checks as the TAP 14 subtest `upstream corpus`, test point K the K-th check, named by
/// its corpus line, with the output of a command whose check failed as TAP comments.
fn guest_script(checks: &[Check]) -> String {
    let mut commands: Vec<&str> = Vec::new();
    for c in checks {
        if !commands.contains(&c.command.as_str()) {
            commands.push(&c.command);
        }
    }
    let mut s = String::from(
        "step() { echo \"MTGDRCOPY-STEP $1 $(cut -d' ' -f1 /proc/uptime)\"; }\n\
         step corpus\nmkdir -p /tmp/corpus\n",
    );
    for (n, cmd) in commands.iter().enumerate() {
        // The output goes to the console too, so that the log shows what each line looked like.
        let _ = writeln!(
            s,
            "( {cmd} ) >/tmp/corpus/{n}.out 2>/tmp/corpus/{n}.err; echo $? >/tmp/corpus/{n}.rc\n\
             echo \"# corpus command {n}, exit $(cat /tmp/corpus/{n}.rc): \"{}\n\
             sed 's/^/  out| /' /tmp/corpus/{n}.out; sed 's/^/  err| /' /tmp/corpus/{n}.err",
            quote(cmd)
        );
    }
    let _ = writeln!(
        s,
        "step checks\nfailed=0\necho '# Subtest: upstream corpus'\necho '    1..{}'",
        checks.len()
    );
    for (k, c) in checks.iter().enumerate() {
        let n = commands
            .iter()
            .position(|x| *x == c.command)
            .unwrap_or_default();
        let test = match c.kind {
            Kind::Matches(st) => format!(
                "grep -Eq -- {} /tmp/corpus/{n}.{}",
                quote(&c.pattern),
                st.file()
            ),
            Kind::Lacks(st) => format!(
                "! grep -Eq -- {} /tmp/corpus/{n}.{}",
                quote(&c.pattern),
                st.file()
            ),
            Kind::Exit => format!("[ \"$(cat /tmp/corpus/{n}.rc)\" = {} ]", c.pattern),
        };
        let _ = writeln!(
            s,
            "if {test}; then echo '    ok {k} - corpus.txt:{line}'; else \
             echo '    not ok {k} - corpus.txt:{line}'; failed=$((failed + 1)); \
             echo \"    # exit $(cat /tmp/corpus/{n}.rc); stdout, stderr:\"; \
             sed 's/^/    # | /' /tmp/corpus/{n}.out /tmp/corpus/{n}.err | head -n 60; fi",
            k = k + 1,
            line = c.line
        );
    }
    let _ = writeln!(
        s,
        "echo \"    # $(({} - failed)) passed, $failed failed, 0 skipped\"\n\
         if [ $failed = 0 ]; then echo 'ok - upstream corpus'; else echo 'not ok - upstream corpus'; fi",
        checks.len()
    );
    s += "step done\nexit 0\n";
    s
}

/// The corpus lines of the checks that did not pass, from the console's `upstream corpus`
/// subtest: failed ones and those never reported (all of them without one such subtest).
fn judge(checks: &[Check], console: &str) -> Vec<usize> {
    let runs = vmtest::subtests(console, "upstream");
    let passed: std::collections::BTreeSet<usize> = match runs.as_slice() {
        [run] => run
            .points
            .iter()
            .filter(|(_, ok, skipped)| *ok && !*skipped)
            .map(|(k, _, _)| *k)
            .collect(),
        _ => Default::default(),
    };
    checks
        .iter()
        .enumerate()
        .filter(|(k, _)| !passed.contains(&(k + 1)))
        .map(|(_, c)| c.line)
        .collect()
}

fn run(sh: &Shell) -> Result<()> {
    host::ensure_host_packages(vmtest::HOST_PACKAGES)?;
    let checks = parse(CORPUS)?;
    let kernel = kernel::bookworm_kernel()?;
    let mut spec = vmtest::tools_vm(sh, &kernel, &guest_script(&checks))?;
    spec.timeout = std::time::Duration::from_secs(900);
    let log = paths::build_dir().join("vm").join("upstream-cli.log");
    let t = Instant::now();
    let outcome = vm::run(&spec, &log)?;
    timed("VM run", t);
    print_guest_steps(&outcome.console);
    outcome.ensure_passed("the upstream-style invocations", &log)?;
    let failed = judge(&checks, &outcome.console.replace('\r', ""));
    if !failed.is_empty() {
        let lines: Vec<String> = CORPUS.lines().map(String::from).collect();
        let mut why = String::new();
        for n in &failed {
            let _ = writeln!(
                why,
                "  corpus.txt:{n}: {}",
                lines.get(n - 1).map_or("", |l| l.as_str())
            );
        }
        bail!(
            "{} of {} upstream-style checks failed:\n{why}full log (with each failed command's \
             output): {}",
            failed.len(),
            checks.len(),
            log.display()
        );
    }
    eprintln!("    {} upstream-style checks passed", checks.len());
    Ok(())
}

pub fn test_step() -> Step<'static> {
    (STEP, Box::new(run))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_corpus_parses_and_covers_every_tool() {
        let checks = parse(CORPUS).unwrap();
        for tool in ["sanity", "copybw", "copylat", "apiperf"] {
            assert!(
                checks
                    .iter()
                    .any(|c| c.command.starts_with(&format!("mtgdrcopy_{tool}"))),
                "no check of {tool}"
            );
        }
    }

    #[test]
    fn lines_parse_into_checks() {
        let c = parse("# comment\n\na -v ==> err~ ^x\\ty$\nb ==> exit 2\nc ==> out!~ z\n").unwrap();
        assert_eq!(c.len(), 3);
        assert_eq!(
            (c[0].line, c[0].command.as_str(), c[0].kind),
            (3, "a -v", Kind::Matches(Stream::Err))
        );
        assert_eq!(c[0].pattern, "^x\ty$");
        assert_eq!((c[1].kind, c[1].pattern.as_str()), (Kind::Exit, "2"));
        assert_eq!(c[2].kind, Kind::Lacks(Stream::Out));
        assert!(parse("a ==> exit x\n").is_err());
        assert!(parse("a ==> bogus y\n").is_err());
        assert!(parse("a => out~ y\n").is_err());
        assert!(parse("a ==> out~\n").is_err());
    }

    #[test]
    fn the_script_runs_each_command_once_and_quotes_patterns() {
        let checks = parse("a ==> out~ it's\na ==> exit 0\nb ==> err!~ q\n").unwrap();
        let s = guest_script(&checks);
        assert_eq!(s.matches("( a )").count(), 1);
        assert_eq!(s.matches("( b )").count(), 1);
        assert!(s.contains(r"grep -Eq -- 'it'\''s' /tmp/corpus/0.out"));
        assert!(s.contains("! grep -Eq -- 'q' /tmp/corpus/1.err"));
        assert!(s.contains("[ \"$(cat /tmp/corpus/0.rc)\" = 0 ]"));
    }

    /// The guest script run by this machine's sh, its corpus files in a directory of its own:
    /// the script and the judge are tested together.
    fn console_of(checks: &[Check]) -> String {
        let dir = std::env::temp_dir().join(format!("corpus-test-{}", std::process::id()));
        let script = guest_script(checks).replace("/tmp/corpus", &dir.display().to_string());
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn the_corpus_is_a_tap_subtest_and_failed_or_missing_checks_fail() {
        let checks =
            parse("echo x ==> out~ x\necho x ==> exit 0\nfalse ==> exit 0\necho y ==> out~ z\n")
                .unwrap();
        let console = console_of(&checks);
        assert_eq!(judge(&checks, &console), vec![3, 4], "{console}");
        let runs = vmtest::subtests(&console, "upstream");
        assert_eq!(runs.len(), 1);
        assert!(runs[0].fault().is_some());
        let failed: Vec<usize> = runs[0]
            .points
            .iter()
            .filter(|p| !p.1)
            .map(|p| p.0)
            .collect();
        assert_eq!(failed, vec![3, 4]);
        assert_eq!(runs[0].summary, "2 passed, 2 failed, 0 skipped");

        let passing = parse("echo x ==> out~ x\necho x ==> exit 0\n").unwrap();
        let console = console_of(&passing);
        assert!(judge(&passing, &console).is_empty(), "{console}");
        // A console cut short: a subtest never closed counts for nothing.
        let cut = &console[..console.find("    ok 2").unwrap()];
        assert_eq!(judge(&passing, cut), vec![1, 2]);
        assert_eq!(judge(&passing, ""), vec![1, 2]);
    }
}
