//! The shared library's soname carries the API major version: consumers link against
//! `libgdrapi.so.1` and keep working across every 1.x.
fn main() {
    let major = env!("CARGO_PKG_VERSION_MAJOR");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libgdrapi.so.{major}");
    println!("cargo:rerun-if-changed=build.rs");
}
