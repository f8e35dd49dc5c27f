//! Bad input gives an error naming the file / tensor / key and what was expected — never a
//! panic (issue 2).

mod common;

use common::*;
use sparkling::cpu::CpuBackend;
use sparkling::decode::{Engine, Method, Models};
use sparkling::loader::open_source;
use sparkling::model::config::{read_json, Arch, DrafterConfig, DrafterKind, TargetConfig};
use sparkling::model::drafter::Drafter;
use sparkling::model::synth::{tiny_target_config, write_random_drafter, write_random_target, DrafterInit, StoreDtype};
use sparkling::model::target::Target;
use std::path::Path;

fn try_load_target(dir: &Path) -> sparkling::Result<Target<CpuBackend>> {
    let (cp, v) = read_json(dir)?;
    let cfg = TargetConfig::from_hf_json(&cp, &v)?;
    let src = open_source(dir)?;
    Target::load(&CpuBackend::new(), src.as_ref(), cfg, &|_, _| {})
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(v.as_object_mut().unwrap());
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
}

fn write_target(arch: Arch, vocab: usize) -> tempfile::TempDir {
    let d = tmpdir("bad");
    write_random_target(d.path(), &tiny_target_config(arch, vocab), 1, StoreDtype::Bf16).unwrap();
    d
}

#[test]
fn truncated_safetensors_names_the_file() {
    let d = write_target(Arch::Qwen3, 32);
    let f = d.path().join("model.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    let e = try_load_target(d.path()).err().expect("must fail").to_string();
    assert!(e.contains("model.safetensors") && e.contains("truncated"), "{e}");
}

#[test]
fn wrong_tensor_shape_names_tensor_and_shapes() {
    let d = write_target(Arch::Llama, 32);
    edit_config(d.path(), |c| {
        c.insert("intermediate_size".into(), 96.into());
    });
    let e = try_load_target(d.path()).err().expect("must fail").to_string();
    assert!(e.contains("model.layers.0.mlp.gate_proj.weight") && e.contains("[96, 64]") && e.contains("[128, 64]"), "{e}");
}

#[test]
fn missing_config_key_is_named() {
    let d = write_target(Arch::Qwen2, 32);
    edit_config(d.path(), |c| {
        c.remove("num_hidden_layers");
    });
    let e = try_load_target(d.path()).err().expect("must fail").to_string();
    assert!(e.contains("config.json") && e.contains("num_hidden_layers"), "{e}");
}

#[test]
fn unknown_tensor_is_refused() {
    let d = write_target(Arch::Qwen3, 32);
    edit_config(d.path(), |c| {
        c.insert("num_hidden_layers".into(), 3.into());
    });
    let e = try_load_target(d.path()).err().expect("must fail").to_string();
    assert!(e.contains("model.layers.3.") && e.contains("unexpected tensor"), "{e}");
}

#[test]
fn unsupported_rope_type_is_refused() {
    let d = write_target(Arch::Qwen3, 32);
    edit_config(d.path(), |c| {
        c.insert("rope_scaling".into(), serde_json::json!({"rope_type": "yarn", "factor": 4.0}));
    });
    let e = try_load_target(d.path()).err().expect("must fail").to_string();
    assert!(e.contains("rope_scaling") && e.contains("yarn"), "{e}");
}

fn drafter_against(target_cfg: &TargetConfig, drafter_for: &TargetConfig) -> String {
    let d = tmpdir("drafter");
    let init = DrafterInit { kind: DrafterKind::DSpark, layers: 1, block_size: 7, markov_rank: 4, taps: 2, mask_token_id: None, confidence_head: true };
    write_random_drafter(d.path(), drafter_for, &init, 1, StoreDtype::F32).unwrap();
    let (cp, v) = read_json(d.path()).unwrap();
    let cfg = DrafterConfig::from_hf_json(&cp, &v).unwrap();
    let src = open_source(d.path()).unwrap();
    Drafter::<CpuBackend>::load(&CpuBackend::new(), src.as_ref(), cfg, target_cfg).err().expect("must fail").to_string()
}

#[test]
fn drafter_that_does_not_fit_the_target() {
    let t = tiny_target_config(Arch::Qwen3, 32);
    let e = drafter_against(&t, &tiny_target_config(Arch::Qwen3, 40));
    assert!(e.contains("vocab_size") && e.contains("40") && e.contains("32"), "{e}");
    let mut wide = t.clone();
    wide.hidden = 80;
    let e = drafter_against(&t, &wide);
    assert!(e.contains("hidden_size") && e.contains("80") && e.contains("64"), "{e}");
}

#[test]
fn empty_prompt_and_too_long_prompt() {
    let d = write_target(Arch::Qwen3, 32);
    edit_config(d.path(), |c| {
        c.insert("max_position_embeddings".into(), 24.into());
    });
    let t = try_load_target(d.path()).unwrap();
    let b = CpuBackend::new();
    let e = Engine { backend: &b, target: &t, drafter: None };
    let err = e.generate(&[], &params(Method::Ar, 1, 0.0, 0, 4, vec![]), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("empty prompt"), "{err}");
    let long: Vec<u32> = (0..20).collect();
    let err = e.generate(&long, &params(Method::Ar, 1, 0.0, 0, 8, vec![]), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("20 tokens") && err.contains("context of 24"), "{err}");
    let err = e.generate(&[1, 99], &params(Method::Ar, 1, 0.0, 0, 8, vec![]), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("99") && err.contains("vocabulary"), "{err}");
    let err = e.generate(&[1, 2], &params(Method::Sparkling, 8, 0.0, 0, 8, vec![]), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("needs a DSpark drafter"), "{err}");
}

/// The one loaded-model type (CLI and browser): a method without its drafter kind is an error
/// listing the loaded kinds; a drafter of the same kind replaces the earlier one.
#[test]
fn models_pick_replace_and_report_missing_drafters() {
    let t = tiny_target_config(Arch::Qwen3, 32);
    let b = CpuBackend::new();
    let target = {
        let d = tmpdir("models");
        write_random_target(d.path(), &t, 1, StoreDtype::F32).unwrap();
        try_load_target(d.path()).unwrap()
    };
    let drafter = |kind: DrafterKind, block: usize| {
        let d = tmpdir("models-drafter");
        let init = DrafterInit { kind, layers: 1, block_size: block, markov_rank: 4, taps: 2, mask_token_id: None, confidence_head: false };
        write_random_drafter(d.path(), &t, &init, 1, StoreDtype::F32).unwrap();
        let (cp, v) = read_json(d.path()).unwrap();
        let src = open_source(d.path()).unwrap();
        Drafter::<CpuBackend>::load(&b, src.as_ref(), DrafterConfig::from_hf_json(&cp, &v).unwrap(), &t).unwrap()
    };
    let mut m = Models::new(target);
    assert!(m.engine(&b, Method::Ar).unwrap().drafter.is_none());
    let err = m.engine(&b, Method::Sparkling).err().expect("no drafter loaded").to_string();
    assert!(err.contains("`sparkling` needs a DSpark drafter; loaded: []"), "{err}");
    m.add_drafter(drafter(DrafterKind::DFlash, 4));
    let err = m.engine(&b, Method::DSpark).err().expect("only DFlash loaded").to_string();
    assert!(err.contains("loaded: [DFlash]"), "{err}");
    assert_eq!(m.engine(&b, Method::DDTree).unwrap().drafter.map(|d| d.cfg.block_size), Some(4));
    m.add_drafter(drafter(DrafterKind::DSpark, 5));
    m.add_drafter(drafter(DrafterKind::DFlash, 6));
    assert_eq!(m.drafters.len(), 2, "same kind replaces");
    assert_eq!(m.engine(&b, Method::DFlash).unwrap().drafter.map(|d| d.cfg.block_size), Some(6));
    assert_eq!(m.engine(&b, Method::TreeSpark).unwrap().drafter.map(|d| d.cfg.block_size), Some(5));
}

/// Issue 15 trial: config values that were accepted and ignored are errors naming key and value.
#[test]
fn config_values_of_the_wrong_kind_are_errors_naming_the_key() {
    for (key, value, want) in [
        ("eos_token_id", serde_json::json!(-1), "-1 is not a token id"),
        ("eos_token_id", serde_json::json!("x"), "is not a token id"),
        ("eos_token_id", serde_json::json!([1, 4294967296u64]), "4294967296 is not a token id"),
        ("bos_token_id", serde_json::json!(500), "500 is outside the vocabulary"),
        ("tie_word_embeddings", serde_json::json!("yes"), "is not true or false"),
        ("use_sliding_window", serde_json::json!(true), "sliding-window attention is not supported"),
        ("num_attention_heads", serde_json::json!(-4), "-4 is not a non-negative integer"),
        ("num_attention_heads", serde_json::json!(4.5), "4.5 is not a non-negative integer"),
    ] {
        let d = write_target(Arch::Qwen3, 32);
        edit_config(d.path(), |c| {
            c.insert(key.into(), value.clone());
        });
        let e = try_load_target(d.path()).err().unwrap_or_else(|| panic!("{key} = {value} must be refused")).to_string();
        assert!(e.contains(key) && e.contains(want), "{key} = {value}: {e}");
    }
}

#[test]
fn absurd_layer_count_is_refused_before_allocating() {
    // Issue 15: 1e9 layers used to allocate until the process was killed.
    let d = write_target(Arch::Qwen3, 32);
    edit_config(d.path(), |c| {
        c.insert("num_hidden_layers".into(), 1_000_000_000u64.into());
    });
    let e = try_load_target(d.path()).err().expect("must fail").to_string();
    assert!(e.contains("num_hidden_layers") && e.contains("1000000000") && e.contains("only 4 layers"), "{e}");
}

#[test]
fn config_values_are_validated_naming_file_key_and_value() {
    let cases: [(&str, serde_json::Value, &str); 9] = [
        ("num_attention_heads", 0.into(), "positive"),
        ("hidden_size", 0.into(), "positive"),
        ("vocab_size", 0.into(), "positive"),
        ("intermediate_size", 0.into(), "positive"),
        ("rms_norm_eps", 0.0.into(), "> 0"),
        ("rms_norm_eps", (-1e-6).into(), "> 0"),
        ("rope_theta", 0.0.into(), "> 0"),
        ("max_position_embeddings", 0.into(), "positive"),
        ("hidden_size", (1u64 << 40).into(), "≤"),
    ];
    for (key, val, expect) in cases {
        let d = write_target(Arch::Qwen3, 32);
        let shown = val.to_string();
        edit_config(d.path(), |c| {
            c.insert(key.into(), val);
        });
        let e = try_load_target(d.path()).err().expect("must fail").to_string();
        assert!(e.contains("config.json") && e.contains(key) && e.contains(expect), "{key} = {shown}: {e}");
    }
    // Heads that do not divide the hidden size when head_dim is derived.
    let d = write_target(Arch::Llama, 32);
    edit_config(d.path(), |c| {
        c.remove("head_dim");
        c.insert("num_attention_heads".into(), 5.into());
        c.insert("num_key_value_heads".into(), 5.into());
    });
    let e = try_load_target(d.path()).err().expect("must fail").to_string();
    assert!(e.contains("num_attention_heads") && e.contains("does not divide"), "{e}");
}

#[test]
fn non_finite_weights_are_an_error() {
    let d = tmpdir("nan");
    write_random_target(d.path(), &tiny_target_config(Arch::Qwen3, 32), 1, StoreDtype::F32).unwrap();
    let f = d.path().join("model.safetensors");
    let mut b = std::fs::read(&f).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let at = 8 + n + 4 * 3; // the fourth value of the first tensor in file order
    b[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&f, b).unwrap();
    let e = try_load_target(d.path()).err().expect("must fail").to_string();
    assert!(e.contains("model.safetensors") || e.contains(&d.path().display().to_string()), "{e}");
    assert!(e.contains("not finite") && e.contains("index 3"), "{e}");
}

/// Issue 15 trial: a BPE merge whose parts or result are not in the vocabulary made the
/// `tokenizers` crate panic while encoding; it is an error at load, naming the merge.
#[test]
fn tokenizer_with_a_merge_outside_the_vocabulary_is_an_error() {
    let vocab: serde_json::Map<String, serde_json::Value> = (32u8..127).map(|c| ((c as char).to_string(), serde_json::json!(c - 32))).collect();
    let tok = |merges: serde_json::Value| {
        serde_json::json!({"version": "1.0", "added_tokens": [], "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
            "model": {"type": "BPE", "vocab": vocab.clone(), "merges": merges}})
        .to_string()
    };
    let e =
        sparkling::tokenizer::TextTokenizer::from_json(&tok(serde_json::json!(["a b"])), None).err().expect("merge `ab` is not in the vocabulary").to_string();
    assert!(e.contains("merge 0") && e.contains("`ab`"), "{e}");
    let t = sparkling::tokenizer::TextTokenizer::from_json(&tok(serde_json::json!([])), None).unwrap();
    assert_eq!(t.encode_raw("hi").unwrap(), vec![72, 73]);
}
