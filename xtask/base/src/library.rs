//! libgdrapi's file names.

/// The library's package version, which names its real file.
pub fn gdrapi_version() -> &'static str {
    gdrapi::VERSION
}

/// `libgdrapi.so.<major>`.
pub fn soname() -> String {
    format!("libgdrapi.so.{}", gdrapi::GDR_API_MAJOR_VERSION)
}
