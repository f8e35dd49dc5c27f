//! Host-side draft-tree build benchmarks (reference spec §5.1, §5.2 (c)).
//!
//! Shapes follow the final SparklingTree configuration: budget 64 non-root nodes, C = 128
//! candidates per depth, Ld = 16 depth rows, V = 49152, rank-64 random Markov head.
//! Benches:
//! - `ddtree_topk_prep`: [`depth_topk`] (full-vocab log-softmax + per-depth top-64).
//! - `ddtree_heap`: [`build_ddtree`] on a precomputed `TopK` (host heap only).
//! - `sparkling_table_prep`: [`candidate_table`] (union, dense bias, per-(d,p) top-k).
//! - `sparkling_heap`: [`build_sparkling_precompute`] on a prebuilt table (host heap only).
//! - `sparkling_lazy_prep`: [`LazyCandidates::new`] (union + gathers; what the CPU engine runs).
//! - `sparkling_lazy_heap`: [`build_sparkling_lazy`] (heap including the rows it expands).
//!
//! Inputs are deterministic pseudo-random (splitmix64). Run with
//! `cargo bench --bench tree_build` (needs `[[bench]] name = "tree_build", harness = false`).

use criterion::{criterion_group, criterion_main, Criterion};
use sparkling::tree::{build_ddtree, build_sparkling_lazy, build_sparkling_precompute, candidate_table, depth_topk, LazyCandidates, MarkovHead};
use std::hint::black_box;
use std::time::Duration;

const BUDGET: usize = 64;
const C: usize = 128;
const LD: usize = 16;
const VOCAB: usize = 49_152;
const RANK: usize = 64;
const MAX_FANOUT: usize = 64;
const ANCHOR: u32 = 1_234;

struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        sparkling::decode::rng::splitmix64_next(&mut self.0)
    }
    /// Uniform in [-1, 1).
    fn sym(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
    /// Roughly normal (sum of 4 uniforms), unit variance.
    fn normalish(&mut self) -> f32 {
        (self.sym() + self.sym() + self.sym() + self.sym()) * 0.866
    }
}

/// Random `[LD, VOCAB]` logits with a heavy head (a few dominant tokens per row), like
/// drafter outputs, and a random rank-64 Markov head with bias std ≈ 1.
fn inputs() -> (Vec<f32>, MarkovHead) {
    let mut rng = SplitMix64(0x5EED_0001);
    let mut logits: Vec<f32> = (0..LD * VOCAB).map(|_| 2.0 * rng.normalish()).collect();
    for d in 0..LD {
        for _ in 0..8 {
            let v = (rng.next_u64() % VOCAB as u64) as usize;
            logits[d * VOCAB + v] += 8.0 + 4.0 * rng.sym();
        }
    }
    let s = (1.0 / RANK as f32).sqrt().sqrt();
    let w1: Vec<f32> = (0..VOCAB * RANK).map(|_| s * rng.normalish()).collect();
    let w2: Vec<f32> = (0..VOCAB * RANK).map(|_| s * rng.normalish()).collect();
    (logits, MarkovHead { vocab: VOCAB, rank: RANK, w1, w2 })
}

fn bench_tree_build(c: &mut Criterion) {
    let (logits, head) = inputs();
    let top = depth_topk(&logits, LD, VOCAB, BUDGET);
    let table = candidate_table(&logits, LD, VOCAB, Some(&head), ANCHOR, C, MAX_FANOUT.min(BUDGET));
    eprintln!(
        "tree_build: candidate union n = {}, table k = {}, ddtree nodes = {}, sparkling nodes = {}",
        table.n(),
        table.k,
        build_ddtree(&top, ANCHOR, BUDGET).num_nodes(),
        build_sparkling_precompute(&table, ANCHOR, BUDGET).num_nodes()
    );

    let mut g = c.benchmark_group("tree_build");
    g.bench_function("ddtree_heap", |b| b.iter(|| build_ddtree(black_box(&top), ANCHOR, BUDGET)));
    g.bench_function("sparkling_heap", |b| b.iter(|| build_sparkling_precompute(black_box(&table), ANCHOR, BUDGET)));
    let lc = LazyCandidates::new(&logits, LD, VOCAB, Some(&head), ANCHOR, C);
    g.bench_function("sparkling_lazy_prep", |b| b.iter(|| LazyCandidates::new(black_box(&logits), LD, VOCAB, Some(&head), ANCHOR, C)));
    g.bench_function("sparkling_lazy_heap", |b| b.iter(|| build_sparkling_lazy(black_box(&lc), Some(&head), ANCHOR, MAX_FANOUT, BUDGET)));
    g.bench_function("ddtree_topk_prep", |b| b.iter(|| depth_topk(black_box(&logits), LD, VOCAB, BUDGET)));
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    g.bench_function("sparkling_table_prep", |b| b.iter(|| candidate_table(black_box(&logits), LD, VOCAB, Some(&head), ANCHOR, C, MAX_FANOUT.min(BUDGET))));
    g.finish();
}

criterion_group!(benches, bench_tree_build);
criterion_main!(benches);
