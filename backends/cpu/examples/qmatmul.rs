//! Quick timing of the CPU matmul paths on SmolLM2-135M shapes (median of repeated calls):
//! `cargo run --release -p sparkling-cpu --example qmatmul [f16|q8_0|q4_1 ...]`.
//! `SPARKLING_CPU_ISA=scalar` times the scalar reference; `RAYON_NUM_THREADS` the threads;
//! `QMATMUL_ROWS=1,13,33` the row counts (default 1, 9, 17, 65);
//! `QMATMUL_REPS=N` multiplies the repetitions (the line gives the median and, after `/`, the
//! fastest call: on a shared machine the fastest is the steadier figure).

use sparkling_core::{ggml, Backend, GgmlWeight};
use sparkling_cpu::{CpuBackend, WeightDtype};
use std::time::Instant;

fn pseudo(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0).collect()
}

fn main() {
    let formats: Vec<String> = std::env::args().skip(1).collect();
    let formats = if formats.is_empty() { vec!["f16".into(), "q8_0".into(), "q4_1".into()] } else { formats };
    let rows: Vec<usize> = match std::env::var("QMATMUL_ROWS") {
        Ok(v) => v.split(',').map(|x| x.trim().parse().expect("QMATMUL_ROWS: comma-separated row counts")).collect(),
        Err(_) => vec![1, 9, 17, 65],
    };
    for f in &formats {
        for (n, k) in [(1536usize, 576usize), (576, 1536), (49152, 576)] {
            let (b, w) = match f.as_str() {
                "f16" => {
                    let b = CpuBackend::with_weight_dtype(WeightDtype::F16);
                    let w = b.upload_weight(pseudo(n * k, 1), n, k).unwrap();
                    (b, w)
                }
                "q8_0" => {
                    let b = CpuBackend::with_weight_dtype(WeightDtype::Q8_0);
                    let w = b.upload_weight(pseudo(n * k, 1), n, k).unwrap();
                    (b, w)
                }
                _ => {
                    let b = CpuBackend::with_weight_dtype(WeightDtype::Native);
                    let blocks = n * k / 32;
                    let mut bytes = Vec::with_capacity(blocks * 20);
                    for i in 0..blocks {
                        bytes.extend_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                        bytes.extend_from_slice(&half::f16::from_f32(-0.07).to_le_bytes());
                        bytes.extend((0..16).map(|t| ((i * 31 + t * 7) % 256) as u8));
                    }
                    let w = b.upload_weight_ggml(GgmlWeight { ggml_type: ggml::Q4_1, n, k, bytes }).unwrap();
                    (b, w)
                }
            };
            let mut line = format!("{f:5} {} n{n:<6} k{k:<5}", b.weight_kernel(&w));
            for &m in &rows {
                let x = b.upload(&pseudo(m * k, 2), m, k).unwrap();
                let scale: usize = std::env::var("QMATMUL_REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(1).max(1);
                let reps = scale * if n > 10000 { 10 } else { 60 };
                let mut ts: Vec<f64> = (0..reps)
                    .map(|_| {
                        let t = Instant::now();
                        std::hint::black_box(b.matmul(&x, &w, None).unwrap());
                        t.elapsed().as_secs_f64() * 1e3
                    })
                    .collect();
                ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
                let med = ts[reps / 2];
                line += &format!(" | m{m}: {med:.3}/{:.3} ms {:.0} GOP/s", ts[0], 2.0 * (m * n * k) as f64 / med / 1e6);
            }
            println!("{line}");
        }
    }
}
