//! Finishing a .deb that cargo-deb wrote: what cargo-deb cannot express, done on the archive.
//!
//! - `Architecture: all` for the DKMS and meta packages (cargo-deb derives the architecture from
//!   the Rust target only);
//! - substitution variables in the control file, debhelper-style: `${shlibs:Depends}` and
//!   `${<package>:Version}`, so that `[package.metadata.deb]` never repeats a version;
//! - extra control members: `shlibs`, `symbols` (cargo-deb writes neither) and `md5sums`
//!   (what dh_md5sums adds; dpkg --verify and debsums use it).
//!
//! Only the control member is rewritten; the data member is read (for md5sums) and kept
//! byte for byte. A .deb is an `ar` archive of `debian-binary`, `control.tar.*`, `data.tar.*`.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use md5::{Digest, Md5};

pub struct Finish<'a> {
    /// Replaces the `Architecture` field.
    pub architecture: Option<&'a str>,
    /// Replaces the `Description` field (synopsis, then the extended description).
    pub description: Option<(&'a str, &'a str)>,
    /// `name` → value for every `${name}` in the control file; an unknown one is an error.
    pub substvars: &'a BTreeMap<String, String>,
    /// Control members to add (name, contents); one already present is an error.
    pub control_files: Vec<(String, Vec<u8>)>,
}

/// Fields holding comma-separated package relations, cleaned after substitution (an empty
/// `${shlibs:Depends}` must not leave `Depends: , foo`).
const RELATION_FIELDS: &[&str] = &[
    "Depends",
    "Pre-Depends",
    "Recommends",
    "Suggests",
    "Enhances",
    "Conflicts",
    "Breaks",
    "Replaces",
    "Provides",
];

struct Member {
    header: ar::Header,
    data: Vec<u8>,
}

/// Rewrites `deb` in place; returns the final control file.
pub fn finish(deb: &Path, f: &Finish) -> Result<String> {
    let members = read_ar(deb)?;
    let names: Vec<String> = members
        .iter()
        .map(|m| String::from_utf8_lossy(m.header.identifier()).into_owned())
        .collect();
    ensure!(
        names.len() == 3 && names[0] == "debian-binary",
        "{}: unexpected members {names:?}",
        deb.display()
    );
    ensure!(
        names[1] == "control.tar.gz" && names[2] == "data.tar.gz",
        "{}: expected gzip'd control and data members, found {names:?}",
        deb.display()
    );
    let md5sums = md5sums(&members[2].data).context("computing md5sums")?;
    let mut control_text = String::new();
    let control = rewrite_control_tar(&members[1].data, |entries| {
        let control = entries
            .iter_mut()
            .find(|e| e.name == "control")
            .context("the control member has no control file")?;
        let text = String::from_utf8(std::mem::take(&mut control.data))
            .context("the control file is not UTF-8")?;
        control_text = edit_control(&text, f)?;
        control.data = control_text.clone().into_bytes();
        let mut added = vec![("md5sums".to_owned(), md5sums.into_bytes())];
        added.extend(f.control_files.iter().cloned());
        for (name, data) in added {
            ensure!(
                !entries.iter().any(|e| e.name == name),
                "cargo-deb already wrote a {name} control file"
            );
            entries.push(TarEntry::new_like(&entries[0], &name, data, 0o644)?);
        }
        Ok(())
    })?;
    let mut members = members;
    members[1].data = control;
    members[1].header = ar_header(&members[1].header, members[1].data.len());
    write_ar(deb, &members)?;
    Ok(control_text)
}

/// The control file with substitutions, architecture and relation fields fixed up.
fn edit_control(text: &str, f: &Finish) -> Result<String> {
    let mut text = text.to_owned();
    for (name, value) in f.substvars {
        text = text.replace(&format!("${{{name}}}"), value);
    }
    if let Some(at) = text.find("${") {
        let name: String = text[at..].chars().take_while(|&c| c != '}').collect();
        bail!("unknown substitution variable {name}}} in the control file");
    }
    let mut out = String::with_capacity(text.len());
    let mut replacing_description = false;
    for line in text.lines() {
        if replacing_description && line.starts_with(' ') {
            continue;
        }
        replacing_description = false;
        let (field, value) = line.split_once(':').unwrap_or(("", ""));
        if let ("Description", Some((synopsis, extended))) = (field, f.description) {
            out.push_str(&description(synopsis, extended)?);
            replacing_description = true;
            continue;
        }
        if field == "Architecture" {
            if let Some(arch) = f.architecture {
                out.push_str(&format!("Architecture: {arch}\n"));
                continue;
            }
        }
        if RELATION_FIELDS.contains(&field) {
            let relations: Vec<&str> = value
                .split(',')
                .map(str::trim)
                .filter(|r| !r.is_empty())
                .collect();
            if !relations.is_empty() {
                out.push_str(&format!("{field}: {}\n", relations.join(", ")));
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    // One paragraph: no blank line at the end.
    let end = out.trim_end().len();
    out.truncate(end);
    out.push('\n');
    Ok(out)
}

/// A `Description` field: the synopsis (at most 79 columns, Debian policy 3.4.1), then the
/// extended description line by line, a blank line written as ` .`.
fn description(synopsis: &str, extended: &str) -> Result<String> {
    ensure!(
        synopsis.chars().count() <= 79 && !synopsis.ends_with('.'),
        "synopsis {synopsis:?}: at most 79 columns and no final period"
    );
    let mut out = format!("Description: {synopsis}\n");
    for line in extended.trim_end().lines() {
        ensure!(
            line.chars().count() <= 79 && !line.contains('\t'),
            "extended description line {line:?}: at most 79 columns, no tabs"
        );
        if line.trim().is_empty() {
            out.push_str(" .\n");
        } else {
            out.push_str(&format!(" {line}\n"));
        }
    }
    Ok(out)
}

/// `md5sums`: one `<md5>  <path>` line per regular file of the data member.
fn md5sums(data_tar_gz: &[u8]) -> Result<String> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(data_tar_gz));
    let mut out = String::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let path = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let path = path.trim_start_matches("./").to_owned();
        let mut hasher = Md5::new();
        let mut buf = [0u8; 65536];
        loop {
            let n = entry.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        let digest = hasher.finalize();
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        out.push_str(&format!("{hex}  {path}\n"));
    }
    Ok(out)
}

struct TarEntry {
    header: tar::Header,
    /// Name without a leading `./`.
    name: String,
    /// Whether the original spelled it with `./`.
    dotted: bool,
    data: Vec<u8>,
}

impl TarEntry {
    /// A new regular-file entry with `like`'s owner, time and naming style.
    fn new_like(like: &TarEntry, name: &str, data: Vec<u8>, mode: u32) -> Result<TarEntry> {
        let mut header = like.header.clone();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(mode);
        Ok(TarEntry {
            header,
            name: name.to_owned(),
            dotted: like.dotted,
            data,
        })
    }
}

fn rewrite_control_tar(
    gz: &[u8],
    edit: impl FnOnce(&mut Vec<TarEntry>) -> Result<()>,
) -> Result<Vec<u8>> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(gz));
    let mut entries = Vec::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let header = entry.header().clone();
        let mut data = Vec::new();
        entry.read_to_end(&mut data)?;
        entries.push(TarEntry {
            header,
            dotted: raw.starts_with("./"),
            name: raw.trim_start_matches("./").to_owned(),
            data,
        });
    }
    ensure!(!entries.is_empty(), "the control member is empty");
    edit(&mut entries)?;
    let mut builder = tar::Builder::new(Vec::new());
    for entry in &mut entries {
        let path = if entry.dotted {
            format!("./{}", entry.name)
        } else {
            entry.name.clone()
        };
        entry.header.set_path(&path)?;
        entry.header.set_size(entry.data.len() as u64);
        entry.header.set_cksum();
        builder.append(&entry.header, entry.data.as_slice())?;
    }
    let tar = builder.into_inner()?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&tar)?;
    Ok(gz.finish()?)
}

fn read_ar(path: &Path) -> Result<Vec<Member>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut archive = ar::Archive::new(file);
    let mut members = Vec::new();
    while let Some(entry) = archive.next_entry() {
        let mut entry = entry.with_context(|| format!("reading {}", path.display()))?;
        let header = entry.header().clone();
        let mut data = Vec::new();
        entry.read_to_end(&mut data)?;
        members.push(Member { header, data });
    }
    Ok(members)
}

/// `old`'s identifier, owner, mode and time for a member of `len` bytes.
fn ar_header(old: &ar::Header, len: usize) -> ar::Header {
    let mut header = ar::Header::new(old.identifier().to_vec(), len as u64);
    header.set_mtime(old.mtime());
    header.set_uid(old.uid());
    header.set_gid(old.gid());
    header.set_mode(old.mode());
    header
}

fn write_ar(path: &Path, members: &[Member]) -> Result<()> {
    let tmp = path.with_extension("deb.tmp");
    {
        let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut builder = ar::Builder::new(file);
        for m in members {
            builder.append(&ar_header(&m.header, m.data.len()), m.data.as_slice())?;
        }
        builder.into_inner()?.sync_all()?;
    }
    fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))
}

/// The value of `field` in a control file.
pub fn field<'a>(control: &'a str, field: &str) -> Option<&'a str> {
    control.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        (name == field).then(|| value.trim())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finish_with<'a>(vars: &'a BTreeMap<String, String>, arch: Option<&'a str>) -> Finish<'a> {
        Finish {
            architecture: arch,
            description: None,
            substvars: vars,
            control_files: Vec::new(),
        }
    }

    #[test]
    fn substitutes_and_cleans_relations() -> Result<()> {
        let vars = BTreeMap::from([
            ("shlibs:Depends".to_owned(), String::new()),
            ("libgdrapi:Version".to_owned(), "1.0.0-1".to_owned()),
        ]);
        let control = "Package: x\nArchitecture: amd64\nDepends: ${shlibs:Depends}, libgdrapi (= ${libgdrapi:Version})\nDescription: d\n more\n";
        let out = edit_control(control, &finish_with(&vars, Some("all")))?;
        assert_eq!(
            out,
            "Package: x\nArchitecture: all\nDepends: libgdrapi (= 1.0.0-1)\nDescription: d\n more\n"
        );
        let empty = edit_control("Depends: ${shlibs:Depends}\n", &finish_with(&vars, None))?;
        assert_eq!(empty, "\n");
        Ok(())
    }

    #[test]
    fn replaces_the_description() -> Result<()> {
        let vars = BTreeMap::new();
        let f = Finish {
            description: Some(("Short", "Line one\n\nLine two\n")),
            ..finish_with(&vars, None)
        };
        let out = edit_control(
            "Package: x\nDescription: A very long crate description\n wrapped\n old text\n",
            &f,
        )?;
        assert_eq!(
            out,
            "Package: x\nDescription: Short\n Line one\n .\n Line two\n"
        );
        Ok(())
    }

    #[test]
    fn unknown_substvar_is_an_error() {
        let vars = BTreeMap::new();
        let err = edit_control("Depends: ${foo:Version}\n", &finish_with(&vars, None));
        assert!(err.is_err_and(|e| e.to_string().contains("${foo:Version}")));
    }

    #[test]
    fn reads_fields() {
        assert_eq!(field("A: 1\nVersion: 2.0-1\n", "Version"), Some("2.0-1"));
        assert_eq!(field("A: 1\n", "Version"), None);
    }
}
