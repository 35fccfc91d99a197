//! Pins: the ranges asked for, the outcome the model predicts, the handles, and the record of a
//! successful pin (checked with GET_INFO_V2).

use mtgdrdrv::*;

use super::ioctl::{Arg, Fields};
use super::{Expect, Finding, Pin, PinState, Step, Worker};
use crate::sys::{self, Errno};

const K64: u64 = 0x10000;
const MAX_PIN: u64 = 1 << 40;

impl Worker {
    /// A pin request: mostly inside an allocation, sometimes off its edges or absurd.
    pub(super) fn pin_range(&mut self) -> (u64, u64) {
        let Some(a) = self
            .rng
            .pick(&(0..self.allocs.len()).collect::<Vec<_>>())
            .copied()
        else {
            return (self.rng.edge_u64(), self.rng.edge_u64());
        };
        let (va, size) = (self.allocs[a].va, self.allocs[a].size);
        let gran = if self.allocs[a].page_size >= 65536 {
            K64
        } else {
            4096
        };
        match self.rng.weighted(&[30, 30, 25, 15]) {
            0 => (va, size),
            1 => {
                let units = size / gran;
                if units == 0 {
                    return (va, size);
                }
                let first = self.rng.below(units);
                let n = 1 + self.rng.below(units - first);
                (va + first * gran, n * gran)
            }
            2 => {
                let off = self.rng.below(size);
                (va + off, 1 + self.rng.below(size - off))
            }
            _ => match self.rng.below(8) {
                0 => (0, size),
                1 => (va, 0),
                2 => (va, size + 1),
                3 => (va.wrapping_sub(4096), 8192),
                4 => (va, u64::MAX),
                5 => (u64::MAX - 4095, 8192),
                6 => (va, MAX_PIN + 1),
                _ => (self.rng.edge_u64(), self.rng.edge_u64()),
            },
        }
    }

    /// Result of a pin of `[addr, addr+size)` on file `f`, were its argument readable and
    /// writable: Ok((alloc, rounded va, rounded size, granule)) or the errno.
    pub(super) fn pin_outcome(
        &self,
        file: usize,
        f: &Fields,
        v2: bool,
    ) -> Result<(usize, u64, u64, u32), Vec<Errno>> {
        if v2 && f.flags != 0 || !v2 && (f.token != 0 || f.va_space != 0) {
            return Err(vec![libc::EINVAL]);
        }
        let end = match f.addr.checked_add(f.size) {
            Some(end) if f.addr != 0 && f.size != 0 && f.size <= MAX_PIN => end,
            _ => return Err(vec![libc::EINVAL]),
        };
        // The last page must be roundable up.
        if end > !4095 {
            return Err(vec![libc::EINVAL]);
        }
        // The file's byte limit, checked before the provider is asked (issue 30, item 14).
        let span = end.div_ceil(4096) * 4096 - (f.addr & !4095);
        if self.file_pinned_bytes(file) + span > self.limits.max_bytes() {
            return Err(vec![libc::ENOSPC]);
        }
        // From here on the provider decides: an injected ENOMEM comes before its checks. The
        // module asks for 8 MiB chunks in turn, so a pin the provider refuses in a later chunk
        // may first get an earlier chunk's table with an injected bad version (EPROTO).
        let refused = if self.faults_possible {
            vec![libc::EINVAL, libc::ENOMEM, libc::EPROTO]
        } else {
            vec![libc::EINVAL]
        };
        let Some(a) = self.alloc_holding(f.addr, f.size) else {
            return Err(refused);
        };
        if self.allocs[a].managed {
            return Err(refused);
        }
        // Pins are rounded to the host page, whatever the allocation's page size.
        let end = f.addr + f.size;
        let (s, e) = (f.addr & !4095, end.div_ceil(4096) * 4096);
        Ok((a, s, e - s, 4096))
    }

    /// Errnos a pin that should succeed may show when faults may be pending.
    pub(super) fn fault_errs(&self) -> Vec<Errno> {
        if self.faults_possible {
            vec![libc::ENOMEM, libc::EINVAL, libc::EPROTO]
        } else {
            Vec::new()
        }
    }

    /// Records a successful pin and checks what GET_INFO says about it.
    pub(super) fn record_pin(
        &mut self,
        file: usize,
        fd: i32,
        f: &Fields,
        handle: u64,
        v2: bool,
    ) -> Step {
        let Ok((alloc, va, size, granule)) = self.pin_outcome(file, f, v2) else {
            finding!(
                "pin {:#x}+{:#x} succeeded, the model says it must fail",
                f.addr,
                f.size
            );
        };
        let fl = &self.files[file];
        if handle < fl.next_handle || (fl.next_exact && handle != fl.next_handle) {
            finding!(
                "pin got handle {handle:#x}, expected {}{:#x}",
                if fl.next_exact { "" } else { ">= " },
                fl.next_handle
            );
        }
        let mut info = GDRDRV_IOC_GET_INFO_V2_PARAMS {
            handle,
            ..Default::default()
        };
        let r = sys::ioctl(fd, GDRDRV_IOC_GET_INFO_V2, &mut info as *mut _ as usize);
        self.check("GET_INFO_V2 of a new pin", &Expect::ok(), r)?;
        if (info.va, info.mapped_size, info.page_size, info.mapping_type) != (va, size, granule, 0)
        {
            finding!(
                "GET_INFO_V2 of pin {:#x}+{:#x}: va {:#x} size {:#x} page {:#x} type {}, \
                 expected {va:#x} {size:#x} {granule:#x} 0",
                f.addr,
                f.size,
                info.va,
                info.mapped_size,
                info.page_size,
                info.mapping_type
            );
        }
        let fl = &mut self.files[file];
        fl.next_handle = handle + (size / self.page as u64).max(1);
        fl.next_exact = true;
        self.pins.push(Pin {
            file,
            handle,
            alloc,
            va,
            size,
            granule,
            mappable: f.addr == va,
            req: 0,
            map_type: 0,
            state: PinState::Live,
        });
        Ok(())
    }

    pub(super) fn op_pin(&mut self) -> Step {
        let Some((file, fd)) = self.pick_fd() else {
            return Ok(());
        };
        let (addr, size) = self.pin_range();
        let v2 = self.rng.chance(700);
        let mut f = Fields {
            addr,
            size,
            ..Default::default()
        };
        if self.rng.chance(40) {
            if v2 {
                f.flags = self.rng.next_u64() as u32 | 1;
            } else {
                f.token = self.rng.edge_u64() | 1;
                f.va_space = self.rng.next_u64() as u32;
            }
        }
        self.do_ioctl(
            file,
            fd,
            if v2 {
                GDRDRV_IOC_PIN_BUFFER_V2
            } else {
                GDRDRV_IOC_PIN_BUFFER
            },
            f,
            Arg::Good,
        )
    }

    pub(super) fn pick_handle(&mut self, file: usize) -> u64 {
        let own: Vec<u64> = self
            .pins
            .iter()
            .filter(|p| p.file == file)
            .map(|p| p.handle)
            .collect();
        let live: Vec<u64> = self
            .pins
            .iter()
            .filter(|p| p.file == file && p.state == PinState::Live)
            .map(|p| p.handle)
            .collect();
        match self.rng.weighted(&[70, 10, 10, 10]) {
            0 if !live.is_empty() => live[self.rng.index(live.len())],
            1 if !own.is_empty() => own[self.rng.index(own.len())],
            2 => self.rng.below(64) * 16,
            _ => self.rng.edge_u64(),
        }
    }

    pub(super) fn op_unpin(&mut self) -> Step {
        let Some((file, fd)) = self.pick_fd() else {
            return Ok(());
        };
        let handle = self.pick_handle(file);
        self.do_ioctl(
            file,
            fd,
            GDRDRV_IOC_UNPIN_BUFFER,
            Fields {
                handle,
                ..Default::default()
            },
            Arg::Good,
        )
    }
}
