//! Where fetched assets live: `$SPARKLING_ASSETS`, default `$HOME/.cache/sparkling`
//! (filled by `scripts/fetch-assets`).

use std::path::PathBuf;

/// The assets directory.
pub fn dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SPARKLING_ASSETS") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("sparkling")
}

/// File name of the default target (SmolLM2-135M-Instruct, Q4_1 GGUF).
pub const DEFAULT_TARGET: &str = "smollm2-135m-instruct-q4_1.gguf";

/// Path of an asset by file name.
pub fn path(name: &str) -> PathBuf {
    dir().join(name)
}
