//! The `--budget auto` cost model cache: one JSON file per target × backend × threads ×
//! weight format × engine build under `$SPARKLING_ASSETS/costs/`, written atomically (`fsio::write_bytes`).
//! A missing, unreadable or too-small entry is re-measured by the engine on first use.

use super::load::ModelArgs;
use sparkling::decode::budget::CostModel;
use sparkling::decode::GenParams;
use std::path::{Path, PathBuf};

/// The cache file of this target (path and size), backend (`Backend::name`, which names the
/// kernel path), rayon thread count, `--weights` and engine build (so a rebuilt engine, whose
/// kernels may cost something else, measures its own curve).
pub fn cache_path(model: &ModelArgs, target: &Path, backend_name: &str) -> PathBuf {
    let canon = std::fs::canonicalize(target).unwrap_or_else(|_| target.to_path_buf());
    let size = std::fs::metadata(&canon).map(|m| m.len()).unwrap_or(0);
    let threads = rayon::current_num_threads();
    let key = format!("{}|{size}|{backend_name}|{threads}|{}|{}", canon.display(), model.weights.name(), engine_build());
    // FNV-1a: a stable name, no dependency.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let stem: String = target
        .file_stem()
        .map(|s| s.to_string_lossy().chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect())
        .unwrap_or_else(|| "target".into());
    let backend: String = backend_name.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
    sparkling::assets::dir().join("costs").join(format!("{stem}-{backend}-t{threads}-{}-{h:016x}.json", model.weights.name()))
}

/// This engine's build: version, and the executable's size and modification time (empty parts
/// where the platform does not say).
fn engine_build() -> String {
    let exe = std::env::current_exe().ok().and_then(|p| std::fs::metadata(p).ok());
    let size = exe.as_ref().map(|m| m.len()).unwrap_or(0);
    let mtime = exe.and_then(|m| m.modified().ok()).and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{}:{size}:{mtime}", env!("CARGO_PKG_VERSION"))
}

/// The cached model at `path` when it exists, parses and covers trees of `n_max` nodes.
pub fn load(path: &Path, n_max: usize) -> Option<CostModel> {
    // A pipe or device here would block (issue 15 trial): only a regular file is a cache entry.
    sparkling::loader::bytes::regular_file(path, "a cost-cache file").ok()?;
    let text = std::fs::read_to_string(path).ok()?;
    let c: CostModel = serde_json::from_str(&text).ok()?;
    (c.is_valid() && c.max_rows() > n_max).then_some(c)
}

/// Write `c` to `path` atomically (creating `costs/`); failures are a note, not an error.
/// A symbolic link found at `path` is replaced, never written through: the cache names its own
/// files, and a link planted there must not turn a cache update into a write elsewhere (issue 15).
pub fn save(path: &Path, c: &CostModel) {
    let r = path
        .parent()
        .map_or(Ok(()), |d| std::fs::create_dir_all(d).map_err(|e| sparkling::Error::file(d, e.to_string())))
        .and_then(|_| match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => {
                std::fs::remove_file(path).map_err(|e| sparkling::Error::file(path, format!("a symbolic link in the cost cache cannot be removed: {e}")))
            }
            _ => Ok(()),
        })
        .and_then(|_| sparkling::fsio::write_bytes(path, serde_json::to_string_pretty(c).unwrap_or_default().as_bytes()));
    match r {
        Ok(()) => eprintln!("budget auto: cost model measured in {:.0} ms, cached in {}", c.measure_ms, path.display()),
        Err(e) => eprintln!("note: budget auto: cannot cache the cost model: {e}"),
    }
}

/// Under `--budget auto`, give `p` the cached cost model (if any).
pub fn attach(p: &mut GenParams, path: &Path) {
    if let Some(a) = p.auto_budget.as_mut() {
        if a.cost.is_none() {
            a.cost = load(path, p.tree.budget);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 15 trial: a symbolic link planted in the cost cache is replaced by the entry; the
    /// file it pointed to is untouched.
    #[cfg(unix)]
    #[test]
    fn a_symlink_in_the_cost_cache_is_replaced_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim.txt");
        std::fs::write(&victim, "keep me").unwrap();
        let entry = dir.path().join("costs").join("entry.json");
        std::fs::create_dir_all(entry.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&victim, &entry).unwrap();
        let c = CostModel::from_points(vec![1, 2, 3], vec![1.0, 1.5, 2.0], 0.5);
        save(&entry, &c);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
        assert!(std::fs::symlink_metadata(&entry).unwrap().file_type().is_file());
        assert_eq!(load(&entry, 2).map(|m| m.max_rows()), Some(c.max_rows()));
    }
}
