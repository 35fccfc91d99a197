//! Processes: fork at random points, with the child checking isolation, fuzzing on its own and
//! exiting with everything live, being SIGKILLed, or running a thread storm.

use crate::emu::Raw;
use mtgdrdrv::*;

use super::{Config, Expect, Finding, Step, Worker};
use crate::sys::{self, ename};

impl Worker {
    pub(super) fn op_fork(&mut self) -> Step {
        // 0: isolation checks; 1: a short run of its own, then exit with everything live;
        // 2: the same, SIGKILLed at a random time; 3: threads racing on one file.
        let mode = self.rng.weighted(&[40, 30, 12, 18]);
        let child_seed = self.rng.next_u64();
        let kill_after_us = self.rng.below(20_000);
        self.note(format!("fork (mode {mode}, child seed {child_seed:#x})"));
        // SAFETY: this process is single-threaded; the child only runs the fuzzer's own code
        // and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            finding!("fork: {}", ename(sys::errno()));
        }
        if pid == 0 {
            let code = match mode {
                0 => self.child_isolation(),
                3 => crate::storm::run(child_seed, self.shared_ops),
                _ => self.child_mini(child_seed, mode == 2),
            };
            // SAFETY: leaving the child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        if mode == 2 {
            std::thread::sleep(std::time::Duration::from_micros(kill_after_us));
            // SAFETY: kills our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is writable.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let exited_ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        let killed = libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL;
        if !(exited_ok || mode == 2 && killed) {
            if let Some(t) = &self.cfg.trace {
                eprintln!("{}", crate::trace::tail(&format!("{t}.child"), 40));
            }
            finding!("child (mode {mode}, seed {child_seed:#x}) ended with status {status:#x}");
        }
        Ok(())
    }

    /// In a forked child: nothing of the parent's works or is mapped here.
    fn child_isolation(&mut self) -> i32 {
        self.in_child = true;
        let r = (|| -> Step {
            for f in 0..self.files.len() {
                for fd in self.files[f].fds.clone() {
                    let mut v = GDRDRV_IOC_GET_VERSION_PARAMS::default();
                    let r = sys::ioctl(fd, GDRDRV_IOC_GET_VERSION, &mut v as *mut _ as usize);
                    self.check("child GET_VERSION", &Expect::err(libc::EACCES), r)?;
                    let handle = self.pick_handle(f);
                    let mut u = GDRDRV_IOC_UNPIN_BUFFER_PARAMS { handle };
                    let r = sys::ioctl(fd, GDRDRV_IOC_UNPIN_BUFFER, &mut u as *mut _ as usize);
                    self.check("child UNPIN", &Expect::err(libc::EACCES), r)?;
                    if let Some(p) = self.pins.iter().find(|p| p.file == f) {
                        let r = sys::mmap(
                            0,
                            self.page,
                            libc::PROT_READ,
                            libc::MAP_SHARED,
                            fd,
                            p.handle * self.page as u64,
                        );
                        let exp = if self.files[f].readable {
                            Expect::err(libc::EACCES)
                        } else {
                            Expect::err(libc::EACCES).also(libc::EINVAL)
                        };
                        self.check("child mmap", &exp, r.map(drop))?;
                    }
                }
            }
            for v in self.vmas.clone() {
                if self.prober.probe(v.start, 1).is_ok() {
                    finding!(
                        "the parent's mapping {:#x} is readable in the child",
                        v.start
                    );
                }
            }
            for a in 0..self.allocs.len() {
                if let (true, Some(emu)) = (self.allocs[a].live, self.emu(self.allocs[a].emu)) {
                    let mut b = [0u8; 8];
                    let r = emu.read(self.allocs[a].va, &mut b).raw();
                    self.check(
                        "child emu read of the parent's VA",
                        &Expect::err(libc::EINVAL),
                        r,
                    )?;
                }
            }
            Ok(())
        })();
        match r {
            Ok(()) => 0,
            Err(Finding(m)) => {
                eprintln!("FINDING in {} child: {m}", self.cfg.name);
                1
            }
        }
    }

    /// In a forked child: a short fuzzing run of its own, then an exit with everything live
    /// (or a SIGKILL from the parent).
    fn child_mini(&mut self, seed: u64, long: bool) -> i32 {
        let cfg = Config {
            name: format!("{}/child", self.cfg.name),
            trace: self.cfg.trace.as_ref().map(|t| format!("{t}.child")),
            seed,
            ops: if long { 1_000_000 } else { 20 + seed % 150 },
            exact: false,
            fork: false,
            foreign_allocs: 0,
            ..self.cfg.clone()
        };
        let Ok(mut w) = Worker::new(cfg, self.shared_ops) else {
            return 2;
        };
        w.in_child = true;
        match w.run() {
            Ok(()) => {
                if seed.is_multiple_of(2) {
                    if let Err(m) = w.teardown() {
                        eprintln!("{m}");
                        return 1;
                    }
                }
                0
            }
            Err(report) => {
                eprintln!("{report}");
                1
            }
        }
    }
}
