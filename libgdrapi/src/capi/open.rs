//! `gdr_t`: an open device, the handles it owns, and what a stale `gdr_t` gets (EINVAL).
//!
//! A `gdr_t` is the address of a [`gdr`] that is never freed: `gdr_close` closes the device and
//! empties it, and a later call with the same pointer (a double or stale close, or a call that
//! races the close) finds it closed and fails with `EINVAL` instead of using freed memory. The
//! cost is one small allocation per `gdr_open`, kept for the life of the process.
//!
//! Lock order (also taken in this order around fork, see `handles::fork`): the backends'
//! process-wide locks (never held with another), [`OPEN`], a `gdr`'s `device`, its `memhs`,
//! the backend's lock (the dma-buf pin table), then the handle table's (`GROWING`,
//! `ALLOCATOR`).

use std::any::Any;
use std::collections::HashMap;
use std::ffi::c_int;
use std::panic::catch_unwind;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use nix::errno::Errno;

use super::{einval, gdr_mh_t, guard};
use crate::error::Error;
use crate::gdr::{Gdr, PinnedBuffer, RawMapping};
use crate::{handles, log};

/// An open device and the handles it owns. `gdr_t` in C.
pub struct gdr {
    /// `None` once closed.
    device: Mutex<Option<Arc<Gdr>>>,
    memhs: Mutex<Memhs>,
}

pub type gdr_t = *mut gdr;

#[derive(Default)]
struct Memhs {
    by_handle: HashMap<u64, Memh>,
    /// Set by `gdr_close`: a pin that a racing call makes afterwards is undone, not kept.
    closed: bool,
}

pub(super) struct Memh {
    pin: PinnedBuffer,
    mapping: Option<RawMapping>,
    /// Its last mapping was kept rather than unmapped (see [`Quiesced::Leaked`]): the slot keeps
    /// that mapping's base and length, so the handle maps no more and its slot is never freed.
    kept: bool,
}

/// Every `gdr_t` this process made, open or closed: for the fork handler (which takes their
/// locks), and so that a closed one stays reachable rather than leaked.
static OPEN: Mutex<Vec<&'static gdr>> = Mutex::new(Vec::new());

fn open_list() -> MutexGuard<'static, Vec<&'static gdr>> {
    OPEN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes the C API's locks for a fork, in the documented order.
fn lock_for_fork() -> Vec<Box<dyn Any>> {
    let mut held: Vec<Box<dyn Any>> = crate::backend::lock_statics_for_fork();
    let list = open_list();
    let shells: Vec<&'static gdr> = list.clone();
    held.push(Box::new(list));
    for shell in shells {
        let device = shell.device.lock().unwrap_or_else(PoisonError::into_inner);
        let backend = device.as_ref().and_then(|d| d.lock_for_fork());
        held.push(Box::new(device));
        held.push(Box::new(shell.memhs()));
        held.extend(backend);
    }
    held
}

/// A `gdr_t` that is open, for the duration of one call.
pub(super) struct Open {
    shell: &'static gdr,
    pub(super) gdr: Arc<Gdr>,
}

impl Open {
    /// The `gdr_t` argument: EINVAL for NULL or a closed one.
    ///
    /// # Safety
    /// `g` is NULL or a value `gdr_open` returned.
    pub(super) unsafe fn get(g: gdr_t) -> Result<Open, Error> {
        // SAFETY: the caller's guarantee; a `gdr` is never freed (see the module's comment).
        let shell: &'static gdr = unsafe { g.as_ref() }.ok_or(einval("gdr_t"))?;
        let gdr = shell.device().clone().ok_or(einval("gdr_t"))?;
        Ok(Open { shell, gdr })
    }

    pub(super) fn with_memh<T>(
        &self,
        handle: gdr_mh_t,
        f: impl FnOnce(&mut Memh) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut memhs = self.shell.memhs();
        let memh = memhs
            .by_handle
            .get_mut(&handle.key())
            .ok_or(einval("gdr_mh_t"))?;
        f(memh)
    }

    /// Takes a new pin into the table; a pin made while `gdr_close` ran is undone (EINVAL).
    pub(super) fn add(&self, pin: PinnedBuffer) -> Result<gdr_mh_t, Error> {
        let mut memhs = self.shell.memhs();
        if memhs.closed {
            drop(memhs);
            if let Err(e) = pin.unpin() {
                log::warn(format_args!("unpin after a racing gdr_close: {e}"));
            }
            return Err(einval("gdr_t"));
        }
        let h = handles::allocate().ok_or(Error::new("gdr_pin_buffer", Errno::ENOMEM))?;
        memhs.by_handle.insert(
            h,
            Memh {
                pin,
                mapping: None,
                kept: false,
            },
        );
        Ok(gdr_mh_t { h: h as _ })
    }

    /// Removes a handle from the table (the first step of an unpin).
    pub(super) fn remove(&self, handle: gdr_mh_t) -> Option<Memh> {
        self.shell.memhs().by_handle.remove(&handle.key())
    }
}

impl gdr {
    fn memhs(&self) -> MutexGuard<'_, Memhs> {
        self.memhs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn device(&self) -> MutexGuard<'_, Option<Arc<Gdr>>> {
        self.device.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Memh {
    pub(super) fn pin(&self) -> &PinnedBuffer {
        &self.pin
    }

    pub(super) fn mapping(&self) -> Option<&RawMapping> {
        self.mapping.as_ref()
    }

    pub(super) fn kept(&self) -> bool {
        self.kept
    }

    pub(super) fn set_mapping(&mut self, mapping: RawMapping) {
        self.mapping = Some(mapping);
    }

    /// Unmaps after the caller retired the handle ([`handles::set_unmapped`] or
    /// [`handles::retire`]): waits for copies in flight, then munmaps. When no wait can be
    /// proven (see `handles::quiesce`) the mapping is kept: leaked, never freed under a copy.
    pub(super) fn unmap_retired(&mut self, key: u64) -> Result<Quiesced, Error> {
        let Some(mut mapping) = self.mapping.take() else {
            return Ok(Quiesced::Yes);
        };
        if handles::quiesce(&[key]).is_err() {
            // Kept whole: mapped, and still listed as uncached if it is (see `copy::uncached`).
            std::mem::forget(mapping);
            self.kept = true;
            return Ok(Quiesced::Leaked);
        }
        // SAFETY: the handle is retired and no copy through it is in flight.
        unsafe { mapping.unmap() }?;
        Ok(Quiesced::Yes)
    }

    pub(super) fn unpin(self, in_opener: bool) -> Result<(), Error> {
        if in_opener {
            self.pin.unpin()
        } else {
            // The parent still owns the pin; the child only lets go of its share.
            self.pin.forget_in_child();
            Ok(())
        }
    }
}

/// Whether a retired handle's slot may be reused.
#[derive(PartialEq, Eq)]
pub(super) enum Quiesced {
    Yes,
    /// The mapping was kept: so is the slot, whose base and length a copy may still read.
    Leaked,
}

/// Retires `key`, unmaps its mapping and unpins; frees its slot unless the mapping was kept.
pub(super) fn unpin_memh(mut memh: Memh, key: u64, in_opener: bool) -> Result<(), Error> {
    handles::retire(key);
    let unmapped = memh.unmap_retired(key);
    if matches!(unmapped, Ok(Quiesced::Yes)) && !memh.kept {
        handles::free(&[key]);
    }
    unmapped?;
    memh.unpin(in_opener)
}

/// `gdr_open`.
pub(super) fn open() -> gdr_t {
    handles::register_outer_locks(lock_for_fork);
    match catch_unwind(Gdr::open) {
        Ok(Ok(device)) => {
            let shell: &'static gdr = Box::leak(Box::new(gdr {
                device: Mutex::new(Some(Arc::new(device))),
                memhs: Mutex::new(Memhs::default()),
            }));
            open_list().push(shell);
            std::ptr::from_ref(shell).cast_mut()
        }
        Ok(Err(e)) => {
            Errno::set_raw(e.errno() as i32);
            std::ptr::null_mut()
        }
        Err(_) => {
            Errno::set_raw(Errno::EIO as i32);
            std::ptr::null_mut()
        }
    }
}

/// `gdr_close`.
///
/// # Safety
/// `g` is NULL or a value `gdr_open` returned.
pub(super) unsafe fn close(g: gdr_t) -> c_int {
    guard(|| {
        // SAFETY: the caller's guarantee; a `gdr` is never freed.
        let shell: &'static gdr = unsafe { g.as_ref() }.ok_or(einval("gdr_close"))?;
        let device = shell.device().take().ok_or(einval("gdr_close"))?;
        let drained: Vec<(u64, Memh)> = {
            let mut memhs = shell.memhs();
            memhs.closed = true;
            std::mem::take(&mut memhs.by_handle).into_iter().collect()
        };
        release_all(drained, device.in_opener())
    })
}

/// Unmaps (in the opening process only) and unpins everything; returns the first error.
fn release_all(drained: Vec<(u64, Memh)>, in_opener: bool) -> Result<(), Error> {
    let keys: Vec<u64> = drained.iter().map(|(h, _)| *h).collect();
    for &h in &keys {
        handles::retire(h);
    }
    let quiesced = handles::quiesce(&keys).is_ok();
    let mut first_error = None;
    let mut freeable = Vec::with_capacity(keys.len());
    for (key, mut memh) in drained {
        match memh.mapping.take() {
            // Kept whole, and so is the slot a copy may still read.
            Some(mapping) if !quiesced => std::mem::forget(mapping),
            Some(mut mapping) => {
                // SAFETY: the handle is retired and no copy through it is in flight.
                match unsafe { mapping.unmap() } {
                    Ok(()) => freeable.push(key),
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            None if !memh.kept => freeable.push(key),
            None => {}
        }
        if let Err(e) = memh.unpin(in_opener) {
            first_error.get_or_insert(e);
        }
    }
    handles::free(&freeable);
    first_error.map_or(Ok(()), Err)
}
