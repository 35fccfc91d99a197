//! Every copy variant this CPU supports, both directions, between ordinary buffers at fuzzed
//! offsets and lengths: the bytes must equal a plain copy's, and nothing outside the two ranges
//! may change (guard bytes on both sides of both buffers).
#![no_main]

use libfuzzer_sys::fuzz_target;

const GUARD: usize = 64;
const MAX: usize = 8192;

fuzz_target!(|data: &[u8]| {
    if data.len() < 7 {
        return;
    }
    let variants: Vec<_> = gdrapi::copy::variants()
        .iter()
        .filter(|v| v.is_supported())
        .collect();
    let v = variants[data[0] as usize % variants.len()];
    let to_device = data[1] & 1 == 0;
    let dst_off = data[2] as usize % 64;
    let src_off = data[3] as usize % 64;
    let len = u16::from_le_bytes([data[4], data[5]]) as usize % MAX;
    let fill = data[6];
    let payload = &data[7..];

    let mut src = vec![0u8; GUARD + 64 + MAX + GUARD];
    for (i, b) in src.iter_mut().enumerate() {
        *b = payload
            .get(i % payload.len().max(1))
            .copied()
            .unwrap_or(i as u8)
            ^ (i as u8);
    }
    let mut dst = vec![fill; GUARD + 64 + MAX + GUARD];
    let src_before = src.clone();
    let mut want = dst.clone();
    want[GUARD + dst_off..GUARD + dst_off + len]
        .copy_from_slice(&src[GUARD + src_off..GUARD + src_off + len]);
    let f = if to_device {
        v.to_device
    } else {
        v.from_device
    };
    // SAFETY: both ranges lie inside their buffers (offsets < 64, len < MAX, guards around).
    unsafe {
        f(
            dst.as_mut_ptr().add(GUARD + dst_off),
            src.as_ptr().add(GUARD + src_off),
            len,
        )
    };
    assert!(src == src_before, "{}: the source changed", v.name);
    if let Some(i) = (0..dst.len()).find(|&i| dst[i] != want[i]) {
        panic!(
            "{} {}: byte {i} (copy of {len} at dst+{dst_off} from src+{src_off}) is {:#x}, want {:#x}",
            v.name,
            if to_device { "to_device" } else { "from_device" },
            dst[i],
            want[i]
        );
    }
});
