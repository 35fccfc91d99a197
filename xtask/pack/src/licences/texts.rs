//! Licence texts: the crates' licence files, the copyright notices in them, and for each short
//! name the text to give, found in those files or Debian's /usr/share/common-licenses.

use std::collections::BTreeSet;
use std::fs;

use anyhow::{bail, Context, Result};

use super::{spdx, Dep, LicenceFile};

/// A crate's licence and notice files: LICENSE*, LICENCE*, COPYING*, UNLICENSE*, COPYRIGHT*,
/// NOTICE* at its top, LICENSES/* (REUSE) and its `license-file`, sorted by name.
pub(super) fn licence_files(dep: &Dep) -> Result<Vec<LicenceFile>> {
    let what = || format!("crate {} {} ({})", dep.name, dep.version, dep.dir.display());
    let mut paths = BTreeSet::new();
    let prefixes = [
        "license",
        "licence",
        "copying",
        "unlicense",
        "copyright",
        "notice",
    ];
    for dir in [dep.dir.clone(), dep.dir.join("LICENSES")] {
        if !dir.is_dir() {
            continue;
        }
        for entry in fs::read_dir(&dir).with_context(what)? {
            let path = entry.with_context(what)?.path();
            let name = path
                .strip_prefix(&dep.dir)
                .unwrap_or(&path)
                .to_string_lossy()
                .to_lowercase();
            let top_level_notice = prefixes.iter().any(|p| name.starts_with(p));
            if path.is_file() && (top_level_notice || name.starts_with("licenses/")) {
                paths.insert(path);
            }
        }
    }
    if let Some(file) = &dep.license_file {
        paths.insert(dep.dir.join(file));
    }
    let mut files = Vec::new();
    for path in paths {
        let text = fs::read_to_string(&path)
            .with_context(|| format!("{}: reading {}", what(), path.display()))?;
        files.push(LicenceFile { text });
    }
    Ok(files)
}

/// Copyright lines of a crate's licence files (the notices its licence says to keep); the
/// Apache-2.0 text's appendix template is no notice.
pub(super) fn notices(files: &[LicenceFile]) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    for file in files {
        let apache = file.text.contains("Apache License")
            && file.text.contains("TERMS AND CONDITIONS FOR USE");
        if apache {
            continue;
        }
        for line in file.text.lines().map(str::trim) {
            let notice = ["Copyright ", "Copyright©", "©", "(c) ", "(C) "]
                .iter()
                .any(|p| line.starts_with(p))
                && !["Copyright and", "Copyright notice", "Copyright holder"]
                    .iter()
                    .any(|p| line.starts_with(p))
                && !["[yyyy]", "<year>", "[year]", "{yyyy}"]
                    .iter()
                    .any(|p| line.contains(p));
            if notice && !found.iter().any(|f| f == line) {
                found.push(line.to_string());
            }
        }
    }
    found
}

/// How a licence's text gets into debian/copyright.
enum Text {
    /// Reproduced from a crate's licence file.
    Reproduce(Find),
    /// In /usr/share/common-licenses: Debian's usual short paragraph pointing there.
    Common(&'static str),
    /// A common licence with an exception whose text is reproduced.
    CommonWith(&'static str, Find),
}

/// A licence text in a file: from the line starting with `start` to the end of the file, and
/// (whitespace folded) containing every `must` and no `must_not`, which tells apart licences
/// that start alike (ISC and 0BSD, Expat and BSL-1.0, BSD-2-clause and BSD-3-clause).
struct Find {
    start: &'static str,
    must: &'static [&'static str],
    must_not: &'static [&'static str],
}

const fn find(start: &'static str, must: &'static [&'static str]) -> Find {
    Find {
        start,
        must,
        must_not: &[],
    }
}

fn text_of(short: &str) -> Option<Text> {
    const PERMISSION_TO_USE: &str = "Permission to use, copy, modify, and/or distribute";
    const REDISTRIBUTION: &str = "Redistribution and use in source and binary forms";
    Some(match short {
        "Expat" => Text::Reproduce(Find {
            start: "Permission is hereby granted, free of charge",
            must: &["substantial portions of the Software"],
            must_not: &["person or organization"],
        }),
        "ISC" => Text::Reproduce(find(PERMISSION_TO_USE, &["above copyright notice"])),
        "0BSD" => Text::Reproduce(Find {
            start: PERMISSION_TO_USE,
            must: &[],
            must_not: &["above copyright notice"],
        }),
        "BSD-2-clause" => Text::Reproduce(Find {
            start: REDISTRIBUTION,
            must: &[],
            must_not: &["endorse or promote"],
        }),
        "BSD-3-clause" => Text::Reproduce(Find {
            start: REDISTRIBUTION,
            must: &["endorse or promote"],
            must_not: &["advertising materials"],
        }),
        "Zlib" => Text::Reproduce(find(
            "This software is provided 'as-is'",
            &["must not be misrepresented"],
        )),
        "BSL-1.0" => Text::Reproduce(find("Boost Software License", &["person or organization"])),
        "Unicode-3.0" => Text::Reproduce(find("UNICODE LICENSE V3", &[])),
        "Unicode-DFS-2016" => Text::Reproduce(find("UNICODE, INC. LICENSE AGREEMENT", &[])),
        "Unlicense" => Text::Reproduce(find(
            "This is free and unencumbered software released into the public domain",
            &[],
        )),
        "Apache-2.0" => Text::Common(APACHE_2),
        "MPL-2.0" => Text::Common(MPL_2),
        "CC0-1.0" => Text::Common(CC0_1),
        "GPL-2" => Text::Common(GPL_2),
        "GPL-2+" => Text::Common(GPL_2_PLUS),
        "Apache-2.0 with LLVM exception" => Text::CommonWith(
            APACHE_2,
            find(
                "As an exception, if, as a result of your compiling",
                &["Sections 4(a), 4(b) and 4(d)"],
            ),
        ),
        _ => return None,
    })
}

/// The text of licence `short`, from the first of `candidates` whose licence files hold it.
pub(super) fn licence_text(
    short: &str,
    candidates: &[&(Dep, Vec<LicenceFile>)],
) -> Result<Vec<String>> {
    let Some(how) = text_of(short) else {
        bail!("no licence text rule for {short}");
    };
    let (common, find) = match how {
        Text::Common(text) => return Ok(text.lines().map(String::from).collect()),
        Text::Reproduce(find) => (None, find),
        Text::CommonWith(text, find) => (Some(text), find),
    };
    for (_, files) in candidates {
        for file in files {
            if let Some(found) = find_text(&file.text, &find) {
                let mut lines: Vec<String> = common
                    .map(|t| t.lines().map(String::from).collect())
                    .unwrap_or_default();
                if !lines.is_empty() {
                    lines.push(String::new());
                }
                lines.extend(found);
                return Ok(lines);
            }
        }
    }
    let users: Vec<String> = candidates
        .iter()
        .take_while(|(dep, _)| {
            dep.license
                .as_deref()
                .and_then(|l| spdx::to_dep5(l).ok())
                .is_some_and(|l| l.names.contains(&short))
        })
        .map(|(dep, _)| format!("{} {}", dep.name, dep.version))
        .collect();
    bail!(
        "no licence file of the crates holds the text of {short} (used by: {}); \
         it must be reproduced in debian/copyright",
        if users.is_empty() {
            "the Rust standard library".to_string()
        } else {
            users.join(", ")
        }
    )
}

fn find_text(text: &str, find: &Find) -> Option<Vec<String>> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_start().starts_with(find.start))?;
    let mut body: Vec<&str> = lines[start..].to_vec();
    while body.last().is_some_and(|l| l.trim().is_empty()) {
        body.pop();
    }
    let folded = body
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let ok = find.must.iter().all(|m| folded.contains(m))
        && !find.must_not.iter().any(|m| folded.contains(m));
    if !ok {
        return None;
    }
    let indent = body
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    Some(
        body.iter()
            .map(|l| l.get(indent..).unwrap_or("").trim_end().to_string())
            .collect(),
    )
}

const APACHE_2: &str = "\
Licensed under the Apache License, Version 2.0 (the \"License\");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    https://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an \"AS IS\" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.

On Debian systems, the complete text of the Apache License, Version 2.0
can be found in /usr/share/common-licenses/Apache-2.0.";

const MPL_2: &str = "\
This Source Code Form is subject to the terms of the Mozilla Public
License, v. 2.0. If a copy of the MPL was not distributed with this
file, You can obtain one at https://mozilla.org/MPL/2.0/.

On Debian systems, the complete text of the Mozilla Public License,
version 2.0 can be found in /usr/share/common-licenses/MPL-2.0.";

const CC0_1: &str = "\
To the extent possible under law, the author(s) have dedicated all
copyright and related and neighboring rights to this software to the
public domain worldwide. This software is distributed without any
warranty.

On Debian systems, the complete text of the CC0 1.0 Universal license
can be found in /usr/share/common-licenses/CC0-1.0.";

const GPL_2: &str = "\
This program is free software; you can redistribute it and/or modify it under
the terms of the GNU General Public License version 2 as published by the Free
Software Foundation.

This program is distributed in the hope that it will be useful, but WITHOUT ANY
WARRANTY; without even the implied warranty of MERCHANTABILITY or FITNESS FOR A
PARTICULAR PURPOSE. See the GNU General Public License for more details.

On Debian systems, the complete text of the GNU General Public License version 2
can be found in /usr/share/common-licenses/GPL-2.";

const GPL_2_PLUS: &str = "\
This program is free software; you can redistribute it and/or modify it under
the terms of the GNU General Public License as published by the Free Software
Foundation; either version 2 of the License, or (at your option) any later
version.

This program is distributed in the hope that it will be useful, but WITHOUT ANY
WARRANTY; without even the implied warranty of MERCHANTABILITY or FITNESS FOR A
PARTICULAR PURPOSE. See the GNU General Public License for more details.

On Debian systems, the complete text of the GNU General Public License version 2
can be found in /usr/share/common-licenses/GPL-2.";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::licences::fixtures::{files, ISC_FILE};

    #[test]
    fn licence_texts_are_told_apart() {
        let find = |short: &str, text: &str| match text_of(short) {
            Some(Text::Reproduce(f)) => find_text(text, &f),
            _ => panic!("{short} is not reproduced"),
        };
        assert!(find("ISC", ISC_FILE).is_some());
        assert!(find("0BSD", ISC_FILE).is_none());
        let bsd3 = "Redistribution and use in source and binary forms\n\
                    Neither the name may be used to endorse or promote products\n";
        assert!(find("BSD-3-clause", bsd3).is_some());
        assert!(find("BSD-2-clause", bsd3).is_none());
        let indented =
            "    MIT License\n\n    Permission is hereby granted, free of charge, to\n      \
                        any person. substantial portions of the Software.\n\n\n";
        assert_eq!(
            find("Expat", indented).unwrap(),
            [
                "Permission is hereby granted, free of charge, to",
                "  any person. substantial portions of the Software."
            ]
        );
        assert_eq!(
            notices(&files(&[
                "MIT License\n\nCopyright (c) 2020 A\n  Copyright 2021 B <b@b>\n",
                "Copyright [yyyy] [name of copyright owner]\n",
                "Apache License\nTERMS AND CONDITIONS FOR USE\nCopyright 2019 Nobody\n",
                "Copyright notice: keep it\nCopyright (c) 2020 A\n",
            ])),
            ["Copyright (c) 2020 A", "Copyright 2021 B <b@b>"]
        );
    }
}
