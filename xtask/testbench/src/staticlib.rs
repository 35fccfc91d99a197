//! libgdrapi.a as C programs link it. rustc's staticlib exports all of std and carries LLVM
//! bitcode; `debian/scripts/static-archive` makes it one object exporting only gdr_*, and
//! [`check`] proves, of any archive (the test step's, or the one a package ships):
//!
//! - no member has an LLVM bitcode section (`.llvmbc`, `.llvmcmd`);
//! - its defined global symbols are exactly the API listed in debian/libgdrapi.symbols;
//! - a C program links it beside another Rust staticlib (staticlib/other.rs: its own std,
//!   global allocator and unwinding) with `--gc-sections`, and runs, each library on its own
//!   runtime.
//!
//! Symbols are read with readelf, not nm: nm hands members that carry bitcode to binutils' LTO
//! plugin (LLVMgold), and where that plugin's LLVM is older than rustc's it lists no symbol of
//! theirs, so an unprocessed archive would look clean.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Cmd, Shell};

use xtask_base::targets::Target;
use xtask_base::{cross, paths, targets};

/// The other Rust staticlib and the C program of the link check.
const OTHER_RS: &str = include_str!("staticlib/other.rs");
const PROG_C: &str = include_str!("staticlib/prog.c");

/// What other.rs's `other_rust_answer` returns when its allocator and unwinding worked.
const OTHER_ANSWER: i32 = 42;

/// An API function prog.c never calls: `--gc-sections` must drop it, which it can only if the
/// partial link kept each function in its own section.
const UNCALLED: &str = "gdr_copy_to_mapping";

/// Sections the archive must not have: LLVM bitcode for LTO, useless to a C linker.
const BITCODE: &[&str] = &[".llvmbc", ".llvmcmd"];

/// Link errors shown in a failure; a clash of two std copies is thousands of lines.
const ERROR_LINES: usize = 12;

/// `cargo xtask check-staticlib`.
#[derive(clap::Args)]
pub struct Args {
    /// A processed archive to check (e.g. a package's); without it, the release build's, made
    /// with debian/scripts/static-archive (the step of `cargo xtask test`).
    pub archive: Option<PathBuf>,
    /// Rust target triple: the archive's, or the one to build for; checked with that target's
    /// toolchain (arm64: Debian's, in its chroot, programs run under qemu-user).
    #[arg(long, value_name = "TRIPLE")]
    pub target: Option<String>,
}

pub fn cli(args: Args) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    let target = targets::parse(args.target.as_deref())?;
    match args.archive {
        None => step(&sh, target),
        Some(archive) => check(&sh, &archive, target),
    }
}

pub fn script() -> PathBuf {
    paths::root().join("debian/scripts/static-archive")
}

/// Runs static-archive on `input` into `output`; for a cross target in its toolchain chroot with
/// its binutils (so both paths must be in the workspace).
pub fn static_archive(
    sh: &Shell,
    input: &Path,
    output: &Path,
    target: Option<&Target>,
) -> Result<()> {
    script_cmd(sh, input, output, target)?
        .quiet()
        .run()
        .with_context(|| format!("debian/scripts/static-archive {}", input.display()))
}

fn script_cmd<'a>(
    sh: &'a Shell,
    input: &Path,
    output: &Path,
    target: Option<&Target>,
) -> Result<Cmd<'a>> {
    let script = script();
    Ok(match target {
        None => cmd!(sh, "{script} {input} {output}"),
        Some(t) => {
            let env: Vec<String> = ["ld", "objcopy", "ar", "nm", "readelf"]
                .iter()
                .map(|tool| format!("{}={}-{tool}", tool.to_uppercase(), t.multiarch))
                .collect();
            cross::toolchain(sh)?
                .cmd(sh, t, &env, None, &script.to_string_lossy())
                .args([input, output])
        }
    })
}

/// Checks the processed static library `archive` for `target` (the machine's if `None`): no
/// bitcode, only the API exported, links and runs beside another Rust staticlib. Every check
/// runs; the error names each that failed.
pub fn check(sh: &Shell, archive: &Path, target: Option<&Target>) -> Result<()> {
    // A copy in the workspace: the cross toolchain's chroot sees only that.
    let dir = work_dir(&paths::build_dir().join("staticlib-check"), target);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let lib = dir.join("libgdrapi.a");
    std::fs::copy(archive, &lib).with_context(|| format!("copying {}", archive.display()))?;
    let tools = Tools { sh, target };
    let failures: Vec<String> = [
        no_bitcode(&tools, &lib),
        exports_only_the_api(&tools, &lib),
        links_beside_rust(&tools, &dir, &lib),
    ]
    .into_iter()
    .filter_map(|r| r.err().map(|e| format!("{e:#}")))
    .collect();
    ensure!(
        failures.is_empty(),
        "{}:\n{}",
        archive.display(),
        failures.join("\n")
    );
    Ok(())
}

/// The step of `cargo xtask test`: see [`step`].
pub fn test_step(sh: &Shell) -> Result<()> {
    step(sh, None)
}

/// The release staticlib for `target` through the script into
/// build/staticlib-check/libgdrapi[-ARCH].a, twice to show the output is reproducible, then
/// [`check`]; and the script must refuse an archive without the API.
fn step(sh: &Shell, target: Option<&Target>) -> Result<()> {
    let input = match target {
        None => crate::library::build_library(sh)?.join("libgdrapi.a"),
        Some(t) => {
            cross::build(sh, t, true, false)?;
            targets::release_dir(t).join("libgdrapi.a")
        }
    };
    let dir = paths::build_dir().join("staticlib-check");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = target.map_or("libgdrapi".to_owned(), |t| {
        format!("libgdrapi-{}", t.debian)
    });
    let output = dir.join(format!("{name}.a"));
    let again = dir.join(format!("{name}.again.a"));
    static_archive(sh, &input, &output, target)?;
    {
        // Another temporary directory (natively; the chroot's is its own /tmp): its path must
        // not reach the output.
        let _tmp = sh.push_env("TMPDIR", &dir);
        static_archive(sh, &input, &again, target)?;
    }
    let (a, b) = (read(&output)?, read(&again)?);
    ensure!(
        a == b,
        "static-archive is not reproducible: two runs on {} differ",
        input.display()
    );
    std::fs::remove_file(&again)?;
    let before = std::fs::metadata(&input)?.len();
    eprintln!(
        "    {} bytes -> {} bytes, {} global symbols -> {}",
        before,
        a.len(),
        defined_globals(&readelf(sh, target, "-s", &input)?).len(),
        defined_globals(&readelf(sh, target, "-s", &output)?).len(),
    );
    check(sh, &output, target)?;
    refuses_archive_without_api(sh, &dir, target)
}

/// static-archive on other.rs's staticlib (left by [`check`]), which defines no gdr_* symbol:
/// must fail, saying so in one line.
fn refuses_archive_without_api(sh: &Shell, dir: &Path, target: Option<&Target>) -> Result<()> {
    let other = work_dir(dir, target).join("libother.a");
    let out = dir.join("refused.a");
    if out.exists() {
        std::fs::remove_file(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    let result = script_cmd(sh, &other, &out, target)?
        .quiet()
        .ignore_status()
        .output()
        .context("running debian/scripts/static-archive")?;
    let stderr = String::from_utf8_lossy(&result.stderr);
    ensure!(
        !result.status.success()
            && !out.exists()
            && stderr.lines().count() == 1
            && stderr.contains("defines no gdr_* symbol"),
        "static-archive on an archive without gdr_* symbols: {}, {:?}",
        result.status,
        stderr
    );
    Ok(())
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// The programs the checks run: the machine's, or a cross target's in its toolchain chroot.
struct Tools<'a> {
    sh: &'a Shell,
    target: Option<&'a Target>,
}

impl<'a> Tools<'a> {
    fn binutil(&self, tool: &str) -> Result<Cmd<'a>> {
        match self.target {
            None => Ok(self.sh.cmd(tool)),
            // The target's binutils, run in the chroot on a workspace path.
            Some(t) => Ok(cross::toolchain(self.sh)?.cmd(
                self.sh,
                t,
                &[],
                None,
                &format!("{}-{tool}", t.multiarch),
            )),
        }
    }

    fn cc(&self) -> Result<Cmd<'a>> {
        match self.target {
            None => Ok(self.sh.cmd("cc")),
            Some(_) => self.binutil("gcc"),
        }
    }

    fn rustc(&self) -> Result<Cmd<'a>> {
        match self.target {
            None => Ok(self.sh.cmd("rustc")),
            Some(t) => Ok(cross::toolchain(self.sh)?
                .cmd(self.sh, t, &[], None, "rustc")
                .args(["--target", t.triple])),
        }
    }

    fn run(&self, exe: &Path) -> Result<Cmd<'a>> {
        match self.target {
            None => Ok(self.sh.cmd(exe)),
            Some(t) => crate::crosstest::run_program(self.sh, t, &[], exe),
        }
    }
}

/// `readelf -W OPTION path`'s output (`-S` sections, `-s` symbols).
fn readelf(sh: &Shell, target: Option<&Target>, option: &str, path: &Path) -> Result<String> {
    Tools { sh, target }
        .binutil("readelf")?
        .args(["-W", option])
        .arg(path)
        .quiet()
        .read()
        .with_context(|| format!("readelf {option} {} (binutils)", path.display()))
}

fn no_bitcode(tools: &Tools, archive: &Path) -> Result<()> {
    let listing = readelf(tools.sh, tools.target, "-S", archive)?;
    let sections = sections(&listing);
    ensure!(!sections.is_empty(), "readelf -S lists no section");
    let bitcode: Vec<String> = sections
        .iter()
        .filter(|(_, name)| BITCODE.contains(&name.as_str()))
        .map(|(member, name)| format!("{member}: {name}"))
        .collect();
    ensure!(
        bitcode.is_empty(),
        "{} LLVM bitcode sections, e.g. {}",
        bitcode.len(),
        bitcode[0]
    );
    Ok(())
}

fn exports_only_the_api(tools: &Tools, archive: &Path) -> Result<()> {
    let (path, api) = listed_symbols()?;
    ensure!(!api.is_empty(), "{} lists no symbol", path.display());
    let exported = defined_globals(&readelf(tools.sh, tools.target, "-s", archive)?);
    compare_exports(&exported, &api)
}

/// Fails unless `exported` is `api`, naming what is extra (a few) and what is missing.
fn compare_exports(exported: &[String], api: &[String]) -> Result<()> {
    let extra: Vec<&str> = exported
        .iter()
        .filter(|s| !api.contains(s))
        .map(String::as_str)
        .collect();
    let missing: Vec<&str> = api
        .iter()
        .filter(|s| !exported.contains(s))
        .map(String::as_str)
        .collect();
    let mut problems = Vec::new();
    if !extra.is_empty() {
        let shown = extra.len().min(5);
        problems.push(format!(
            "exports {} global symbols beyond the gdr_* API ({}{})",
            extra.len(),
            extra[..shown].join(", "),
            if extra.len() > shown { ", …" } else { "" }
        ));
    }
    if !missing.is_empty() {
        problems.push(format!("lacks {}", missing.join(", ")));
    }
    ensure!(problems.is_empty(), "{}", problems.join("; "));
    Ok(())
}

/// Where [`check`] works for `target`, under `dir`.
fn work_dir(dir: &Path, target: Option<&Target>) -> PathBuf {
    dir.join(target.map_or("native", |t| t.debian))
}

/// Builds other.rs's staticlib and prog.c in `dir`, links prog.c with `lib` and it, runs it.
fn links_beside_rust(tools: &Tools, dir: &Path, lib: &Path) -> Result<()> {
    let (other_rs, prog_c) = (dir.join("other.rs"), dir.join("prog.c"));
    std::fs::write(&other_rs, OTHER_RS)?;
    std::fs::write(&prog_c, PROG_C)?;
    let other = dir.join("libother.a");
    tools
        .rustc()?
        .args(["--edition", "2021", "-O", "--crate-type", "staticlib"])
        .args(["--crate-name", "other", "-o"])
        .args([&other, &other_rs])
        .quiet()
        .run()
        .context("building the other Rust staticlib (rustc)")?;
    let include = paths::root().join("libgdrapi/include");
    let exe = dir.join("prog");
    let link = tools
        .cc()?
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
        .arg(format!("-I{}", include.display()))
        .arg(&prog_c)
        .args([lib, &other])
        .args(["-lpthread", "-ldl", "-lm"])
        // Unused sections must still go; any linker warning (an executable stack, a text
        // relocation) is a failure.
        .args(["-Wl,--gc-sections", "-Wl,--fatal-warnings", "-o"])
        .arg(&exe)
        .quiet()
        .ignore_status()
        .output()
        .context("running the C compiler")?;
    ensure!(
        link.status.success(),
        "a C program does not link it beside another Rust staticlib:\n{}",
        head(&String::from_utf8_lossy(&link.stderr), ERROR_LINES)
    );
    let run = tools
        .run(&exe)?
        .env_remove("GDRCOPY_ENABLE_LOGGING")
        .env_remove("GDRCOPY_LOG_LEVEL")
        .quiet()
        .ignore_status()
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    let stdout = String::from_utf8_lossy(&run.stdout);
    let expected = format!(
        "gdr_runtime_get_version {}.{}\nother_rust_answer {OTHER_ANSWER}\n",
        gdrapi::GDR_API_MAJOR_VERSION,
        gdrapi::GDR_API_MINOR_VERSION
    );
    ensure!(
        run.status.success() && stdout == expected,
        "the program linked beside another Rust staticlib: {}, printed {stdout:?}, expected \
         {expected:?}; stderr: {}",
        run.status,
        String::from_utf8_lossy(&run.stderr).trim()
    );
    let symbols = readelf(tools.sh, tools.target, "-s", &exe)?;
    ensure!(
        !symbols
            .lines()
            .any(|l| l.split_whitespace().last() == Some(UNCALLED)),
        "--gc-sections left {UNCALLED}, which the program never calls, in it"
    );
    Ok(())
}

/// The first `n` lines of `text`, and how many more there were.
fn head(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut shown = lines[..n.min(lines.len())].join("\n");
    if lines.len() > n {
        shown.push_str(&format!("\n({} more lines)", lines.len() - n));
    }
    shown
}

/// (member, section name) of every section `readelf -S -W` lists for an archive or an object
/// (member empty for an object), but the null section.
fn sections(listing: &str) -> Vec<(String, String)> {
    let mut member = String::new();
    let mut found = Vec::new();
    for line in listing.lines() {
        if let Some(file) = line.strip_prefix("File: ") {
            member = file.to_owned();
            continue;
        }
        let Some((index, rest)) = line
            .trim_start()
            .strip_prefix('[')
            .and_then(|l| l.split_once(']'))
        else {
            continue;
        };
        let index = index.trim();
        if index == "Nr" || index == "0" {
            continue;
        }
        if let Some(name) = rest.split_whitespace().next() {
            found.push((member.clone(), name.to_owned()));
        }
    }
    found
}

/// The defined global (and weak) symbols of `readelf -s -W`'s listing, sorted, without repeats.
/// Hidden ones count: in a static link they clash all the same.
fn defined_globals(listing: &str) -> Vec<String> {
    let mut names: Vec<String> = listing
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // Num: Value Size Type Bind Vis [st_other…] Ndx Name
            if fields.len() < 8 || !fields[0].ends_with(':') {
                return None;
            }
            let (bind, ndx, name) = (
                fields[4],
                fields[fields.len() - 2],
                fields[fields.len() - 1],
            );
            let global = matches!(bind, "GLOBAL" | "WEAK" | "UNIQUE");
            (global && ndx != "UND").then(|| name.to_owned())
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// debian/libgdrapi.symbols: its path and the symbols it lists, sorted.
fn listed_symbols() -> Result<(PathBuf, Vec<String>)> {
    let path = paths::root().join("debian/libgdrapi.symbols");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok((path, symbols_listed(&text)))
}

/// The symbols a Debian symbols file lists (` name@Base version` lines), sorted.
fn symbols_listed(symbols_file: &str) -> Vec<String> {
    let mut names: Vec<String> = symbols_file
        .lines()
        .filter(|l| l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next()?.strip_suffix("@Base"))
        .map(str::to_owned)
        .collect();
    names.sort_unstable();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_from_a_symbols_file() {
        let file = "libgdrapi.so.1 libgdrapi #MINVER#\n\
                    * Build-Depends-Package: libgdrapi\n \
                    gdr_open@Base 1.0.0\n \
                    gdr_close@Base 1.0.0\n";
        assert_eq!(symbols_listed(file), ["gdr_close", "gdr_open"]);
    }

    const SECTIONS: &str = "
File: libgdrapi.a(gdrapi.o)
There are 5 section headers, starting at offset 0x1000:

Section Headers:
  [Nr] Name              Type            Address          Off    Size   ES Flg Lk Inf Al
  [ 0]                   NULL            0000000000000000 000000 000000 00      0   0  0
  [ 1] .text.gdr_open    PROGBITS        0000000000000000 000040 000010 00  AX  0   0 16
  [ 2] .llvmbc           PROGBITS        0000000000000000 000050 000100 00   E  0   0  1
Key to Flags:
  W (write), A (alloc), X (execute), M (merge), S (strings), I (info),

File: libgdrapi.a(std.o)
Section Headers:
  [Nr] Name              Type            Address          Off    Size   ES Flg Lk Inf Al
  [ 0]                   NULL            0000000000000000 000000 000000 00      0   0  0
  [10044] .tbss.x        NOBITS          0000000000000000 11a478 000010 00 WAT  0   0  8
";

    #[test]
    fn sections_per_member() {
        let found = sections(SECTIONS);
        let pairs: Vec<(&str, &str)> = found
            .iter()
            .map(|(m, n)| (m.as_str(), n.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("libgdrapi.a(gdrapi.o)", ".text.gdr_open"),
                ("libgdrapi.a(gdrapi.o)", ".llvmbc"),
                ("libgdrapi.a(std.o)", ".tbss.x"),
            ]
        );
    }

    const SYMBOLS: &str = "
File: libgdrapi.a(gdrapi.o)

Symbol table '.symtab' contains 9 entries:
   Num:    Value          Size Type    Bind   Vis      Ndx Name
     0: 0000000000000000     0 NOTYPE  LOCAL  DEFAULT  UND 
     1: 0000000000000000     0 SECTION LOCAL  DEFAULT    2 .text
     2: 0000000000000000    16 TLS     LOCAL  DEFAULT   10 _RNvNtNtCs_3std6thread7current7CURRENT
     3: 0000000000000000   100 FUNC    GLOBAL DEFAULT    3 gdr_open
     4: 0000000000000000     0 NOTYPE  GLOBAL DEFAULT  UND malloc
     5: 0000000000000000     8 OBJECT  WEAK   HIDDEN     7 DW.ref.rust_eh_personality
     6: 0000000000000000    20 FUNC    GLOBAL HIDDEN     4 rust_eh_personality
     7: 0000000000000000     0 NOTYPE  WEAK   DEFAULT  UND __gmon_start__
     8: 0000000000000000    40 FUNC    GLOBAL DEFAULT [VARIANT_PCS]     5 __aarch64_cas4_acq

File: libgdrapi.a(other.o)

Symbol table '.symtab' contains 2 entries:
   Num:    Value          Size Type    Bind   Vis      Ndx Name
     0: 0000000000000000     0 NOTYPE  LOCAL  DEFAULT  UND 
     1: 0000000000000000     8 OBJECT  WEAK   HIDDEN     3 DW.ref.rust_eh_personality
";

    #[test]
    fn defined_globals_include_weak_and_hidden_not_undefined_or_local() {
        assert_eq!(
            defined_globals(SYMBOLS),
            [
                "DW.ref.rust_eh_personality",
                "__aarch64_cas4_acq",
                "gdr_open",
                "rust_eh_personality",
            ]
        );
    }

    #[test]
    fn the_package_symbols_file_is_the_api() {
        let (_, api) = listed_symbols().expect("debian/libgdrapi.symbols");
        assert!(api.len() > 10 && api.iter().all(|s| s.starts_with("gdr_")));
    }

    #[test]
    fn exports_compared_both_ways() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let api = s(&["gdr_close", "gdr_open"]);
        assert!(compare_exports(&api, &api).is_ok());
        let err = compare_exports(&s(&["a", "b", "c", "d", "e", "f", "gdr_close"]), &api)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "exports 6 global symbols beyond the gdr_* API (a, b, c, d, e, …); lacks gdr_open"
        );
    }

    #[test]
    fn head_says_how_much_it_left_out() {
        assert_eq!(head("a\nb\nc", 2), "a\nb\n(1 more lines)");
        assert_eq!(head("a\nb", 2), "a\nb");
    }
}
