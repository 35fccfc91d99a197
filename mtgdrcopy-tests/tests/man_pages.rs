//! The manual pages in `man/` are written by hand; this test ties each one to its program so
//! that they cannot drift apart: every program has a page, and the page's OPTIONS and SYNOPSIS
//! name exactly the options of the program's clap command (`mtgdrcopy_tests::cli`), with its
//! value names, defaults and possible values; EXIT STATUS lists the statuses of status.rs;
//! ENVIRONMENT and FILES name what the tools and libgdrapi read. Whether the pages are valid
//! roff is `cargo xtask test`'s groff and `man --warnings` step.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use mtgdrcopy_tests::tool::Status;

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The programs: one per src/bin/*.rs (cargo's rule, as debian/scripts/install-tree's).
fn programs() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(crate_dir().join("src/bin"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn page_path(program: &str) -> PathBuf {
    crate_dir().join("man").join(format!("{program}.1"))
}

/// A page split into its sections, each line reduced to its text.
struct Page {
    name: String,
    th: String,
    sections: Vec<(String, Vec<String>)>,
}

impl Page {
    fn read(program: &str) -> Page {
        let path = page_path(program);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{program} has no manual page {}: {e}", path.display()));
        let mut th = String::new();
        let mut sections: Vec<(String, Vec<String>)> = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix(".TH ") {
                th = rest.to_owned();
            } else if let Some(title) = line.strip_prefix(".SH ") {
                sections.push((title.trim_matches('"').to_owned(), Vec::new()));
            } else if let Some((_, lines)) = sections.last_mut() {
                lines.push(line.to_owned());
            }
        }
        Page {
            name: program.to_owned(),
            th,
            sections,
        }
    }

    /// The raw lines of section `title`.
    fn section(&self, title: &str) -> &[String] {
        self.sections
            .iter()
            .find(|(t, _)| t == title)
            .map(|(_, lines)| lines.as_slice())
            .unwrap_or_else(|| panic!("{}'s page has no {title} section", self.name))
    }

    /// The text of section `title`, one line per input line.
    fn text(&self, title: &str) -> String {
        self.section(title)
            .iter()
            .map(|l| plain(l))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The tagged paragraphs (`.TP`) of section `title`: (tag, body), as text.
    fn tagged(&self, title: &str) -> Vec<(String, String)> {
        let mut items: Vec<(String, String)> = Vec::new();
        let mut lines = self.section(title).iter();
        while let Some(line) = lines.next() {
            if line == ".TP" {
                let tag = lines.next().map(|t| plain(t)).unwrap_or_default();
                items.push((tag, String::new()));
            } else if line.starts_with(".PP") || line.starts_with(".RS") {
                // A paragraph after the list: not part of the last item.
                items.push((String::new(), String::new()));
            } else if let Some((_, body)) = items.last_mut() {
                body.push(' ');
                body.push_str(&plain(line));
            }
        }
        items.retain(|(tag, _)| !tag.is_empty());
        items
    }
}

/// A roff line as the reader sees its words: font escapes dropped, `\-` as `-`, a macro's
/// arguments without quotes (the alternating-font macros' arguments joined).
fn plain(line: &str) -> String {
    let unescaped = line
        .replace("\\-", "-")
        .replace("\\e", "\\")
        .replace("\\fB", "")
        .replace("\\fI", "")
        .replace("\\fR", "")
        .replace("\\fP", "");
    let Some(control) = unescaped.strip_prefix('.') else {
        return unescaped;
    };
    let (name, args) = control.split_once(' ').unwrap_or((control, ""));
    let words = split_args(args);
    match name {
        "B" | "I" | "OP" => words.join(" "),
        "BR" | "RB" | "IR" | "RI" | "BI" | "IB" => words.concat(),
        _ => String::new(),
    }
}

/// A macro's arguments: words, or double-quoted strings.
fn split_args(args: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = args.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c == ' ' {
            chars.next();
        } else if c == '"' {
            chars.next();
            words.push(chars.by_ref().take_while(|&c| c != '"').collect());
        } else {
            let mut word = String::new();
            while let Some(&c) = chars.peek() {
                if c == ' ' {
                    break;
                }
                word.push(c);
                chars.next();
            }
            words.push(word);
        }
    }
    words
}

/// The options an OPTIONS tag names (`-s, --size bytes`): the short, the long, the value name.
fn tag_option(tag: &str) -> (Option<char>, Option<String>, Option<String>) {
    let (mut short, mut long, mut value) = (None, None, None);
    for word in tag.split([',', ' ']).filter(|w| !w.is_empty()) {
        if let Some(l) = word.strip_prefix("--") {
            long = Some(l.to_owned());
        } else if let Some(s) = word.strip_prefix('-') {
            assert_eq!(
                s.chars().count(),
                1,
                "tag {tag:?}: {word} is not a short option"
            );
            short = s.chars().next();
        } else {
            value = Some(word.to_owned());
        }
    }
    (short, long, value)
}

/// The options of a program's clap command that a reader can use (hidden ones left out).
fn clap_options(cmd: &mut clap::Command) -> Vec<&clap::Arg> {
    cmd.build();
    cmd.get_arguments().filter(|a| !a.is_hide_set()).collect()
}

fn spelled(short: Option<char>, long: Option<&str>) -> String {
    match (short, long) {
        (Some(s), Some(l)) => format!("-{s}/--{l}"),
        (Some(s), None) => format!("-{s}"),
        (None, Some(l)) => format!("--{l}"),
        (None, None) => "(positional)".into(),
    }
}

#[test]
fn every_program_has_a_command_and_a_page() {
    let commands: Vec<String> = mtgdrcopy_tests::cli::commands()
        .iter()
        .map(|c| c.get_name().to_owned())
        .collect();
    let programs = programs();
    assert!(programs.len() >= 5, "{programs:?}");
    for program in &programs {
        assert!(
            commands.contains(program),
            "{program}: add its command line to mtgdrcopy_tests::cli::commands(), which ties \
             its manual page to it"
        );
        assert!(
            page_path(program).exists(),
            "{program} has no man/{program}.1"
        );
    }
}

#[test]
fn options_on_the_pages_are_the_programs_options() {
    for mut cmd in mtgdrcopy_tests::cli::commands() {
        let program = cmd.get_name().to_owned();
        let page = Page::read(&program);
        let tags = page.tagged("OPTIONS");
        let mut documented = BTreeSet::new();
        for (tag, body) in &tags {
            let (short, long, value) = tag_option(tag);
            let arg = clap_options(&mut cmd)
                .into_iter()
                .find(|a| a.get_short() == short && a.get_long() == long.as_deref());
            let arg = arg.unwrap_or_else(|| {
                panic!(
                    "{program}'s page documents {}, which the program does not have \
                     (or not with exactly these short and long names)",
                    spelled(short, long.as_deref())
                )
            });
            let name = spelled(short, long.as_deref());
            let takes_values = arg.get_action().takes_values();
            let clap_value = arg
                .get_value_names()
                .and_then(|v| v.first())
                .map(|v| v.to_lowercase());
            assert_eq!(
                value.map(|v| v.to_lowercase()),
                takes_values.then_some(clap_value).flatten(),
                "{program}'s page: {name}'s value name"
            );
            if takes_values {
                for default in arg.get_default_values() {
                    let want = format!("default: {}", default.to_string_lossy());
                    assert!(
                        body.contains(&want),
                        "{program}'s page: {name} lacks ({want}) in: {body}"
                    );
                }
                for possible in arg
                    .get_possible_values()
                    .iter()
                    .filter(|p| !p.is_hide_set())
                {
                    assert!(
                        body.contains(possible.get_name()),
                        "{program}'s page: {name} lacks the value {}",
                        possible.get_name()
                    );
                }
            }
            assert!(documented.insert(name.clone()), "{program}: {name} twice");
        }
        let all: BTreeSet<String> = clap_options(&mut cmd)
            .iter()
            .map(|a| spelled(a.get_short(), a.get_long()))
            .collect();
        assert_eq!(
            documented, all,
            "{program}: OPTIONS against the program's options"
        );

        // SYNOPSIS names each option once by one of its names, and nothing else.
        let synopsis = page.text("SYNOPSIS");
        let mut named = BTreeSet::new();
        for word in synopsis.split(|c: char| c.is_whitespace() || "[]|".contains(c)) {
            if word.starts_with('-') {
                let arg = clap_options(&mut cmd).into_iter().find(|a| {
                    Some(word) == a.get_long().map(|l| format!("--{l}")).as_deref()
                        || a.get_short().map(|s| format!("-{s}")).as_deref() == Some(word)
                });
                let arg = arg.unwrap_or_else(|| panic!("{program}'s SYNOPSIS: {word}?"));
                named.insert(spelled(arg.get_short(), arg.get_long()));
            }
        }
        assert_eq!(
            named, all,
            "{program}: SYNOPSIS against the program's options"
        );
    }
}

#[test]
fn pages_have_every_section_and_the_shared_facts() {
    let version = format!("\"mtgdrcopy-tests {}\"", env!("CARGO_PKG_VERSION"));
    let programs = programs();
    let statuses: BTreeSet<String> = [
        Status::Passed,
        Status::Failed,
        Status::Usage,
        Status::Unavailable,
    ]
    .iter()
    .map(|s| s.code().to_string())
    .collect();
    for program in &programs {
        let page = Page::read(program);
        assert!(
            page.th
                .starts_with(&format!("{} 1 ", program.to_uppercase()))
                && page.th.contains(&version),
            "{program}: .TH {} (the version must be {version})",
            page.th
        );
        let titles: Vec<&str> = page.sections.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(
            titles,
            [
                "NAME",
                "SYNOPSIS",
                "DESCRIPTION",
                "OPTIONS",
                "OUTPUT",
                "EXAMPLES",
                "EXIT STATUS",
                "ENVIRONMENT",
                "FILES",
                "SEE ALSO"
            ],
            "{program}'s sections"
        );
        let name = page.text("NAME");
        assert!(name.starts_with(&format!("{program} - ")), "{name}");
        let codes: BTreeSet<String> = page
            .tagged("EXIT STATUS")
            .into_iter()
            .map(|t| t.0)
            .collect();
        assert_eq!(codes, statuses, "{program}: EXIT STATUS");
        let environment: Vec<String> = page
            .tagged("ENVIRONMENT")
            .into_iter()
            .map(|t| t.0)
            .collect();
        for var in [
            gdrapi::log::ENABLE_ENV,
            gdrapi::log::LEVEL_ENV,
            gdrapi::USE_DMABUF_ENV,
            gdrapi::copy::VARIANT_ENV,
            gdrapi::musa::MUSA_HOME_ENV,
            mtgdrcopy_tests::gdr::LIBRARY_ENV,
            "MTGDRCOPY_ALLOW_EMULATED_MUSA",
            "NO_COLOR",
        ] {
            assert!(
                environment.iter().any(|v| v == var),
                "{program}: ENVIRONMENT lacks {var}"
            );
        }
        let files = page.text("FILES");
        for path in [
            gdrapi::DEVICE_PATH,
            mtgdrdrv::procfs::PARAMS_PATH,
            mtgdrdrv::procfs::COUNTERS_PATH,
            "libgdrapi.so.1",
            "libmusa.so.1",
            &format!("{}/lib64", gdrapi::musa::DEFAULT_MUSA_HOME),
        ] {
            assert!(files.contains(path), "{program}: FILES lacks {path}");
        }
        let see_also = page.text("SEE ALSO");
        assert!(
            see_also.contains("gdrapi(3)"),
            "{program}: SEE ALSO gdrapi(3)"
        );
        for other in &programs {
            assert_eq!(
                see_also.contains(&format!("{other}(1)")),
                other != program,
                "{program}: SEE ALSO and {other}(1)"
            );
        }
        let examples = page.text("EXAMPLES");
        assert!(
            examples.contains(&format!("$ {program}"))
                || examples.contains(&format!(" {program} ")),
            "{program}: EXAMPLES run it"
        );
    }
}

#[test]
fn the_parser_reads_tags_and_macros() {
    assert_eq!(
        tag_option(&plain(r"\fB\-s\fR, \fB\-\-size\fR \fIbytes\fR")),
        (Some('s'), Some("size".into()), Some("bytes".into()))
    );
    assert_eq!(tag_option("--check"), (None, Some("check".into()), None));
    assert_eq!(plain(r".BR gdrapi (3),"), "gdrapi(3),");
    assert_eq!(plain(r#".B "\-M wc""#), "-M wc");
    assert_eq!(plain(".PP"), "");
}
