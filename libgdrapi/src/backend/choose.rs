//! The choice at `gdr_open`: the module when `/dev/mtgdrdrv` can be opened; the dma-buf backend
//! when it cannot (not loaded, not passed into the container, no permission) or when
//! `GDRCOPY_USE_DMABUF_MMAP=1` forces it. A module that opens but fails the version handshake
//! is an error, not a reason to fall back: the installation is broken and should say so.

use super::dmabuf::DmaBuf;
use super::module::{self, Driver};
use super::{Backend, USE_DMABUF_ENV};
use crate::error::{Error, Result};
use crate::{handles, log};

/// Which backend `gdr_open` takes, from `GDRCOPY_USE_DMABUF_MMAP`'s value.
fn forced(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| v == "1")
}

/// Opens the backend as described at the top of this file.
pub(crate) fn open() -> Result<Box<dyn Backend>> {
    // Before any mapping exists: the fork handler and the unmap/copy barrier.
    handles::init();
    let module_error = if forced(std::env::var_os(USE_DMABUF_ENV).as_deref()) {
        log::info(format_args!(
            "{USE_DMABUF_ENV}=1: using the dma-buf backend"
        ));
        None
    } else {
        match Driver::open_node() {
            Ok(fd) => return Ok(Box::new(Driver::with_node(fd)?)),
            Err(errno) => Some(errno),
        }
    };
    match DmaBuf::open() {
        Ok(backend) => {
            if let Some(errno) = module_error {
                log::info(format_args!(
                    "{} cannot be opened ({}): using the dma-buf backend",
                    module::DEVICE_PATH,
                    errno.desc()
                ));
            }
            Ok(Box::new(backend))
        }
        Err(unavailable) => {
            // One line, whichever way it failed.
            let Some(errno) = module_error else {
                log::error(format_args!(
                    "{USE_DMABUF_ENV}=1, but the dma-buf backend is not available: {}",
                    unavailable.why
                ));
                return Err(Error::new("dma-buf backend", unavailable.errno));
            };
            log::error(format_args!(
                "{}; the dma-buf backend (no module needed) is not available either: {}",
                module::open_failure_text(errno),
                unavailable.why
            ));
            Err(Error::new("open(/dev/mtgdrdrv)", errno))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_value_1_forces_dma_buf() {
        assert!(forced(Some("1".as_ref())));
        for v in ["", "0", "true", "yes", " 1", "11"] {
            assert!(!forced(Some(v.as_ref())), "{v:?}");
        }
        assert!(!forced(None));
    }
}
