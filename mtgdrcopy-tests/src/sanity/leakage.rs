//! Leaks across processes (extended).

use anyhow::{Context, Result};

use super::support::*;
use super::{note, Ctx};

/// Issue 313: when a forked child holds the last reference to the parent's device file, its
/// gdr_close releases the parent's pins there: pins_outstanding returns to its value before.
pub fn leakage_pin_pages_fork_mumemalloc(ctx: &Ctx) -> Result<()> {
    let gdr = Gdr::open()?;
    module_backend_or_skip(&gdr, "the module file's last reference")?;
    let before = PinSnapshot::take()?;
    let to_child = Channel::new()?;
    let child = Helper::spawn("child", || {
        to_child.recv()?;
        note!("child: closing its copy, the last reference to the file");
        // SAFETY: this forked child never uses its copy again.
        unsafe { gdr.close_inherited() }?;
        Ok(0)
    })?;
    let gpu = ctx.gpu()?;
    let buf = DevBuf::aligned(&*gpu, DATA_SIZE)?;
    let mh = gdr.pin(buf.ptr, buf.size)?;
    anyhow::ensure!(mh.h != 0, "null handle");
    let pinned = Counters::read()?;
    note!("parent pinned: {pinned:?}; closing its descriptor behind the library");
    let fd = device_fd()?;
    nix::unistd::close(fd).context("close")?;
    // The library's gdr_t now names a closed descriptor: never use or close it again.
    gdr.leak();
    to_child.send(1)?;
    child.wait()?.expect_success("the child")?;
    before.expect_same("after the child's gdr_close released the file")
}
