//! DEVICE (uncached) mappings get small accesses only.
//!
//! The variants' wide accesses (16–64-byte non-temporal stores, MOVDIR64B, streaming loads) are
//! made for write-combining memory. On an uncached mapping every access is its own PCIe
//! transaction, made in program order, and that order is what a caller who asks for a DEVICE
//! mapping wants: a 64-byte MOVDIR64B or a pair of 16-byte stores is no longer a sequence of
//! ordered register writes, and some devices refuse reads wider than 8 bytes. So copies to and
//! from a DEVICE mapping make naturally aligned accesses of at most 8 bytes, as upstream GDRCopy
//! does for its device mappings: the generic variant's routines. Copies below
//! `INLINE_BELOW` bytes already do that whatever the variant.
//!
//! The copy routines see addresses, not handles, so the DEVICE mappings' ranges are registered
//! here while they exist ([`register`], before the mapping is published to any copy). The first
//! one swaps the dispatch pointers for routines that look the address up first; a process that
//! never maps DEVICE memory never pays for the look-up. A range stays registered until its
//! mapping is gone, so a range that is still listed while a write-combining mapping reuses the
//! address only makes that mapping's copies small (slower, never wrong). Beyond `CAPACITY`
//! DEVICE mappings at once, every copy of the process is made small until they go.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use super::{generic_from_device, generic_to_device, selected, FROM_DEVICE, TO_DEVICE};

/// DEVICE mappings listed one by one; a copy scans at most this many entries.
const CAPACITY: usize = 64;

struct Range {
    base: AtomicUsize,
    /// 0: a free entry. Written last when an entry is filled, first when it is freed.
    len: AtomicUsize,
}

static RANGES: [Range; CAPACITY] = [const {
    Range {
        base: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
    }
}; CAPACITY];
/// Entries ever used: the scan stops there.
static USED: AtomicUsize = AtomicUsize::new(0);
/// DEVICE mappings that found no free entry: while any exists, every copy is small.
static UNLISTED: AtomicUsize = AtomicUsize::new(0);
/// Serialises registrations; copies never take it.
static WRITER: Mutex<()> = Mutex::new(());

/// A registered DEVICE mapping; dropping it ends the registration. Drop it only once no copy
/// can reach the mapping any more (it is unmapped, or its handle retired and quiesced).
#[derive(Debug)]
pub struct Registration(Option<usize>);

/// Lists `[base, base + len)` as a DEVICE mapping. Call before any copy can reach the range:
/// whatever publishes the mapping afterwards (the handle's release store, or handing the
/// `Mapping` to another thread) makes the registration visible to the copies.
pub fn register(base: usize, len: usize) -> Registration {
    let _writer = WRITER.lock().unwrap_or_else(PoisonError::into_inner);
    // The variant is chosen (and logged) here if no copy chose it yet: the routines installed
    // next use it for every other mapping.
    selected();
    install_checking_dispatch();
    let used = USED.load(Ordering::Relaxed);
    let free = (0..used)
        .find(|&i| RANGES[i].len.load(Ordering::Relaxed) == 0)
        .or((used < CAPACITY).then_some(used));
    match free {
        Some(i) if len != 0 => {
            RANGES[i].base.store(base, Ordering::Relaxed);
            RANGES[i].len.store(len, Ordering::Release);
            if i == used {
                USED.store(used + 1, Ordering::Release);
            }
            Registration(Some(i))
        }
        _ => {
            UNLISTED.fetch_add(1, Ordering::Release);
            Registration(None)
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _writer = WRITER.lock().unwrap_or_else(PoisonError::into_inner);
        match self.0 {
            Some(i) => RANGES[i].len.store(0, Ordering::Release),
            None => {
                UNLISTED.fetch_sub(1, Ordering::Release);
            }
        }
    }
}

/// Whether `addr` may lie in a DEVICE mapping. Exact for the mapping a copy is allowed to
/// touch (its entry was written before the mapping was published and stays until the mapping
/// is gone); an entry being rewritten meanwhile can only answer yes for another address.
fn is_uncached(addr: usize) -> bool {
    if UNLISTED.load(Ordering::Acquire) != 0 {
        return true;
    }
    let used = USED.load(Ordering::Acquire);
    RANGES[..used].iter().any(|r| {
        let len = r.len.load(Ordering::Acquire);
        len != 0 && addr.wrapping_sub(r.base.load(Ordering::Relaxed)) < len
    })
}

/// From the first DEVICE mapping on, copies of `INLINE_BELOW` bytes or more look up their
/// device address first. The resolvers install a routine only over themselves
/// (compare-exchange), so this store is never undone.
fn install_checking_dispatch() {
    TO_DEVICE.store(checking_to_device as *mut (), Ordering::Relaxed);
    FROM_DEVICE.store(checking_from_device as *mut (), Ordering::Relaxed);
}

unsafe fn checking_to_device(dst: *mut u8, src: *const u8, n: usize) {
    let f = if is_uncached(dst as usize) {
        generic_to_device
    } else {
        selected().to_device
    };
    // SAFETY: forwarded caller guarantee.
    unsafe { f(dst, src, n) }
}

unsafe fn checking_from_device(dst: *mut u8, src: *const u8, n: usize) {
    let f = if is_uncached(src as usize) {
        generic_from_device
    } else {
        selected().from_device
    };
    // SAFETY: forwarded caller guarantee.
    unsafe { f(dst, src, n) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The registry is process-wide: one test at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn registered_ranges_answer_until_dropped() {
        let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        let (a, b) = (0x10_0000_0000usize, 0x20_0000_0000usize);
        let first = register(a, 0x1000);
        let second = register(b, 0x2000);
        assert!(is_uncached(a) && is_uncached(a + 0xfff) && !is_uncached(a + 0x1000));
        assert!(is_uncached(b + 0x1fff) && !is_uncached(b - 1));
        drop(first);
        assert!(!is_uncached(a) && is_uncached(b));
        // A freed entry is reused.
        let used = USED.load(Ordering::Relaxed);
        let third = register(a + 0x4000, 0x1000);
        assert_eq!(USED.load(Ordering::Relaxed), used);
        assert!(is_uncached(a + 0x4000));
        drop((second, third));
        assert!(!is_uncached(b) && !is_uncached(a + 0x4000));
    }

    #[test]
    fn copies_to_a_registered_range_go_through_the_checking_dispatch_byte_exact() {
        let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        let mut device = vec![0u8; 4096 + 64];
        let src: Vec<u8> = (0..4000).map(|i| (i * 7 + 3) as u8).collect();
        let registration = register(device.as_ptr() as usize, device.len());
        let dst = device[3..].as_mut_ptr();
        // SAFETY: 4000 bytes from offset 3 lie inside `device`; `src` holds 4000.
        unsafe { super::super::to_device(dst, src.as_ptr(), src.len()) };
        let mut back = vec![0u8; src.len()];
        // SAFETY: as above, the other way.
        unsafe { super::super::from_device(back.as_mut_ptr(), dst, back.len()) };
        drop(registration);
        assert_eq!(
            TO_DEVICE.load(Ordering::Relaxed),
            checking_to_device as *mut ()
        );
        assert_eq!(&device[3..4003], &src[..]);
        assert_eq!(back, src);
        assert!(device[..3].iter().chain(&device[4003..]).all(|&b| b == 0));
    }

    #[test]
    fn beyond_capacity_every_address_is_uncached_until_they_go() {
        let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        let base = 0x30_0000_0000usize;
        let many: Vec<Registration> = (0..=CAPACITY)
            .map(|i| register(base + i * 0x1000, 0x1000))
            .collect();
        assert!(is_uncached(1));
        drop(many);
        assert!(!is_uncached(1));
    }
}
