//! Same soname as the real driver library, so programs load it by the name they use on hardware.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmusa.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
