//! The queries: gdr_get_info(_v2), gdr_get_callback_flag, gdr_get_attribute, the version
//! calls and gdr_get_mapping_type_string, with NULL outputs and bad arguments.

use std::ffi::{c_char, c_int};

use gdrapi::capi::*;

use super::{out_ptr, ApiFuzzer, Finding, Step};

impl ApiFuzzer {
    pub(super) fn op_info(&mut self) -> Step {
        let g = self.pick_g_or_null();
        let (h, mine) = self.pick_mh(g);
        let null_out = self.rng.chance(50);
        let which = self.rng.below(3);
        self.note(format!(
            "info {which} (g{g:?}, {:#x}, null {null_out})",
            h.h
        ));
        let want = if g.is_some() && mine.is_some() && !null_out {
            0
        } else {
            libc::EINVAL
        };
        let gp = self.g_ptr(g);
        match which {
            0 => {
                let mut info = gdr_info_v2::default();
                let out = out_ptr(&mut info, null_out);
                // SAFETY: NULL or a live gdr_t; `out` NULL or writable.
                let rc = unsafe { gdr_get_info_v2(gp, h, out) };
                self.expect("gdr_get_info_v2", rc, &[want])?;
                if rc == 0 {
                    self.check_info(
                        mine,
                        info.va,
                        info.mapped_size,
                        info.page_size,
                        info.flags,
                        Some(info.mapping_type),
                    )?;
                }
            }
            1 => {
                let mut info = gdr_info_v1::default();
                let out = out_ptr(&mut info, null_out);
                // SAFETY: as above.
                let rc = unsafe { gdr_get_info_v1(gp, h, out) };
                self.expect("gdr_get_info", rc, &[want])?;
                if rc == 0 {
                    self.check_info(
                        mine,
                        info.va,
                        info.mapped_size,
                        info.page_size,
                        info.flags,
                        None,
                    )?;
                }
            }
            _ => {
                let mut flag: c_int = 5;
                let out = out_ptr(&mut flag, null_out);
                // SAFETY: as above.
                let rc = unsafe { gdr_get_callback_flag(gp, h, out) };
                self.expect("gdr_get_callback_flag", rc, &[want])?;
                if rc == 0 && flag != 0 {
                    finding!("callback flag {flag}");
                }
            }
        }
        Ok(())
    }

    fn check_info(
        &self,
        mine: Option<usize>,
        va: u64,
        size: u64,
        page: u32,
        flags: u32,
        t: Option<c_int>,
    ) -> Step {
        let Some(i) = mine else { return Ok(()) };
        let m = &self.mhs[i];
        let mt = m.map.map_or(0, |(_, _, t)| t);
        let want_flags = u32::from(mt != 0) | u32::from(mt == 1) << 1;
        if (va, size, page, flags & 3) != (m.va, m.size, m.granule, want_flags)
            || t.is_some_and(|t| t != mt)
        {
            finding!(
                "info: va {va:#x} size {size:#x} page {page:#x} flags {flags:#x} type {t:?}, \
                 expected {:#x} {:#x} {:#x} {want_flags:#x} {mt}",
                m.va,
                m.size,
                m.granule
            );
        }
        Ok(())
    }

    pub(super) fn op_misc(&mut self) -> Step {
        let g = self.pick_g_or_null();
        let gp = self.g_ptr(g);
        match self.rng.below(4) {
            0 => {
                let attr = if self.rng.chance(700) {
                    self.rng.range(0, 4) as c_int
                } else {
                    self.rng.edge_u64() as c_int
                };
                let null = self.rng.chance(100);
                let mut v: c_int = 9;
                let out: *mut c_int = if null { std::ptr::null_mut() } else { &mut v };
                self.note(format!("gdr_get_attribute(g{g:?}, {attr}, null {null})"));
                // SAFETY: NULL or a live gdr_t; `out` NULL or writable.
                let rc = unsafe { gdr_get_attribute(gp, attr, out) };
                let want = if g.is_none() || null || !(1..=3).contains(&attr) {
                    libc::EINVAL
                } else {
                    0
                };
                self.expect("gdr_get_attribute", rc, &[want])?;
                if rc == 0 && v != c_int::from(attr == 1) {
                    finding!("attribute {attr} = {v}");
                }
            }
            1 => {
                let (mut ma, mut mi) = (-1, -1);
                let nulls = self.rng.below(4);
                let pa: *mut c_int = if nulls & 1 != 0 {
                    std::ptr::null_mut()
                } else {
                    &mut ma
                };
                let pb: *mut c_int = if nulls & 2 != 0 {
                    std::ptr::null_mut()
                } else {
                    &mut mi
                };
                self.note(format!("gdr_driver_get_version(g{g:?}, nulls {nulls})"));
                // SAFETY: NULL or a live gdr_t; pointers NULL or writable.
                let rc = unsafe { gdr_driver_get_version(gp, pa, pb) };
                let want = if g.is_none() || nulls != 0 {
                    libc::EINVAL
                } else {
                    0
                };
                self.expect("gdr_driver_get_version", rc, &[want])?;
                if rc == 0 && (ma, mi) != (0, 1) {
                    finding!("driver version {ma}.{mi}");
                }
                // SAFETY: NULLs are allowed.
                unsafe { gdr_runtime_get_version(pa, std::ptr::null_mut()) };
            }
            _ => {
                let t = if self.rng.chance(700) {
                    self.rng.range(0, 4) as c_int
                } else {
                    self.rng.edge_u64() as c_int
                };
                let null = self.rng.chance(100);
                let mut s: *const c_char = std::ptr::null();
                let out: *mut *const c_char = if null { std::ptr::null_mut() } else { &mut s };
                self.note(format!("gdr_get_mapping_type_string({t}, null {null})"));
                // SAFETY: `out` NULL or writable.
                let rc = unsafe { gdr_get_mapping_type_string(t, out) };
                let want = if null || !(0..=3).contains(&t) {
                    libc::EINVAL
                } else {
                    0
                };
                self.expect("gdr_get_mapping_type_string", rc, &[want])?;
                if rc == 0 && s.is_null() {
                    finding!("NULL mapping type string");
                }
            }
        }
        Ok(())
    }
}
