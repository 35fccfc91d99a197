//! libgdrapi/include/gdrapi.h
use std::path::Path;

use anyhow::Result;

pub fn header(_root: &Path) -> Result<String> {
    Ok(String::new())
}
