//! Runs one copy routine on ordinary memory standing in for a mapping, so that tools can observe
//! it: `cargo xtask copy-counts` runs this under valgrind to count the instructions and the
//! device-side accesses (number and width) each copy variant issues, and `cargo xtask bench`
//! times it on the host.
//!
//! usage: copy_probe VARIANT to|from SIZE COUNT [DEVICE_MISALIGNMENT]
//! Prints `device=0x<addr> size=<n> marker=0x<addr>` so the observer knows which accesses hit
//! the "device", and from where in a trace the copies start.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};

/// Written once right before the copies: in an access trace, the store to it marks where the
/// copies begin (anything earlier at the device addresses predates the mapping).
static MARKER: AtomicU64 = AtomicU64::new(0);

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("copy_probe: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [variant, direction, size, count, rest @ ..] = args.as_slice() else {
        return Err("usage: copy_probe VARIANT to|from SIZE COUNT [DEVICE_MISALIGNMENT]".into());
    };
    let size: usize = size.parse().map_err(|e| format!("SIZE: {e}"))?;
    let count: usize = count.parse().map_err(|e| format!("COUNT: {e}"))?;
    let misalign: usize = match rest.first() {
        Some(m) => m.parse().map_err(|e| format!("DEVICE_MISALIGNMENT: {e}"))?,
        None => 0,
    };
    let v = gdrapi::copy::variants()
        .iter()
        .find(|v| v.name == variant)
        .ok_or_else(|| format!("unknown variant {variant}"))?;
    if !v.is_supported() {
        return Err(format!("this CPU cannot run variant {variant}"));
    }
    let to_device = match direction.as_str() {
        "to" => true,
        "from" => false,
        other => return Err(format!("direction must be to or from, not {other}")),
    };
    // The "device" buffer comes straight from mmap (page aligned, zero, and never touched by
    // the allocator, which under valgrind zeroes memory byte by byte); the host buffer sits at an
    // odd offset like real callers'.
    let len = size + misalign + 1;
    // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
    let device = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if device == libc::MAP_FAILED {
        return Err(format!("mmap of {len} bytes failed"));
    }
    // SAFETY: `misalign < len`, inside the mapping.
    let dev = unsafe { device.cast::<u8>().add(misalign) };
    let mut host_buf = vec![0x5au8; size + 3];
    let host = host_buf[3..].as_mut_ptr();
    println!(
        "device={:#x} size={size} marker={:#x}",
        dev as usize,
        MARKER.as_ptr() as usize
    );
    MARKER.store(1, Ordering::SeqCst);
    for _ in 0..count {
        // SAFETY: both buffers hold `size` bytes past these pointers; the variant is supported.
        unsafe {
            if to_device {
                (v.to_device)(dev, host, size);
            } else {
                (v.from_device)(host, dev, size);
            }
        }
    }
    std::hint::black_box(&host_buf);
    // The mapping stays until exit, so no later allocation reuses the range and its accesses
    // are never mistaken for the copy's.
    Ok(())
}
