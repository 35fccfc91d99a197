//! Who can reach a mapping, and for how long: upstream's `invalidation_*` cases, adapted to
//! persistent pins (freeing memory never invalidates a mapping) and to a driver that serves
//! only the process that opened it (a forked child or a process given the descriptor gets
//! EACCES and inherits no mapping).

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr;

use anyhow::{bail, ensure, Context, Result};
use nix::errno::Errno;
use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};

use super::support::*;
use super::{note, Ctx};
use crate::gdr::gdr_mh_t;
use crate::gpu::Gpu;

/// Exit statuses of a helper that read a mapping instead of faulting.
const READ_WRITTEN_VALUE: i32 = 10;
const READ_OTHER_VALUE: i32 = 11;

/// A SMALL_SIZE buffer filled with 0x95, pinned and mapped through a gdr of its own, with
/// `token_value(salt)` written at offset 0 of the mapping: how most cases here begin.
struct Written<'g> {
    buf: DevBuf<'g>,
    gdr: Gdr,
    mh: gdr_mh_t,
    map: *mut u8,
    value: u32,
}

fn written_small_mapping(gpu: &dyn Gpu, salt: u32) -> Result<Written<'_>> {
    let buf = DevBuf::aligned(gpu, SMALL_SIZE)?;
    buf.fill(0x95)?;
    let gdr = Gdr::open()?;
    let (mh, map) = pin_and_map(&gdr, buf.ptr, buf.size)?;
    let value = token_value(salt);
    // SAFETY: offset 0 of a live mapping.
    unsafe { store_u32(map, value) };
    Ok(Written {
        buf,
        gdr,
        mh,
        map,
        value,
    })
}

/// Judges a helper that wrote a value through a mapping, lost the mapping and read it again:
/// a fault is right, other data is tolerated (upstream's rule), the value written is a leak.
fn expect_no_access(end: End, after: &str) -> Result<()> {
    match end {
        e if e.is_fault() => {
            note!("the access after {after} {e}, as expected");
            Ok(())
        }
        End::Exited(READ_OTHER_VALUE) => {
            note!("the access after {after} read other data");
            Ok(())
        }
        End::Exited(READ_WRITTEN_VALUE) => {
            bail!("the mapping still returned the value written, after {after}")
        }
        e => bail!("the process accessing the mapping after {after} {e}"),
    }
}

/// Sets up a small mapped buffer in a helper, writes a value, loses the mapping with `lose`,
/// then reads the mapping again.
fn access_after(
    ctx: &Ctx,
    after: &str,
    lose: impl FnOnce(Gdr, gdr_mh_t) -> Result<()>,
) -> Result<()> {
    let end = in_helper("accessing process", || {
        no_core_dump();
        let gpu = ctx.gpu()?;
        let Written {
            buf: _buf,
            gdr,
            mh,
            map,
            value: v,
        } = written_small_mapping(&*gpu, 1)?;
        lose(gdr, mh)?;
        note!("reading the mapping after {after}");
        // SAFETY: deliberately reads an address whose mapping is gone: the expected outcome
        // is SIGSEGV or SIGBUS, which ends this helper process.
        let got = unsafe { load_u32(map) };
        Ok(if got == v {
            READ_WRITTEN_VALUE
        } else {
            READ_OTHER_VALUE
        })
    })?;
    expect_no_access(end, after)
}

/// After gdr_close without gdr_unmap the mapping is gone: reading it faults (SIGSEGV/SIGBUS),
/// or at least does not return the value written.
pub fn invalidation_access_after_gdr_close_mumemalloc(ctx: &Ctx) -> Result<()> {
    access_after(ctx, "gdr_close", |gdr, _| Ok(gdr.close()?))
}

/// After gdr_unpin_buffer of a mapped handle (which unmaps it first) reading the mapping
/// faults, or at least does not return the value written.
pub fn invalidation_access_after_unpin_mumemalloc(ctx: &Ctx) -> Result<()> {
    access_after(ctx, "gdr_unpin_buffer", |gdr, mh| {
        gdr.unpin(mh)?;
        // The gdr_t stays open: only the unpin may have taken the mapping away.
        gdr.leak();
        Ok(())
    })
}

/// Persistent pins: freeing the memory while it is pinned and mapped leaves the mapping
/// valid; the value written stays readable until unpin.
pub fn invalidation_access_after_free_mumemalloc(ctx: &Ctx) -> Result<()> {
    let gpu = ctx.gpu()?;
    let Written {
        mut buf,
        gdr,
        mh,
        map,
        value: v,
    } = written_small_mapping(&*gpu, 3)?;
    buf.free()?;
    // SAFETY: the pin keeps the memory and the mapping alive after the free.
    let got = unsafe { load_u32(map) };
    ensure!(got == v, "read {got:#x} after the free, wrote {v:#x}");
    unmap_unpin_close(gdr, mh, map, SMALL_SIZE)
}

/// Free while pinned: gdr_get_callback_flag stays 0, the whole buffer stays readable and
/// writable through the mapping, and unpin then releases everything.
pub fn invalidation_callback_flag_after_free_mumemalloc(ctx: &Ctx) -> Result<()> {
    let gpu = ctx.gpu()?;
    let mut buf = DevBuf::aligned(&*gpu, DATA_SIZE)?;
    let size = buf.size;
    let gdr = Gdr::open()?;
    let before = PinSnapshot::take()?;
    let (mh, map) = pin_and_map(&gdr, buf.ptr, size)?;
    let data = walking_bit(size);
    gdr.copy_to(mh, map, &data)?;
    let flag = gdr.callback_flag(mh)?;
    ensure!(flag == 0, "callback flag {flag} before the free");
    buf.free()?;
    let flag = gdr.callback_flag(mh)?;
    ensure!(
        flag == 0,
        "callback flag {flag} after the free: mtgpu pins are never invalidated"
    );
    let info = gdr.info(mh)?;
    ensure!(
        info.flags & INFO_MAPPED != 0 && info.va == buf.ptr,
        "info after the free: {info:?}"
    );
    let mut back = vec![0u8; size];
    gdr.copy_from(mh, &mut back, map)?;
    compare("data read after the free", &data, &back)?;
    let inverse: Vec<u8> = data.iter().map(|x| !x).collect();
    gdr.copy_to(mh, map, &inverse)?;
    gdr.copy_from(mh, &mut back, map)?;
    compare("data written after the free", &inverse, &back)?;
    gdr.unmap(mh, map, size)?;
    gdr.unpin(mh)?;
    before.expect_same("after unpinning the freed buffer")?;
    Ok(gdr.close()?)
}

/// Freeing buffer A while both A and B are pinned and mapped leaves B's mapping intact (and,
/// pins being persistent, A's too).
pub fn invalidation_two_mappings_mumemalloc(ctx: &Ctx) -> Result<()> {
    let gpu = ctx.gpu()?;
    let mut bufs = [
        DevBuf::aligned(&*gpu, SMALL_SIZE)?,
        DevBuf::aligned(&*gpu, SMALL_SIZE)?,
    ];
    let gdr = Gdr::open()?;
    let v = token_value(4);
    let mut maps = Vec::new();
    for (i, b) in bufs.iter().enumerate() {
        b.fill(0x95)?;
        let (mh, map) = pin_and_map(&gdr, b.ptr, b.size)?;
        // SAFETY: offset 0 of a live mapping.
        unsafe { store_u32(map, v + i as u32) };
        maps.push((mh, map));
    }
    for (i, &(_, map)) in maps.iter().enumerate() {
        // SAFETY: offset 0 of a live mapping.
        let got = unsafe { load_u32(map) };
        ensure!(got == v + i as u32, "buffer {i}: read {got:#x}");
    }
    bufs[0].free()?;
    // SAFETY: B is untouched by A's free; A's pin keeps its memory.
    let (a, b) = unsafe { (load_u32(maps[0].1), load_u32(maps[1].1)) };
    ensure!(
        b == v + 1,
        "B reads {b:#x} after A was freed, wrote {:#x}",
        v + 1
    );
    ensure!(
        a == v,
        "A reads {a:#x} after its free, wrote {v:#x} (pins are persistent)"
    );
    bufs[1].free()?;
    for (mh, map) in maps {
        gdr.unmap(mh, map, SMALL_SIZE)?;
        gdr.unpin(mh)?;
    }
    Ok(gdr.close()?)
}

/// Parent and child each map their own buffer; the parent frees its buffer while mapped; what
/// the child then writes to its buffer never shows in the parent's mapping, which (pins being
/// persistent) still holds the parent's value.
pub fn invalidation_fork_access_after_free_mumemalloc(ctx: &Ctx) -> Result<()> {
    let to_child = Channel::new()?;
    let to_parent = Channel::new()?;
    let child = Helper::spawn("child", || {
        to_child.recv()?;
        let gpu = ctx.gpu()?;
        let Written {
            buf: _buf,
            gdr,
            mh,
            map,
            value: v,
        } = written_small_mapping(&*gpu, 5)?;
        note!("child: wrote {v:#x}");
        to_parent.send(u64::from(v))?;
        to_child.recv()?;
        unmap_unpin_close(gdr, mh, map, SMALL_SIZE)?;
        Ok(0)
    })?;

    let gpu = ctx.gpu()?;
    let Written {
        mut buf,
        gdr,
        mh,
        map,
        value: v,
    } = written_small_mapping(&*gpu, 6)?;
    note!("parent: wrote {v:#x}, freeing the buffer");
    buf.free()?;
    to_child.send(1)?;
    let child_value = to_parent.recv()? as u32;
    // SAFETY: the pin keeps the parent's memory and mapping alive.
    let got = unsafe { load_u32(map) };
    to_child.send(1)?;
    child.wait()?.expect_success("the child")?;
    ensure!(
        got != child_value,
        "the parent's mapping shows the child's data {got:#x}"
    );
    ensure!(
        got == v,
        "the parent's mapping reads {got:#x} after the free, wrote {v:#x}"
    );
    unmap_unpin_close(gdr, mh, map, SMALL_SIZE)
}

/// A child forked after gdr_map inherits no mapping: touching the address kills it with
/// SIGSEGV/SIGBUS and never returns the parent's data; the parent keeps its access.
pub fn invalidation_fork_after_gdr_map_mumemalloc(ctx: &Ctx) -> Result<()> {
    let gpu = ctx.gpu()?;
    let Written {
        buf: _buf,
        gdr,
        mh,
        map,
        value: v,
    } = written_small_mapping(&*gpu, 7)?;
    let end = in_helper("child", || {
        no_core_dump();
        // SAFETY: deliberately touches the parent's mapping, which the child must not have:
        // the expected outcome is SIGSEGV or SIGBUS, which ends this helper process.
        let got = unsafe { load_u32(map) };
        Ok(if got == v {
            READ_WRITTEN_VALUE
        } else {
            READ_OTHER_VALUE
        })
    })?;
    ensure!(
        end.is_fault(),
        "the child touching the parent's mapping {}",
        match end {
            End::Exited(READ_WRITTEN_VALUE) => "read the parent's data".to_string(),
            End::Exited(READ_OTHER_VALUE) => "read something without faulting".to_string(),
            e => e.to_string(),
        }
    );
    // SAFETY: the parent's mapping is still live.
    let got = unsafe { load_u32(map) };
    ensure!(got == v, "the parent reads {got:#x}, wrote {v:#x}");
    unmap_unpin_close(gdr, mh, map, SMALL_SIZE)
}

/// A forked child cannot map or query the parent's pinned handle (the driver refuses with
/// EACCES) and may close its copy of the gdr_t; the parent's pin survives and maps.
pub fn invalidation_fork_child_gdr_map_parent_mumemalloc(ctx: &Ctx) -> Result<()> {
    let gpu = ctx.gpu()?;
    let buf = DevBuf::aligned(&*gpu, SMALL_SIZE)?;
    let gdr = Gdr::open()?;
    let mh = gdr.pin(buf.ptr, buf.size)?;
    in_helper("child", || {
        expect_errno(
            gdr.map(mh, SMALL_SIZE),
            Errno::EACCES,
            "gdr_map of the parent's handle in the child",
        )?;
        expect_errno(
            gdr.info(mh),
            Errno::EACCES,
            "gdr_get_info of the parent's handle in the child",
        )?;
        // SAFETY: this forked child never uses its copy again.
        unsafe { gdr.close_inherited() }?;
        Ok(0)
    })?
    .expect_success("the child")?;
    let info = gdr.info(mh)?;
    ensure!(info.va == buf.ptr, "the parent's pin changed: {info:?}");
    let map = gdr.map(mh, SMALL_SIZE)?;
    unmap_unpin_close(gdr, mh, map, SMALL_SIZE)
}

/// A child that maps and frees its own buffer does not disturb the parent's separate mapping.
pub fn invalidation_fork_map_and_free_mumemalloc(ctx: &Ctx) -> Result<()> {
    let to_parent = Channel::new()?;
    let child = Helper::spawn("child", || {
        let gpu = ctx.gpu()?;
        let mut buf = DevBuf::aligned(&*gpu, SMALL_SIZE)?;
        buf.fill(0x95)?;
        let gdr = Gdr::open()?;
        let (mh, map) = pin_and_map(&gdr, buf.ptr, buf.size)?;
        // SAFETY: offset 0 of a live mapping.
        unsafe { store_u32(map, token_value(8)) };
        note!("child: freeing its buffer");
        buf.free()?;
        to_parent.send(1)?;
        unmap_unpin_close(gdr, mh, map, SMALL_SIZE)?;
        Ok(0)
    })?;
    let gpu = ctx.gpu()?;
    let Written {
        buf,
        gdr,
        mh,
        map,
        value: v,
    } = written_small_mapping(&*gpu, 9)?;
    to_parent.recv()?;
    // SAFETY: the parent's mapping is live.
    let got = unsafe { load_u32(map) };
    child.wait()?.expect_success("the child")?;
    ensure!(
        got == v,
        "the parent reads {got:#x} after the child's free, wrote {v:#x}"
    );
    let b = buf.read(0, 4)?;
    ensure!(
        u32::from_le_bytes([b[0], b[1], b[2], b[3]]) == v,
        "the driver reads other data than the parent wrote"
    );
    unmap_unpin_close(gdr, mh, map, SMALL_SIZE)
}

/// Sends `fd` and an 8-byte payload over a unix datagram socket.
fn send_fd(sock: &OwnedFd, fd: RawFd, payload: u64) -> Result<()> {
    let fds = [fd];
    let bytes = payload.to_le_bytes();
    let iov = [std::io::IoSlice::new(&bytes)];
    sendmsg::<()>(
        sock.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .context("sendmsg(SCM_RIGHTS)")?;
    Ok(())
}

/// Receives what [`send_fd`] sent.
fn recv_fd(sock: &OwnedFd) -> Result<(OwnedFd, u64)> {
    wait_readable(sock.as_raw_fd(), std::time::Duration::from_secs(20))?;
    let mut bytes = [0u8; 8];
    let mut iov = [std::io::IoSliceMut::new(&mut bytes)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::empty(),
    )
    .context("recvmsg")?;
    let fd = match msg.cmsgs().context("control messages")?.next() {
        Some(ControlMessageOwned::ScmRights(fds)) if fds.len() == 1 => fds[0],
        other => bail!("no descriptor received: {other:?}"),
    };
    // SAFETY: the received descriptor is new in this process and ours alone.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    Ok((fd, u64::from_le_bytes(bytes)))
}

fn datagram_pair() -> Result<(OwnedFd, OwnedFd)> {
    socketpair(
        AddressFamily::Unix,
        SockType::Datagram,
        None,
        SockFlag::empty(),
    )
    .context("socketpair")
}

/// A raw mtgdrdrv ioctl; `params` must be the struct type of `request`.
fn raw_ioctl<T>(fd: RawFd, request: u32, params: &mut T) -> Result<(), Errno> {
    // SAFETY: `params` is a live, exclusively borrowed struct of the type the command copies
    // in and out (the callers pair each command with its params type).
    let rc = unsafe { libc::ioctl(fd, request as _, ptr::from_mut(params)) };
    if rc == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

/// A gdr_open descriptor passed over a unix socket (SCM_RIGHTS) to another process cannot pin
/// there: the driver answers EACCES, even for the receiver's own memory.
pub fn invalidation_unix_sock_shared_fd_gdr_pin_buffer_mumemalloc(ctx: &Ctx) -> Result<()> {
    module_backend_or_skip(&Gdr::open()?, "passing /dev/mtgdrdrv's descriptor")?;
    let (parent_sock, child_sock) = datagram_pair()?;
    let child = Helper::spawn("receiving process", || {
        let gpu = ctx.gpu()?;
        let buf = DevBuf::aligned(&*gpu, SMALL_SIZE)?;
        let (fd, _) = recv_fd(&child_sock)?;
        let mut p = mtgdrdrv::GDRDRV_IOC_PIN_BUFFER_V2_PARAMS {
            addr: buf.ptr,
            size: buf.size as u64,
            ..Default::default()
        };
        let r = raw_ioctl(fd.as_raw_fd(), mtgdrdrv::GDRDRV_IOC_PIN_BUFFER_V2, &mut p);
        ensure!(
            r == Err(Errno::EACCES),
            "PIN_BUFFER_V2 on the received descriptor: {r:?}; expected EACCES"
        );
        note!("receiver: PIN_BUFFER_V2 refused with EACCES");
        Ok(0)
    })?;
    let gdr = Gdr::open()?;
    let fd = device_fd()?;
    send_fd(&parent_sock, fd, 0)?;
    child.wait()?.expect_success("the receiving process")?;
    Ok(gdr.close()?)
}

/// The passed descriptor plus the parent's kernel handle cannot map (or query) the parent's
/// pin in the receiving process: mmap and GET_INFO fail with EACCES.
pub fn invalidation_unix_sock_shared_fd_gdr_map_mumemalloc(ctx: &Ctx) -> Result<()> {
    module_backend_or_skip(&Gdr::open()?, "passing /dev/mtgdrdrv's descriptor")?;
    let (parent_sock, child_sock) = datagram_pair()?;
    let child = Helper::spawn("receiving process", || {
        let (fd, handle) = recv_fd(&child_sock)?;
        let shift = host_page().trailing_zeros();
        // SAFETY: a shared mapping request on the received descriptor; it must be refused,
        // and a mapping it returned anyway is only inspected, never accessed.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                SMALL_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                (handle << shift) as libc::off_t,
            )
        };
        ensure!(
            p == libc::MAP_FAILED,
            "mmap of the parent's handle {handle} succeeded in the receiving process"
        );
        let errno = Errno::last();
        ensure!(
            errno == Errno::EACCES,
            "mmap of the parent's handle: {errno}; expected EACCES"
        );
        let mut info = mtgdrdrv::GDRDRV_IOC_GET_INFO_V2_PARAMS {
            handle,
            ..Default::default()
        };
        let r = raw_ioctl(fd.as_raw_fd(), mtgdrdrv::GDRDRV_IOC_GET_INFO_V2, &mut info);
        ensure!(
            r == Err(Errno::EACCES),
            "GET_INFO_V2 on the received descriptor: {r:?}; expected EACCES"
        );
        note!("receiver: mmap and GET_INFO_V2 refused with EACCES");
        Ok(0)
    })?;
    let gpu = ctx.gpu()?;
    let buf = DevBuf::aligned(&*gpu, SMALL_SIZE)?;
    let gdr = Gdr::open()?;
    let mh = gdr.pin(buf.ptr, buf.size)?;
    let fd = device_fd()?;
    // The first pin of a new descriptor gets kernel handle 0; the parent checks it.
    let handle = 0;
    let mut info = mtgdrdrv::GDRDRV_IOC_GET_INFO_V2_PARAMS {
        handle,
        ..Default::default()
    };
    let r = raw_ioctl(fd, mtgdrdrv::GDRDRV_IOC_GET_INFO_V2, &mut info);
    ensure!(
        r.is_ok() && info.va == buf.ptr,
        "kernel handle {handle} is not the pin ({r:?}, va {:#x})",
        info.va
    );
    send_fd(&parent_sock, fd, handle)?;
    child.wait()?.expect_success("the receiving process")?;
    gdr.unpin(mh)?;
    Ok(gdr.close()?)
}

/// A forked child cannot pin the parent's GPU memory through its own gdr_t: not with tokens
/// (mtgpu has none: EINVAL) and not without (the address is not the child's memory).
pub fn invalidation_fork_child_gdr_pin_parent_with_tokens(ctx: &Ctx) -> Result<()> {
    let to_child = Channel::new()?;
    let child = Helper::spawn("child", || {
        let gdr = Gdr::open()?;
        let addr = to_child.recv()?;
        let before = PinSnapshot::take()?;
        expect_errno(
            gdr.pin_with_tokens(addr, SMALL_SIZE, 0x0123_4567_89ab_cdef, 1),
            Errno::EINVAL,
            "gdr_pin_buffer of the parent's memory with tokens",
        )?;
        match gdr.pin(addr, SMALL_SIZE) {
            Ok(_) => bail!("the child pinned the parent's memory at {addr:#x}"),
            Err(e) => note!("child: pin of the parent's memory refused: {e}"),
        }
        before.expect_same("after the child's refused pins")?;
        gdr.close()?;
        Ok(0)
    })?;
    let gpu = ctx.gpu()?;
    let buf = DevBuf::aligned(&*gpu, SMALL_SIZE)?;
    to_child.send(buf.ptr)?;
    child.wait()?.expect_success("the child")
}
