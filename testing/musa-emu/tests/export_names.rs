//! The emulated libmusa exports what libmusa does, and `gdrapi::musa` (the library's and the
//! tools' one resolution rule) finds every function the tools and the dma-buf backend use in it.

use libloading::Library;

/// The cdylib cargo built for this test: beside it in `target/<profile>/deps/` (where `cargo
/// test` leaves it), or in `target/<profile>/` after a `cargo build`.
fn emulated_libmusa() -> Library {
    let exe = std::env::current_exe().expect("test path");
    let deps = exe.parent().expect("deps directory");
    let file = "libmtgpu_emu_musa.so";
    let path = [deps.join(file), deps.join("..").join(file)]
        .into_iter()
        .find(|p| p.exists())
        .expect("libmtgpu_emu_musa.so in target/<profile>/deps or target/<profile>");
    // SAFETY: the emulated libmusa's initialisers only set up Rust statics.
    unsafe { Library::new(&path) }.unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

fn exports(lib: &Library, name: &str) -> bool {
    let symbol = format!("{name}\0");
    // SAFETY: only the symbol's presence is checked; it is never called.
    unsafe { lib.get::<*const ()>(symbol.as_bytes()) }.is_ok()
}

#[test]
fn primary_ctx_release_is_exported_only_as_v2_like_real_libmusa() {
    let lib = emulated_libmusa();
    assert!(exports(&lib, "muDevicePrimaryCtxRelease_v2"));
    assert!(!exports(&lib, "muDevicePrimaryCtxRelease"));
}

#[test]
fn every_function_used_resolves_by_the_v2_rule() {
    let lib = emulated_libmusa();
    for function in [
        "muInit",
        "muDriverGetVersion",
        "muDeviceGetCount",
        "muDeviceGet",
        "muDeviceGetName",
        "muDeviceGetAttribute",
        "muDevicePrimaryCtxRetain",
        "muDevicePrimaryCtxRelease",
        "muCtxGetCurrent",
        "muCtxSetCurrent",
        "muMemAlloc",
        "muMemAllocManaged",
        "muMemFree",
        "muMemcpyHtoD",
        "muMemcpyDtoH",
        "muMemsetD8",
        "muPointerSetAttribute",
        "muMemGetHandleForAddressRange",
        "muGetErrorName",
        "muMemGetAllocationGranularity",
        "muMemCreate",
        "muMemRelease",
        "muMemAddressReserve",
        "muMemAddressFree",
        "muMemMap",
        "muMemUnmap",
        "muMemSetAccess",
    ] {
        // SAFETY: the pointer is only compared with null, never called.
        let found: Option<*const ()> = unsafe { gdrapi::musa::function(&lib, function) };
        assert!(found.is_some(), "{function} does not resolve");
    }
    // Where CUDA has a `_v2`, the rule takes it when the library exports it: the plain name
    // alone would not have been found.
    assert_eq!(
        gdrapi::musa::export_names("muDevicePrimaryCtxRelease")[0],
        "muDevicePrimaryCtxRelease_v2"
    );
}

#[test]
fn it_identifies_itself_as_emulated() {
    let lib = emulated_libmusa();
    assert!(exports(&lib, gdrapi::musa::EMULATED_MARKER));
    assert!(gdrapi::musa::is_emulated(&lib));
}
