//! The bytes of a checkpoint file: memory-mapped from disk on native targets, or owned (a
//! buffer fetched by a browser, or built in memory by `model::synth`). Loaders read files only
//! through this type, so the same safetensors / GGUF parsers serve both.

use crate::error::{Error, Result};
use std::path::Path;

/// Check that `path` is a regular file (after following links) before opening it: opening a
/// named pipe blocks until a writer appears, and a device never ends (issue 15: a pipe named
/// `model.safetensors` or `config.json` inside a model directory hung the loader). `what`
/// names the expected file in the error.
pub fn regular_file(path: &Path, what: &str) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(m) if m.is_dir() => Err(Error::file(path, format!("is a directory: expected {what}"))),
        Ok(_) => Err(Error::file(path, format!("is not a regular file (a pipe or device?): expected {what}"))),
        Err(e) => Err(Error::file(path, format!("cannot open: {e}"))),
    }
}

/// Read-only bytes of one checkpoint file; derefs to `[u8]`.
pub enum FileBytes {
    /// A read-only memory map of a file (native targets only; `wasm32` has no file system).
    #[cfg(not(target_arch = "wasm32"))]
    Mapped(memmap2::Mmap),
    /// Bytes held in memory.
    Owned(Vec<u8>),
}

impl FileBytes {
    /// Map `path` read-only (native) or read it whole (`wasm32`, where `std::fs` reports the
    /// operation as unsupported — load from bytes there).
    /// Errors: [`Error::File`] naming the path when it cannot be opened, mapped or read.
    pub fn open(path: &Path) -> Result<FileBytes> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            regular_file(path, "a model file")?;
            let f = std::fs::File::open(path).map_err(|e| Error::file(path, format!("cannot open: {e}")))?;
            let meta = f.metadata().map_err(|e| Error::file(path, format!("cannot stat: {e}")))?;
            if meta.is_dir() {
                return Err(Error::file(path, "is a directory: expected a model file"));
            }
            let len = meta.len();
            if len == 0 {
                // Mapping an empty file fails on some systems; the parsers report "too small".
                return Ok(FileBytes::Owned(Vec::new()));
            }
            // SAFETY: the file is opened read-only and never written through the map. Files
            // changed by another process while mapped are outside what a loader can guard
            // against (as for every mmap-based model loader).
            let m = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| Error::file(path, format!("cannot map: {e}")))?;
            Ok(FileBytes::Mapped(m))
        }
        #[cfg(target_arch = "wasm32")]
        {
            std::fs::read(path)
                .map(FileBytes::Owned)
                .map_err(|e| Error::file(path, format!("cannot read (no file system in the browser: load checkpoints from bytes): {e}")))
        }
    }
}

impl std::fmt::Debug for FileBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileBytes({} bytes)", self.len())
    }
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            FileBytes::Mapped(m) => m,
            FileBytes::Owned(v) => v,
        }
    }
}
