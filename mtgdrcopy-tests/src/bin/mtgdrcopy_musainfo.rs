//! `mtgdrcopy_musainfo`: what the MUSA driver library the mtgdrcopy tools load reports (library
//! path, driver version, devices), and with `--check`, whether device memory round-trips
//! through the driver (alloc, H→D, D→H, memset, managed memory, SYNC_MEMOPS).

use std::process::ExitCode;

use anyhow::{ensure, Context, Result};
use clap::Parser;
use mtgdrcopy_tests::cli::musainfo::Cli;
use mtgdrcopy_tests::gpu::Gpu;
use mtgdrcopy_tests::musa;
use mtgdrcopy_tests::tool::{self, Status};

const PROGRAM: &str = "mtgdrcopy_musainfo";

fn main() -> ExitCode {
    let cli = Cli::parse();
    tool::main(PROGRAM, &cli.version, |_| {
        run(&cli).map(|()| Status::Passed)
    })
}

fn run(cli: &Cli) -> Result<()> {
    #[cfg(feature = "emulator")]
    if cli.emu_stats {
        return print_emu_stats();
    }
    let count = musa::device_count()?;
    println!("library:        {}", musa::library_path()?);
    match musa::driver_version() {
        Ok(v) => println!("driver version: {v}"),
        Err(e) => println!("driver version: unknown ({e:#})"),
    }
    println!("devices:        {count}");
    let devices: Vec<i32> = match cli.device {
        Some(d) => vec![d],
        None => (0..count).collect(),
    };
    if devices.is_empty() {
        // device_count() is 0 only when the driver reports no device: let open() say so.
        musa::open(0)?;
    }
    for d in devices {
        let gpu = musa::open(d)?;
        println!(
            "device {d}:       {} (PCI {})",
            gpu.name(),
            gpu.pci_bus_id().as_deref().unwrap_or("unknown")
        );
        if cli.check {
            check(gpu.as_ref()).with_context(|| format!("device {d}: check failed"))?;
            println!("device {d}:       check passed");
        }
    }
    Ok(())
}

/// Sizes that cover sub-page, page-crossing and multi-chunk transfers.
const CHECK_SIZES: [usize; 4] = [1, 4096 + 3, (1 << 20) + 17, 3 << 20];

/// A byte pattern that differs between sizes and offsets.
fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + seed * 7 + 1) as u8).collect()
}

fn round_trip(gpu: &dyn Gpu, ptr: u64, size: usize, seed: usize) -> Result<()> {
    let data = pattern(size, seed);
    gpu.memcpy_htod(ptr, &data)?;
    let mut back = vec![0u8; size];
    gpu.memcpy_dtoh(&mut back, ptr)?;
    ensure!(
        back == data,
        "{size} bytes at {ptr:#x}: D→H differs from H→D"
    );

    let value = (seed as u8) ^ 0xa5;
    let (off, len) = (size / 3, size - size / 3);
    gpu.memset_d8(ptr + off as u64, value, len)?;
    gpu.memcpy_dtoh(&mut back, ptr)?;
    ensure!(
        back[..off] == data[..off] && back[off..].iter().all(|&b| b == value),
        "{size} bytes at {ptr:#x}: memset of [{off}, {size}) to {value:#04x} not seen"
    );
    Ok(())
}

fn check(gpu: &dyn Gpu) -> Result<()> {
    for (seed, size) in CHECK_SIZES.into_iter().enumerate() {
        let ptr = gpu.alloc(size)?;
        if let Err(e) = gpu.set_sync_memops(ptr) {
            eprintln!("{PROGRAM}: warning: {e:#}");
        }
        let res = round_trip(gpu, ptr, size, seed);
        gpu.free(ptr)?;
        res?;
        println!("  memory   {size:>8} bytes: alloc, H→D, D→H, memset ok");
    }
    let size = 64 << 10;
    let ptr = gpu.alloc_managed(size)?;
    let res = round_trip(gpu, ptr, size, 9);
    gpu.free(ptr)?;
    res?;
    println!("  managed  {size:>8} bytes: alloc, H→D, D→H, memset ok");
    Ok(())
}

/// The emulator's counters, for the test VM's leak check: the test suite's build only.
#[cfg(feature = "emulator")]
fn print_emu_stats() -> Result<()> {
    let emu = mtgpu_emu_abi::Emu::open()
        .map_err(|e| anyhow::anyhow!("opening {}: {e}", mtgpu_emu_abi::device_path()))?;
    let s = emu
        .stats()
        .map_err(|e| anyhow::anyhow!("emulator stats: {e}"))?;
    for (name, value) in s.named() {
        println!("emu_{name}: {value}");
    }
    Ok(())
}
