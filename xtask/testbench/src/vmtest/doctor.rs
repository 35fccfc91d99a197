//! mtgdrcopy_doctor in the test VM, in each state it must diagnose: healthy (with the emulated
//! libmusa, a warning), no libmusa, the device node closed to a user outside its group and to
//! one whose membership is not yet effective, mtgdrdrv unloaded, nothing at all (exit 77), the
//! provider loaded with disable_driver=1, and x86 PAT off (the `nopat` boot). The guest marks
//! every line the doctor prints with its state; [`check`] finds the exact line each state must
//! produce, and the run's exit status is a test point of the script's checks (`checks.rs`).

use std::path::{Path, PathBuf};

use anyhow::{ensure, Result};

/// The shell function the guest scripts call: `doctor STATE WANT [PREFIX...]` runs
/// `PREFIX mtgdrcopy_doctor`, prints each of its lines marked `MTGDRCOPY-DOCTOR STATE ` and
/// writes its exit status as a test point of the open checks section (`checks::FUNCTIONS`).
pub const FUNCTION: &str = r#"doctor() {
    state=$1; want=$2; shift 2
    "$@" mtgdrcopy_doctor >/tmp/doctor.out 2>&1
    got=$?
    sed "s/^/MTGDRCOPY-DOCTOR $state /" /tmp/doctor.out
    [ "$got" = "$want" ]
    point "mtgdrcopy_doctor ($state) exits $want (got $got)"
}
"#;

/// Where the guest finds setpriv, to run the doctor as another user.
const SETPRIV: &str = "/opt/mtgdrcopy/doctor-setpriv";

/// The files the doctor's states need in the guest.
pub fn files() -> Vec<(PathBuf, String)> {
    vec![(PathBuf::from("/usr/bin/setpriv"), SETPRIV.into())]
}

/// The states with both modules loaded (the tools' exit-status step): healthy, no libmusa, and
/// /dev/mtgdrdrv as group render, mode 0660, for `outsider` (not in the group) and `relogin`
/// (in the group per /etc/group, but its session started without it).
pub fn loaded_states() -> String {
    format!(
        r#"doctor healthy 0
doctor no-libmusa 1 env LD_LIBRARY_PATH=/usr/lib/mtgdrcopy
grep -q '^render:' /etc/group 2>/dev/null || echo "render:x:992:" >>/etc/group
sed -i 's/^\(render:[^:]*:[^:]*:\)\(.*\)$/\1\2,relogin/; s/^\(render:[^:]*:[^:]*:\),/\1/' /etc/group
printf 'outsider:x:1001:1001::/tmp:/bin/sh\nrelogin:x:1002:1002::/tmp:/bin/sh\n' >>/etc/passwd
node=$(stat -c '%a %g' /dev/mtgdrdrv)
chgrp render /dev/mtgdrdrv && chmod 0660 /dev/mtgdrdrv || fail "/dev/mtgdrdrv for group render"
doctor no-group 1 {SETPRIV} --reuid=1001 --regid=1001 --clear-groups
doctor relogin 1 {SETPRIV} --reuid=1002 --regid=1002 --clear-groups
chgrp "${{node#* }}" /dev/mtgdrdrv && chmod "${{node% *}}" /dev/mtgdrdrv || fail "restoring /dev/mtgdrdrv"
"#
    )
}

const EMULATED: &str = "WARN  libmusa: /usr/lib/mtgdrcopy/emu/libmusa.so.1 (version 30000) is the \
    mtgdrcopy test suite's emulated libmusa, not Moore Threads' driver; fix: remove \
    /usr/lib/mtgdrcopy/emu from LD_LIBRARY_PATH and install Moore Threads' MUSA driver; the \
    tools refuse the emulated one unless MTGDRCOPY_ALLOW_EMULATED_MUSA=1 (only the test suite \
    sets it)";

/// The states [`check`] judges in the full run: those of [`loaded_states`], then the others.
pub const LOADED_STATES: [&str; 4] = ["healthy", "no-libmusa", "no-group", "relogin"];
pub const OTHER_STATES: [&str; 3] = ["no-module", "nothing", "disabled"];

/// The `nopat` boot's run.
pub const NOPAT_RUN: &str = "doctor nopat 0";

/// Each state's line that must be there, exactly.
pub const EXPECTED: [(&str, &str); 8] = [
    ("healthy", EMULATED),
    (
        "no-libmusa",
        "FAIL  libmusa: not found (tried libmusa.so.1, /usr/local/musa/lib64/libmusa.so.1, \
         /usr/local/musa/lib/libmusa.so.1, libmusa.so); fix: install Moore Threads' MUSA \
         driver (it ships libmusa.so.1), or set MUSA_HOME to its installation",
    ),
    (
        "no-group",
        "FAIL  /dev/mtgdrdrv: /dev/mtgdrdrv (crw-rw---- 0:render): permission denied for \
         outsider; fix: sudo usermod -aG render outsider, then log in again",
    ),
    (
        "relogin",
        "FAIL  /dev/mtgdrdrv: /dev/mtgdrdrv (crw-rw---- 0:render): permission denied for \
         relogin; relogin is in group render per /etc/group, but this session is not; fix: log \
         in again (or run `newgrp render`) so that the membership takes effect",
    ),
    (
        "no-module",
        "FAIL  mtgdrdrv: not loaded; fix: sudo modprobe mtgdrdrv (package mtgdrdrv-dkms); if \
         that fails, `dkms status` and `dmesg | grep mtgdrdrv` say why",
    ),
    (
        "nothing",
        "mtgdrcopy_doctor: nothing to check: no mtgpu driver, no mtgdrdrv and no libmusa on \
         this system (not a Moore Threads GPU host)",
    ),
    (
        "disabled",
        "FAIL  mtgpu: mtgpu_emu (MTGDRDRV_PROVIDER) is loaded with disable_driver=1: its GPU \
         driver is not initialised, and calling into it crashes the caller; fix: reboot (the \
         driver's installer leaves it so until then), or sudo modprobe -r mtgdrdrv mtgpu_emu \
         && sudo modprobe mtgpu_emu (without disable_driver)",
    ),
    (
        "nopat",
        "WARN  pat: x86 PAT is off (nopat on the kernel command line): mtgdrdrv's mappings are \
         then uncached, not write-combined, and copies to the GPU much slower; fix: remove \
         nopat from the kernel command line (GRUB_CMDLINE_LINUX in /etc/default/grub), run \
         sudo update-grub and reboot",
    ),
];

/// The doctor's lines of `states` in `console`, each state's expected line among them, and in
/// the healthy state no FAIL at all. Prints every line (the closing notes quote them).
pub fn check(console: &str, states: &[&str], log: &Path) -> Result<()> {
    let lines: Vec<(&str, &str)> = super::marked(console, "MTGDRCOPY-DOCTOR ")
        .filter_map(|l| l.split_once(' '))
        .collect();
    for state in states {
        let of_state: Vec<&str> = lines
            .iter()
            .filter(|(s, _)| s == state)
            .map(|(_, l)| *l)
            .collect();
        for line in &of_state {
            eprintln!("      guest doctor ({state}): {line}");
        }
        let expected = EXPECTED
            .iter()
            .find(|(s, _)| s == state)
            .map(|(_, l)| *l)
            .unwrap_or_default();
        ensure!(
            of_state.contains(&expected),
            "mtgdrcopy_doctor ({state}) did not print {expected:?}; full log: {}",
            log.display()
        );
        if *state == "healthy" {
            ensure!(
                !of_state.iter().any(|l| l.starts_with("FAIL")),
                "mtgdrcopy_doctor found a failure on the healthy VM; full log: {}",
                log.display()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_is_run_and_has_its_line() {
        let script = format!("checks_begin tools\n{}checks_end\n", loaded_states());
        assert_eq!(
            super::super::checks::expected_sections(&script),
            [("tools", 4)]
        );
        let console = "MTGDRCOPY-DOCTOR healthy OK    mtgpu: fine\r\n\
                       MTGDRCOPY-DOCTOR healthy WARN  libmusa: x\n";
        let log = Path::new("log");
        let error = check(console, &["healthy"], log).unwrap_err().to_string();
        assert!(error.contains("did not print"), "{error}");
        let console = format!("MTGDRCOPY-DOCTOR healthy {EMULATED}\n");
        check(&console, &["healthy"], log).unwrap();
        let failed = format!("{console}MTGDRCOPY-DOCTOR healthy FAIL  pat: x; fix: y\n");
        assert!(check(&failed, &["healthy"], log).is_err());
    }

    #[test]
    fn the_scripts_run_every_expected_state() {
        let script = super::super::SCRIPT.replace("@DOCTOR_LOADED@", &loaded_states());
        for (state, _) in EXPECTED {
            let run = format!("doctor {state} ");
            let found = if state == "nopat" {
                NOPAT_RUN.starts_with(&run)
            } else {
                script.lines().any(|l| l.starts_with(&run))
            };
            assert!(found, "no run of the doctor in state {state}");
        }
        assert_eq!(LOADED_STATES.len() + OTHER_STATES.len() + 1, EXPECTED.len());
    }
}
