//! Data: upstream's walking-bit pattern, buffer comparison, raw volatile accesses through a
//! mapping, and per-process token values.

use std::ptr;

use anyhow::{bail, ensure, Result};

/// Upstream's walking-bit pattern: word `w` is `0x3F4C5E6A ^ (1 << (w % 32))`, little endian.
pub fn walking_bit(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let w = (i / 4) as u32;
            (0x3F4C_5E6Au32 ^ (1u32 << (w % 32))).to_le_bytes()[i % 4]
        })
        .collect()
}

/// Compares whole buffers; the error names the first 10 differing words (byte offset,
/// expected, found) and how many differ in all.
pub fn compare(what: &str, expected: &[u8], got: &[u8]) -> Result<()> {
    ensure!(
        expected.len() == got.len(),
        "{what}: {} bytes compared with {}",
        got.len(),
        expected.len()
    );
    if expected == got {
        return Ok(());
    }
    let word = |b: &[u8]| {
        b.iter()
            .rev()
            .fold(String::new(), |s, x| format!("{s}{x:02x}"))
    };
    let bad: Vec<usize> = expected
        .chunks(4)
        .zip(got.chunks(4))
        .enumerate()
        .filter(|(_, (e, g))| e != g)
        .map(|(i, _)| i)
        .collect();
    let mut text = format!(
        "{what}: {} of {} words differ",
        bad.len(),
        expected.len().div_ceil(4)
    );
    for &i in bad.iter().take(10) {
        let (e, g) = (
            &expected[i * 4..(i * 4 + 4).min(expected.len())],
            &got[i * 4..(i * 4 + 4).min(got.len())],
        );
        text += &format!(
            "\n    at byte {:#x}: expected 0x{}, found 0x{}",
            i * 4,
            word(e),
            word(g)
        );
    }
    bail!(text)
}

/// Stores `data` through a mapping with aligned 4-byte volatile stores (the tail byte-wise):
/// the "CPU initialization through the mapping" of upstream's check 1.
///
/// # Safety
/// `dst .. dst + data.len()` lies inside a live mapping and `dst` is 4-byte aligned.
pub unsafe fn store_words(dst: *mut u8, data: &[u8]) {
    let words = data.chunks_exact(4);
    let tail = words.remainder();
    for (i, w) in words.enumerate() {
        let v = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        // SAFETY: in bounds and aligned, per the caller.
        unsafe { ptr::write_volatile(dst.add(i * 4).cast::<u32>(), v) };
    }
    let start = data.len() - tail.len();
    for (i, b) in tail.iter().enumerate() {
        // SAFETY: in bounds, per the caller.
        unsafe { ptr::write_volatile(dst.add(start + i), *b) };
    }
    store_fence();
}

/// One volatile 4-byte load through a mapping.
///
/// # Safety
/// `src` is 4-byte aligned and inside a live mapping (or the caller expects the fault).
pub unsafe fn load_u32(src: *const u8) -> u32 {
    // SAFETY: per the caller.
    unsafe { ptr::read_volatile(src.cast::<u32>()) }
}

/// One volatile 4-byte store through a mapping, followed by a store fence.
///
/// # Safety
/// `dst` is 4-byte aligned and inside a live mapping.
pub unsafe fn store_u32(dst: *mut u8, v: u32) {
    // SAFETY: per the caller.
    unsafe { ptr::write_volatile(dst.cast::<u32>(), v) };
    store_fence();
}

/// Makes write-combined stores visible before what follows (upstream's `SB()`).
fn store_fence() {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// A value unlikely to be in device memory by chance, different in every process.
pub fn token_value(salt: u32) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (t ^ std::process::id().rotate_left(16) ^ salt.wrapping_mul(0x9E37_79B9)) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walking_bit_is_upstreams_pattern() {
        let p = walking_bit(33 * 4 + 2);
        let word =
            |w: usize| u32::from_le_bytes([p[w * 4], p[w * 4 + 1], p[w * 4 + 2], p[w * 4 + 3]]);
        assert_eq!(word(0), 0x3F4C_5E6B);
        assert_eq!(word(1), 0x3F4C_5E68);
        assert_eq!(word(31), 0x3F4C_5E6A ^ 0x8000_0000);
        assert_eq!(word(32), 0x3F4C_5E6B);
        assert_eq!(&p[132..], &0x3F4C_5E68u32.to_le_bytes()[..2]);
    }

    #[test]
    fn compare_names_the_first_ten_differing_words() {
        let expected = walking_bit(64 * 4 + 3);
        assert!(compare("same", &expected, &expected.clone()).is_ok());
        let got = vec![0u8; expected.len()];
        let text = format!("{:#}", compare("zeros", &expected, &got).unwrap_err());
        assert!(text.starts_with("zeros: 65 of 65 words differ"), "{text}");
        assert_eq!(text.lines().count(), 11, "{text}");
        assert!(
            text.contains("at byte 0x4: expected 0x3f4c5e68, found 0x00000000"),
            "{text}"
        );
        let mut tail = expected.clone();
        *tail.last_mut().unwrap() ^= 1;
        let text = format!("{:#}", compare("tail", &expected, &tail).unwrap_err());
        assert!(
            text.contains("1 of 65 words differ") && text.contains("at byte 0x100"),
            "{text}"
        );
        assert!(compare("length", &expected, &expected[1..]).is_err());
    }
}
