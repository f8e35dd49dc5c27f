//! The on-disk training cache written by `gen-data` and read by `train`.
//!
//! One directory per (target, tap layers, top-k): `meta.json` ([`CacheMeta`]) plus one file per
//! answered prompt, `seq-NNNNN.bin` (NNNNN = the prompt's line index in its source file).
//! Sequence file layout, little-endian:
//!
//! | field | type | meaning |
//! |---|---|---|
//! | magic | `b"SPKD"` | file type |
//! | version | u32 | [`VERSION`] |
//! | id, prompt_len, n_tokens, width, topk | 5 × u32 | `width = n_taps * H` |
//! | tokens | `n_tokens` × u32 | prompt (chat template) + the target's greedy answer |
//! | taps | `n_tokens × width` × f16 | raw residual outputs of the tap layers, listed order (reference §1.4) |
//! | top ids | `(n_tokens - prompt_len) × topk` × u32 | row `i`: the target's top-k ids for the token at position `prompt_len + i` (logits of position `prompt_len + i - 1`) |
//! | top logp | same × f32 | their log-probabilities under the full softmax (so a row sums to ≤ 1 in probability) |
//!
//! Files are written to a temporary name and renamed, so a killed run leaves no half file.

use crate::error::{io, Error, Result};
use half::f16;
use std::path::{Path, PathBuf};

/// File-format version of `seq-*.bin`.
pub const VERSION: u32 = 1;
const MAGIC: &[u8; 4] = b"SPKD";

/// What a cache directory holds (`meta.json`); `gen-data` refuses to extend a cache whose
/// meta differs from its own settings.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CacheMeta {
    /// Target file the data came from (informational).
    pub target: String,
    /// Target decoder layers.
    pub target_layers: usize,
    /// Target hidden size H.
    pub hidden: usize,
    /// Target vocabulary size V.
    pub vocab: usize,
    /// Tapped target layers, in concatenation order.
    pub tap_layers: Vec<usize>,
    /// Top-k logits kept per position.
    pub topk: usize,
    /// Prompt source file (informational).
    pub source: String,
    /// Maximum new tokens per answer.
    pub max_new_tokens: usize,
    /// The target's weight storage on the CPU (`native`, `q8_0`, `f16`, `f32`): a GGUF target
    /// kept in its 4-bit blocks answers (and taps) differently from the same file widened to
    /// f16, so one cache holds one of them. `None` in caches written before it was recorded.
    #[serde(default)]
    pub weights: Option<String>,
}

impl CacheMeta {
    /// Read `dir/meta.json`; `Ok(None)` when absent.
    pub fn read(dir: &Path) -> Result<Option<CacheMeta>> {
        let p = dir.join("meta.json");
        if !p.exists() {
            return Ok(None);
        }
        sparkling::loader::bytes::regular_file(&p, "a run or cache file")?;
        let text = std::fs::read_to_string(&p).map_err(|e| io(&p, e))?;
        serde_json::from_str(&text).map(Some).map_err(|e| Error::file(&p, format!("invalid cache meta: {e}")))
    }

    /// Write `dir/meta.json` (creating `dir`).
    pub fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let p = dir.join("meta.json");
        let text = serde_json::to_string_pretty(self).map_err(|e| Error::file(&p, e))?;
        Ok(sparkling::fsio::write_bytes(&p, text.as_bytes())?)
    }

    /// Width of one tap row, `n_taps * H`.
    pub fn width(&self) -> usize {
        self.tap_layers.len() * self.hidden
    }
}

/// One cached sequence (see the module doc for the meaning of each field).
#[derive(Debug, Clone, PartialEq)]
pub struct Sequence {
    /// Prompt index in the source file.
    pub id: u32,
    /// Prompt tokens at the start of `tokens`.
    pub prompt_len: usize,
    /// Prompt + answer token ids.
    pub tokens: Vec<u32>,
    /// Tap row width `n_taps * H`.
    pub width: usize,
    /// Tapped hidden states `[tokens.len(), width]`, f16.
    pub taps: Vec<f16>,
    /// Top-k kept per answer position.
    pub topk: usize,
    /// `[tokens.len() - prompt_len, topk]` ids.
    pub top_ids: Vec<u32>,
    /// `[tokens.len() - prompt_len, topk]` log-probabilities.
    pub top_logp: Vec<f32>,
}

impl Sequence {
    /// Number of tokens (prompt + answer).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the sequence has no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The target's top-k (ids, log-probs) for the token at absolute position `pos`
    /// (`prompt_len ≤ pos < len`), else `None`.
    pub fn topk_at(&self, pos: usize) -> Option<(&[u32], &[f32])> {
        if pos < self.prompt_len || pos >= self.len() {
            return None;
        }
        let r = pos - self.prompt_len;
        Some((&self.top_ids[r * self.topk..(r + 1) * self.topk], &self.top_logp[r * self.topk..(r + 1) * self.topk]))
    }

    /// Tap rows `lo..hi` widened to f32 (`[(hi-lo), width]`).
    pub fn taps_f32(&self, lo: usize, hi: usize) -> Vec<f32> {
        self.taps[lo * self.width..hi * self.width].iter().map(|v| v.to_f32()).collect()
    }

    /// The same sequence with only the taps `idx` (indices into its tap layers, each of width
    /// `hidden`), in that order: `[len, idx.len() * hidden]`.
    pub fn select_taps(self, idx: &[usize], hidden: usize) -> Sequence {
        let n = self.len();
        let mut taps = Vec::with_capacity(n * idx.len() * hidden);
        for r in 0..n {
            let row = &self.taps[r * self.width..(r + 1) * self.width];
            for &i in idx {
                taps.extend_from_slice(&row[i * hidden..(i + 1) * hidden]);
            }
        }
        Sequence { width: idx.len() * hidden, taps, ..self }
    }

    /// Check internal consistency; the error names `path`.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let n = self.len();
        let bad = |m: String| Err(Error::file(path, m));
        if self.prompt_len == 0 || self.prompt_len > n {
            return bad(format!("prompt length {} for {n} tokens", self.prompt_len));
        }
        if self.taps.len() != n * self.width {
            return bad(format!("{} tap values for {n} × {}", self.taps.len(), self.width));
        }
        let rows = n - self.prompt_len;
        if self.top_ids.len() != rows * self.topk || self.top_logp.len() != rows * self.topk {
            return bad(format!("top-k arrays do not hold {rows} × {}", self.topk));
        }
        Ok(())
    }

    /// Serialize (format in the module doc).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(28 + self.tokens.len() * 4 + self.taps.len() * 2 + self.top_ids.len() * 8);
        b.extend_from_slice(MAGIC);
        for v in [VERSION, self.id, self.prompt_len as u32, self.tokens.len() as u32, self.width as u32, self.topk as u32] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        self.tokens.iter().for_each(|t| b.extend_from_slice(&t.to_le_bytes()));
        self.taps.iter().for_each(|t| b.extend_from_slice(&t.to_le_bytes()));
        self.top_ids.iter().for_each(|t| b.extend_from_slice(&t.to_le_bytes()));
        self.top_logp.iter().for_each(|t| b.extend_from_slice(&t.to_le_bytes()));
        b
    }

    /// Parse bytes written by [`Sequence::to_bytes`]; errors name `path`.
    pub fn from_bytes(path: &Path, b: &[u8]) -> Result<Self> {
        let short = || Error::file(path, "truncated training-cache file");
        if b.len() < 28 || &b[..4] != MAGIC {
            return Err(Error::file(path, "not a sparkling training-cache file (bad magic)"));
        }
        let u = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if u(4) != VERSION {
            return Err(Error::file(path, format!("cache format version {} (this build reads {VERSION})", u(4))));
        }
        let (id, prompt_len, n, width, topk) = (u(8), u(12) as usize, u(16) as usize, u(20) as usize, u(24) as usize);
        let rows = n.checked_sub(prompt_len).ok_or_else(|| Error::file(path, format!("prompt length {prompt_len} > {n} tokens")))?;
        let need = 28usize
            .checked_add(n * 4)
            .and_then(|x| x.checked_add(n.checked_mul(width)?.checked_mul(2)?))
            .and_then(|x| x.checked_add(rows.checked_mul(topk)?.checked_mul(8)?))
            .ok_or_else(short)?;
        if b.len() != need {
            return Err(Error::file(path, format!("size {} bytes, header implies {need}", b.len())));
        }
        let mut off = 28;
        let mut take = |len: usize| {
            let s = &b[off..off + len];
            off += len;
            s
        };
        let tokens = take(n * 4).chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let taps = take(n * width * 2).chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]])).collect();
        let top_ids = take(rows * topk * 4).chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let top_logp = take(rows * topk * 4).chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let s = Sequence { id, prompt_len, tokens, width, taps, topk, top_ids, top_logp };
        s.validate(path)?;
        Ok(s)
    }

    /// Write atomically to `dir/seq-NNNNN.bin` (a synced temporary sibling renamed into place,
    /// [`sparkling::fsio::write_bytes`]): a killed run leaves the complete file or none.
    pub fn write(&self, dir: &Path) -> Result<PathBuf> {
        let p = seq_path(dir, self.id);
        sparkling::fsio::write_bytes(&p, &self.to_bytes())?;
        Ok(p)
    }

    /// Read one sequence file.
    pub fn read(path: &Path) -> Result<Self> {
        sparkling::loader::bytes::regular_file(path, "a cache file")?;
        let b = std::fs::read(path).map_err(|e| io(path, e))?;
        Sequence::from_bytes(path, &b)
    }
}

/// Path of the file holding prompt `id`.
pub fn seq_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("seq-{id:05}.bin"))
}

/// The file names of every `seq-*.bin` in `dir`, sorted (by name: zero-padded ids sort by id).
/// A training run lists the cache once and freezes the list (`gen-data` may keep appending).
pub fn list(dir: &Path) -> Result<Vec<String>> {
    let rd = std::fs::read_dir(dir).map_err(|e| io(dir, e))?;
    let mut names: Vec<String> =
        rd.filter_map(|e| e.ok().and_then(|e| e.file_name().to_str().map(str::to_string))).filter(|n| n.starts_with("seq-") && n.ends_with(".bin")).collect();
    names.sort();
    Ok(names)
}

/// Read the sequence files `names` of `dir` (in that order) and check each against `meta`.
/// When `meta.tap_layers` is a subset of the layers the cache stores (its own `meta.json`), only
/// those taps are kept, in `meta`'s order (`train --use-taps`).
/// Errors name the file (missing, corrupt, or not matching `meta`).
pub fn load_files(dir: &Path, meta: &CacheMeta, names: &[String]) -> Result<Vec<Sequence>> {
    let stored = CacheMeta::read(dir)?.unwrap_or_else(|| meta.clone());
    let select: Option<Vec<usize>> = if stored.tap_layers == meta.tap_layers {
        None
    } else {
        let idx: Option<Vec<usize>> = meta.tap_layers.iter().map(|l| stored.tap_layers.iter().position(|s| s == l)).collect();
        Some(idx.ok_or_else(|| Error::file(&dir.join("meta.json"), format!("holds taps {:?}, not all of {:?}", stored.tap_layers, meta.tap_layers)))?)
    };
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        let p = dir.join(n);
        let mut s = Sequence::read(&p)?;
        if let Some(idx) = &select {
            if s.width != stored.width() {
                return Err(Error::file(&p, format!("width {} differs from meta.json ({})", s.width, stored.width())));
            }
            s = s.select_taps(idx, stored.hidden);
        }
        if s.width != meta.width() || s.topk != meta.topk {
            return Err(Error::file(&p, format!("width {} / top-k {} differ from meta.json ({} / {})", s.width, s.topk, meta.width(), meta.topk)));
        }
        if let Some(&t) = s.tokens.iter().find(|&&t| t as usize >= meta.vocab) {
            return Err(Error::file(&p, format!("token id {t} outside the vocabulary of {}", meta.vocab)));
        }
        out.push(s);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Sequence {
        Sequence {
            id: 7,
            prompt_len: 2,
            tokens: vec![1, 2, 3, 4],
            width: 3,
            taps: (0..12).map(|i| f16::from_f32(i as f32 * 0.5)).collect(),
            topk: 2,
            top_ids: vec![3, 9, 4, 8],
            top_logp: vec![-0.1, -2.0, -0.2, -3.0],
        }
    }

    #[test]
    fn round_trip_and_lookup() {
        let s = sample();
        let p = Path::new("x.bin");
        let back = Sequence::from_bytes(p, &s.to_bytes()).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.topk_at(3).unwrap().0, &[4, 8]);
        assert!(back.topk_at(1).is_none());
        assert_eq!(back.taps_f32(1, 2), vec![1.5, 2.0, 2.5]);
    }

    #[test]
    fn select_taps_keeps_the_listed_taps_in_order() {
        // Width 4 = two taps of hidden 2; row r holds 4r..4r+4 (× 0.5).
        let s = Sequence { width: 4, taps: (0..16).map(|i| f16::from_f32(i as f32)).collect(), ..sample() };
        let t = s.select_taps(&[1, 0], 2);
        assert_eq!(t.width, 4);
        assert_eq!(t.taps_f32(0, 2), vec![2.0, 3.0, 0.0, 1.0, 6.0, 7.0, 4.0, 5.0]);
        let u = t.select_taps(&[1], 2);
        assert_eq!(u.taps_f32(0, 4), vec![0.0, 1.0, 4.0, 5.0, 8.0, 9.0, 12.0, 13.0]);
    }

    #[test]
    fn corrupt_files_are_errors_naming_the_file() {
        let s = sample();
        let mut b = s.to_bytes();
        b.truncate(b.len() - 1);
        let e = Sequence::from_bytes(Path::new("dir/seq-00007.bin"), &b).unwrap_err().to_string();
        assert!(e.contains("seq-00007.bin"), "{e}");
        let e = Sequence::from_bytes(Path::new("f.bin"), b"nope").unwrap_err().to_string();
        assert!(e.contains("magic"), "{e}");
    }
}
