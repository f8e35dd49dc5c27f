//! Hugging Face hub ids (`Qwen/Qwen3-4B`) → a local snapshot directory in the standard HF cache
//! (`$HF_HOME/hub`, via the `hf-hub` crate). Files already in the cache are used without
//! network; missing files are downloaded where the network allows, and otherwise the error says
//! how to pass a local path instead.

use crate::error::{Error, Result};
use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo};
use std::path::{Path, PathBuf};

/// Whether `s` looks like a hub id (`owner/name`, no leading `.` or `/`, not an existing path).
pub fn looks_like_hub_id(s: &str) -> bool {
    let parts: Vec<&str> = s.split('/').collect();
    parts.len() == 2
        && parts.iter().all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)))
        && !s.starts_with('.')
        && !Path::new(s).exists()
}

/// The files an HF checkpoint directory needs: config, weights (single or sharded), tokenizer.
const WANTED: [&str; 3] = ["config.json", "tokenizer.json", "tokenizer_config.json"];

/// Resolve a hub id to its snapshot directory, downloading what is missing. Errors name the id
/// and say to pass a local directory when the hub cannot be reached.
pub fn resolve(id: &str) -> Result<PathBuf> {
    resolve_with(id, Cache::from_env(), ApiBuilder::from_env())
}

/// [`resolve`] with an explicit cache and client (tests point them at temporary places).
pub fn resolve_with(id: &str, cache: Cache, builder: ApiBuilder) -> Result<PathBuf> {
    let cached = cache.repo(Repo::model(id.to_string()));
    if let (Some(cfg), true) = (cached.get("config.json"), cached.get("model.safetensors").is_some() || cached.get("model.safetensors.index.json").is_some()) {
        if let Some(dir) = cfg.parent() {
            return Ok(dir.to_path_buf());
        }
    }
    let offline = |e: &dyn std::fmt::Display| {
        Error::Input(format!(
            "cannot fetch `{id}` from the Hugging Face hub ({e}); without network access, download the model elsewhere and pass its local directory (config.json + safetensors) or a .gguf file"
        ))
    };
    let api = builder.with_progress(true).build().map_err(|e| offline(&e))?;
    let repo = api.model(id.to_string());
    let config = repo.get("config.json").map_err(|e| offline(&e))?;
    for f in &WANTED[1..] {
        // Tokenizer files are optional (a --tokenizer can be given).
        let _ = repo.get(f);
    }
    match repo.get("model.safetensors") {
        Ok(_) => {}
        Err(_) => {
            let index = repo.get("model.safetensors.index.json").map_err(|e| offline(&e))?;
            let text = std::fs::read_to_string(&index).map_err(|e| Error::file(&index, e.to_string()))?;
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::file(&index, e.to_string()))?;
            let mut shards: Vec<String> =
                v.get("weight_map").and_then(|m| m.as_object()).map(|m| m.values().filter_map(|x| x.as_str().map(String::from)).collect()).unwrap_or_default();
            shards.sort();
            shards.dedup();
            for s in shards {
                repo.get(&s).map_err(|e| offline(&e))?;
            }
        }
    }
    config.parent().map(Path::to_path_buf).ok_or_else(|| Error::file(&config, "downloaded config has no parent directory"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_id_shapes() {
        assert!(looks_like_hub_id("Qwen/Qwen3-4B"));
        assert!(looks_like_hub_id("z-lab/Qwen3-4B-DFlash-b16"));
        assert!(!looks_like_hub_id("./model"));
        assert!(!looks_like_hub_id("/abs/path"));
        assert!(!looks_like_hub_id("a/b/c"));
        assert!(!looks_like_hub_id("model.gguf"));
    }

    #[test]
    fn unreachable_hub_says_to_pass_a_local_path() {
        // A closed local port and an empty cache: no real network is touched.
        let dir = tempdir("unreachable");
        let builder = ApiBuilder::new().with_cache_dir(dir.clone()).with_endpoint("http://127.0.0.1:9".into()).with_retries(0);
        let err = resolve_with("Qwen/Qwen3-4B", Cache::new(dir.clone()), builder).unwrap_err().to_string();
        assert!(err.contains("Qwen/Qwen3-4B") && err.contains("pass its local directory"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn cached_snapshot_is_used_without_network() {
        let dir = tempdir("cached");
        let repo = dir.join("models--org--tiny");
        let snap = repo.join("snapshots").join("abc123");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs").join("main"), "abc123").unwrap();
        std::fs::write(snap.join("config.json"), "{}").unwrap();
        std::fs::write(snap.join("model.safetensors"), "").unwrap();
        let builder = ApiBuilder::new().with_cache_dir(dir.clone()).with_endpoint("http://127.0.0.1:9".into()).with_retries(0);
        let got = resolve_with("org/tiny", Cache::new(dir.clone()), builder).unwrap();
        assert_eq!(got, snap);
        let _ = std::fs::remove_dir_all(dir);
    }

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sparkling-hub-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
