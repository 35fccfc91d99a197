//! A generated file's contents, as the generators (codegen, identity, licences) return them.

use std::path::PathBuf;

pub struct Generated {
    pub path: PathBuf,
    pub contents: String,
}
