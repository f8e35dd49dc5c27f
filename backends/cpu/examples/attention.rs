//! Quick timing of the CPU attention on SmolLM2-135M's shape (9 query heads over 3 KV heads of
//! 64, 30 layers, each layer its own cache as in a forward, so long contexts come from memory):
//! `cargo run --release -p sparkling-cpu --example attention [f16|q8_0|f32 ...]`.
//! Each line is one forward's attention (30 calls), the median and, after `/`, the fastest of
//! `ATTN_REPS` (default 15) forwards, in ms, for a decode row, a 1 + 8 and a 1 + 16 tree
//! verify and a 64-row prefill block over 400, 1 024 and 4 096 cached keys.
//! `SPARKLING_CPU_ISA` forces a lower path; `RAYON_NUM_THREADS` the threads.

use sparkling_core::{AttnMask, AttnShape, Backend, NO_PARENT};
use sparkling_cpu::{CpuBackend, KvDtype};
use std::time::Instant;

const SHAPE: AttnShape = AttnShape { n_heads: 9, n_kv_heads: 3, head_dim: 64 };
const LAYERS: usize = 30;

fn pseudo(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0).collect()
}

fn main() {
    let kinds: Vec<String> = std::env::args().skip(1).collect();
    let kinds = if kinds.is_empty() { vec!["f16".into()] } else { kinds };
    let reps: usize = std::env::var("ATTN_REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    eprintln!("attention example: CPU path {:?}", sparkling_cpu::isa::active());
    let (qc, kvc) = (SHAPE.n_heads * SHAPE.head_dim, SHAPE.n_kv_heads * SHAPE.head_dim);
    // Trees of a best-first build: node i under an earlier node.
    let tree9: Vec<u32> = vec![NO_PARENT, 0, 0, 1, 1, 2, 3, 6, 5];
    let tree17: Vec<u32> = (0..17u32).map(|i| if i == 0 { NO_PARENT } else { (i * 7 + 3) % i }).collect();
    for kind in &kinds {
        let dtype = match kind.as_str() {
            "f16" => KvDtype::F16,
            "q8_0" => KvDtype::Q8_0,
            "f32" => KvDtype::F32,
            other => {
                eprintln!("unknown KV cache type {other:?}: expected f16, q8_0 or f32");
                std::process::exit(2);
            }
        };
        let b = CpuBackend::new().with_kv_dtype(dtype);
        for keys in [400usize, 1024, 4096] {
            let caches: Vec<_> = (0..LAYERS)
                .map(|l| {
                    let mut k = b.kv_zeros(keys, SHAPE.n_kv_heads, SHAPE.head_dim).unwrap();
                    let mut v = b.kv_zeros(keys, SHAPE.n_kv_heads, SHAPE.head_dim).unwrap();
                    b.write_rows(&mut k, 0, &b.upload(&pseudo(keys * kvc, 2 * l as u32), keys, kvc).unwrap()).unwrap();
                    b.write_rows(&mut v, 0, &b.upload(&pseudo(keys * kvc, 2 * l as u32 + 1), keys, kvc).unwrap()).unwrap();
                    (k, v)
                })
                .collect();
            let shapes: [(&str, usize, AttnMask<'_>); 4] = [
                ("decode 1 row", 1, AttnMask::Causal),
                ("verify 1 + 8", 9, AttnMask::Tree { parents: &tree9 }),
                ("verify 1 + 16", 17, AttnMask::Tree { parents: &tree17 }),
                ("prefill 64 rows", 64, AttnMask::Causal),
            ];
            for (name, rows, mask) in shapes {
                let q = b.upload(&pseudo(rows * qc, 7), rows, qc).unwrap();
                let mut times = Vec::with_capacity(reps);
                for _ in 0..reps {
                    let t0 = Instant::now();
                    for (k, v) in &caches {
                        std::hint::black_box(b.attention(&q, k, v, keys, SHAPE, mask).unwrap());
                    }
                    times.push(t0.elapsed().as_secs_f64() * 1e3);
                }
                times.sort_by(f64::total_cmp);
                println!("{kind:>4} {keys:>5} keys  {name:<16} {:8.3} / {:8.3} ms", times[reps / 2], times[0]);
            }
        }
    }
}
