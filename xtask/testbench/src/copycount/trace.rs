//! The tracer of `cargo xtask copy-counts`: runs `testing/copy-harness/harness count` under
//! ptrace, single-steps each measured `gdr_copy_*` call from its first instruction to its return,
//! and for every instruction decodes (iced-x86) the memory it touches. Counting by stepping works
//! for every copy variant, including those valgrind cannot run (AVX-512).
//!
//! A variant whose instructions this CPU lacks (AVX-512 or MOVDIR64B on an AMD EPYC, say) still
//! gets figures: the tracer plays a CPU that has them. While the harness opens the library and
//! makes its first copies (where the library detects CPU features) every instruction is stepped,
//! and `cpuid`/`xgetbv` are answered with the features added; later, each instruction the real
//! CPU refuses (SIGILL) is carried out by the tracer on the tracee's memory and counted as one.
//! Only the handful of instructions the copy routines use are emulated; anything else is an error.

use std::collections::HashMap;
use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};

use anyhow::{bail, ensure, Context, Result};
use iced_x86::{
    Code, Decoder, DecoderOptions, Instruction, InstructionInfoFactory, Mnemonic, OpAccess,
    Register,
};
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::uio::{process_vm_readv, process_vm_writev, RemoteIoVec};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

mod virtual_cpu;

/// One copy call the harness makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Case {
    pub to_device: bool,
    pub size: usize,
    pub device_misalignment: usize,
    pub host_misalignment: usize,
}

/// A memory access inside the device window of a measured call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub addr: u64,
    pub width: u64,
    pub write: bool,
}

/// What one measured call did.
#[derive(Debug)]
pub struct Measured {
    pub case: Case,
    /// Instructions from the entry point's first to its `ret`, both included.
    pub instructions: u64,
    /// How many of them the tracer carried out for a CPU that lacks them.
    pub emulated: u64,
    /// The device range of the call.
    pub device: u64,
    /// Accesses within a page of the device range, in program order.
    pub accesses: Vec<Access>,
}

/// CPU features the tracer reports to the tracee although this CPU may lack them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Virtual {
    pub avx512f: bool,
    pub movdir64b: bool,
}

impl Virtual {
    fn any(self) -> bool {
        self.avx512f || self.movdir64b
    }
}

/// Runs the harness on the library with copy variant `variant`, through a write-combining
/// mapping or (`device_mapping`) a DEVICE one, and measures every case; also returns the variant
/// the library says it chose. Tracer and harness run on CPU `cpu`: a single step is a round
/// trip between them, several times faster when no wake-up crosses CPUs.
pub fn run(
    tools: &super::Tools,
    variant: &str,
    virt: Virtual,
    device_mapping: bool,
    cases: &[Case],
    cpu: usize,
) -> Result<(String, Vec<Measured>)> {
    let mut set = nix::sched::CpuSet::new();
    // Best effort: without it only the speed differs.
    if set.set(cpu).is_ok() {
        let _ = nix::sched::sched_setaffinity(Pid::from_raw(0), &set);
    }
    let mut command = Command::new(&tools.harness);
    command
        .arg("count")
        .arg(&tools.library)
        .args(device_mapping.then_some("device"))
        .env("LD_PRELOAD", &tools.preload)
        .env(gdrapi::copy::VARIANT_ENV, variant)
        // Info level: the library names the variant it chose.
        .env(gdrapi::log::ENABLE_ENV, "1")
        .env(gdrapi::log::LEVEL_ENV, "2")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the forked child before exec and only makes one system call.
    unsafe {
        command.pre_exec(|| ptrace::traceme().map_err(std::io::Error::from));
    }
    let mut child = command.spawn().context("starting the copy harness")?;
    let pid = Pid::from_raw(child.id() as i32);
    let mut stdin = child.stdin.take().context("harness stdin")?;
    let input: String = cases
        .iter()
        .map(|c| {
            format!(
                "{} {} {} {}\n",
                if c.to_device { "to" } else { "from" },
                c.size,
                c.device_misalignment,
                c.host_misalignment
            )
        })
        .collect();
    // The harness is stopped until traced: feed it from another thread (the pipe is small).
    let feeder = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let mut stderr = child.stderr.take().context("harness stderr")?;
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let mut tracer = Tracer {
        pid,
        virt,
        zmm: [[0; 64]; 32],
        info: InstructionInfoFactory::new(),
        decoded: HashMap::new(),
    };
    let result = tracer.trace(cases);
    if result.is_err() {
        let _ = child.kill();
    }
    let _ = child.wait();
    let _ = feeder.join();
    let log = log.join().unwrap_or_default();
    let measured = result.with_context(|| format!("harness log:\n{log}"))?;
    let chosen = log
        .lines()
        .find_map(|l| l.split("copy variant: ").nth(1))
        .unwrap_or("")
        .trim()
        .to_string();
    Ok((chosen, measured))
}

struct Tracer {
    pid: Pid,
    virt: Virtual,
    /// The emulated AVX-512 registers (only loaded and stored whole by the copy routines).
    zmm: [[u8; 64]; 32],
    info: InstructionInfoFactory,
    /// Instructions by address: the harness's code does not change while it runs.
    decoded: HashMap<u64, Instruction>,
}

/// Where the tracee is.
enum Mode {
    /// Running freely between markers.
    Free,
    /// Stepping the set-up, answering cpuid/xgetbv for the virtual CPU.
    SetUp,
    /// Stepping towards the measured call's entry point.
    ToEntry(Pending),
    /// Stepping the measured call.
    InCall(Pending, Call),
}

#[derive(Clone, Copy)]
struct Pending {
    entry: u64,
    device: u64,
    size: u64,
}

struct Call {
    return_to: u64,
    stack: u64,
    instructions: u64,
    emulated: u64,
    accesses: Vec<Access>,
}

impl Tracer {
    fn trace(&mut self, cases: &[Case]) -> Result<Vec<Measured>> {
        match waitpid(self.pid, None)? {
            WaitStatus::Stopped(_, Signal::SIGTRAP) => {}
            other => bail!("the harness did not stop at exec: {other:?}"),
        }
        ptrace::setoptions(self.pid, ptrace::Options::PTRACE_O_EXITKILL)?;
        let mut done = Vec::with_capacity(cases.len());
        let mut mode = Mode::Free;
        let mut signal: Option<Signal> = None;
        // The registers after the last step, when nothing changed them since.
        let mut known: Option<libc::user_regs_struct> = None;
        loop {
            if let Mode::Free = mode {
                ptrace::cont(self.pid, signal.take())?;
                match waitpid(self.pid, None)? {
                    WaitStatus::Exited(_, 0) => break,
                    WaitStatus::Exited(_, code) => bail!("the harness exited with {code}"),
                    WaitStatus::Signaled(_, sig, _) => bail!("the harness was killed by {sig}"),
                    WaitStatus::Stopped(_, Signal::SIGTRAP) => {
                        let regs = ptrace::getregs(self.pid)?;
                        mode = self.marker(&regs, regs.rip - 1)?;
                    }
                    WaitStatus::Stopped(_, Signal::SIGILL) => {
                        let regs = ptrace::getregs(self.pid)?;
                        let instr = self.decode(regs.rip)?;
                        self.emulate(&instr, regs, &mut Vec::new())?;
                    }
                    WaitStatus::Stopped(_, sig) => signal = Some(sig),
                    other => bail!("unexpected harness state {other:?}"),
                }
                continue;
            }
            let mut regs = match known.take() {
                Some(regs) => regs,
                None => ptrace::getregs(self.pid)?,
            };
            if let Mode::ToEntry(p) = mode {
                if regs.rip == p.entry {
                    mode = Mode::InCall(
                        p,
                        Call {
                            return_to: self.read_u64(regs.rsp)?,
                            stack: regs.rsp,
                            instructions: 0,
                            emulated: 0,
                            accesses: Vec::new(),
                        },
                    );
                }
            }
            let instr = self.decode(regs.rip)?;
            if instr.code() == Code::Int3 {
                regs.rip += 1;
                ptrace::setregs(self.pid, regs)?;
                mode = self.marker(&regs, regs.rip - 1)?;
                continue;
            }
            if self.virt.any() && self.answer_cpu_query(&instr, regs)? {
                continue;
            }
            let before = regs;
            ptrace::step(self.pid, signal.take())?;
            let status = waitpid(self.pid, None)?;
            let executed = match status {
                WaitStatus::Stopped(_, Signal::SIGTRAP) => true,
                WaitStatus::Stopped(_, Signal::SIGILL) => false,
                WaitStatus::Stopped(_, sig) => {
                    signal = Some(sig);
                    continue;
                }
                other => bail!("the harness stopped being traceable mid-copy: {other:?}"),
            };
            if let Mode::InCall(p, call) = &mut mode {
                call.instructions += 1;
                if executed {
                    self.record(&instr, &before, p, &mut call.accesses)?;
                } else {
                    call.emulated += 1;
                    let mut accesses = Vec::new();
                    self.emulate(&instr, before, &mut accesses)?;
                    call.accesses
                        .extend(accesses.into_iter().filter(|a| in_window(a, p)));
                }
                let now = ptrace::getregs(self.pid)?;
                known = Some(now);
                if now.rip == call.return_to && now.rsp == call.stack + 8 {
                    let Mode::InCall(p, call) = std::mem::replace(&mut mode, Mode::Free) else {
                        unreachable!()
                    };
                    let case = *cases
                        .get(done.len())
                        .context("the harness measured more calls than it was given")?;
                    done.push(Measured {
                        case,
                        instructions: call.instructions,
                        emulated: call.emulated,
                        device: p.device,
                        accesses: call.accesses,
                    });
                }
            } else if !executed {
                self.emulate(&instr, before, &mut Vec::new())?;
            }
        }
        ensure!(
            done.len() == cases.len(),
            "the harness measured {} of {} calls",
            done.len(),
            cases.len()
        );
        Ok(done)
    }

    /// The harness's int3 at `at`: what it announces (see harness.c).
    fn marker(&self, regs: &libc::user_regs_struct, at: u64) -> Result<Mode> {
        ensure!(
            self.read(at, 1)? == [0xcc],
            "SIGTRAP at {at:#x} is not one of the harness's markers"
        );
        Ok(match regs.rax {
            1 if self.virt.any() => Mode::SetUp,
            1 | 2 => Mode::Free,
            3 => Mode::ToEntry(Pending {
                entry: regs.rbx,
                device: regs.rcx,
                size: regs.rdx,
            }),
            code => bail!("unknown harness marker {code}"),
        })
    }

    /// The accesses of an instruction the CPU executed, computed from the registers before it.
    fn record(
        &mut self,
        instr: &Instruction,
        regs: &libc::user_regs_struct,
        p: &Pending,
        accesses: &mut Vec<Access>,
    ) -> Result<()> {
        if instr.mnemonic() == Mnemonic::Movdir64b {
            // Its destination is the address in a register, which the decoder does not list.
            let dst = reg_value(instr.op0_register(), regs).context("movdir64b destination")?;
            let src = self.address(instr, 1, regs)?;
            for a in [
                Access {
                    addr: src,
                    width: 64,
                    write: false,
                },
                Access {
                    addr: dst,
                    width: 64,
                    write: true,
                },
            ] {
                if in_window(&a, p) {
                    accesses.push(a);
                }
            }
            return Ok(());
        }
        let info = self.info.info(instr);
        for mem in info.used_memory() {
            let (read, write) = match mem.access() {
                OpAccess::Read | OpAccess::CondRead => (true, false),
                OpAccess::Write | OpAccess::CondWrite => (false, true),
                OpAccess::ReadWrite | OpAccess::ReadCondWrite => (true, true),
                _ => continue,
            };
            let addr = mem
                .virtual_address(0, |reg, _, _| reg_value(reg, regs))
                .with_context(|| format!("address of {instr} at {:#x}", instr.ip()))?;
            let width = mem.memory_size().size() as u64;
            for (kind, wanted) in [(false, read), (true, write)] {
                let a = Access {
                    addr,
                    width,
                    write: kind,
                };
                if wanted && in_window(&a, p) {
                    accesses.push(a);
                }
            }
        }
        Ok(())
    }

    /// The address of memory operand `operand`.
    fn address(
        &self,
        instr: &Instruction,
        operand: u32,
        regs: &libc::user_regs_struct,
    ) -> Result<u64> {
        instr
            .virtual_address(operand, 0, |reg, _, _| reg_value(reg, regs))
            .with_context(|| format!("address of {instr} at {:#x}", instr.ip()))
    }

    fn decode(&mut self, rip: u64) -> Result<Instruction> {
        if let Some(instr) = self.decoded.get(&rip) {
            return Ok(*instr);
        }
        // An instruction is at most 15 bytes; near the end of a mapping fewer may be readable.
        let mut bytes = self.read(rip, 16);
        if bytes.is_err() {
            let to_page_end = 4096 - (rip % 4096) as usize;
            bytes = self.read(rip, to_page_end.min(16));
        }
        let bytes = bytes?;
        let instr = Decoder::with_ip(64, &bytes, rip, DecoderOptions::NONE).decode();
        ensure!(
            !instr.is_invalid(),
            "cannot decode the instruction at {rip:#x}"
        );
        self.decoded.insert(rip, instr);
        Ok(instr)
    }

    fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let n = process_vm_readv(
            self.pid,
            &mut [std::io::IoSliceMut::new(&mut buf)],
            &[RemoteIoVec {
                base: addr as usize,
                len,
            }],
        )
        .with_context(|| format!("reading the harness's memory at {addr:#x}"))?;
        ensure!(n == len, "short read of the harness's memory at {addr:#x}");
        Ok(buf)
    }

    fn read_u64(&self, addr: u64) -> Result<u64> {
        let bytes = self.read(addr, 8)?;
        Ok(u64::from_le_bytes(
            bytes
                .try_into()
                .map_err(|_| anyhow::anyhow!("short read"))?,
        ))
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        let n = process_vm_writev(
            self.pid,
            &[std::io::IoSlice::new(data)],
            &[RemoteIoVec {
                base: addr as usize,
                len: data.len(),
            }],
        )
        .with_context(|| format!("writing the harness's memory at {addr:#x}"))?;
        ensure!(
            n == data.len(),
            "short write to the harness's memory at {addr:#x}"
        );
        Ok(())
    }
}

/// Whether an access falls within a page of the device range (anything there is the copy's:
/// the harness keeps nothing else near its mapping).
fn in_window(a: &Access, p: &Pending) -> bool {
    let lo = p.device.saturating_sub(4096);
    let hi = p.device + p.size + 4096;
    a.addr < hi && a.addr + a.width > lo
}

/// The value of a general-purpose or segment-base register, for address computation.
fn reg_value(reg: Register, regs: &libc::user_regs_struct) -> Option<u64> {
    let full = match reg.full_register() {
        Register::RAX => regs.rax,
        Register::RBX => regs.rbx,
        Register::RCX => regs.rcx,
        Register::RDX => regs.rdx,
        Register::RSI => regs.rsi,
        Register::RDI => regs.rdi,
        Register::RBP => regs.rbp,
        Register::RSP => regs.rsp,
        Register::R8 => regs.r8,
        Register::R9 => regs.r9,
        Register::R10 => regs.r10,
        Register::R11 => regs.r11,
        Register::R12 => regs.r12,
        Register::R13 => regs.r13,
        Register::R14 => regs.r14,
        Register::R15 => regs.r15,
        Register::RIP => regs.rip,
        Register::FS => return Some(regs.fs_base),
        Register::GS => return Some(regs.gs_base),
        Register::ES | Register::CS | Register::SS | Register::DS => return Some(0),
        _ => return None,
    };
    Some(match reg.size() {
        8 => full,
        4 => full & 0xffff_ffff,
        2 => full & 0xffff,
        1 if reg.is_gpr8()
            && matches!(
                reg,
                Register::AH | Register::BH | Register::CH | Register::DH
            ) =>
        {
            (full >> 8) & 0xff
        }
        1 => full & 0xff,
        _ => return None,
    })
}
