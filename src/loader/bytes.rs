//! The bytes of a checkpoint file: memory-mapped from disk on native targets, or owned (a
//! buffer fetched by a browser, or built in memory by `model::synth`). Loaders read files only
//! through this type, so the same safetensors / GGUF parsers serve both.

use crate::error::{Error, Result};
use std::path::Path;

/// Check that `path` is a regular file (after following links) before opening it: opening a
/// named pipe blocks until a writer appears, and a device never ends (a pipe named
/// `model.safetensors` or `config.json` inside a model directory would hang the loader). `what`
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

impl FileBytes {
    /// Tell the OS that bytes `start..start + len` will not be read again soon: a mapped
    /// file's pages in that range leave the process's resident set (`madvise(MADV_DONTNEED)`
    /// on a read-only file mapping: a later read faults them in again from the file, so every
    /// slice stays valid and equal). Owned bytes and other platforms: nothing. The loaders
    /// call it once a tensor is copied out, so a model's peak memory is about its uploaded
    /// weights, not weights + file. A range
    /// outside the bytes, or an OS that refuses the advice, changes nothing.
    pub fn release(&self, start: usize, len: usize) {
        #[cfg(all(unix, not(target_arch = "wasm32")))]
        if let FileBytes::Mapped(m) = self {
            if len > 0 && start.checked_add(len).is_some_and(|end| end <= m.len()) {
                // SAFETY: the map is read-only and file-backed (never written through), so
                // dropping its pages loses nothing: they are re-read from the file on access.
                let _ = unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) };
            }
        }
        let _ = (start, len);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_pages_read_back_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.bin");
        let data: Vec<u8> = (0..5 * 4096 + 123).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let f = FileBytes::open(&path).unwrap();
        assert_eq!(&f[..], &data[..]);
        // An unaligned range in the middle, the tail, then ranges past the end (ignored).
        f.release(4096 + 17, 2 * 4096);
        f.release(4 * 4096, 4096 + 123);
        f.release(data.len() - 1, 2);
        f.release(usize::MAX, 2);
        assert_eq!(&f[..], &data[..], "a released range reads back from the file");
    }
}
