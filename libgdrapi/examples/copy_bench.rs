//! Host microbenchmark of the copy routines on ORDINARY MEMORY (not a device mapping): every
//! variant this CPU supports, both directions, sizes 1 B – 16 MiB. It shows the CPU side of the
//! copy path; on a real write-combined BAR the store pattern, not this throughput, sets the pace.
//!
//! Method: for each case the iteration count is calibrated so one sample lasts ≥ 200 µs, then 31
//! samples are taken; reported are the median time per copy with a 95% confidence interval of
//! the median (median ± 1.57·IQR/√n, McGill et al.'s notch) and the minimum.
//!
//! Output: one tab-separated line per case:
//! `variant direction size_bytes median_ns ci_low_ns ci_high_ns min_ns samples iterations`.

use std::hint::black_box;
use std::time::{Duration, Instant};

const SAMPLES: usize = 31;
const MIN_SAMPLE: Duration = Duration::from_micros(200);
const MAX_SIZE: usize = 16 << 20;

fn main() {
    let only: Option<String> = std::env::args().nth(1);
    let mut device = vec![0u8; MAX_SIZE + 8192];
    let mut host = vec![0x5au8; MAX_SIZE + 8192];
    let dev_off = device.as_ptr().align_offset(4096);
    let dev = device[dev_off..].as_mut_ptr();
    let host_ptr = host[3..].as_mut_ptr();
    println!("# variant\tdirection\tsize_bytes\tmedian_ns\tci_low_ns\tci_high_ns\tmin_ns\tsamples\titerations");
    for v in gdrapi::copy::variants().iter().filter(|v| v.is_supported()) {
        if only.as_deref().is_some_and(|o| o != v.name) {
            continue;
        }
        for to_device in [true, false] {
            let mut size = 1;
            while size <= MAX_SIZE {
                let copy = || {
                    // SAFETY: both buffers hold MAX_SIZE bytes past these pointers.
                    unsafe {
                        if to_device {
                            (v.to_device)(dev, host_ptr, size)
                        } else {
                            (v.from_device)(host_ptr, dev, size)
                        }
                    }
                };
                let (iterations, samples) = measure(copy);
                let ns: Vec<f64> = samples
                    .iter()
                    .map(|d| d.as_nanos() as f64 / iterations as f64)
                    .collect();
                let (median, low, high, min) = summarize(ns);
                println!(
                    "{}\t{}\t{size}\t{median:.2}\t{low:.2}\t{high:.2}\t{min:.2}\t{SAMPLES}\t{iterations}",
                    v.name,
                    if to_device { "to" } else { "from" },
                );
                size *= 2;
            }
        }
    }
    black_box((&device, &host));
}

/// Calibrates the batch size, then times SAMPLES batches.
fn measure(mut copy: impl FnMut()) -> (u64, Vec<Duration>) {
    for _ in 0..3 {
        copy();
    }
    let mut iterations = 1u64;
    loop {
        let t = Instant::now();
        for _ in 0..iterations {
            copy();
        }
        if t.elapsed() >= MIN_SAMPLE || iterations >= 1 << 24 {
            break;
        }
        iterations *= 2;
    }
    let samples = (0..SAMPLES)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iterations {
                copy();
            }
            t.elapsed()
        })
        .collect();
    (iterations, samples)
}

/// (median, CI low, CI high, min) of per-copy times.
fn summarize(mut ns: Vec<f64>) -> (f64, f64, f64, f64) {
    ns.sort_by(f64::total_cmp);
    let n = ns.len();
    let median = ns[n / 2];
    let iqr = ns[(3 * n) / 4] - ns[n / 4];
    let half = 1.57 * iqr / (n as f64).sqrt();
    (median, (median - half).max(ns[0]), median + half, ns[0])
}
