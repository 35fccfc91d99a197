//! The emulated provider's char device (`/dev/mtgpu_emu`), with raw errnos: the fuzzer allocates
//! its "device memory" here, checks it through the emulator's own (DMA) path, and injects faults.

use mtgdrdrv::emu::*;

use crate::sys::{self, Errno};

pub const PATH: &str = "/dev/mtgpu_emu";

/// Bytes of a plain-old-data ABI struct (all padding is explicit, so every byte is initialised).
pub fn bytes_of<T: Copy>(t: &T) -> Vec<u8> {
    // SAFETY: `T` is one of the `#[repr(C)]` ABI structs whose padding is spelled out as fields,
    // so all `size_of::<T>()` bytes are initialised.
    unsafe { std::slice::from_raw_parts((t as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
        .to_vec()
}

/// An open `/dev/mtgpu_emu`; allocations belong to it and go when it is closed.
pub struct Emu {
    pub fd: i32,
}

impl Emu {
    pub fn open() -> Result<Emu, Errno> {
        sys::open(PATH, libc::O_RDWR | libc::O_CLOEXEC).map(|fd| Emu { fd })
    }

    fn call<T>(&self, cmd: u32, arg: &mut T) -> Result<(), Errno> {
        sys::ioctl(self.fd, cmd, arg as *mut T as usize)
    }

    pub fn alloc(&self, size: u64, align: u64, page_size: u32, flags: u32) -> Result<u64, Errno> {
        let mut a = mtgpu_emu_alloc {
            size,
            align,
            page_size,
            flags,
            gpu_va: 0,
        };
        self.call(MTGPU_EMU_IOC_ALLOC, &mut a)?;
        Ok(a.gpu_va)
    }

    pub fn free(&self, gpu_va: u64) -> Result<(), Errno> {
        self.call(MTGPU_EMU_IOC_FREE, &mut mtgpu_emu_free { gpu_va })
    }

    pub fn read(&self, gpu_va: u64, buf: &mut [u8]) -> Result<(), Errno> {
        let mut rw = mtgpu_emu_rw {
            gpu_va,
            size: buf.len() as u64,
            user_ptr: buf.as_mut_ptr() as u64,
            ..Default::default()
        };
        self.call(MTGPU_EMU_IOC_READ, &mut rw)
    }

    pub fn write(&self, gpu_va: u64, buf: &[u8]) -> Result<(), Errno> {
        let mut rw = mtgpu_emu_rw {
            gpu_va,
            size: buf.len() as u64,
            user_ptr: buf.as_ptr() as u64,
            ..Default::default()
        };
        self.call(MTGPU_EMU_IOC_WRITE, &mut rw)
    }

    pub fn inject(&self, kind: u32, count: u32) -> Result<(), Errno> {
        self.call(
            MTGPU_EMU_IOC_INJECT_FAULT,
            &mut mtgpu_emu_fault { kind, count },
        )
    }

    pub fn stats(&self) -> Result<mtgpu_emu_stats, Errno> {
        let mut s = mtgpu_emu_stats::default();
        self.call(MTGPU_EMU_IOC_GET_STATS, &mut s)?;
        Ok(s)
    }
}

impl Drop for Emu {
    fn drop(&mut self) {
        sys::close(self.fd);
    }
}
