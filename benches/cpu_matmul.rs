//! CPU backend matmul throughput on SmolLM2-135M shapes (hidden 576, MLP 1536, vocab 49152):
//! decode (M = 1) is weight-bandwidth bound, tree verify (M = 17, 65) compute bound.
//! `cargo bench --bench cpu_matmul`; GFLOP/s = 2·M·N·K / time.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sparkling::core::Backend;
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
}

criterion_group!(benches, bench);
criterion_main!(benches);
