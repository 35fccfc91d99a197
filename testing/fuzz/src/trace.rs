//! The operation traces: each worker appends the operations it runs to its own file, whose
//! tail is printed when it finds something, to show how it got there.

/// The trace file of the worker called `name`.
pub fn path(name: &str) -> String {
    format!("/tmp/mtgdrdrv_fuzz.{name}.trace")
}

/// The last `n` lines of a trace file.
pub fn tail(path: &str, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!(
        "last operations of {path}:\n  {}",
        lines[lines.len().saturating_sub(n)..].join("\n  ")
    )
}
