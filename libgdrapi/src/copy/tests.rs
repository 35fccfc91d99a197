//! Every supported variant, both directions, byte-exact, with guard bytes around the
//! destination: sizes 0–4096 at every destination misalignment 0–63 (the source misalignment
//! varies with size so that all 64 occur), every source × destination misalignment pair for
//! sizes 0–160, and sizes up to 16 MiB.

use std::cell::RefCell;

use super::{variants, Variant};

const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xA5;

/// A buffer aligned to 4096 with room for misalignment and guards on both sides.
pub(super) struct Arena {
    storage: Vec<u8>,
    base: usize,
}

impl Arena {
    pub(super) fn new(len: usize) -> Self {
        let storage = vec![0u8; len + 2 * GUARD + 64 + 4096];
        let start = storage.as_ptr() as usize + GUARD;
        let base = start.div_ceil(4096) * 4096 - storage.as_ptr() as usize;
        Arena { storage, base }
    }
    pub(super) fn ptr_at(&mut self, misalign: usize) -> *mut u8 {
        // SAFETY: `base + misalign` is inside `storage` by construction.
        unsafe { self.storage.as_mut_ptr().add(self.base + misalign) }
    }
}

thread_local! {
    /// The test data's sequence, (k * 131 + 1) % 251 for k = 0, 1, ..., as long as the longest
    /// copy so far needed. Made once and sliced: making each copy's data anew was most of these
    /// tests' time in debug builds, and over a minute of the arm64 step under qemu-user.
    static SEQUENCE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Calls `f` with `len` bytes of test data for `seed`: byte i is (i * 131 + seed * 7 + 1) % 251,
/// a sequence of period 251, so that bytes landed at any offset below that read wrong.
fn with_pattern<R>(seed: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
    // 131 * 23 = 12 * 251 + 1, so the seed's term is a shift of the sequence by
    // seed * 7 * 23 (mod 251) bytes.
    let shift = seed * 7 % 251 * 23 % 251;
    let end = shift + len;
    SEQUENCE.with_borrow_mut(|seq| {
        if seq.len() < end {
            let grown = end.max(2 * seq.len());
            let start = seq.len();
            seq.extend((start..grown).map(|k| ((k * 131 + 1) % 251) as u8));
        }
        f(&seq[shift..end])
    })
}

#[test]
fn the_test_data_follows_its_formula() {
    for (seed, len) in [(0, 0), (0, 300), (1, 1), (250, 600), (251, 7), (4159, 4096)] {
        with_pattern(seed, len, |data| {
            assert_eq!(data.len(), len);
            for (i, &b) in data.iter().enumerate() {
                assert_eq!(
                    b,
                    ((i * 131 + seed * 7 + 1) % 251) as u8,
                    "seed {seed} i {i}"
                );
            }
        });
    }
}

/// Copies `n` bytes with `variant` in one direction and checks the destination exactly,
/// including `GUARD` bytes before and after it.
pub(super) fn check(
    variant: &Variant,
    to_device: bool,
    n: usize,
    src_mis: usize,
    dst_mis: usize,
    src: &mut Arena,
    dst: &mut Arena,
) {
    let copy = if to_device {
        variant.to_device
    } else {
        variant.from_device
    };
    check_with(copy, variant.name, to_device, n, src_mis, dst_mis, src, dst);
}

/// `check` for any copy function.
#[allow(clippy::too_many_arguments)]
fn check_with(
    copy: super::CopyFn,
    name: &str,
    to_device: bool,
    n: usize,
    src_mis: usize,
    dst_mis: usize,
    src: &mut Arena,
    dst: &mut Arena,
) {
    let sp = src.ptr_at(src_mis);
    let dp = dst.ptr_at(dst_mis);
    // SAFETY: both arenas hold `n + 64` bytes past their aligned base plus `GUARD` bytes around.
    with_pattern(n + src_mis, n, |data| unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), sp, n);
        std::ptr::write_bytes(dp.sub(GUARD), GUARD_BYTE, n + 2 * GUARD);
        copy(dp, sp, n);
        let got = std::slice::from_raw_parts(dp.sub(GUARD), n + 2 * GUARD);
        let ctx = || {
            format!(
                "{} {} n={n} src+{src_mis} dst+{dst_mis}",
                name,
                if to_device { "to" } else { "from" }
            )
        };
        assert!(
            got[..GUARD] == [GUARD_BYTE; GUARD],
            "wrote before dst: {}",
            ctx()
        );
        assert!(
            got[GUARD + n..] == [GUARD_BYTE; GUARD],
            "wrote after dst: {}",
            ctx()
        );
        assert!(got[GUARD..GUARD + n] == data[..], "wrong bytes: {}", ctx());
    })
}

/// The variants the matrices run: the supported ones; on arm64 `ls64` only where its
/// instructions are emulated (see aarch64/ls64_tests.rs: ordinary memory may not take them).
fn supported() -> Vec<&'static Variant> {
    let v: Vec<_> = variants().iter().filter(|v| tested_here(v)).collect();
    assert!(!v.is_empty());
    v
}

#[cfg(target_arch = "aarch64")]
fn tested_here(v: &Variant) -> bool {
    if v.name == "ls64" {
        super::aarch64::ls64_tests::emulated()
    } else {
        v.is_supported()
    }
}

#[cfg(not(target_arch = "aarch64"))]
fn tested_here(v: &Variant) -> bool {
    v.is_supported()
}

#[test]
fn sizes_to_4096_at_every_destination_misalignment() {
    let mut src = Arena::new(4096 + 64);
    let mut dst = Arena::new(4096 + 64);
    for variant in supported() {
        for to_device in [true, false] {
            for n in 0..=4096 {
                for dst_mis in 0..64 {
                    let src_mis = (n + 3 * dst_mis) % 64;
                    check(variant, to_device, n, src_mis, dst_mis, &mut src, &mut dst);
                }
            }
        }
    }
}

#[test]
fn every_misalignment_pair_for_small_sizes() {
    let mut src = Arena::new(256);
    let mut dst = Arena::new(256);
    for variant in supported() {
        for to_device in [true, false] {
            for n in 0..=160 {
                for src_mis in 0..64 {
                    for dst_mis in 0..64 {
                        check(variant, to_device, n, src_mis, dst_mis, &mut src, &mut dst);
                    }
                }
            }
        }
    }
}

#[test]
fn large_sizes_up_to_16_mib() {
    let max = 16 << 20;
    let mut src = Arena::new(max + 64);
    let mut dst = Arena::new(max + 64);
    for variant in supported() {
        for to_device in [true, false] {
            for (n, mis) in [
                (65536, 0),
                (65536 + 7, 13),
                (1 << 20, 32),
                ((1 << 20) + 3, 61),
                (max - 1, 1),
                (max, 0),
            ] {
                check(
                    variant,
                    to_device,
                    n,
                    (mis * 5) % 64,
                    mis,
                    &mut src,
                    &mut dst,
                );
            }
        }
    }
}

/// The entry points the library uses: copies below `INLINE_BELOW` inline, larger ones through
/// the selected variant.
#[test]
fn entry_points_at_every_misalignment_pair() {
    let mut src = Arena::new(256);
    let mut dst = Arena::new(256);
    for (to_device, copy) in [
        (true, super::to_device as super::CopyFn),
        (false, super::from_device as super::CopyFn),
    ] {
        for n in 0..=80 {
            for src_mis in 0..64 {
                for dst_mis in 0..64 {
                    check_with(
                        copy, "entry", to_device, n, src_mis, dst_mis, &mut src, &mut dst,
                    );
                }
            }
        }
    }
}

#[test]
fn one_access_is_exactly_the_aligned_powers_of_two() {
    // Its domain: the inline copies, n < 16, at a device address that is not null.
    for addr in 1..128usize {
        for n in 0..16usize {
            let expected = matches!(n, 1 | 2 | 4 | 8) && addr % n == 0;
            assert_eq!(super::is_one_access(addr, n), expected, "addr {addr} n {n}");
        }
    }
}

#[test]
fn the_selected_variant_is_supported_and_listed() {
    let chosen = super::selected();
    assert!(chosen.is_supported());
    assert!(variants().iter().any(|v| std::ptr::eq(v, chosen)));
}

#[test]
fn small_width_is_naturally_aligned_and_fits() {
    for addr in 0..64usize {
        for n in 1..20usize {
            let w = super::small_width(addr, n);
            assert!(
                w.is_power_of_two() && w <= 8 && w <= n && addr % w == 0,
                "addr {addr} n {n} -> {w}"
            );
        }
    }
    assert_eq!(
        super::small_width(8, 8),
        8,
        "an aligned 8-byte copy is one store"
    );
}

/// NEON is part of the arm64 baseline: were its detection to fail (or qemu-user to hide it),
/// the matrices above would silently test only the generic variant. LS64 is tested wherever
/// its instructions are emulated (qemu-user has none).
#[cfg(target_arch = "aarch64")]
#[test]
fn ls64_neon_and_generic_are_all_tested_on_arm64() {
    let names: Vec<&str> = supported().iter().map(|v| v.name).collect();
    // SAFETY: getauxval has no preconditions.
    let native_ls64 = unsafe { libc::getauxval(libc::AT_HWCAP3) } & (1 << 3) != 0;
    let expected: &[&str] = if native_ls64 {
        &["neon", "generic"]
    } else {
        &["ls64", "neon", "generic"]
    };
    assert_eq!(names, expected);
}
