//! CPU backend matmul throughput on SmolLM2-135M shapes (hidden 576, MLP 1536, vocab 49152):
//! decode (M = 1) is weight-bandwidth bound, tree verify (M = 17, 65) compute bound.
//! `cargo bench --bench cpu_matmul`; GFLOP/s = 2·M·N·K / time. The `cpu_matmul_q` group runs
//! the ggml block formats the default model ships in (Q4_1 layers, Q8_0 lm_head) on the int8
//! kernels, at M = 1 (decode) and 9 / 17 (a tree verify of 1+8 / 1+16 rows):
//! `cargo bench --bench cpu_matmul -- cpu_matmul_q`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sparkling::core::{ggml, Backend, GgmlWeight};
use sparkling::cpu::{CpuBackend, WeightDtype};
use std::hint::black_box;
use std::time::Duration;

fn pseudo(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i as u32).wrapping_mul(2654435761) % 1000) as f32 / 500.0 - 1.0).collect()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("cpu_matmul");
    g.measurement_time(Duration::from_secs(3)).sample_size(20);
    for dtype in [WeightDtype::F16, WeightDtype::F32] {
        let b = CpuBackend::with_weight_dtype(dtype);
        for (n, k) in [(1536usize, 576usize), (49152, 576)] {
            let w = b.upload_weight(pseudo(n * k), n, k).unwrap();
            for m in [1usize, 17, 65] {
                let x = b.upload(&pseudo(m * k), m, k).unwrap();
                g.throughput(Throughput::Elements((2 * m * n * k) as u64));
                g.bench_function(format!("{dtype:?}/m{m}_n{n}_k{k}"), |bch| bch.iter(|| b.matmul(black_box(&x), &w, None).unwrap()));
            }
        }
    }
    g.finish();

    let mut g = c.benchmark_group("cpu_matmul_q");
    g.measurement_time(Duration::from_secs(2)).sample_size(20);
    let b = CpuBackend::with_weight_dtype(WeightDtype::Native);
    // SmolLM2-135M: q/o 576², k/v 192×576, gate/up 1536×576, down 576×1536 (Q4_1), lm_head (Q8_0).
    let shapes = [(ggml::Q4_1, 576usize, 576usize), (ggml::Q4_1, 1536, 576), (ggml::Q4_1, 576, 1536), (ggml::Q8_0, 49152, 576)];
    for (t, n, k) in shapes {
        let (block_bytes, name) = if t == ggml::Q8_0 { (34, "q8_0") } else { (20, "q4_1") };
        let blocks = n * k / 32;
        // Random codes; small positive f16 scales (and mins) so the sums stay finite.
        let mut bytes: Vec<u8> = pseudo(blocks * block_bytes).iter().map(|v| ((v + 1.0) * 127.0) as u8).collect();
        for blk in bytes.chunks_mut(block_bytes) {
            blk[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            if t == ggml::Q4_1 {
                blk[2..4].copy_from_slice(&half::f16::from_f32(-0.05).to_le_bytes());
            }
        }
        let w = b.upload_weight_ggml(GgmlWeight { ggml_type: t, n, k, bytes }).unwrap();
        for m in [1usize, 9, 17] {
            let x = b.upload(&pseudo(m * k), m, k).unwrap();
            g.throughput(Throughput::Elements((2 * m * n * k) as u64));
            g.bench_function(format!("{name}/m{m}_n{n}_k{k}"), |bch| bch.iter(|| b.matmul(black_box(&x), &w, None).unwrap()));
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
