//! The emulated provider's char device through the shared client (mtgpu-emu-abi): the fuzzer
//! allocates its "device memory" there, checks it through the emulator's own (DMA) path, and
//! injects faults. Its own malformed ioctls go through `sys::ioctl` on [`Emu::fd`].

pub use mtgpu_emu_abi::Emu;

/// Bytes of a plain-old-data ABI struct (all padding is explicit, so every byte is initialised).
pub fn bytes_of<T: Copy>(t: &T) -> Vec<u8> {
    // SAFETY: `T` is one of the `#[repr(C)]` ABI structs whose padding is spelled out as fields,
    // so all `size_of::<T>()` bytes are initialised.
    unsafe { std::slice::from_raw_parts((t as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
        .to_vec()
}

/// The client's errors as the fuzzer's raw errnos, which its expectations are written in.
pub trait Raw<T> {
    fn raw(self) -> Result<T, crate::sys::Errno>;
}

impl<T> Raw<T> for Result<T, mtgpu_emu_abi::Errno> {
    fn raw(self) -> Result<T, crate::sys::Errno> {
        self.map_err(|e| e as crate::sys::Errno)
    }
}
