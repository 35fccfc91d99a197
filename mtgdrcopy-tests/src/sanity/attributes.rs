//! What the library and driver say about themselves: attributes, mapping type names, and the
//! version handshake.

use std::path::Path;

use anyhow::{ensure, Context, Result};
use nix::errno::Errno;

use super::support::*;
use super::{note, skip, Ctx};
use crate::gdr;

/// gdr_get_attribute answers every attribute (persistent mapping 1, FORCE_PCIE support 0,
/// dma-buf mmap 0) and refuses unknown ones with EINVAL; the mapping type names are
/// upstream's.
pub fn attributes_sanity(_ctx: &Ctx) -> Result<()> {
    let gdr = Gdr::open()?;
    // gdr_open takes the dma-buf backend when forced or when the module's node is missing.
    let dma_buf = std::env::var_os(gdrapi::USE_DMABUF_ENV).is_some_and(|v| v == "1")
        || !Path::new(gdrapi::DEVICE_PATH).exists();
    for (attr, name, want) in [
        (
            ATTR_USE_PERSISTENT_MAPPING,
            "GDR_ATTR_USE_PERSISTENT_MAPPING",
            1,
        ),
        (
            ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE,
            "GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE",
            0,
        ),
        (
            ATTR_USING_DMA_BUF_MMAP,
            "GDR_ATTR_USING_DMA_BUF_MMAP",
            std::ffi::c_int::from(dma_buf),
        ),
    ] {
        let v = gdr.attribute(attr)?;
        note!("{name} = {v}");
        ensure!(v == want, "{name} reads {v}, expected {want}");
    }
    for attr in [0, 4, 99, -1] {
        expect_errno(
            gdr.attribute(attr),
            Errno::EINVAL,
            &format!("gdr_get_attribute({attr})"),
        )?;
    }
    let api = gdr::api()?;
    for (t, name) in [
        (0, "None"),
        (1, "Write Combining"),
        (2, "Caching"),
        (3, "Device"),
    ] {
        let got = gdr::mapping_type_name(api, t);
        ensure!(
            got == name,
            "mapping type {t} is named {got:?}, expected {name:?}"
        );
    }
    ensure!(
        gdr::mapping_type_name(api, 4) == "?",
        "gdr_get_mapping_type_string(4) did not fail"
    );
    Ok(gdr.close()?)
}

const REPORT_VERSION: &str = "/sys/module/mtgdrdrv/parameters/test_report_version";

/// Makes GET_VERSION report `version` (test builds of the module); restores 0 on drop.
struct ReportedVersion;

impl ReportedVersion {
    fn set(version: u32) -> Result<ReportedVersion> {
        std::fs::write(REPORT_VERSION, version.to_string())
            .with_context(|| format!("writing {version:#x} to {REPORT_VERSION}"))?;
        Ok(ReportedVersion)
    }
}

impl Drop for ReportedVersion {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(REPORT_VERSION, "0") {
            eprintln!("  warning: could not restore {REPORT_VERSION} to 0: {e}");
        }
    }
}

/// gdr_open refuses a driver that reports an unsupported major version (1.0 or 2.0, through
/// the test-build parameter test_report_version) with EPROTO, accepts a newer minor (0.5),
/// and works again once the real version is back.
pub fn version_handshake_unsupported_major(_ctx: &Ctx) -> Result<()> {
    if std::env::var_os(gdrapi::USE_DMABUF_ENV).is_some_and(|v| v == "1") {
        skip!("the module's version handshake; this run forces the dma-buf backend");
    }
    if !Path::new(REPORT_VERSION).exists() {
        skip!("the module was built without the test parameter {REPORT_VERSION}");
    }
    if let Err(e) = std::fs::OpenOptions::new().write(true).open(REPORT_VERSION) {
        skip!("cannot write {REPORT_VERSION} ({e}): run as root");
    }
    for version in [0x2_0000u32, 0x1_0000] {
        let _reported = ReportedVersion::set(version)?;
        note!("driver reports {}.{}", version >> 16, version & 0xffff);
        expect_errno(
            Gdr::try_open()?,
            Errno::EPROTO,
            &format!(
                "gdr_open with driver {}.{}",
                version >> 16,
                version & 0xffff
            ),
        )?;
    }
    {
        let _reported = ReportedVersion::set(0x0005)?;
        let gdr = Gdr::open().context("gdr_open with driver 0.5 (a newer minor)")?;
        let v = gdr.driver_version()?;
        ensure!(
            v == (0, 5),
            "gdr_driver_get_version reports {v:?}, expected (0, 5)"
        );
        gdr.close()?;
    }
    let gdr = Gdr::open().context("gdr_open once the real version is back")?;
    let (major, minor) = gdr.driver_version()?;
    note!("real driver version {major}.{minor}");
    ensure!(major == 0, "the real driver reports major {major}");
    Ok(gdr.close()?)
}
