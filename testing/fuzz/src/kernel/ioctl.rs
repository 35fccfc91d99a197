//! The nine ioctls as raw hostile calls: their fields, where their argument points (the scratch
//! pages, NULL, kernel and non-canonical addresses, our own live or zapped mappings), the
//! expected result and effects of each, and garbage commands.

use mtgdrdrv::*;

use super::{Expect, Finding, PinState, Step, Worker};
use crate::emu::bytes_of;
use crate::sys::{self, ename, Errno};

/// Where an ioctl's argument points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Arg {
    Good,
    ReadOnly,
    /// The struct runs into a PROT_NONE page after `k` bytes.
    Truncated(usize),
    Null,
    ProtNone,
    Kernel,
    NonCanonical,
    /// Inside one of our live, writable device mappings.
    DevLive(usize),
    /// Inside a mapping whose pin was unpinned (zapped): faults.
    DevZapped(usize),
}

/// Fields of a structured ioctl.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Fields {
    pub(super) addr: u64,
    pub(super) size: u64,
    pub(super) token: u64,
    pub(super) va_space: u32,
    pub(super) flags: u32,
    pub(super) handle: u64,
    pub(super) attr: u32,
    pub(super) mtype: u32,
}

/// The scratch pages ioctl arguments live in: [RW][RO][RW][NONE].
pub(super) struct Scratch {
    base: usize,
    page: usize,
}

impl Scratch {
    pub(super) fn new(page: usize) -> anyhow::Result<Scratch> {
        let base = sys::anon(4 * page, libc::PROT_READ | libc::PROT_WRITE)
            .map_err(|e| anyhow::anyhow!("scratch mmap: {}", ename(e)))?;
        let s = Scratch { base, page };
        sys::mprotect(base + page, page, libc::PROT_READ).map_err(|e| anyhow::anyhow!("{e}"))?;
        sys::mprotect(base + 3 * page, page, libc::PROT_NONE)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(s)
    }
    pub(super) fn good(&self) -> usize {
        self.base
    }
    fn ro(&self) -> usize {
        self.base + self.page
    }
    fn before_guard(&self) -> usize {
        self.base + 3 * self.page
    }
    pub(super) fn none(&self) -> usize {
        self.base + 3 * self.page
    }
    /// Writes `bytes` at `addr` (inside the scratch pages, made writable for the moment).
    fn put(&self, addr: usize, bytes: &[u8]) {
        let ro = self.ro();
        let in_ro = addr >= ro && addr < ro + self.page;
        if in_ro {
            let _ = sys::mprotect(ro, self.page, libc::PROT_READ | libc::PROT_WRITE);
        }
        // SAFETY: `addr .. addr + len` lies in the scratch pages, writable now.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
        if in_ro {
            let _ = sys::mprotect(ro, self.page, libc::PROT_READ);
        }
    }
    fn get(&self, addr: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        // SAFETY: `addr .. addr + len` lies in the readable scratch pages.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, v.as_mut_ptr(), len) };
        v
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = sys::munmap(self.base, 4 * self.page);
    }
}

impl Worker {
    fn pick_arg(&mut self) -> Arg {
        match self.rng.weighted(&[70, 8, 6, 3, 3, 2, 2, 4, 2]) {
            0 => Arg::Good,
            1 => Arg::ReadOnly,
            2 => Arg::Truncated(self.rng.range(1, 7) as usize),
            3 => Arg::Null,
            4 => Arg::ProtNone,
            5 => Arg::Kernel,
            6 => Arg::NonCanonical,
            7 => {
                let live: Vec<usize> = (0..self.vmas.len())
                    .filter(|&i| self.accessible(&self.vmas[i], true) && self.vmas[i].len >= 64)
                    .collect();
                match self.rng.pick(&live) {
                    Some(&i) => {
                        let v = &self.vmas[i];
                        let off = (self.rng.below((v.len - 64) as u64) as usize) & !7;
                        Arg::DevLive(v.start + off)
                    }
                    None => Arg::Good,
                }
            }
            _ => {
                let zapped = |i: usize| self.pins[self.vmas[i].pin].state == PinState::Zapped;
                match self.rng.pick_index(self.vmas.len(), zapped) {
                    Some(i) => Arg::DevZapped(self.vmas[i].start),
                    None => Arg::Null,
                }
            }
        }
    }

    pub(super) fn op_ioctl(&mut self) -> Step {
        let Some((file, fd)) = self.pick_fd() else {
            return Ok(());
        };
        let cmd = IOCTLS[self.rng.index(IOCTLS.len())].1;
        let mut f = Fields::default();
        match cmd {
            GDRDRV_IOC_PIN_BUFFER | GDRDRV_IOC_PIN_BUFFER_V2 => {
                (f.addr, f.size) = self.pin_range();
                if self.rng.chance(100) {
                    f.flags = self.rng.next_u64() as u32;
                    f.token = self.rng.edge_u64();
                    f.va_space = self.rng.next_u64() as u32;
                }
            }
            GDRDRV_IOC_GET_ATTR => {
                f.attr = if self.rng.chance(700) {
                    self.rng.range(1, 2) as u32
                } else {
                    self.rng.edge_u64() as u32
                };
            }
            GDRDRV_IOC_REQ_MAPPING_TYPE => {
                f.handle = self.pick_handle(file);
                f.mtype = if self.rng.chance(900) {
                    self.rng.below(4) as u32
                } else {
                    self.rng.edge_u64() as u32
                };
            }
            _ => f.handle = self.pick_handle(file),
        }
        let arg = self.pick_arg();
        self.do_ioctl(file, fd, cmd, f, arg)
    }

    /// The bytes of command `cmd`'s struct with fields `f`.
    fn encode(cmd: u32, f: &Fields) -> Vec<u8> {
        match cmd {
            GDRDRV_IOC_PIN_BUFFER => bytes_of(&GDRDRV_IOC_PIN_BUFFER_PARAMS {
                addr: f.addr,
                size: f.size,
                p2p_token: f.token,
                va_space: f.va_space,
                _pad: 0,
                handle: 0xdead_beef,
            }),
            GDRDRV_IOC_PIN_BUFFER_V2 => bytes_of(&GDRDRV_IOC_PIN_BUFFER_V2_PARAMS {
                addr: f.addr,
                size: f.size,
                flags: f.flags,
                pad: 0,
                handle: 0xdead_beef,
            }),
            GDRDRV_IOC_UNPIN_BUFFER => {
                bytes_of(&GDRDRV_IOC_UNPIN_BUFFER_PARAMS { handle: f.handle })
            }
            GDRDRV_IOC_GET_CB_FLAG => bytes_of(&GDRDRV_IOC_GET_CB_FLAG_PARAMS {
                handle: f.handle,
                flag: 7,
                _pad: 0,
            }),
            GDRDRV_IOC_GET_INFO => bytes_of(&GDRDRV_IOC_GET_INFO_PARAMS {
                handle: f.handle,
                ..Default::default()
            }),
            GDRDRV_IOC_GET_INFO_V2 => bytes_of(&GDRDRV_IOC_GET_INFO_V2_PARAMS {
                handle: f.handle,
                ..Default::default()
            }),
            GDRDRV_IOC_GET_ATTR => bytes_of(&GDRDRV_IOC_GET_ATTR_PARAMS {
                attr: f.attr,
                val: 77,
            }),
            GDRDRV_IOC_REQ_MAPPING_TYPE => bytes_of(&GDRDRV_IOC_REQ_MAPPING_TYPE_PARAMS {
                handle: f.handle,
                mapping_type: f.mtype,
                _pad: 0,
            }),
            _ => bytes_of(&GDRDRV_IOC_GET_VERSION_PARAMS::default()),
        }
    }

    /// Places the argument; returns its address and how to read the result back.
    fn place_arg(&mut self, arg: Arg, bytes: &[u8]) -> usize {
        match arg {
            Arg::Good => {
                let off = (self.rng.below(64) as usize) * 8;
                let addr = self.scratch.good() + off;
                self.scratch.put(addr, bytes);
                addr
            }
            Arg::ReadOnly => {
                let addr = self.scratch.ro() + (self.rng.below(64) as usize) * 8;
                self.scratch.put(addr, bytes);
                addr
            }
            Arg::Truncated(k) => {
                let k = k.min(bytes.len() - 1);
                let addr = self.scratch.before_guard() - k;
                self.scratch.put(addr, &bytes[..k]);
                addr
            }
            Arg::Null => 0,
            Arg::ProtNone => self.scratch.none() + 8,
            Arg::Kernel => 0xffff_ffff_8100_0000,
            Arg::NonCanonical => 0x0000_8000_0000_0000,
            Arg::DevLive(addr) => {
                // SAFETY: `addr .. +64` lies in a live, writable device mapping (pick_arg).
                unsafe { sys::store(addr, bytes) };
                self.sync_shadow(addr, bytes.len());
                addr
            }
            Arg::DevZapped(addr) => addr,
        }
    }

    /// After the kernel (or we) wrote `len` bytes at `addr` of a live device mapping, copies
    /// them into the shadow: writes there are legitimate.
    fn sync_shadow(&mut self, addr: usize, len: usize) {
        let Some(i) = self.vma_at(addr) else { return };
        let v = self.vmas[i].clone();
        let mut now = vec![0u8; len];
        // SAFETY: `addr .. addr + len` lies in a live, readable device mapping.
        unsafe { sys::load(&mut now, addr) };
        if let Some((a, idx)) = self.shadow_of(&v, addr - v.start) {
            self.allocs[a].shadow[idx..idx + len].copy_from_slice(&now);
        }
    }

    fn read_arg(&self, arg: Arg, addr: usize, len: usize) -> Vec<u8> {
        match arg {
            Arg::DevLive(_) => {
                let mut v = vec![0u8; len];
                // SAFETY: a live, readable device mapping (pick_arg).
                unsafe { sys::load(&mut v, addr) };
                v
            }
            _ => self.scratch.get(addr, len),
        }
    }

    /// Issues one of the nine ioctls and checks its result and effects against the model.
    pub(super) fn do_ioctl(&mut self, file: usize, fd: i32, cmd: u32, f: Fields, arg: Arg) -> Step {
        let bytes = Self::encode(cmd, &f);
        let name = IOCTLS.iter().find(|c| c.1 == cmd).map_or("?", |c| c.0);
        self.note(format!("ioctl fd {fd} {name} {f:?} arg {arg:?}"));
        // The logical outcome, were the argument memory fine.
        let mut pin_ok = None;
        let logical: Result<(), Vec<Errno>> = match cmd {
            GDRDRV_IOC_PIN_BUFFER | GDRDRV_IOC_PIN_BUFFER_V2 => {
                match self.pin_outcome(file, &f, cmd == GDRDRV_IOC_PIN_BUFFER_V2) {
                    Ok(o) => {
                        pin_ok = Some(o);
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            GDRDRV_IOC_UNPIN_BUFFER
            | GDRDRV_IOC_GET_CB_FLAG
            | GDRDRV_IOC_GET_INFO
            | GDRDRV_IOC_GET_INFO_V2 => match self.live_pin(file, f.handle) {
                Some(_) => Ok(()),
                None => Err(vec![libc::EINVAL]),
            },
            GDRDRV_IOC_GET_ATTR => {
                if f.attr == 1 || f.attr == 2 {
                    Ok(())
                } else {
                    Err(vec![libc::EINVAL])
                }
            }
            GDRDRV_IOC_REQ_MAPPING_TYPE => {
                if f.mtype > 3 {
                    Err(vec![libc::EINVAL])
                } else {
                    match self.live_pin(file, f.handle) {
                        None => Err(vec![libc::EINVAL]),
                        Some(p) if self.pin_vmas(p) > 0 => Err(vec![libc::EBUSY]),
                        Some(_) if f.mtype == 2 => Err(vec![libc::EOPNOTSUPP]),
                        Some(_) => Ok(()),
                    }
                }
            }
            _ => Ok(()),
        };
        let copies_out = !matches!(cmd, GDRDRV_IOC_UNPIN_BUFFER | GDRDRV_IOC_REQ_MAPPING_TYPE);
        let readable_arg = matches!(arg, Arg::Good | Arg::ReadOnly | Arg::DevLive(_));
        let writable_arg = matches!(arg, Arg::Good | Arg::DevLive(_));
        let mut exp = if cmd == GDRDRV_IOC_GET_VERSION {
            if writable_arg {
                Expect::ok()
            } else {
                Expect::err(libc::EFAULT)
            }
        } else if !readable_arg {
            Expect::err(libc::EFAULT)
        } else {
            match &logical {
                Err(errs) => Expect {
                    ok: false,
                    errs: errs.clone(),
                },
                Ok(()) if copies_out && !writable_arg => Expect::err(libc::EFAULT),
                Ok(()) => Expect::ok(),
            }
        };
        let is_pin = pin_ok.is_some() && readable_arg;
        if is_pin {
            exp.errs.extend(self.fault_errs());
            if let Some((a, ..)) = pin_ok {
                if self.may_pass_run_cap(a, f.addr, f.size) {
                    exp.errs.push(libc::ENOSPC);
                }
            }
        }
        let addr = self.place_arg(arg, &bytes);
        let r = sys::ioctl(fd, cmd, addr);
        // Commands that copy out wrote into the mapping: legitimate writes. (UNPIN may just have
        // zapped the very mapping its argument lives in: it only reads it.)
        if let (Arg::DevLive(a), true) = (arg, copies_out) {
            self.sync_shadow(a, bytes.len());
        }
        self.check(name, &exp, r)?;
        // A pin that was made and undone (copy-out failed) consumed handles.
        if is_pin && !writable_arg {
            self.files[file].next_exact = false;
        }
        if r.is_err() {
            return Ok(());
        }
        let out = if copies_out {
            self.read_arg(arg, addr, bytes.len())
        } else {
            bytes.clone()
        };
        let u64_at = |o: usize| u64::from_ne_bytes(out[o..o + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |o: usize| u32::from_ne_bytes(out[o..o + 4].try_into().unwrap_or([0; 4]));
        match cmd {
            GDRDRV_IOC_PIN_BUFFER | GDRDRV_IOC_PIN_BUFFER_V2 => {
                let handle = if cmd == GDRDRV_IOC_PIN_BUFFER {
                    u64_at(32)
                } else {
                    u64_at(24)
                };
                self.record_pin(file, fd, &f, handle, cmd == GDRDRV_IOC_PIN_BUFFER_V2)?;
            }
            GDRDRV_IOC_UNPIN_BUFFER => {
                if let Some(p) = self.live_pin(file, f.handle) {
                    self.pins[p].state = if self.pin_vmas(p) > 0 {
                        PinState::Zapped
                    } else {
                        PinState::Dead
                    };
                }
            }
            GDRDRV_IOC_GET_CB_FLAG => {
                if u32_at(8) != 0 {
                    finding!("GET_CB_FLAG returned flag {}", u32_at(8));
                }
            }
            GDRDRV_IOC_GET_INFO | GDRDRV_IOC_GET_INFO_V2 => {
                let Some(p) = self.live_pin(file, f.handle) else {
                    return Ok(());
                };
                let pin = &self.pins[p];
                let mapped = self.pin_vmas(p) > 0;
                let want_type = if mapped { pin.map_type } else { 0 };
                let got = (u64_at(8), u64_at(16), u32_at(24));
                if got != (pin.va, pin.size, pin.granule) {
                    finding!(
                        "{name}: (va, size, page) {got:x?}, expected ({:#x}, {:#x}, {:#x})",
                        pin.va,
                        pin.size,
                        pin.granule
                    );
                }
                if cmd == GDRDRV_IOC_GET_INFO {
                    let flags = (u32_at(40), u32_at(44));
                    let want = (u32::from(mapped), u32::from(want_type == 1));
                    if flags != want {
                        finding!("GET_INFO (mapped, wc) {flags:?}, expected {want:?}");
                    }
                } else if u32_at(40) != want_type {
                    finding!(
                        "GET_INFO_V2 mapping_type {}, expected {want_type}",
                        u32_at(40)
                    );
                }
            }
            GDRDRV_IOC_GET_ATTR => {
                let want = u32::from(f.attr == 1);
                if u32_at(4) != want {
                    finding!("GET_ATTR {} = {}, expected {want}", f.attr, u32_at(4));
                }
            }
            GDRDRV_IOC_REQ_MAPPING_TYPE => {
                if let Some(p) = self.live_pin(file, f.handle) {
                    self.pins[p].req = f.mtype;
                }
            }
            _ => {
                if (u32_at(0), u32_at(4)) != (MTGDRDRV_VERSION, MINIMUM_GDR_API_VERSION) {
                    finding!("GET_VERSION {:#x} {:#x}", u32_at(0), u32_at(4));
                }
            }
        }
        Ok(())
    }

    pub(super) fn op_ioctl_garbage(&mut self) -> Step {
        let Some((_, fd)) = self.pick_fd() else {
            return Ok(());
        };
        let known: Vec<u32> = IOCTLS.iter().map(|c| c.1).collect();
        let (cmd, exp) = match self.rng.below(4) {
            0 => {
                // Our magic, a number no command has.
                let nr = [0u32, 9, 10, 100, 254][self.rng.index(5)];
                let dir = self.rng.below(4) as u32;
                let size = self.rng.below(1 << 14) as u32;
                (
                    dir << 30 | size << 16 | GDRDRV_IOCTL << 8 | nr,
                    Expect::err(libc::ENOTTY),
                )
            }
            1 => {
                // A known number with another size or direction (truncated or oversized).
                let c = known[self.rng.index(known.len())];
                let size = [0u32, 1, 4, 7, 8, 16, 39, 41, 48, 4096, 16383][self.rng.index(11)];
                let dir = self.rng.below(4) as u32;
                let cmd = dir << 30 | size << 16 | (c & 0xffff);
                let exp = if known.contains(&cmd) {
                    return Ok(());
                } else {
                    Expect::err(libc::ENOTTY)
                };
                (cmd, exp)
            }
            2 => {
                // Another magic: refused before anything else. Magics the VFS or the block
                // layer handle themselves (FIO*, FS_IOC_*, FIFREEZE, FICLONE, FIBMAP) are left out.
                let magic = loop {
                    let m = self.rng.below(256) as u32;
                    if ![0x00, 0x12, 0x15, 0x54, 0x58, 0x66, 0x94, GDRDRV_IOCTL].contains(&m) {
                        break m;
                    }
                };
                let cmd = (self.rng.next_u64() as u32 & 0xffff_00ff) | magic << 8;
                (cmd, Expect::err(libc::EINVAL))
            }
            _ => {
                // A known command with a random argument address.
                let c = known[self.rng.index(known.len())];
                (
                    c,
                    Expect::err(libc::EFAULT)
                        .also(libc::EINVAL)
                        .also(libc::ENOTTY),
                )
            }
        };
        let arg = match self.rng.below(4) {
            0 => self.scratch.good(),
            1 => 0,
            2 => self.scratch.none(),
            _ => self.rng.edge_u64() as usize | 0xffff_0000_0000_0000,
        };
        self.note(format!(
            "garbage ioctl fd {fd} cmd {cmd:#010x} arg {arg:#x}"
        ));
        if arg == self.scratch.good() {
            let mut junk = vec![0u8; 48];
            self.rng.fill(&mut junk);
            // Garbage that cannot be a live handle of ours: handles are small.
            junk[7] |= 0x80;
            junk[15] |= 0x80;
            self.scratch.put(arg, &junk);
        }
        let r = sys::ioctl(fd, cmd, arg);
        let exp = if exp.errs.contains(&libc::EFAULT) && r.is_ok() {
            // GET_VERSION / GET_ATTR with a valid attr may legitimately succeed on good memory.
            Expect::ok().also(libc::EFAULT)
        } else {
            exp
        };
        self.check("garbage ioctl", &exp, r)
    }
}

pub(super) fn unpin_raw(fd: i32, handle: u64) -> Result<(), Errno> {
    let mut u = GDRDRV_IOC_UNPIN_BUFFER_PARAMS { handle };
    sys::ioctl(fd, GDRDRV_IOC_UNPIN_BUFFER, &mut u as *mut _ as usize)
}
