//! The guest scripts of the module tests' VM: the full run ([`SCRIPT`], its placeholders filled
//! in by `run_module_tests`) and the one that only loads the modules ([`LOAD_ONLY`]).

pub(super) const SCRIPT: &str = r#"
step() { echo "MTGDRCOPY-STEP $1 $(cut -d' ' -f1 /proc/uptime)"; }
@CHECKS_FUNCTIONS@
@SANITY_FUNCTION@
@DOCTOR_FUNCTION@
step load
insmod /lib/mtgdrcopy/mtgpu_emu.ko || fail "insmod mtgpu_emu"
insmod /lib/mtgdrcopy/mtgdrdrv.ko || fail "insmod mtgdrdrv"
for i in $(seq 50); do [ -c /dev/mtgdrdrv ] && [ -c /dev/mtgpu_emu ] && break; sleep 0.1; done
[ -c /dev/mtgdrdrv ] || fail "/dev/mtgdrdrv did not appear"
[ -c /dev/mtgpu_emu ] || fail "/dev/mtgpu_emu did not appear"
cat /proc/driver/mtgdrdrv/params
step tests
/opt/mtgdrcopy/vm_module --test-threads=1
rc=$?
step sanity
@ENVIRONMENT@
# One run per emulated page size on the module backend.
sanity_run 4096 env MTGPU_EMU_PAGE_SIZE=4096 mtgdrcopy_sanity -e --format tap
sanity_run 65536 env MTGPU_EMU_PAGE_SIZE=65536 mtgdrcopy_sanity -e --format tap
sanity_run 2097152 env MTGPU_EMU_PAGE_SIZE=2097152 mtgdrcopy_sanity -e --format tap
step tool-status
# Exit statuses and --json with the environment present (without it: mtgdrcopy-tests/tests/tools.rs).
checks_begin tools
expect_exit 0 mtgdrcopy_copybw -s 64K -w 10 -r 10 --json /tmp/bw.json
grep -q '"tool": "copybw"' /tmp/bw.json; point copybw --json writes its report
echo previous >/tmp/old.json
expect_exit 1 mtgdrcopy_copybw -s 64K -w 10 -r 10 -M cache --json /tmp/old.json
[ "$(cat /tmp/old.json)" = previous ]; point a failed run leaves its --json file as it was
! ls -a /tmp | grep -q '[.]tmp$'; point no --json temporary file is left
expect_exit 2 mtgdrcopy_copybw -o 6
# VMM memory (issue 31): the three benchmarks with -a muMemCreate and upstream's spelling; a
# device without GPUDirect RDMA for VMM memory is a missing feature (77), its cases skipped.
expect_exit 0 mtgdrcopy_copybw -s 64K -w 10 -r 10 -a muMemCreate
grep -q 'from muMemCreate' /tmp/tool.out; point copybw -a muMemCreate uses it
expect_exit 0 mtgdrcopy_copylat -s 64K -w 100 -r 100 -a cuMemCreate
expect_exit 0 mtgdrcopy_apiperf -s 128K -n 2 -w 1 -a muMemCreate
expect_exit 77 env MTGPU_EMU_VMM_RDMA=off mtgdrcopy_copybw -s 64K -a cuMemCreate
expect_exit 0 env MTGPU_EMU_VMM_RDMA=off mtgdrcopy_sanity -v -t basic_vmmalloc
grep -Eq '(SKIPPED|WAIVED) basic_vmmalloc' /tmp/tool.out; point basic_vmmalloc is skipped without the VMM attribute
expect_exit 0 mtgdrcopy_sanity -t basic_mumemalloc -t fault_get_pages_enomem --format tap
[ "$(grep -c '^ok [12] - ' /tmp/tool.out)" = 2 ] && grep -q '^1[.][.]2$' /tmp/tool.out; point sanity -t twice: plan 1..2, points 1 and 2 ok
mtgdrcopy_copybw --version | grep -q '^driver: *mtgdrdrv '; point --version names mtgdrdrv
# The emulated libmusa is refused unless the test suite allows it, and named when it is in use.
expect_exit 77 env -u MTGDRCOPY_ALLOW_EMULATED_MUSA mtgdrcopy_musainfo
grep -q "libmusa.so.1 is the mtgdrcopy test suite's emulated libmusa" /tmp/tool.out; point the emulated libmusa is refused by name
mtgdrcopy_copybw --version | grep -qF 'MUSA driver: 30000 (emulated, /usr/lib/mtgdrcopy/emu/libmusa.so.1)'; point --version says the libmusa is emulated
step doctor
@DOCTOR_LOADED@
checks_end
step sanity-dmabuf
# The dma-buf backend, forced while the module is loaded.
sanity_run dmabuf-forced env GDRCOPY_USE_DMABUF_MMAP=1 mtgdrcopy_sanity --format tap
step fuzz
# The fuzzer's kernel log reader: a line logged first is caught after the ring buffer lost it.
mtgdrdrv_fuzz --klog-selftest || rc=1
mtgdrdrv_fuzz --seed @FUZZ_SEED@ --ops @FUZZ_OPS@ --api-ops @FUZZ_API_OPS@ || rc=1
step counters
sed 's/^/MTGDRCOPY-COUNTER /' /proc/driver/mtgdrdrv/counters
step unload
rmmod mtgdrdrv || fail "rmmod mtgdrdrv"
step sanity-nomodule
# The dma-buf backend chosen because /dev/mtgdrdrv is gone.
sanity_run dmabuf-nomodule mtgdrcopy_sanity --format tap
checks_begin no-module
doctor no-module 1
# A refused mmap is reported in one log line.
n=$(MTGPU_EMU_DMABUF=no-mmap GDRCOPY_ENABLE_LOGGING=1 mtgdrcopy_sanity -t dmabuf_refused_mmap 2>&1 | grep -c 'mmap of the MUSA dma-buf was refused')
[ "$n" = 1 ]; point a refused dma-buf mmap is logged in one line "($n)"
# Neither backend: no module, and a device whose driver exports no dma-buf.
expect_exit 77 env MTGPU_EMU_DMABUF=off mtgdrcopy_copybw
grep -q 'mtgdrdrv is not loaded' /tmp/tool.out; point the hint says mtgdrdrv is not loaded
mtgdrcopy_musainfo --emu-stats | sed 's/^/MTGDRCOPY-COUNTER /'
rmmod mtgpu_emu || fail "rmmod mtgpu_emu (a dma-buf still holds it?)"
doctor nothing 77 env LD_LIBRARY_PATH=/usr/lib/mtgdrcopy
# No GPU at all: the emulated libmusa finds no device.
expect_exit 77 mtgdrcopy_copybw
expect_exit 77 mtgdrcopy_sanity --format tap
grep -q '^Bail out! ' /tmp/tool.out; point sanity bails out in TAP
checks_end
step disabled
# mtgpu as its vendor's DKMS post_install leaves it: loaded with disable_driver=1, symbols
# exported, PCI driver not registered. Pins fail with ENODEV and never reach the provider
# (a call WARNs in the emulator); the load and the refusals say what to do, rate-limited.
insmod /lib/mtgdrcopy/mtgpu_emu.ko disable_driver=1 || fail "insmod mtgpu_emu disable_driver=1"
insmod /lib/mtgdrcopy/mtgdrdrv.ko || fail "insmod mtgdrdrv over a disabled provider"
for i in $(seq 50); do [ -c /dev/mtgdrdrv ] && break; sleep 0.1; done
checks_begin disabled
/opt/mtgdrcopy/vm_module --exact provider::disabled_provider_refuses_pins_without_calling_it --ignored --test-threads=1; point pins are refused without calling the provider
n=$(dmesg | grep -c "reload mtgpu without disable_driver=1")
[ "$n" -ge 2 ] && [ "$n" -le 11 ]; point the load and the refusals say to reload mtgpu, rate-limited "($n lines)"
doctor disabled 1
checks_end
rmmod mtgdrdrv || fail "rmmod mtgdrdrv (disabled provider)"
rmmod mtgpu_emu || fail "rmmod mtgpu_emu (disable_driver=1)"
@FROM_SOURCE@
step done
exit $rc
"#;

/// `sanity_run NAME COMMAND...`: one run of the sanity suite (COMMAND, writing TAP), reported
/// on the console as a TAP 14 subtest named `sanity NAME`: its output indented, then a test
/// point for the run, `not ok` (and the script's status 1) when it exited with an error. The
/// judge expects one subtest per `sanity_run` line of the script (`judge::sanity_runs_in`).
pub(super) const SANITY_FUNCTION: &str = r##"sanity_run() {
    name=$1
    shift
    echo "# Subtest: sanity $name"
    "$@" >/tmp/sanity.tap 2>&1
    status=$?
    sed 's/^/    /' /tmp/sanity.tap
    if [ "$status" = 0 ]; then echo "ok - sanity $name"; else echo "not ok - sanity $name"; rc=1; fi
}
"##;

/// What the guest's tools run with: libgdrapi, and the emulated libmusa standing in for the MUSA
/// driver's, which the tools use only because the test suite allows it; the emulated provider
/// named for the doctor (as for mtgdrdrv-load and insmod.sh).
pub(super) const ENVIRONMENT: &str =
    "export LD_LIBRARY_PATH=/usr/lib/mtgdrcopy:/usr/lib/mtgdrcopy/emu
export MTGDRCOPY_ALLOW_EMULATED_MUSA=1
export MTGDRDRV_PROVIDER=mtgpu_emu";

/// [`LOAD_ONLY`] with its environment.
pub(crate) fn load_only() -> String {
    LOAD_ONLY.replace("@ENVIRONMENT@", ENVIRONMENT)
}

pub(super) const LOAD_ONLY: &str = r#"
insmod /lib/mtgdrcopy/mtgpu_emu.ko && insmod /lib/mtgdrcopy/mtgdrdrv.ko || exit 1
for i in $(seq 50); do [ -c /dev/mtgdrdrv ] && [ -c /dev/mtgpu_emu ] && break; sleep 0.1; done
@ENVIRONMENT@
echo "modules loaded; tools in /usr/bin/mtgdrcopy_*; tests: /opt/mtgdrcopy/vm_module --test-threads=1"
"#;
