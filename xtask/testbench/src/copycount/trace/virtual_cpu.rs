//! The virtual CPU of the tracer: `cpuid` and `xgetbv` answered with the features a variant
//! needs, and the few instructions the real CPU refuses (SIGILL) carried out on the tracee.

use anyhow::{ensure, Result};
use iced_x86::{Instruction, Mnemonic, OpKind, Register};
use nix::sys::ptrace;

use super::{reg_value, Access, Tracer};

impl Tracer {
    /// Answers `cpuid` and `xgetbv` for the virtual CPU: this CPU's answers with the virtual
    /// features added. True if `instr` was one of them (and is done).
    pub(super) fn answer_cpu_query(
        &self,
        instr: &Instruction,
        mut regs: libc::user_regs_struct,
    ) -> Result<bool> {
        match instr.mnemonic() {
            Mnemonic::Cpuid => {
                // SAFETY: cpuid exists on every x86-64 CPU and only reads identification.
                #[allow(unused_unsafe)]
                let mut r =
                    unsafe { std::arch::x86_64::__cpuid_count(regs.rax as u32, regs.rcx as u32) };
                if regs.rax as u32 == 7 && regs.rcx as u32 == 0 {
                    if self.virt.avx512f {
                        r.ebx |= 1 << 16;
                    }
                    if self.virt.movdir64b {
                        r.ecx |= 1 << 28;
                    }
                }
                (regs.rax, regs.rbx, regs.rcx, regs.rdx) =
                    (r.eax.into(), r.ebx.into(), r.ecx.into(), r.edx.into());
            }
            Mnemonic::Xgetbv => {
                ensure!(
                    std::arch::is_x86_feature_detected!("xsave"),
                    "the tracee asked xgetbv on a CPU without XSAVE"
                );
                // SAFETY: XSAVE is present (checked), so xgetbv with ecx = 0 is defined.
                let mut xcr0 = unsafe { std::arch::x86_64::_xgetbv(regs.rcx as u32) };
                if regs.rcx as u32 == 0 && self.virt.avx512f {
                    // Opmask, ZMM_Hi256 and Hi16_ZMM state: the OS "saves" AVX-512 registers.
                    xcr0 |= 0xe0;
                }
                (regs.rax, regs.rdx) = (xcr0 & 0xffff_ffff, xcr0 >> 32);
            }
            _ => return Ok(false),
        }
        regs.rip += instr.len() as u64;
        ptrace::setregs(self.pid, regs)?;
        Ok(true)
    }

    /// Carries out an instruction this CPU refused, on the tracee's registers and memory.
    pub(super) fn emulate(
        &mut self,
        instr: &Instruction,
        mut regs: libc::user_regs_struct,
        accesses: &mut Vec<Access>,
    ) -> Result<()> {
        let unsupported = || {
            anyhow::anyhow!(
                "the harness executed {instr} at {:#x}, which this CPU lacks and the tracer does \
                 not emulate",
                instr.ip()
            )
        };
        if instr.op_mask() != Register::None {
            return Err(unsupported());
        }
        let zmm = |reg: Register| -> Option<usize> {
            reg.is_zmm().then(|| reg.number() - Register::ZMM0.number())
        };
        match instr.mnemonic() {
            Mnemonic::Movdir64b => {
                let dst = reg_value(instr.op0_register(), &regs).ok_or_else(unsupported)?;
                let src = self.address(instr, 1, &regs)?;
                let line = self.read(src, 64)?;
                self.write(dst, &line)?;
                accesses.push(Access {
                    addr: src,
                    width: 64,
                    write: false,
                });
                accesses.push(Access {
                    addr: dst,
                    width: 64,
                    write: true,
                });
            }
            Mnemonic::Vmovdqu64
            | Mnemonic::Vmovdqa64
            | Mnemonic::Vmovntdqa
            | Mnemonic::Vmovntdq => {
                if instr.op0_kind() == OpKind::Register && instr.op1_kind() == OpKind::Memory {
                    let n = zmm(instr.op0_register()).ok_or_else(unsupported)?;
                    let src = self.address(instr, 1, &regs)?;
                    let line = self.read(src, 64)?;
                    self.zmm[n].copy_from_slice(&line);
                    accesses.push(Access {
                        addr: src,
                        width: 64,
                        write: false,
                    });
                } else if instr.op0_kind() == OpKind::Memory && instr.op1_kind() == OpKind::Register
                {
                    let n = zmm(instr.op1_register()).ok_or_else(unsupported)?;
                    let dst = self.address(instr, 0, &regs)?;
                    self.write(dst, &self.zmm[n].clone())?;
                    accesses.push(Access {
                        addr: dst,
                        width: 64,
                        write: true,
                    });
                } else {
                    return Err(unsupported());
                }
            }
            _ => return Err(unsupported()),
        }
        regs.rip += instr.len() as u64;
        ptrace::setregs(self.pid, regs)?;
        Ok(())
    }
}
