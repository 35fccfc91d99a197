//! Provider faults (emulator only): a `mtgpu_p2p_get_pages` that fails, or succeeds with a
//! page table the module cannot use, fails the pin with a clear errno and leaves nothing
//! pinned; the next pin works.

use anyhow::Result;
use nix::errno::Errno;

use super::support::*;
use super::{note, Ctx};
use mtgpu_emu_abi::{Emu, FaultKind};

/// Makes the next get_pages call show `kind`; clears the fault on drop, even on failure.
struct Fault<'e>(&'e Emu);

impl<'e> Fault<'e> {
    fn inject(emu: &'e Emu, kind: FaultKind) -> Result<Fault<'e>> {
        emu.inject_fault(kind, 1)
            .map_err(|e| anyhow::anyhow!("injecting {kind:?}: {e}"))?;
        Ok(Fault(emu))
    }
}

impl Drop for Fault<'_> {
    fn drop(&mut self) {
        let _ = self.0.inject_fault(FaultKind::MTGPU_EMU_FAULT_NONE, 0);
    }
}

fn fault_case(ctx: &Ctx, kind: FaultKind, want: Errno) -> Result<()> {
    let emu = emulator_or_skip("fault injection")?;
    let gpu = ctx.gpu()?;
    let buf = DevBuf::aligned(&*gpu, DATA_SIZE)?;
    let gdr = Gdr::open()?;
    module_backend_or_skip(&gdr, "a get_pages fault (the module's provider call)")?;
    let before = PinSnapshot::take()?;
    {
        let _fault = Fault::inject(&emu, kind)?;
        note!("injected {kind:?}");
        expect_errno(
            gdr.pin(buf.ptr, buf.size),
            want,
            &format!("gdr_pin_buffer with {kind:?}"),
        )?;
    }
    before.expect_same(&format!("after the pin failed with {kind:?}"))?;
    let mh = gdr.pin(buf.ptr, buf.size)?;
    let map = gdr.map(mh, buf.size)?;
    let data = walking_bit(buf.size);
    gdr.copy_to(mh, map, &data)?;
    compare("data after the fault", &data, &buf.read(0, buf.size)?)?;
    gdr.unmap(mh, map, buf.size)?;
    gdr.unpin(mh)?;
    before.expect_same("after the pin that followed the fault")?;
    Ok(gdr.close()?)
}

/// get_pages failing with -ENOMEM fails the pin with ENOMEM, pinning nothing.
pub fn fault_get_pages_enomem(ctx: &Ctx) -> Result<()> {
    fault_case(ctx, FaultKind::MTGPU_EMU_FAULT_ENOMEM, Errno::ENOMEM)
}

/// get_pages failing with -EINVAL fails the pin with EINVAL, pinning nothing.
pub fn fault_get_pages_einval(ctx: &Ctx) -> Result<()> {
    fault_case(ctx, FaultKind::MTGPU_EMU_FAULT_EINVAL, Errno::EINVAL)
}

/// A page table of an unknown major version (2.0) fails the pin with EPROTO; the table is put
/// back, nothing stays pinned.
pub fn fault_get_pages_bad_version(ctx: &Ctx) -> Result<()> {
    fault_case(ctx, FaultKind::MTGPU_EMU_FAULT_BAD_VERSION, Errno::EPROTO)
}

/// A page table whose page size is not a power of two fails the pin with EINVAL; the table is
/// put back, nothing stays pinned.
pub fn fault_get_pages_bad_page_size(ctx: &Ctx) -> Result<()> {
    fault_case(ctx, FaultKind::MTGPU_EMU_FAULT_BAD_PAGE_SIZE, Errno::EINVAL)
}
