//! `/dev/mtgdrdrv` (present, openable by this user, and if not, whether the group membership
//! is missing or only not yet effective) and `container` (inside one: which `--device` or
//! `--group-add` its run command lacks).

use std::os::unix::fs::{FileTypeExt, MetadataExt};

use super::report::Line;
use super::{Host, Process};

/// The module's device node.
pub const DEVICE: &str = gdrapi::DEVICE_PATH;

/// Owner, group and mode of a device node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

/// What opening the node gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeState {
    Missing,
    NotCharDevice,
    Opened(NodeInfo),
    /// EACCES or EPERM.
    Denied(NodeInfo),
    Failed(NodeInfo, String),
}

pub fn stat(host: &Host, abs: &str) -> Option<(NodeInfo, bool)> {
    let meta = std::fs::metadata(host.path(abs)).ok()?;
    let info = NodeInfo {
        uid: meta.uid(),
        gid: meta.gid(),
        mode: meta.mode() & 0o7777,
    };
    Some((info, meta.file_type().is_char_device()))
}

/// Stats and opens `abs` read-write, as libgdrapi does (opening mtgdrdrv calls no provider).
pub fn probe(host: &Host, abs: &str) -> NodeState {
    let Some((info, is_char)) = stat(host, abs) else {
        return NodeState::Missing;
    };
    if !is_char {
        return NodeState::NotCharDevice;
    }
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(host.path(abs))
    {
        Ok(_) => NodeState::Opened(info),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => NodeState::Denied(info),
        Err(e) => NodeState::Failed(info, e.to_string()),
    }
}

/// The name of group `gid` and its listed members, from `/etc/group`.
pub fn group(host: &Host, gid: u32) -> Option<(String, Vec<String>)> {
    host.read("/etc/group")?.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.len() >= 4 && f[2].parse() == Ok(gid)).then(|| {
            let members = f[3]
                .split(',')
                .filter(|m| !m.is_empty())
                .map(String::from)
                .collect();
            (f[0].to_string(), members)
        })
    })
}

/// `crw-rw----` for a character device's mode bits.
fn mode_string(mode: u32) -> String {
    let mut s = String::from("c");
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

fn group_name(host: &Host, gid: u32) -> String {
    group(host, gid).map_or_else(|| gid.to_string(), |(name, _)| name)
}

pub fn device_line(host: &Host, process: &Process, state: &NodeState, module_loaded: bool) -> Line {
    let user = process
        .user
        .clone()
        .unwrap_or_else(|| format!("uid {}", process.uid));
    let describe = |info: &NodeInfo| {
        format!(
            "{DEVICE} ({} {}:{})",
            mode_string(info.mode),
            info.uid,
            group_name(host, info.gid)
        )
    };
    match state {
        NodeState::Missing if module_loaded => Line::fail(
            DEVICE,
            "missing although mtgdrdrv is loaded",
            "in a container, pass it with --device /dev/mtgdrdrv; on the host, udev did not \
             create it: sudo udevadm trigger --subsystem-match=misc (the package's rule is \
             60-mtgdrdrv.rules)",
        ),
        NodeState::Missing => Line::fail(
            DEVICE,
            "missing: mtgdrdrv is not loaded",
            "load mtgdrdrv (sudo modprobe mtgdrdrv); udev then creates the node",
        ),
        NodeState::NotCharDevice => Line::fail(
            DEVICE,
            "is not a character device",
            "sudo rm /dev/mtgdrdrv, then sudo modprobe -r mtgdrdrv && sudo modprobe mtgdrdrv",
        ),
        NodeState::Opened(info) => Line::ok(
            DEVICE,
            format!("{} opens read-write for {user}", describe(info)),
        ),
        NodeState::Failed(info, e) => Line::fail(
            DEVICE,
            format!("{}: open failed: {e}", describe(info)),
            "sudo modprobe -r mtgdrdrv && sudo modprobe mtgdrdrv; `dmesg | grep mtgdrdrv` says more",
        ),
        NodeState::Denied(info) => {
            let (name, members) =
                group(host, info.gid).unwrap_or_else(|| (info.gid.to_string(), Vec::new()));
            let finding = format!("{}: permission denied for {user}", describe(info));
            if process.gids.contains(&info.gid) || info.mode & 0o060 != 0o060 {
                Line::fail(
                    DEVICE,
                    finding,
                    format!(
                        "the node is not read-write for its group: reinstall mtgdrdrv-dkms (its \
                         udev rule 60-mtgdrdrv.rules makes it 0660, group {name}) or fix a local \
                         rule that overrides it, then sudo udevadm trigger"
                    ),
                )
            } else if process.user.as_ref().is_some_and(|u| members.contains(u))
                || process.primary_gid == Some(info.gid)
            {
                Line::fail(
                    DEVICE,
                    format!("{finding}; {user} is in group {name} per /etc/group, but this session is not"),
                    format!("log in again (or run `newgrp {name}`) so that the membership takes effect"),
                )
            } else {
                Line::fail(
                    DEVICE,
                    finding,
                    format!("sudo usermod -aG {name} {user}, then log in again"),
                )
            }
        }
    }
}

/// The kind of container this process runs in, if it can tell.
pub fn container_kind(host: &Host) -> Option<String> {
    if host.exists("/.dockerenv") {
        return Some("docker".into());
    }
    if host.exists("/run/.containerenv") {
        return Some("podman".into());
    }
    // systemd-nspawn, LXC and others set `container=` for PID 1 (readable by root).
    if let Some(env) = host.read("/proc/1/environ") {
        if let Some(kind) = env
            .split('\0')
            .find_map(|v| v.strip_prefix("container="))
            .filter(|k| !k.is_empty())
        {
            return Some(kind.to_string());
        }
    }
    let cgroup = host.read("/proc/1/cgroup").unwrap_or_default();
    let mountinfo = host.read("/proc/self/mountinfo").unwrap_or_default();
    ["kubepods", "docker", "containerd", "libpod", "lxc"]
        .into_iter()
        .find(|k| cgroup.contains(k) || mountinfo.contains(&format!("/{k}/containers/")))
        .map(String::from)
}

/// What the container's device nodes look like.
#[derive(Clone, Debug, Default)]
pub struct Passed {
    pub mtgdrdrv: Option<NodeInfo>,
    /// The first `/dev/dri/renderD*`.
    pub render: Option<NodeInfo>,
    /// Whether a `/dev/mtgpu.N` is present.
    pub mtgpu_node: bool,
}

impl Passed {
    pub fn probe(host: &Host) -> Passed {
        let render = host
            .entries("/dev/dri")
            .into_iter()
            .find(|e| e.starts_with("renderD"))
            .and_then(|e| stat(host, &format!("/dev/dri/{e}")))
            .map(|(info, _)| info);
        Passed {
            mtgdrdrv: stat(host, DEVICE).map(|(info, _)| info),
            render,
            mtgpu_node: host.entries("/dev").iter().any(|e| e.starts_with("mtgpu.")),
        }
    }
}

/// The host's GPU driver, as far as the container's device nodes are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gpu {
    /// No live GPU driver: its nodes cannot be asked for.
    None,
    /// mtgpu, whose devices are /dev/mtgpu.N and /dev/dri/renderD*.
    Real,
    /// The test suite's emulated provider: a DRM render node only (for libmusa's sake).
    Emulated,
}

/// The run options the container lacks.
pub fn missing_options(
    passed: &Passed,
    process: &Process,
    module_loaded: bool,
    gpu: Gpu,
) -> Vec<String> {
    let mut options = Vec::new();
    if module_loaded && passed.mtgdrdrv.is_none() {
        options.push("--device /dev/mtgdrdrv".to_string());
    }
    if gpu == Gpu::Real && !passed.mtgpu_node {
        options.push("--device /dev/mtgpu.N (each GPU's)".to_string());
    }
    if gpu != Gpu::None && passed.render.is_none() {
        options.push("--device /dev/dri".to_string());
    }
    let mut groups: Vec<u32> = [passed.mtgdrdrv, passed.render]
        .into_iter()
        .flatten()
        .filter(|n| {
            process.uid != 0
                && n.uid != process.uid
                && n.mode & 0o006 != 0o006
                && !process.gids.contains(&n.gid)
        })
        .map(|n| n.gid)
        .collect();
    groups.dedup();
    options.extend(groups.into_iter().map(|g| format!("--group-add {g}")));
    options
}

pub fn container_line(
    host: &Host,
    process: &Process,
    kind: &str,
    module_loaded: bool,
    gpu: Gpu,
) -> Line {
    let options = missing_options(&Passed::probe(host), process, module_loaded, gpu);
    if options.is_empty() {
        Line::ok(
            "container",
            format!("inside a container ({kind}); its device nodes are passed and accessible"),
        )
    } else {
        Line::fail(
            "container",
            format!(
                "inside a container ({kind}) that lacks {}",
                options.join(", ")
            ),
            format!("run the container with {}", options.join(" ")),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::host::FakeRoot;
    use crate::doctor::Level;

    fn user(gids: &[u32]) -> Process {
        Process {
            uid: 1000,
            gids: gids.to_vec(),
            user: Some("alice".into()),
            primary_gid: Some(1000),
            cpus: vec![0],
        }
    }

    const RENDER: NodeInfo = NodeInfo {
        uid: 0,
        gid: 105,
        mode: 0o660,
    };

    fn etc(root: &FakeRoot, render_members: &str) {
        root.file(
            "/etc/group",
            &format!("root:x:0:\nalice:x:1000:\nrender:x:105:{render_members}\n"),
        );
    }

    #[test]
    fn denied_says_add_the_user_or_log_in_again() {
        let root = FakeRoot::new("denied");
        etc(&root, "bob");
        let line = device_line(
            &root.host(),
            &user(&[1000]),
            &NodeState::Denied(RENDER),
            true,
        );
        assert_eq!(
            line.to_string(),
            "FAIL  /dev/mtgdrdrv: /dev/mtgdrdrv (crw-rw---- 0:render): permission denied for \
             alice; fix: sudo usermod -aG render alice, then log in again"
        );
        etc(&root, "bob,alice");
        let line = device_line(
            &root.host(),
            &user(&[1000]),
            &NodeState::Denied(RENDER),
            true,
        );
        assert!(
            line.finding
                .ends_with("alice is in group render per /etc/group, but this session is not"),
            "{line}"
        );
        assert!(line.fix.starts_with("log in again"), "{line}");
        // In the group, but the group may not write: the node's mode is wrong.
        let ro = NodeInfo {
            mode: 0o640,
            ..RENDER
        };
        let line = device_line(
            &root.host(),
            &user(&[1000, 105]),
            &NodeState::Denied(ro),
            true,
        );
        assert!(line.fix.contains("60-mtgdrdrv.rules"), "{line}");
    }

    #[test]
    fn present_missing_and_opened() {
        let root = FakeRoot::new("node");
        etc(&root, "alice");
        assert_eq!(probe(&root.host(), DEVICE), NodeState::Missing);
        root.file(DEVICE, "");
        assert_eq!(probe(&root.host(), DEVICE), NodeState::NotCharDevice);
        let line = device_line(&root.host(), &user(&[1000]), &NodeState::Missing, false);
        assert_eq!(line.level, Level::Fail);
        assert!(line.fix.contains("modprobe mtgdrdrv"), "{line}");
        let line = device_line(
            &root.host(),
            &user(&[1000, 105]),
            &NodeState::Opened(RENDER),
            true,
        );
        assert_eq!(
            line.to_string(),
            "OK    /dev/mtgdrdrv: /dev/mtgdrdrv (crw-rw---- 0:render) opens read-write for alice"
        );
    }

    #[test]
    fn containers_are_detected() {
        let root = FakeRoot::new("container");
        assert_eq!(container_kind(&root.host()), None);
        root.file("/proc/1/cgroup", "0::/\n");
        assert_eq!(container_kind(&root.host()), None);
        root.file(
            "/proc/self/mountinfo",
            "1 2 0:1 /var/lib/docker/containers/ab/hostname /etc/hostname rw\n",
        );
        assert_eq!(container_kind(&root.host()).as_deref(), Some("docker"));
        root.file("/run/.containerenv", "");
        assert_eq!(container_kind(&root.host()).as_deref(), Some("podman"));
    }

    #[test]
    fn the_container_lacks_devices_and_groups() {
        let nothing = Passed::default();
        assert_eq!(
            missing_options(&nothing, &user(&[1000]), true, Gpu::Real),
            [
                "--device /dev/mtgdrdrv",
                "--device /dev/mtgpu.N (each GPU's)",
                "--device /dev/dri"
            ]
        );
        let passed = Passed {
            mtgdrdrv: Some(RENDER),
            render: Some(RENDER),
            mtgpu_node: true,
        };
        assert_eq!(
            missing_options(&passed, &user(&[1000]), true, Gpu::Real),
            ["--group-add 105"]
        );
        assert!(missing_options(&passed, &user(&[1000, 105]), true, Gpu::Real).is_empty());
        let root = Process {
            uid: 0,
            ..user(&[0])
        };
        assert!(missing_options(&nothing, &user(&[1000]), false, Gpu::None).is_empty());
        assert!(missing_options(&passed, &root, true, Gpu::Real).is_empty());
    }
}
