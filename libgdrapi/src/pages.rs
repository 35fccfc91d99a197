//! Page arithmetic in one place: the GPU page, the host page size, and lengths rounded up to a
//! page.

use nix::errno::Errno;

use crate::error::{Error, Result};

/// The GPU page: pins are rounded to it, like upstream's, so `info.va` keeps its meaning.
pub const GPU_PAGE_SHIFT: u32 = 16;
pub const GPU_PAGE_SIZE: u64 = 1 << GPU_PAGE_SHIFT;

/// The host page size, from sysconf.
pub(crate) fn host_page_size() -> Result<usize> {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|v| usize::try_from(v).ok())
        .filter(|v| v.is_power_of_two())
        .ok_or(Error::new("sysconf(PAGE_SIZE)", Errno::EINVAL))
}

/// Rounds `size` up to `page` (a power of two); `None` on overflow or for 0.
pub(crate) fn round_up(size: usize, page: usize) -> Option<usize> {
    size.checked_add(page - 1)
        .map(|s| s & !(page - 1))
        .filter(|&s| s > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_round_up_to_the_page() {
        assert_eq!(round_up(1, 4096), Some(4096));
        assert_eq!(round_up(4096, 4096), Some(4096));
        assert_eq!(round_up(4097, 4096), Some(8192));
        assert_eq!(round_up(0, 4096), None);
        assert_eq!(round_up(usize::MAX, 4096), None);
    }

    #[test]
    fn the_host_page_is_a_power_of_two() {
        assert!(host_page_size().unwrap().is_power_of_two());
    }
}
