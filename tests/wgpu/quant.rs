//! GGUF blocks kept quantized on wgpu (`--weights native`): every block format's matmul and
//! embedding against the loader's scalar dequantization (the CPU reference) on awkward shapes,
//! through both matmul kernels and split bindings; the stored bytes; bad input; and SmolLM2's
//! greedy tokens on native blocks against the CPU backend's.
use crate::common::*;
use crate::open;
use sparkling::loader::gguf::dequantize;
use sparkling_core::{ggml, Backend, Error, GgmlWeight, ReadBack};
use sparkling_wgpu::{MatmulKernel, WeightDtype, WeightStorage, WgpuBackend, WgpuOptions};

/// `(ggml type, values per block, bytes per block, byte offsets of the f16 scales)`.
const FORMATS: [(u32, usize, usize, &[usize]); 6] = [
    (ggml::Q8_0, 32, 34, &[0]),
    (ggml::Q4_0, 32, 18, &[0]),
    (ggml::Q4_1, 32, 20, &[0, 2]),
    (ggml::Q5_0, 32, 22, &[0]),
    (ggml::Q4_K, 256, 144, &[0, 2]),
    (ggml::Q6_K, 256, 210, &[208]),
];

/// `n` rows of `k` values of ggml type `t` as random blocks: random codes (every bit pattern,
/// the K-quants' packed 6-bit scales included) and f16 scales of either sign in [0.004, 0.05).
fn random_blocks(t: u32, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let &(_, values, block_bytes, halves) = FORMATS.iter().find(|f| f.0 == t).unwrap();
    let mut r = Rng(seed);
    let mut bytes: Vec<u8> = (0..n * k / values * block_bytes).map(|_| r.next_u64() as u8).collect();
    for block in bytes.chunks_exact_mut(block_bytes) {
        for &at in halves {
            let v = (0.004 + 0.046 * r.uniform()) * if r.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
            block[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
    }
    bytes
}

fn dequant(t: u32, bytes: &[u8], n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n * k];
    dequantize(t, bytes, n * k, &mut out).unwrap();
    out
}

fn native(kernel: MatmulKernel, max_binding_bytes: Option<u64>) -> Option<WgpuBackend> {
    open(&WgpuOptions { weight_dtype: WeightDtype::Native, matmul_kernel: kernel, max_binding_bytes, ..Default::default() }, "native weights")
}

/// `y = x·Wᵀ + b` in f64 and the bound `Σ|x·w|` per output (the documented matmul tolerance is
/// `2e-6·Σ|x·w|` against an f32 chain in another order).
fn reference(x: &[f32], w: &[f32], bias: &[f32], m: usize, n: usize, k: usize) -> (Vec<f32>, Vec<f32>) {
    let mut y = vec![0.0f32; m * n];
    let mut mag = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut a) = (bias[j] as f64, bias[j].abs() as f64);
            for c in 0..k {
                let p = x[i * k + c] as f64 * w[j * k + c] as f64;
                s += p;
                a += p.abs();
            }
            y[i * n + j] = s as f32;
            mag[i * n + j] = a as f32;
        }
    }
    (y, mag)
}

/// Every block format, K not a multiple of 256 (for the 32-value formats), N not a multiple of
/// any tile, M = 1..65, both matmul kernels: within the matmul
/// tolerance of the f64 product of the loader's dequantized values, and bit-identical to the
/// same backend's f32 matmul of those values (same fma chain, same dequantized numbers).
#[test]
fn every_block_format_matches_the_dequantized_reference() {
    let Some(f32b) = open(&WgpuOptions::default(), "f32 weights") else { return };
    let variants: Vec<(&str, WgpuBackend)> = [("direct", MatmulKernel::Direct), ("tiled", MatmulKernel::Tiled)]
        .into_iter()
        .filter_map(|(name, kern)| native(kern, None).map(|b| (name, b)))
        .collect();
    if variants.is_empty() {
        return;
    }
    let mut r = Rng(41);
    for (t, values, _, _) in FORMATS {
        let ks: Vec<usize> = if values == 32 { vec![224, 800] } else { vec![256, 768] };
        for k in ks {
            let n = 67;
            let bytes = random_blocks(t, n, k, t as u64 * 1000 + k as u64);
            let wf = dequant(t, &bytes, n, k);
            let bias = r.vec(n);
            let f32w = f32b.upload_weight(wf.clone(), n, k).unwrap();
            for m in [1usize, 2, 3, 4, 5, 17, 65] {
                let x = r.vec(m * k);
                let (want, mag) = reference(&x, &wf, &bias, m, n, k);
                let exact = f32b.download(&f32b.matmul(&f32b.upload(&x, m, k).unwrap(), &f32w, Some(&f32b.upload(&bias, 1, n).unwrap())).unwrap()).unwrap();
                for (name, b) in &variants {
                    let what = format!("ggml type {t}, [{m}, {k}] x [{n}, {k}]ᵀ, {name}");
                    let w = b.upload_weight_ggml(GgmlWeight { ggml_type: t, n, k, bytes: bytes.clone() }).unwrap();
                    assert!(matches!(w.storage(), WeightStorage::Quant(_)), "{what}: stored as {:?}", w.storage());
                    let got = b.download(&b.matmul(&b.upload(&x, m, k).unwrap(), &w, Some(&b.upload(&bias, 1, n).unwrap())).unwrap()).unwrap();
                    for i in 0..m * n {
                        assert!((got[i] - want[i]).abs() <= 2e-6 * mag[i] + 1e-7, "{what}: output {i}: {} vs {} (Σ|x·w| {})", got[i], want[i], mag[i]);
                    }
                    assert_bits(&format!("{what}: native vs f32 of the dequantized values"), &got, &exact);
                }
            }
        }
    }
}

/// Embedding rows of a quantized table (ids in several chunks under 16 KiB bindings) are the
/// dequantized rows, bit for bit.
#[test]
fn embedding_rows_of_a_quantized_table_are_the_dequantized_rows() {
    let Some(b) = native(MatmulKernel::Auto, Some(16384)) else { return };
    for (t, values, _, _) in FORMATS {
        let (n, k) = (600, 2 * values);
        let bytes = random_blocks(t, n, k, 7 + t as u64);
        let wf = dequant(t, &bytes, n, k);
        let w = b.upload_weight_ggml(GgmlWeight { ggml_type: t, n, k, bytes }).unwrap();
        assert!(w.n_chunks() > 1, "type {t}: 16 KiB bindings should split a [{n}, {k}] table");
        let ids = [0u32, 599, 3, 317, 43, 1];
        let got = b.download(&b.embedding(&w, &ids).unwrap()).unwrap();
        let want: Vec<f32> = ids.iter().flat_map(|&id| wf[id as usize * k..(id as usize + 1) * k].to_vec()).collect();
        assert_bits(&format!("embedding of ggml type {t}"), &got, &want);
    }
}

/// The stored bytes are the file's block bytes (rows a multiple of 4: no padding at all), and
/// `native` keeps f16 tensors and float matrices in f16.
#[test]
fn native_storage_costs_the_file_bytes() {
    let Some(b) = native(MatmulKernel::Auto, None) else { return };
    for (t, values, block_bytes, _) in FORMATS {
        let (n, k) = (64, 3 * values);
        let w = b.upload_weight_ggml(GgmlWeight { ggml_type: t, n, k, bytes: random_blocks(t, n, k, 3) }).unwrap();
        assert_eq!(b.weight_bytes(&w), n * k / values * block_bytes, "ggml type {t}");
        assert!(b.weight_kernel(&w).contains("dequantized in registers"), "{}", b.weight_kernel(&w));
    }
    let f16: Vec<u8> = (0..8 * 32).flat_map(|i| half::f16::from_f32(i as f32 * 0.125).to_le_bytes()).collect();
    let w = b.upload_weight_ggml(GgmlWeight { ggml_type: ggml::F16, n: 8, k: 32, bytes: f16 }).unwrap();
    assert_eq!(w.storage(), WeightStorage::F16);
    assert_eq!(b.download(&b.embedding(&w, &[7]).unwrap()).unwrap()[31], (7 * 32 + 31) as f32 * 0.125);
    assert_eq!(b.upload_weight(vec![0.5; 64], 2, 32).unwrap().storage(), WeightStorage::F16);
    assert!(b.accepts_ggml(ggml::Q4_K) && b.accepts_ggml(ggml::F16) && !b.accepts_ggml(13), "Q5_K has no prelude");
    let Some(f) = open(&WgpuOptions { weight_dtype: WeightDtype::F16, ..Default::default() }, "f16 weights") else { return };
    assert!(!f.accepts_ggml(ggml::Q4_K), "only `native` keeps blocks");
}

/// Blocks that do not fit the shape are refused with the sizes, never read out of bounds.
#[test]
fn malformed_blocks_are_refused() {
    let Some(b) = native(MatmulKernel::Auto, None) else { return };
    let g = |t: u32, n: usize, k: usize, bytes: Vec<u8>| b.upload_weight_ggml(GgmlWeight { ggml_type: t, n, k, bytes });
    let e = g(ggml::Q4_0, 2, 32, vec![0; 35]).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }) && e.to_string().contains("35 bytes") && e.to_string().contains("36"), "{e}");
    let e = g(ggml::Q4_K, 1, 128, vec![0; 72]).unwrap_err();
    assert!(e.to_string().contains("multiple of 256"), "{e}");
    assert!(matches!(g(13, 1, 256, vec![0; 176]), Err(Error::Unavailable(_))));
    assert!(matches!(g(ggml::F16, 2, 3, vec![0; 11]), Err(Error::Shape { .. })));
}

/// SmolLM2-135M-Instruct Q4_1 (Q4_1 matrices, a Q8_0 tied head) through [`follow_cpu_tokens`].
#[test]
fn smollm2_native_blocks_follow_the_cpu_tokens() {
    follow_cpu_tokens("smollm2-135m-instruct-q4_1.gguf", "smollm2");
}

/// Qwen2.5-Coder-0.5B-Instruct Q4_K_M (Q4_K, Q5_0, Q6_K and Q8_0 blocks, QKV biases, an
/// untied Q8_0 head) through [`follow_cpu_tokens`]; skipped unless fetched
/// (`scripts/fetch-assets qwen2.5-coder-0.5b`, not part of CI: minutes on lavapipe).
#[test]
fn qwen_coder_native_blocks_follow_the_cpu_tokens() {
    follow_cpu_tokens("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b");
}

/// A GGUF target on wgpu native blocks against the CPU backend on the same values (the
/// loader's dequantization, f32 arithmetic): greedy `ar` tokens equal on at least 4 of 5 chat
/// prompts × 32 tokens (summation orders differ, so a near-tie may go the
/// other way: the first divergence's position and the CPU's top-2 logit margin there are
/// printed). The weights a decode step reads stay within 1.1× the file's bytes of those tensors.
/// Skips (loudly) when the asset is missing.
fn follow_cpu_tokens(file: &str, fetch: &str) {
    use sparkling::cpu::{CpuBackend, WeightDtype as CpuDtype};
    use sparkling::decode::{Engine, Method};
    use sparkling::model::config::TargetConfig;
    use sparkling::model::target::{LogitRows, SeqInput, Target};
    use sparkling_core::AttnMask;
    let Some(path) = asset(file) else {
        eprintln!("SKIPPED {file} on wgpu native blocks: asset missing (scripts/fetch-assets {fetch})");
        return;
    };
    let Some(b) = native(MatmulKernel::Auto, None) else { return };
    let src = sparkling::loader::gguf_source::GgufSource::open(&path).expect("gguf");
    let cfg = TargetConfig::from_gguf(&src.file).expect("config");
    let tok = sparkling::tokenizer::TextTokenizer::from_gguf(&src.file).expect("tokenizer");
    let cpu = CpuBackend::with_weight_dtype(CpuDtype::F32);
    let t_cpu = Target::load(&cpu, &src, cfg.clone(), &|_, _| {}).expect("cpu target");
    let t_gpu = Target::load(&b, &src, cfg.clone(), &|_, _| {}).expect("wgpu target");

    let per_step = |name: &str| {
        name.starts_with("blk.")
            && ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"].iter().any(|t| name.ends_with(&format!(".{t}.weight")))
    };
    let head = if src.file.tensor("output.weight").is_some() { "output.weight" } else { "token_embd.weight" };
    let file_bytes: u64 = src.file.tensors.iter().filter(|t| per_step(&t.name) || t.name == head).map(|t| t.n_bytes()).sum();
    let stored = t_gpu.decode_weight_bytes(&b);
    eprintln!("{file} on wgpu native: {stored} bytes read per decode step, file {file_bytes} ({:.3}×)", stored as f64 / file_bytes as f64);
    assert!(stored as f64 <= 1.1 * file_bytes as f64, "{stored} stored bytes for {file_bytes} file bytes");

    let prompts =
        ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.", "Explain what a CPU does.", "Say hello in Spanish."];
    let mut equal = 0;
    for q in prompts {
        let prompt = tok.encode_chat(q, None).unwrap();
        let p = params(Method::Ar, 1, 0.0, 0, 32, vec![]);
        let a = Engine { backend: &cpu, target: &t_cpu, drafter: None }.generate(&prompt, &p, &mut |_| {}).unwrap().tokens;
        let g = Engine { backend: &b, target: &t_gpu, drafter: None }.generate(&prompt, &p, &mut |_| {}).unwrap().tokens;
        if a == g {
            equal += 1;
            continue;
        }
        let at = a.iter().zip(&g).position(|(x, y)| x != y).unwrap_or(a.len().min(g.len()));
        let mut ctx = prompt.clone();
        ctx.extend_from_slice(&a[..at]);
        let mut cache = t_cpu.new_cache(&cpu, ctx.len() + 1).unwrap();
        let pos: Vec<u32> = (0..ctx.len() as u32).collect();
        let seq = SeqInput { ids: &ctx, positions: &pos, mask: AttnMask::Causal, logits: Some(LogitRows::Last) };
        let mut top = cpu.download(&t_cpu.forward(&cpu, &mut cache, seq, &[]).unwrap().logits).unwrap();
        top.sort_by(|x, y| y.total_cmp(x));
        eprintln!("{q:?}: wgpu native diverges from cpu f32 at token {at} (cpu top-2 logit margin {:.4})", top[0] - top[1]);
    }
    assert!(equal >= 4, "{file}: only {equal} of 5 prompts gave the CPU's 32 greedy tokens on wgpu native blocks");
}
