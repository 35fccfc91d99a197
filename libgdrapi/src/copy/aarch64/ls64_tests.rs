//! The `ls64` variant without an LS64 CPU. qemu-user (11.1 `-cpu max` included) does not
//! implement FEAT_LS64: `ld64b`/`st64b` raise SIGILL and `AT_HWCAP3` reads 0. So these tests
//! run the variant's real code and carry out each `ld64b`/`st64b` in a SIGILL handler, as the
//! architecture defines them (eight registers from an even Xt, 64 bytes at Xn, which must be
//! 64-byte aligned), and log every one. The copy matrices of ../tests.rs then run the variant at
//! every size and misalignment like the others; the tests here check that the 64-byte accesses
//! are exactly the mapping's 64-byte-aligned blocks, and that the variant is chosen exactly when
//! `AT_HWCAP3` advertises LS64.
//!
//! Not executed here: the instructions themselves on a CPU that has them (their atomicity and
//! how a write-combining PCIe mapping carries them). On such a CPU nothing is emulated and the
//! matrices leave the variant out: LS64 on ordinary write-back memory may fault.

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use super::super::select::{choose, default_variant};
use super::super::tests::{check, Arena};
use super::super::Variant;
use super::{fake_hwcap3, HWCAP3_LS64, VARIANTS};

/// Opcodes with the Rn (bits 9:5) and Rt (bits 4:0) fields clear (Arm ARM, LD64B and ST64B).
const LD64B: u32 = 0xf83f_d000;
const ST64B: u32 = 0xf83f_9000;
const REGISTER_FIELDS: u32 = 0x3ff;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Ld64b,
    St64b,
}

thread_local! {
    /// The accesses of this thread's copies while `recorded` runs.
    static LOG: RefCell<Option<Vec<(Kind, usize)>>> = const { RefCell::new(None) };
}

/// Whether this process emulates LD64B/ST64B (installing the handler on first call): true
/// where the CPU lacks LS64, as under qemu-user.
pub(in crate::copy) fn emulated() -> bool {
    static EMULATED: OnceLock<bool> = OnceLock::new();
    *EMULATED.get_or_init(|| {
        // SAFETY: getauxval has no preconditions.
        let native = unsafe { libc::getauxval(libc::AT_HWCAP3) } & HWCAP3_LS64 != 0;
        if !native {
            install();
        }
        !native
    })
}

fn install() {
    // SAFETY: a zeroed sigaction is a valid start; the handler has the three-argument signature
    // SA_SIGINFO asks for, and replaces only SIGILL's default (which kills the process).
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigill as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGILL, &action, std::ptr::null_mut()),
            0
        );
    }
}

/// Ends the test process as the hardware would have faulted it, with the reason on stderr.
fn die(why: &[u8]) -> ! {
    // SAFETY: write(2) and abort(3) are async-signal-safe; `why` is a valid buffer.
    unsafe {
        libc::write(2, why.as_ptr().cast(), why.len());
        libc::abort()
    }
}

// The signal is synchronous: it comes from an `ld64b`/`st64b` inside a copy routine, which
// holds no lock, so the handler may use the thread's log (whose capacity `recorded` reserved).
extern "C" fn on_sigill(_: c_int, _: *mut libc::siginfo_t, context: *mut c_void) {
    // SAFETY: for an SA_SIGINFO handler the third argument is the interrupted context.
    let mc = unsafe { &mut (*context.cast::<libc::ucontext_t>()).uc_mcontext };
    // SAFETY: pc is the address of the instruction that raised SIGILL, in this program's text.
    let insn = unsafe { (mc.pc as *const u32).read() };
    let kind = match insn & !REGISTER_FIELDS {
        LD64B => Kind::Ld64b,
        ST64B => Kind::St64b,
        _ => die(b"SIGILL from an instruction other than LD64B/ST64B\n"),
    };
    let (rt, rn) = ((insn & 31) as usize, ((insn >> 5) & 31) as usize);
    let addr = if rn == 31 { mc.sp } else { mc.regs[rn] } as usize;
    if rt % 2 != 0 || rt > 22 {
        die(b"LD64B/ST64B with an odd Xt or one above x22: CONSTRAINED UNPREDICTABLE\n");
    }
    if addr % 64 != 0 {
        die(b"LD64B/ST64B at an address that is not 64-byte aligned: an alignment fault\n");
    }
    let memory = addr as *mut u64;
    for i in 0..8 {
        // SAFETY: the copy routine's caller made these 64 bytes valid (the test's arenas).
        unsafe {
            match kind {
                Kind::St64b => memory.add(i).write_volatile(mc.regs[rt + i]),
                Kind::Ld64b => mc.regs[rt + i] = memory.add(i).read_volatile(),
            }
        }
    }
    LOG.with(|log| {
        if let Some(log) = log.borrow_mut().as_mut() {
            log.push((kind, addr));
        }
    });
    mc.pc += 4;
}

/// The LD64B/ST64B accesses `copy` makes on this thread.
fn recorded(copy: impl FnOnce()) -> Vec<(Kind, usize)> {
    LOG.with(|log| *log.borrow_mut() = Some(Vec::with_capacity(4096)));
    copy();
    LOG.with(|log| log.borrow_mut().take()).unwrap_or_default()
}

fn ls64() -> &'static Variant {
    &VARIANTS[0]
}

/// Resets the thread's `AT_HWCAP3` to the real one when a test ends, passed or not.
struct FakeHwcap3;

impl FakeHwcap3 {
    fn set(value: u64) -> FakeHwcap3 {
        fake_hwcap3::set(Some(value));
        FakeHwcap3
    }
}

impl Drop for FakeHwcap3 {
    fn drop(&mut self) {
        fake_hwcap3::set(None);
    }
}

#[test]
fn ls64_is_chosen_exactly_when_hwcap3_advertises_it() {
    assert_eq!(ls64().name, "ls64");
    // The bits around LS64's (MTE_FAR, MTE_STORE_ONLY and LSFE below it, SVE_B16MM above).
    let values = [0, 0b111, 1 << 4, !HWCAP3_LS64, HWCAP3_LS64, u64::MAX];
    for hwcap3 in values {
        let _fake = FakeHwcap3::set(hwcap3);
        let advertised = hwcap3 & HWCAP3_LS64 != 0;
        let expected = if advertised { "ls64" } else { "neon" };
        assert_eq!(default_variant().name, expected, "AT_HWCAP3 {hwcap3:#x}");
        assert_eq!(ls64().is_supported(), advertised, "AT_HWCAP3 {hwcap3:#x}");
        let (unset, warning) = choose(None);
        assert_eq!((unset.name, warning), (expected, None));
        let (forced, warning) = choose(Some("ls64".as_ref()));
        assert_eq!(
            forced.name, expected,
            "GDRCOPY_COPY_VARIANT=ls64, {hwcap3:#x}"
        );
        assert_eq!(
            warning.is_some_and(|w| w.contains("lacks the features")),
            !advertised,
            "a forced ls64 the CPU lacks is refused with a warning ({hwcap3:#x})"
        );
        let (neon, warning) = choose(Some("neon".as_ref()));
        assert_eq!((neon.name, warning), ("neon", None));
    }
    // And the real auxiliary vector, as in every other test.
    // SAFETY: getauxval has no preconditions.
    let real = unsafe { libc::getauxval(libc::AT_HWCAP3) } & HWCAP3_LS64 != 0;
    assert_eq!(default_variant().name == "ls64", real);
}

/// Every LD64B/ST64B of a copy: the right one for the direction, at each 64-byte-aligned
/// 64-byte block inside the mapping's range, in order, once; and the copy byte-exact.
#[test]
fn ld64b_and_st64b_copy_exactly_the_aligned_blocks() {
    if !emulated() {
        eprintln!("skipped: this CPU has LS64, which ordinary memory may not support");
        return;
    }
    let sizes: Vec<usize> = (0..=320).chain([4096, 4096 + 17, 65536 + 5]).collect();
    let max = 65536 + 5;
    let mut host = Arena::new(max + 64);
    let mut device = Arena::new(max + 64);
    for to_device in [true, false] {
        for &n in &sizes {
            for dev_mis in 0..64 {
                let host_mis = (n + 5 * dev_mis) % 64;
                let base = device.ptr_at(dev_mis) as usize;
                let log = recorded(|| {
                    let (src, dst) = if to_device {
                        (&mut host, &mut device)
                    } else {
                        (&mut device, &mut host)
                    };
                    let (src_mis, dst_mis) = if to_device {
                        (host_mis, dev_mis)
                    } else {
                        (dev_mis, host_mis)
                    };
                    check(ls64(), to_device, n, src_mis, dst_mis, src, dst);
                });
                let kind = if to_device { Kind::St64b } else { Kind::Ld64b };
                let expected: Vec<(Kind, usize)> = (base.next_multiple_of(64)..)
                    .step_by(64)
                    .take_while(|&a| a + 64 <= base + n)
                    .map(|a| (kind, a))
                    .collect();
                assert_eq!(
                    log,
                    expected,
                    "{} n={n} device+{dev_mis} host+{host_mis}",
                    if to_device { "to" } else { "from" }
                );
            }
        }
    }
}
