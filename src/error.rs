//! The engine's error type: every variant names the file, tensor, key or argument at fault and
//! what was expected, so a user knows what to fix.

use std::fmt;
use std::path::{Path, PathBuf};

/// Engine error.
#[derive(Debug)]
pub enum Error {
    /// A backend op failed (shape mismatch, device failure).
    Backend(sparkling_core::Error),
    /// A file could not be read or parsed: `path` and what went wrong.
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        msg: String,
    },
    /// A config key is missing or has the wrong type/value.
    Config {
        /// The config file.
        path: PathBuf,
        /// The key.
        key: String,
        /// What was expected.
        msg: String,
    },
    /// A tensor is missing, has the wrong shape or an unsupported dtype.
    Tensor {
        /// The checkpoint file or directory.
        path: PathBuf,
        /// The tensor name.
        name: String,
        /// What was expected.
        msg: String,
    },
    /// The user's input (prompt, CLI argument) is not acceptable.
    Input(String),
    /// Tokenizer failure.
    Tokenizer(String),
}

impl Error {
    /// Build an [`Error::File`].
    pub fn file(path: &Path, msg: impl Into<String>) -> Self {
        Error::File { path: path.to_path_buf(), msg: msg.into() }
    }
    /// Build an [`Error::Config`].
    pub fn config(path: &Path, key: &str, msg: impl Into<String>) -> Self {
        Error::Config { path: path.to_path_buf(), key: key.to_string(), msg: msg.into() }
    }
    /// Build an [`Error::Tensor`].
    pub fn tensor(path: &Path, name: &str, msg: impl Into<String>) -> Self {
        Error::Tensor { path: path.to_path_buf(), name: name.to_string(), msg: msg.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Backend(e) => write!(f, "{e}"),
            Error::File { path, msg } => write!(f, "{}: {msg}", path.display()),
            Error::Config { path, key, msg } => write!(f, "{}: config key `{key}`: {msg}", path.display()),
            Error::Tensor { path, name, msg } => write!(f, "{}: tensor `{name}`: {msg}", path.display()),
            Error::Input(m) => write!(f, "{m}"),
            Error::Tokenizer(m) => write!(f, "tokenizer: {m}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<sparkling_core::Error> for Error {
    fn from(e: sparkling_core::Error) -> Self {
        Error::Backend(e)
    }
}

/// Result alias of the engine.
pub type Result<T> = std::result::Result<T, Error>;
