//! The trainer's error type: a message that names the file, argument or tensor at fault.

use std::fmt;
use std::path::Path;

/// A trainer error (one human-readable message).
#[derive(Debug)]
pub struct Error(pub String);

/// Result alias of the trainer.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error about `path`.
    pub fn file(path: &Path, msg: impl fmt::Display) -> Self {
        Error(format!("{}: {msg}", path.display()))
    }
    /// An error about a command-line argument `--arg`.
    pub fn arg(arg: &str, msg: impl fmt::Display) -> Self {
        Error(format!("--{arg}: {msg}"))
    }
    /// Add context in front of the message.
    pub fn context(self, ctx: impl fmt::Display) -> Self {
        Error(format!("{ctx}: {}", self.0))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error(format!("candle: {e}"))
    }
}

impl From<sparkling::core::Error> for Error {
    fn from(e: sparkling::core::Error) -> Self {
        Error(e.to_string())
    }
}

impl From<sparkling::Error> for Error {
    fn from(e: sparkling::Error) -> Self {
        Error(e.to_string())
    }
}

/// Attach a path to an I/O error.
pub fn io(path: &Path, e: std::io::Error) -> Error {
    Error::file(path, e)
}
