//! Errors carry the errno and the call that failed, so a message can say both.

use std::fmt;

pub use nix::errno::Errno;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Error {
    call: &'static str,
    errno: Errno,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) const fn new(call: &'static str, errno: Errno) -> Self {
        Error { call, errno }
    }

    /// The errno; the C API returns it as a positive number.
    pub fn errno(&self) -> Errno {
        self.errno
    }

    /// The operation that failed, e.g. `"ioctl(PIN_BUFFER_V2)"`.
    pub fn call(&self) -> &'static str {
        self.call
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {} ({})",
            self.call,
            self.errno.desc(),
            self.errno
        )
    }
}

impl std::error::Error for Error {}
