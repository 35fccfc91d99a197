//! `gpu N` (one line per GPU: name, PCI address, NUMA node, BAR size) and `numa` (this
//! process's CPU affinity against the GPU's NUMA node).
//!
//! The GPUs and their ordinals are libmusa's when it could be initialised, else the PCI devices
//! bound to the mtgpu PCI driver in address order; NUMA node and BARs come from sysfs.

use super::host::{format_cpulist, parse_cpulist};
use super::modules;
use super::musa::Found;
use super::report::Line;
use super::{Host, Process};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    pub ordinal: i32,
    pub name: String,
    pub pci: Option<String>,
    /// sysfs `numa_node`; `None` when the platform reports none (-1).
    pub numa: Option<u32>,
    /// The largest memory BAR, in bytes.
    pub bar: Option<u64>,
}

/// The largest memory BAR in a sysfs `resource` file (`start end flags` per line).
pub fn largest_memory_bar(resource: &str) -> Option<u64> {
    const IORESOURCE_MEM: u64 = 0x200;
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    resource
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (start, end, flags) = (hex(f.next()?)?, hex(f.next()?)?, hex(f.next()?)?);
            (flags & IORESOURCE_MEM != 0 && end > start).then(|| end - start + 1)
        })
        .max()
}

fn sysfs_facts(host: &Host, pci: &str) -> (Option<u32>, Option<u64>) {
    let dir = format!("/sys/bus/pci/devices/{pci}");
    let numa = host
        .value(&format!("{dir}/numa_node"))
        .and_then(|v| v.parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    let bar = host
        .read(&format!("{dir}/resource"))
        .and_then(|r| largest_memory_bar(&r));
    (numa, bar)
}

/// The GPUs visible: libmusa's devices if it was initialised, else those bound to mtgpu.
pub fn find(host: &Host, library: Option<&Found>, mtgpu_live: bool) -> Vec<Gpu> {
    if let Some(Ok(devices)) = library.map(|f| &f.devices) {
        return devices
            .iter()
            .map(|d| {
                let (numa, bar) = d
                    .pci
                    .as_deref()
                    .map_or((None, None), |p| sysfs_facts(host, p));
                Gpu {
                    ordinal: d.ordinal,
                    name: d.name.clone(),
                    pci: d.pci.clone(),
                    numa,
                    bar,
                }
            })
            .collect();
    }
    if !mtgpu_live {
        return Vec::new();
    }
    modules::bound_devices(host)
        .into_iter()
        .enumerate()
        .map(|(i, pci)| {
            let (numa, bar) = sysfs_facts(host, &pci);
            let id = |f: &str| host.value(&format!("/sys/bus/pci/devices/{pci}/{f}"));
            let name = match (id("vendor"), id("device")) {
                (Some(v), Some(d)) => format!(
                    "PCI device {}:{}",
                    v.trim_start_matches("0x"),
                    d.trim_start_matches("0x")
                ),
                _ => "unnamed".into(),
            };
            Gpu {
                ordinal: i as i32,
                name,
                pci: Some(pci),
                numa,
                bar,
            }
        })
        .collect()
}

/// The GPUs `--device` selects (all without it).
pub fn select(gpus: &[Gpu], device: Option<i32>) -> Vec<Gpu> {
    gpus.iter()
        .filter(|g| device.is_none_or(|d| d == g.ordinal))
        .cloned()
        .collect()
}

fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["bytes", "KiB", "MiB", "GiB"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1024 && value % 1024 == 0 && unit + 1 < UNITS.len() {
        value /= 1024;
        unit += 1;
    }
    format!("{value} {}", UNITS[unit])
}

pub fn gpu_lines(all: &[Gpu], device: Option<i32>, selected: &[Gpu]) -> Vec<Line> {
    if all.is_empty() {
        return vec![Line::fail(
            "gpu",
            "no GPU visible",
            "make mtgpu and libmusa work (above); in a container, pass the GPU's /dev/mtgpu.N \
             and /dev/dri",
        )];
    }
    if let (Some(d), true) = (device, selected.is_empty()) {
        return vec![Line::fail(
            format!("gpu {d}"),
            format!("no such GPU: {} visible (0..{})", all.len(), all.len() - 1),
            "pass --device with one of those ordinals",
        )];
    }
    selected
        .iter()
        .map(|g| {
            let numa = g
                .numa
                .map_or_else(|| "no NUMA node".to_string(), |n| format!("NUMA node {n}"));
            let bar = g
                .bar
                .map_or_else(|| "BAR size unknown".into(), |b| format!("BAR {}", size(b)));
            Line::ok(
                format!("gpu {}", g.ordinal),
                format!(
                    "{}, {}, {numa}, {bar}",
                    g.name,
                    g.pci.as_deref().unwrap_or("PCI address unknown")
                ),
            )
        })
        .collect()
}

pub fn numa_line(host: &Host, process: &Process, gpus: &[Gpu]) -> Line {
    let nodes = host
        .entries("/sys/devices/system/node")
        .into_iter()
        .filter(|e| {
            e.strip_prefix("node")
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .count();
    let with_node: Vec<(&Gpu, u32)> = gpus.iter().filter_map(|g| Some((g, g.numa?))).collect();
    if nodes <= 1 || with_node.is_empty() {
        return Line::ok(
            "numa",
            format!(
                "{}: no CPU binding needed",
                if nodes <= 1 {
                    "one NUMA node"
                } else {
                    "the GPU reports no NUMA node"
                }
            ),
        );
    }
    let mine = format_cpulist(&process.cpus);
    let mut off = Vec::new();
    for (gpu, node) in &with_node {
        let Some(local) = host
            .read(&format!("/sys/devices/system/node/node{node}/cpulist"))
            .and_then(|l| parse_cpulist(&l))
        else {
            continue;
        };
        let outside: Vec<usize> = process
            .cpus
            .iter()
            .copied()
            .filter(|c| !local.contains(c))
            .collect();
        if !outside.is_empty() {
            off.push((
                gpu.ordinal,
                *node,
                format_cpulist(&local),
                format_cpulist(&outside),
            ));
        }
    }
    if off.is_empty() {
        let nodes: Vec<String> = with_node
            .iter()
            .map(|(g, n)| format!("GPU {}'s node {n}", g.ordinal))
            .collect();
        return Line::ok(
            "numa",
            format!(
                "this process's CPUs ({mine}) are all on {}",
                nodes.join(", ")
            ),
        );
    }
    let (gpu, node, local, outside) = &off[0];
    Line::warn(
        "numa",
        format!(
            "this process may run on CPUs {mine}; {outside} of them are not on GPU {gpu}'s NUMA \
             node {node} (CPUs {local}), where copies to it are slower"
        ),
        format!("run the program on the GPU's node: numactl --cpunodebind={node} --membind={node} <program>"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::host::FakeRoot;
    use crate::doctor::Level;

    const RESOURCE: &str = "0x00000000fea00000 0x00000000fea000ff 0x0000000000040200\n\
                            0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                            0x000000c000000000 0x000000c00fffffff 0x000000000014220c\n\
                            0x000000000000c000 0x000000000000c0ff 0x0000000000040101\n";

    #[test]
    fn the_largest_memory_bar_counts() {
        assert_eq!(largest_memory_bar(RESOURCE), Some(256 << 20));
        assert_eq!(largest_memory_bar(""), None);
        assert_eq!(size(256 << 20), "256 MiB");
        assert_eq!(size(32 << 30), "32 GiB");
    }

    fn fake() -> FakeRoot {
        let root = FakeRoot::new("gpus");
        root.dir("/sys/bus/pci/drivers/mtgpu/0000:00:04.0")
            .file("/sys/bus/pci/devices/0000:00:04.0/resource", RESOURCE)
            .file("/sys/bus/pci/devices/0000:00:04.0/numa_node", "1\n")
            .file("/sys/bus/pci/devices/0000:00:04.0/vendor", "0x1af4\n")
            .file("/sys/bus/pci/devices/0000:00:04.0/device", "0x1110\n")
            .file("/sys/devices/system/node/node0/cpulist", "0-3\n")
            .file("/sys/devices/system/node/node1/cpulist", "4-7\n");
        root
    }

    #[test]
    fn gpus_from_sysfs_with_node_and_bar() {
        let root = fake();
        let gpus = find(&root.host(), None, true);
        let lines = gpu_lines(&gpus, None, &select(&gpus, None));
        assert_eq!(
            lines[0].to_string(),
            "OK    gpu 0: PCI device 1af4:1110, 0000:00:04.0, NUMA node 1, BAR 256 MiB"
        );
        assert!(find(&root.host(), None, false).is_empty());
        let missing = gpu_lines(&gpus, Some(3), &select(&gpus, Some(3)));
        assert_eq!(missing[0].level, Level::Fail);
        assert_eq!(gpu_lines(&[], None, &[])[0].level, Level::Fail);
    }

    #[test]
    fn affinity_against_the_gpus_node() {
        let root = fake();
        let gpus = find(&root.host(), None, true);
        let process = |cpus: Vec<usize>| Process {
            uid: 1000,
            gids: vec![],
            user: None,
            primary_gid: None,
            cpus,
        };
        let on = numa_line(&root.host(), &process(vec![4, 5, 6, 7]), &gpus);
        assert_eq!(
            on.to_string(),
            "OK    numa: this process's CPUs (4-7) are all on GPU 0's node 1"
        );
        let off = numa_line(&root.host(), &process((0..8).collect()), &gpus);
        assert_eq!(off.level, Level::Warn);
        assert!(
            off.finding
                .contains("0-3 of them are not on GPU 0's NUMA node 1"),
            "{off}"
        );
        assert!(
            off.fix.contains("numactl --cpunodebind=1 --membind=1"),
            "{off}"
        );
        let single = FakeRoot::new("gpus-single");
        single.file("/sys/devices/system/node/node0/cpulist", "0-7\n");
        let line = numa_line(&single.host(), &process(vec![0]), &gpus);
        assert_eq!(
            line.to_string(),
            "OK    numa: one NUMA node: no CPU binding needed"
        );
    }
}
