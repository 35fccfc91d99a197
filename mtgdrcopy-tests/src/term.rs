//! What goes to the terminal besides the results: warnings, errors and a progress line, all on
//! standard error. Colour only when stderr is a terminal, `TERM` is not `dumb` and `NO_COLOR`
//! is unset or empty; the progress line only when stderr is a terminal. Standard output carries
//! the results alone, the same whether or not it is a terminal.

use std::io::{self, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether a progress line is on the screen (so that clearing it is needed).
static PROGRESS_SHOWN: AtomicBool = AtomicBool::new(false);

#[derive(Clone, Copy, Debug)]
pub struct Term {
    color: bool,
    progress: bool,
}

const RED: &str = "\x1b[1;31m";
const YELLOW: &str = "\x1b[1;33m";
const RESET: &str = "\x1b[0m";

impl Term {
    /// Decides from stderr and the environment.
    pub fn detect() -> Term {
        let tty = io::stderr().is_terminal();
        let dumb = std::env::var_os("TERM").is_some_and(|t| t == "dumb");
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Term {
            color: tty && !dumb && !no_color,
            progress: tty && !dumb,
        }
    }

    fn paint(&self, color: &str, text: &str) -> String {
        if self.color {
            format!("{color}{text}{RESET}")
        } else {
            text.to_string()
        }
    }

    /// `warning: …` on stderr.
    pub fn warn(&self, msg: impl std::fmt::Display) {
        self.clear_progress();
        eprintln!("{} {msg}", self.paint(YELLOW, "warning:"));
    }

    /// `program: …` on stderr, with the whole context chain on one line.
    pub fn error(&self, program: &str, err: &anyhow::Error) {
        self.clear_progress();
        eprintln!("{} {err:#}", self.paint(RED, &format!("{program}:")));
    }

    /// Replaces the progress line (nothing when stderr is not a terminal).
    pub fn progress(&self, msg: impl std::fmt::Display) {
        if self.progress {
            let mut e = io::stderr().lock();
            // \r and erase-line: the next message overwrites this one.
            let _ = write!(e, "\r\x1b[2K{msg}");
            let _ = e.flush();
            PROGRESS_SHOWN.store(true, Ordering::Relaxed);
        }
    }

    pub fn clear_progress(&self) {
        if self.progress && PROGRESS_SHOWN.swap(false, Ordering::Relaxed) {
            let mut e = io::stderr().lock();
            let _ = write!(e, "\r\x1b[2K");
            let _ = e.flush();
        }
    }
}
