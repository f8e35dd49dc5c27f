//! Kernel bench: matmul GFLOP/s, attention and selection-op times for SmolLM2-135M
//! decode / verify / draft shapes, the wgpu backend (lavapipe here, any adapter elsewhere) vs
//! the CPU backend.
//!
//! - matmul `x[M,576] · W[N,576]ᵀ`, f32 weights: `1×576·576×1536` (MLP up/gate at decode),
//!   `1×576·576×49152` (lm_head at decode), `65×576·576×1536` (a 64-node tree verify).
//!   Throughput is reported as elements/s with one element = one FLOP (2·M·N·K per call), so
//!   criterion's `Gelem/s` reads as GFLOP/s.
//! - attention, 9 query heads / 3 KV heads, head_dim 64, over 512 cached keys: 1 causal query
//!   (decode) and 65 tree queries (verify; random parents).
//!
//! - topk + log-sum-exp over 15 draft rows of V = 49152 (SmolLM2 vocab), k = 64 and 128;
//!   markov_table over n = 1000 candidates, ld = 15 depth rows, k = 64 children, Markov rank
//!   r = 32 (V = 49152); sample over 16 rows of V = 49152 at T = 1, top-p 0.9. These ops end in a
//!   read-back, so every wgpu call is timed including its sync (as the engine sees it). The
//!   wgpu rows run on both reduction paths: `wgpu` (subgroup kernels where the adapter has
//!   them) and `wgpu_nosg` (`Subgroups::Off`, the portable path).
//!
//! wgpu timings are pipelined: `iters` calls are recorded back to back and the clock stops
//! after one `synchronize()` (the engine also syncs once per round, not per op).
//! Run: `cargo bench --features wgpu --bench kernels` (on lavapipe: `scripts/install-lavapipe`;
//! `WGPU_ADAPTER_NAME` or `SPARKLING_BENCH_ADAPTER` picks another adapter). Without an adapter
//! only the CPU rows run.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sparkling::core::{AttnMask, AttnShape, Backend, ReadBack, SampleParams, NO_PARENT};
use sparkling::cpu::CpuBackend;
use sparkling::wgpu_backend::{Subgroups, WgpuBackend, WgpuOptions};
use std::hint::black_box;
use std::time::{Duration, Instant};

const MATMULS: [(usize, usize, usize); 3] = [(1, 576, 1536), (1, 576, 49152), (65, 576, 1536)];
const SHAPE: AttnShape = AttnShape { n_heads: 9, n_kv_heads: 3, head_dim: 64 };
const KEYS: usize = 512;

struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> f32 {
        let z = sparkling::decode::rng::splitmix64_next(&mut self.0);
        ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

fn wgpu_backend() -> Option<WgpuBackend> {
    let want = std::env::var("SPARKLING_BENCH_ADAPTER").ok();
    match WgpuBackend::new(want.as_deref()) {
        Ok(b) => {
            eprintln!("kernels bench: wgpu on {}", b.name());
            Some(b)
        }
        Err(e) => {
            eprintln!("kernels bench: no wgpu adapter ({e}); CPU rows only");
            None
        }
    }
}

fn bench_matmul(c: &mut Criterion) {
    let cpu = CpuBackend::new();
    let gpu = wgpu_backend();
    let mut r = SplitMix64(1);
    let mut group = c.benchmark_group("matmul");
    for (m, k, n) in MATMULS {
        let x = r.vec(m * k);
        let w = r.vec(n * k);
        group.throughput(Throughput::Elements((2 * m * n * k) as u64));
        let id = format!("{m}x{k}x{n}");
        let (cx, cw) = (cpu.upload(&x, m, k).unwrap(), cpu.upload_weight(w.clone(), n, k).unwrap());
        group.bench_function(format!("cpu/{id}"), |b| b.iter(|| black_box(cpu.matmul(&cx, &cw, None).unwrap())));
        if let Some(g) = &gpu {
            let (gx, gw) = (g.upload(&x, m, k).unwrap(), g.upload_weight(w, n, k).unwrap());
            group.bench_function(format!("wgpu/{id}"), |b| {
                b.iter_custom(|iters| {
                    g.synchronize().unwrap();
                    let t = Instant::now();
                    for _ in 0..iters {
                        black_box(g.matmul(&gx, &gw, None).unwrap());
                    }
                    g.synchronize().unwrap();
                    t.elapsed()
                })
            });
        }
    }
    group.finish();
}

fn bench_attention(c: &mut Criterion) {
    let cpu = CpuBackend::new();
    let gpu = wgpu_backend();
    let mut r = SplitMix64(2);
    let qc = SHAPE.n_heads * SHAPE.head_dim;
    let kvc = SHAPE.n_kv_heads * SHAPE.head_dim;
    let k = r.vec(KEYS * kvc);
    let v = r.vec(KEYS * kvc);
    // A 65-node tree: node i hangs under a pseudo-random earlier node.
    let parents: Vec<u32> = (0..65u32).map(|i| if i == 0 { NO_PARENT } else { (i * 7 + 3) % i }).collect();
    let mut group = c.benchmark_group("attention");
    for (name, t) in [("decode_1q", 1usize), ("tree_65q", 65)] {
        let q = r.vec(t * qc);
        let mask = if t == 1 { AttnMask::Causal } else { AttnMask::Tree { parents: &parents } };
        let (cq, ck, cv) = (cpu.upload(&q, t, qc).unwrap(), cpu.upload(&k, KEYS, kvc).unwrap(), cpu.upload(&v, KEYS, kvc).unwrap());
        group.bench_function(format!("cpu/{name}_{KEYS}k"), |b| b.iter(|| black_box(cpu.attention(&cq, &ck, &cv, KEYS, SHAPE, mask).unwrap())));
        if let Some(g) = &gpu {
            let (gq, gk, gv) = (g.upload(&q, t, qc).unwrap(), g.upload(&k, KEYS, kvc).unwrap(), g.upload(&v, KEYS, kvc).unwrap());
            group.bench_function(format!("wgpu/{name}_{KEYS}k"), |b| {
                b.iter_custom(|iters| {
                    g.synchronize().unwrap();
                    let t0 = Instant::now();
                    for _ in 0..iters {
                        black_box(g.attention(&gq, &gk, &gv, KEYS, SHAPE, mask).unwrap());
                    }
                    g.synchronize().unwrap();
                    t0.elapsed()
                })
            });
        }
    }
    group.finish();
}

/// The wgpu backends of the selection benches: `("wgpu", default)` and, when the default uses
/// subgroups, `("wgpu_nosg", Subgroups::Off)` too.
fn wgpu_paths() -> Vec<(&'static str, WgpuBackend)> {
    let Some(auto) = wgpu_backend() else { return Vec::new() };
    let sg = auto.uses_subgroups();
    eprintln!("kernels bench: subgroup kernels {}", if sg { "on (wgpu), off (wgpu_nosg)" } else { "unavailable" });
    let mut v = vec![("wgpu", auto)];
    if sg {
        let want = std::env::var("SPARKLING_BENCH_ADAPTER").ok();
        if let Ok(off) = WgpuBackend::with_options(&WgpuOptions { adapter: want, subgroups: Subgroups::Off, ..Default::default() }) {
            v.push(("wgpu_nosg", off));
        }
    }
    v
}

const SEL_ROWS: usize = 15;
const SEL_VOCAB: usize = 49152;

fn bench_topk(c: &mut Criterion) {
    let cpu = CpuBackend::new();
    let gpus = wgpu_paths();
    let mut r = SplitMix64(3);
    let x: Vec<f32> = r.vec(SEL_ROWS * SEL_VOCAB).iter().map(|v| v * 8.0).collect();
    let mut group = c.benchmark_group("topk");
    let cx = cpu.upload(&x, SEL_ROWS, SEL_VOCAB).unwrap();
    for k in [64usize, 128] {
        let id = format!("{SEL_ROWS}x{SEL_VOCAB}_k{k}");
        group.bench_function(format!("cpu/{id}"), |b| b.iter(|| black_box(cpu.topk(&cx, k).unwrap())));
        for (name, g) in &gpus {
            let gx = g.upload(&x, SEL_ROWS, SEL_VOCAB).unwrap();
            group.bench_function(format!("{name}/{id}"), |b| b.iter(|| black_box(g.topk(&gx, k).unwrap())));
        }
    }
    group.finish();
}

fn bench_markov_table(c: &mut Criterion) {
    let (n, ld, k, rank) = (1000usize, 15usize, 64usize, 32usize);
    let cpu = CpuBackend::new();
    let gpus = wgpu_paths();
    let mut r = SplitMix64(4);
    let base: Vec<f32> = r.vec(ld * SEL_VOCAB).iter().map(|v| v * 6.0).collect();
    let w1 = r.vec(SEL_VOCAB * rank);
    let w2 = r.vec(SEL_VOCAB * rank);
    // n distinct ascending candidate ids spread over the vocabulary.
    let cand: Vec<u32> = (0..n as u32).map(|i| i * (SEL_VOCAB / n) as u32 + (i * 7) % 13).collect();
    let mut group = c.benchmark_group("markov_table");
    let id = format!("n{n}_ld{ld}_k{k}_r{rank}");
    let (cb, c1, c2) = (cpu.upload(&base, ld, SEL_VOCAB).unwrap(), cpu.upload(&w1, SEL_VOCAB, rank).unwrap(), cpu.upload(&w2, SEL_VOCAB, rank).unwrap());
    group.bench_function(format!("cpu/{id}"), |b| b.iter(|| black_box(cpu.markov_table(&cb, Some((&c1, &c2)), &cand, k).unwrap())));
    for (name, g) in &gpus {
        let (gb, g1, g2) = (g.upload(&base, ld, SEL_VOCAB).unwrap(), g.upload(&w1, SEL_VOCAB, rank).unwrap(), g.upload(&w2, SEL_VOCAB, rank).unwrap());
        group.bench_function(format!("{name}/{id}"), |b| b.iter(|| black_box(g.markov_table(&gb, Some((&g1, &g2)), &cand, k).unwrap())));
    }
    group.finish();
}

fn bench_sample(c: &mut Criterion) {
    let rows = 16usize;
    let cpu = CpuBackend::new();
    let gpus = wgpu_paths();
    let mut r = SplitMix64(5);
    let x: Vec<f32> = r.vec(rows * SEL_VOCAB).iter().map(|v| v * 8.0).collect();
    let u: Vec<f32> = r.vec(rows).iter().map(|v| (v + 1.0) / 2.0).collect();
    let p = SampleParams { temperature: 1.0, top_k: 0, top_p: 0.9 };
    let mut group = c.benchmark_group("sample");
    let id = format!("{rows}x{SEL_VOCAB}_topp0.9");
    let cx = cpu.upload(&x, rows, SEL_VOCAB).unwrap();
    group.bench_function(format!("cpu/{id}"), |b| b.iter(|| black_box(cpu.sample(&cx, p, &u).unwrap())));
    for (name, g) in &gpus {
        let gx = g.upload(&x, rows, SEL_VOCAB).unwrap();
        group.bench_function(format!("{name}/{id}"), |b| b.iter(|| black_box(g.sample(&gx, p, &u).unwrap())));
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default().sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = kernels;
    config = config();
    targets = bench_matmul, bench_attention, bench_topk, bench_markov_table, bench_sample
}
criterion_main!(kernels);
