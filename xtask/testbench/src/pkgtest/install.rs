//! The install test's sequence (the module's steps 1 to 5) on the host and container roots: the
//! signed repository the host installs from, and the C consumer built against the installed
//! library.

use std::fs;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use super::debs::{find, put_debs};
use super::dkms::{check_dkms_installed, check_purged};
use super::root::{self, Root};
use crate::step::timed;
use xtask_base::{host, paths};
use xtask_pack::deb::Built;
use xtask_pack::stage::Package;

use crate::{kernel, vmtest};
use xtask_pack::aptrepo;

pub(super) fn install_test(sh: &Shell, debs: &[Built]) -> Result<()> {
    host::ensure_host_packages(vmtest::HOST_PACKAGES)?;
    // The roots in build/pkgtest/ are one run's at a time.
    let _lock = xtask_base::files::lock_file(
        &paths::build_dir().join("pkgtest/.lock"),
        "running the package install test",
    )?;
    let kernel = kernel::bookworm_kernel()?;
    let release = kernel.release.clone();
    let t = Instant::now();
    let host_layers = root::dkms_layers(sh, &kernel)?;
    let minbase = root::minbase(sh)?;
    timed("cached root layers ready", t);

    let host = Root::fresh(host_layers.clone(), "host")?;
    let container = Root::fresh(vec![minbase], "container")?;
    let before = host.file_list(sh)?;

    // 1. Host: the four packages.
    let t = Instant::now();
    let output = install_from_repo(sh, &host, debs)?;
    timed(
        "host: apt-get install mtgdrcopy from the signed repository (DKMS build)",
        t,
    );
    let kmod_version = &find(debs, Package::Kmod)?
        .version()
        .split('-')
        .next()
        .unwrap_or_default()
        .to_owned();
    check_dkms_installed(sh, &host, &release, kmod_version, &output)?;
    let t = Instant::now();
    let lib = find(debs, Package::Lib)?;
    check_consumer(sh, &host, lib)?;
    timed("host: consumer built with pkg-config, dpkg-shlibdeps", t);

    // 2. Container: library and tools only.
    let t = Instant::now();
    let inside = put_debs(
        &container,
        &[find(debs, Package::Lib)?, find(debs, Package::Tests)?],
    )?;
    container.apt_install(sh, &inside.iter().map(String::as_str).collect::<Vec<_>>())?;
    for absent in ["dkms", "mtgdrdrv-dkms", "linux-headers-amd64"] {
        let (_, status, _) =
            container.output(sh, &["dpkg-query", "-W", "-f", "${Status}", absent])?;
        ensure!(
            status.trim() != "install ok installed",
            "installing libgdrapi and mtgdrcopy-tests pulled in {absent}"
        );
    }
    ensure!(
        !container.exists(sh, &format!("/usr/src/mtgdrdrv-{kmod_version}"))?,
        "the container root got the module sources"
    );
    timed("container: apt-get install libgdrapi mtgdrcopy-tests", t);

    // 3. Purge.
    let t = Instant::now();
    host.run(
        sh,
        &[
            "apt-get",
            "purge",
            "-y",
            "-q",
            "mtgdrcopy",
            "mtgdrcopy-tests",
            "libgdrapi",
            "mtgdrdrv-dkms",
        ],
    )?;
    check_purged(sh, &host, &release, &before)?;
    timed("host: purge, nothing left behind", t);

    // 4. The bundle.
    let t = Instant::now();
    let bundle = find(debs, Package::Bundle)?;
    let inside = put_debs(&host, &[bundle])?;
    let output = host.apt_install(sh, &inside.iter().map(String::as_str).collect::<Vec<_>>())?;
    check_dkms_installed(sh, &host, &release, kmod_version, &output)?;
    let status = host.run(sh, &["dpkg-query", "-W", "-f", "${Version}", "mtgdrcopy"])?;
    ensure!(
        status == bundle.version(),
        "mtgdrcopy {status} is installed, expected the bundle's {}",
        bundle.version()
    );
    host.run(sh, &["apt-get", "purge", "-y", "-q", "mtgdrcopy"])?;
    check_purged(sh, &host, &release, &before)?;
    timed(
        "host: the single-package build installs (DKMS) and purges clean",
        t,
    );
    Ok(())
}

/// Step 1: the release as a fleet gets it. `cargo xtask apt-repo`'s repository of every .deb,
/// signed with a throwaway key, is put in the root as a `file:` source with `signed-by=`. First
/// the entry names another key: `apt-get update` must refuse the repository (so apt really
/// checks the signature); then the right key, and `apt-get install mtgdrcopy` must bring the
/// four split packages (component main), not the bundle. Returns apt-get's output. The
/// sources entry and keyrings are removed afterwards, so the purge leaves the root as found.
fn install_from_repo(sh: &Shell, host: &Root, debs: &[Built]) -> Result<String> {
    const REPO: &str = "/tmp/mtgdrcopy-apt";
    const LIST: &str = "/etc/apt/sources.list.d/mtgdrcopy.list";
    const KEYRINGS: &str = "/etc/apt/keyrings";
    let scratch = paths::build_dir().join("pkgtest");
    let key = aptrepo::TestKey::generate(sh, &scratch.join("gnupg"), "mtgdrcopy-test-archive")?;
    let stranger = aptrepo::TestKey::generate(sh, &scratch.join("gnupg-stranger"), "stranger")?;
    let files: Vec<PathBuf> = debs.iter().map(|d| d.path.clone()).collect();
    let repo = aptrepo::build(
        sh,
        &files,
        &[],
        &scratch.join("apt"),
        "stable",
        Some(&key.signer()),
    )?;
    let keyring = repo
        .keyring
        .clone()
        .context("the signed repository has no keyring")?;
    let had_keyrings = host.exists(sh, KEYRINGS)?;
    let into = host.new_file(REPO);
    fs::create_dir_all(&into)?;
    // Made in the upper directory, /tmp takes that directory's mode: keep it /tmp's, since
    // apt's unprivileged user writes its temporary files there while checking signatures.
    xtask_base::files::set_mode(&host.new_file("/tmp"), 0o1777)?;
    let from = repo.dir.join(".");
    cmd!(sh, "cp -a {from} {into}").quiet().run()?;
    let keyrings = host.new_file(KEYRINGS);
    fs::create_dir_all(&keyrings)?;
    fs::copy(&keyring, keyrings.join("mtgdrcopy.gpg"))?;
    fs::write(keyrings.join("stranger.gpg"), stranger.public_key(sh)?)?;
    // Only this source is fetched: the root's Debian lists stay as the layer has them.
    let update = [
        "apt-get",
        "update",
        "-q",
        "-o",
        &format!("Dir::Etc::SourceList={LIST}"),
        "-o",
        "Dir::Etc::SourceParts=-",
        "-o",
        "APT::Get::List-Cleanup=0",
    ];
    let uri = format!("file:{REPO}");
    let list = host.new_file(LIST);
    // The upper directory has only what the test wrote: make the entry's directory there.
    if let Some(dir) = list.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    fs::write(
        &list,
        format!(
            "{}\n",
            repo.sources_line(&uri, "main", &format!("{KEYRINGS}/stranger.gpg"))
        ),
    )?;
    let (ok, stdout, stderr) = host.output(sh, &update)?;
    ensure!(
        !ok && format!("{stdout}{stderr}").contains("NO_PUBKEY"),
        "apt-get update accepted the repository with a sources entry naming another key \
         (exit ok: {ok}):\n{stdout}{stderr}"
    );
    fs::write(
        &list,
        format!(
            "{}\n",
            repo.sources_line(&uri, "main", &format!("{KEYRINGS}/mtgdrcopy.gpg"))
        ),
    )?;
    host.run(sh, &update)?;
    let output = host.apt_install(sh, &["mtgdrcopy"])?;
    for package in Package::SPLIT {
        let built = find(debs, package)?;
        let installed = host.run(
            sh,
            &["dpkg-query", "-W", "-f", "${Version}", package.deb_name()],
        )?;
        ensure!(
            installed == built.version(),
            "{} {installed} is installed from the repository, expected {}",
            package.deb_name(),
            built.version()
        );
    }
    eprintln!(
        "    repository: {} ({}), signed; a sources entry naming another key is refused",
        repo.components.join(" + "),
        repo.architectures.join(" ")
    );
    let mut remove = vec![
        "rm".to_owned(),
        "-f".to_owned(),
        LIST.to_owned(),
        format!("{KEYRINGS}/mtgdrcopy.gpg"),
        format!("{KEYRINGS}/stranger.gpg"),
    ];
    if !had_keyrings {
        remove = vec!["rm".into(), "-rf".into(), LIST.into(), KEYRINGS.into()];
    }
    let remove: Vec<&str> = remove.iter().map(String::as_str).collect();
    host.run(sh, &remove)?;
    Ok(output)
}

/// A C program against the installed libgdrapi: compiled and linked through pkg-config (shared
/// and static), and dpkg-shlibdeps gives it `libgdrapi (>= <upstream version>), libgdrapi (<<
/// <next major>~)`: a 2.x package, which has no libgdrapi.so.1, must not satisfy it.
fn check_consumer(sh: &Shell, host: &Root, lib: &Built) -> Result<()> {
    let dir = host.new_file("/tmp/consumer");
    fs::create_dir_all(dir.join("debian"))?;
    fs::write(
        dir.join("consumer.c"),
        "#include <gdrapi.h>\n#include <stdio.h>\n\
         int main(void) {\n\
         \tint major = 0, minor = 0;\n\
         \tgdr_runtime_get_version(&major, &minor);\n\
         \tprintf(\"libgdrapi %d.%d\\n\", major, minor);\n\
         \tgdr_t g = gdr_open();\n\
         \tprintf(\"gdr_open: %s\\n\", g ? \"ok\" : \"failed\");\n\
         \tif (g)\n\
         \t\tgdr_close(g);\n\
         \treturn 0;\n}\n",
    )?;
    fs::write(
        dir.join("debian/control"),
        "Source: consumer\n\nPackage: consumer\nArchitecture: any\n",
    )?;
    let sh_in = |script: &str| -> Result<String> { host.run(sh, &["sh", "-euc", script]) };
    let shared = sh_in(
        "cd /tmp/consumer && cc -Wall -Werror consumer.c $(pkg-config --cflags --libs gdrapi) \
         -o consumer && ./consumer",
    )?;
    // libgdrapi.a linked in, the rest (Libs.private: what Rust's std needs) dynamically.
    let stat = sh_in(
        "cd /tmp/consumer && cc -Wall -Werror consumer.c \
         $(pkg-config --static --cflags --libs gdrapi | sed 's/-lgdrapi /-l:libgdrapi.a /') \
         -o consumer-static && ./consumer-static",
    )?;
    let upstream = lib.version().split('-').next().unwrap_or_default();
    let (major, minor) = {
        let mut v = upstream.split('.');
        (v.next().unwrap_or(""), v.next().unwrap_or(""))
    };
    // No /dev/mtgdrdrv in the root: gdr_open fails, quietly (logging is off by default).
    let expected = format!("libgdrapi {major}.{minor}\ngdr_open: failed");
    ensure!(
        shared.trim() == expected && stat.trim() == expected,
        "the consumer printed {shared:?} (shared) and {stat:?} (static), expected {expected:?}"
    );
    let deps = sh_in("cd /tmp/consumer && dpkg-shlibdeps -O consumer 2>/dev/null")?;
    let want = format!(
        "libgdrapi (>= {upstream}), libgdrapi (<< {})",
        next_major(upstream)?
    );
    ensure!(
        deps.contains(&want),
        "dpkg-shlibdeps gave a consumer {deps:?}, which lacks {want}"
    );
    eprintln!("    consumer: {}", deps.trim());
    Ok(())
}

/// `${<package>:NextMajor}`: the lowest version of the next major, `2~` for 1.x (`~` sorts
/// before any release of it).
pub fn next_major(version: &str) -> Result<String> {
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("no major version in {version}"))?;
    Ok(format!("{}~", major + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_major_sorts_before_its_releases() -> Result<()> {
        assert_eq!(next_major("1.4.2")?, "2~");
        assert_eq!(next_major("0.1.0")?, "1~");
        Ok(())
    }
}
