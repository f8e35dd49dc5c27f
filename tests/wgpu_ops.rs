//! Every non-attention op of the wgpu backend vs `sparkling_cpu::CpuBackend` on random inputs
//! of awkward sizes (1 row, 7×33, 65×576 · 576×1536, vocab-wide rows of 49152 and 151936).
//!
//! Tolerances (documented here and printed with the measured error by every test):
//! - matmul: `|Δ| ≤ 1e-6 + 2e-6 · Σ_k |x_ik · w_jk|` — both backends accumulate in f32 but in
//!   different orders (GPU: one sequential fma chain; CPU: 32-lane blocked fma), and the
//!   rounding error of either is bounded by a multiple of `Σ|x·w|` (Higham, dot products).
//! - rms_norm: `1e-6 + 1e-5·|want|`; silu_mul: `1e-6 + 1e-5·|want|` (device `exp`);
//!   rope: `1e-5` absolute (identical cos/sin table, possible fma contraction; inputs ±1).
//! - add_assign, embedding, concat, gather, write_rows, compact_rows, argmax: exact.
//! - sample: the same draws as the CPU for these fixed seeds (the device CDF is f32; a draw
//!   may differ only within ~1e-5 of a CDF or top-p boundary — tests/wgpu_select.rs checks that
//!   rule on thousands of draws on both reduction paths).
#![cfg(feature = "wgpu")]

#[path = "wgpu_common/mod.rs"]
mod common;

use common::*;
use sparkling_core::{Backend, Error, SampleParams};
use sparkling_cpu::{CpuBackend, WeightDtype as CpuDtype};
use sparkling_wgpu::{MatmulKernel, WeightDtype, WgpuBackend, WgpuOptions};

/// `Σ_k |x_ik w_jk|` for every output, the scale of the matmul tolerance.
fn abs_dot(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|t| (x[i * k + t] * w[j * k + t]).abs()).sum();
        }
    }
    out
}

/// Compare one matmul on `g` (weights already rounded the way `g` stores them) with the CPU.
fn check_matmul(g: &WgpuBackend, cpu: &CpuBackend, m: usize, k: usize, n: usize, bias: bool, seed: u64) {
    let mut r = Rng(seed);
    let x = r.vec(m * k);
    let w = r.vec(n * k);
    let bv = r.vec(n);
    let gx = g.upload(&x, m, k).unwrap();
    let gw = g.upload_weight(w.clone(), n, k).unwrap();
    let gb = g.upload(&bv, 1, n).unwrap();
    let got = g.download(&g.matmul(&gx, &gw, bias.then_some(&gb)).unwrap()).unwrap();
    // The CPU reference sees the weights as the GPU stores them.
    let w_ref: Vec<f32> = match g.weight_dtype() {
        WeightDtype::F32 => w,
        WeightDtype::F16 => w.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect(),
        WeightDtype::Bf16 => w.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect(),
    };
    let cx = cpu.upload(&x, m, k).unwrap();
    let cw = cpu.upload_weight(w_ref.clone(), n, k).unwrap();
    let cb = cpu.upload(&bv, 1, n).unwrap();
    let want = cpu.matmul(&cx, &cw, bias.then_some(&cb)).unwrap().data;
    let scale = abs_dot(&x, &w_ref, m, n, k);
    let mut worst = 0.0f32;
    for (i, ((a, b), s)) in got.iter().zip(&want).zip(&scale).enumerate() {
        let tol = 1e-6 + 2e-6 * s;
        assert!((a - b).abs() <= tol, "matmul {m}x{k}·{n}x{k} {:?}: element {i}: {a} vs {b} (tol {tol:e})", g.weight_dtype());
        worst = worst.max((a - b).abs() / (1e-6 + s));
    }
    eprintln!("matmul [{m},{k}]·[{n},{k}]ᵀ {:?} bias={bias} on {}: max |Δ|/Σ|x·w| = {worst:e} (tolerance 2e-6)", g.weight_dtype(), g.name());
}

/// A backend forcing one matmul kernel, or `None` after a loud skip.
fn with_kernel(kernel: MatmulKernel) -> Option<WgpuBackend> {
    common::open(&WgpuOptions { matmul_kernel: kernel, ..Default::default() }, "forced matmul kernel")
}

#[test]
fn matmul_matches_cpu_on_awkward_and_model_shapes() {
    let Some(tiled) = with_kernel(MatmulKernel::Tiled) else { return };
    let g = gpu_or_skip!();
    let cpu = CpuBackend::new();
    for (i, &(m, k, n, bias)) in [
        (1, 1, 1, false),
        (1, 576, 1536, false),
        (7, 33, 19, true),
        (5, 17, 3, false),
        (65, 576, 1536, false),
        (33, 64, 65, true),
        (2, 64, 49152, false),
        (1, 16, 151936, true),
    ]
    .iter()
    .enumerate()
    {
        check_matmul(g, &cpu, m, k, n, bias, 100 + i as u64);
        if m * n * k < 10_000_000 {
            check_matmul(&tiled, &cpu, m, k, n, bias, 100 + i as u64);
        }
    }
}

#[test]
fn matmul_packed_f16_and_bf16_weights_match_cpu() {
    let cpu = CpuBackend::new();
    for dt in [WeightDtype::F16, WeightDtype::Bf16] {
        let Some(g) = common::open(&WgpuOptions { weight_dtype: dt, ..Default::default() }, "packed matmul") else { return };
        for (i, &(m, k, n)) in [(1usize, 33usize, 7usize), (7, 33, 19), (65, 576, 96), (1, 3, 5)].iter().enumerate() {
            check_matmul(&g, &cpu, m, k, n, i % 2 == 0, 200 + i as u64);
        }
    }
    // The f16 path agrees with the CPU backend's own f16 weights too.
    let Some(g) = common::open(&WgpuOptions { weight_dtype: WeightDtype::F16, ..Default::default() }, "f16 matmul") else { return };
    let cpu16 = CpuBackend::with_weight_dtype(CpuDtype::F16);
    let mut r = Rng(7);
    let (m, k, n) = (3, 40, 21);
    let (x, w) = (r.vec(m * k), r.vec(n * k));
    let got = g.download(&g.matmul(&g.upload(&x, m, k).unwrap(), &g.upload_weight(w.clone(), n, k).unwrap(), None).unwrap()).unwrap();
    let want = cpu16.matmul(&cpu16.upload(&x, m, k).unwrap(), &cpu16.upload_weight(w, n, k).unwrap(), None).unwrap().data;
    assert_close("f16 matmul vs CPU f16", &got, &want, 1e-5, 1e-5);
}

#[test]
fn matmul_rows_do_not_depend_on_the_batch_or_the_kernel() {
    // Row i of a 65-row call must equal that row computed alone, bit for bit, whichever kernel
    // (tiled or direct) each call uses: the determinism contract that makes a tree verify
    // reproduce plain decoding.
    let (Some(tiled), Some(direct)) = (with_kernel(MatmulKernel::Tiled), with_kernel(MatmulKernel::Direct)) else { return };
    let mut r = Rng(31);
    let (m, k, n) = (65, 96, 130);
    let x = r.vec(m * k);
    let wv = r.vec(n * k);
    let bv = r.vec(n);
    let run = |be: &WgpuBackend, rows: std::ops::Range<usize>| {
        let w = be.upload_weight(wv.clone(), n, k).unwrap();
        let bias = be.upload(&bv, 1, n).unwrap();
        be.download(&be.matmul(&be.upload(&x[rows.start * k..rows.end * k], rows.len(), k).unwrap(), &w, Some(&bias)).unwrap()).unwrap()
    };
    let all = run(&tiled, 0..m);
    assert_bits("direct vs tiled, 65 rows", &run(&direct, 0..m), &all);
    for i in [0usize, 1, 31, 32, 64] {
        assert_bits(&format!("row {i} alone (direct)"), &run(&direct, i..i + 1), &all[i * n..(i + 1) * n]);
        assert_bits(&format!("row {i} alone (tiled)"), &run(&tiled, i..i + 1), &all[i * n..(i + 1) * n]);
        let s = i.min(60);
        assert_bits(&format!("5-row block at {s} (tiled)"), &run(&tiled, s..s + 5), &all[s * n..(s + 5) * n]);
    }
}

#[test]
fn embedding_matches_cpu_exactly_for_every_dtype() {
    let cpu = CpuBackend::new();
    for dt in [WeightDtype::F32, WeightDtype::F16, WeightDtype::Bf16] {
        let Some(g) = common::open(&WgpuOptions { weight_dtype: dt, ..Default::default() }, "embedding") else { return };
        let mut r = Rng(5);
        let (v, k) = (97, 33);
        let table = r.vec(v * k);
        let t_ref: Vec<f32> = match dt {
            WeightDtype::F32 => table.clone(),
            WeightDtype::F16 => table.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect(),
            WeightDtype::Bf16 => table.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect(),
        };
        let ids: Vec<u32> = vec![0, 96, 5, 5, 44, 1, 95];
        let got = g.download(&g.embedding(&g.upload_weight(table, v, k).unwrap(), &ids).unwrap()).unwrap();
        let want = cpu.embedding(&cpu.upload_weight(t_ref, v, k).unwrap(), &ids).unwrap().data;
        assert_bits(&format!("embedding {dt:?}"), &got, &want);
        let err = g.embedding(&g.upload_weight(vec![0.0; 6], 2, 3).unwrap(), &[2]).unwrap_err();
        assert!(matches!(err, Error::Invalid(_)), "{err}");
    }
}

/// A reduced draft vocabulary's output layer: `gather_weight_rows` and its awaiting twin (the
/// browser's path, which may not block) give the same weight, whose rows are the chosen rows.
#[test]
fn gathered_weight_rows_are_the_rows_sync_or_async() {
    for dt in [WeightDtype::F32, WeightDtype::F16] {
        let Some(g) = common::open(&WgpuOptions { weight_dtype: dt, ..Default::default() }, "gather_weight_rows") else { return };
        let mut r = Rng(9);
        let (v, k) = (41, 64);
        let w = g.upload_weight(r.vec(v * k), v, k).unwrap();
        let rows = [40u32, 0, 7, 7, 3];
        let want = g.download(&g.embedding(&w, &rows).unwrap()).unwrap();
        let all: Vec<u32> = (0..rows.len() as u32).collect();
        let sync = g.gather_weight_rows(&w, &rows).unwrap();
        let asy = pollster::block_on(g.gather_weight_rows_async(&w, &rows)).unwrap();
        for (name, gw) in [("sync", &sync), ("async", &asy)] {
            assert_eq!(g.weight_shape(gw), (rows.len(), k), "{dt:?} {name}");
            assert_bits(&format!("gathered rows {dt:?} {name}"), &g.download(&g.embedding(gw, &all).unwrap()).unwrap(), &want);
        }
        assert!(matches!(pollster::block_on(g.gather_weight_rows_async(&w, &[41])), Err(Error::Invalid(_))));
        assert!(matches!(pollster::block_on(g.gather_weight_rows_async(&w, &[])), Err(Error::Invalid(_))));
    }
}

#[test]
fn rms_norm_matches_cpu_for_rows_and_heads() {
    let g = gpu_or_skip!();
    let cpu = CpuBackend::new();
    for (i, &(rows, cols, group)) in [(1usize, 1usize, 1usize), (7, 33, 33), (65, 576, 576), (5, 64, 16), (3, 200, 200)].iter().enumerate() {
        let mut r = Rng(300 + i as u64);
        let x = r.vec(rows * cols);
        let w: Vec<f32> = (0..group).map(|_| 1.0 + 0.1 * r.uniform()).collect();
        let got = g.download(&g.rms_norm(&g.upload(&x, rows, cols).unwrap(), &g.upload(&w, 1, group).unwrap(), group, 1e-6).unwrap()).unwrap();
        let want = cpu.rms_norm(&cpu.upload(&x, rows, cols).unwrap(), &cpu.upload(&w, 1, group).unwrap(), group, 1e-6).unwrap().data;
        assert_close(&format!("rms_norm [{rows},{cols}] group {group}"), &got, &want, 1e-6, 1e-5);
    }
}

#[test]
fn rope_matches_cpu_at_large_positions() {
    let g = gpu_or_skip!();
    let cpu = CpuBackend::new();
    for (i, &(rows, heads, hd, theta, max_pos)) in
        [(1usize, 1usize, 2usize, 10000.0f32, 1u32), (7, 4, 16, 10000.0, 40), (65, 9, 64, 100000.0, 4000), (5, 2, 128, 1_000_000.0, 40000)].iter().enumerate()
    {
        let mut r = Rng(400 + i as u64);
        let cols = heads * hd;
        let x = r.vec(rows * cols);
        let pos: Vec<u32> = (0..rows).map(|_| r.below(max_pos as usize + 1) as u32).collect();
        let mut gx = g.upload(&x, rows, cols).unwrap();
        g.rope(&mut gx, &pos, hd, theta).unwrap();
        let mut cx = cpu.upload(&x, rows, cols).unwrap();
        cpu.rope(&mut cx, &pos, hd, theta).unwrap();
        assert_close(&format!("rope [{rows},{cols}] hd {hd} theta {theta} pos ≤ {max_pos}"), &g.download(&gx).unwrap(), &cx.data, 1e-5, 0.0);
    }
}

#[test]
fn silu_mul_and_add_assign_match_cpu() {
    let g = gpu_or_skip!();
    let cpu = CpuBackend::new();
    for (i, &(rows, cols)) in [(1usize, 1usize), (7, 33), (65, 1536)].iter().enumerate() {
        let mut r = Rng(500 + i as u64);
        let a: Vec<f32> = r.vec(rows * cols).iter().map(|v| v * 8.0).collect();
        let b = r.vec(rows * cols);
        let got = g.download(&g.silu_mul(&g.upload(&a, rows, cols).unwrap(), &g.upload(&b, rows, cols).unwrap()).unwrap()).unwrap();
        let want = cpu.silu_mul(&cpu.upload(&a, rows, cols).unwrap(), &cpu.upload(&b, rows, cols).unwrap()).unwrap().data;
        assert_close(&format!("silu_mul [{rows},{cols}]"), &got, &want, 1e-6, 1e-5);
        let mut gx = g.upload(&a, rows, cols).unwrap();
        g.add_assign(&mut gx, &g.upload(&b, rows, cols).unwrap()).unwrap();
        let mut cx = cpu.upload(&a, rows, cols).unwrap();
        cpu.add_assign(&mut cx, &cpu.upload(&b, rows, cols).unwrap()).unwrap();
        assert_bits(&format!("add_assign [{rows},{cols}]"), &g.download(&gx).unwrap(), &cx.data);
    }
}

#[test]
fn copies_concat_gather_write_and_compact_match_cpu_exactly() {
    let g = gpu_or_skip!();
    let cpu = CpuBackend::new();
    let mut r = Rng(600);
    let (a, b, c) = (r.vec(7 * 33), r.vec(7 * 5), r.vec(7));
    let parts_g = [g.upload(&a, 7, 33).unwrap(), g.upload(&b, 7, 5).unwrap(), g.upload(&c, 7, 1).unwrap()];
    let parts_c = [cpu.upload(&a, 7, 33).unwrap(), cpu.upload(&b, 7, 5).unwrap(), cpu.upload(&c, 7, 1).unwrap()];
    let got = g.concat_cols(&parts_g.iter().collect::<Vec<_>>()).unwrap();
    assert_eq!(g.shape(&got), (7, 39));
    assert_bits("concat_cols", &g.download(&got).unwrap(), &cpu.concat_cols(&parts_c.iter().collect::<Vec<_>>()).unwrap().data);
    assert_bits("concat_cols single", &g.download(&g.concat_cols(&[&parts_g[0]]).unwrap()).unwrap(), &a);

    let (d, e) = (r.vec(33), r.vec(4 * 33));
    let rows_g = [g.upload(&d, 1, 33).unwrap(), g.upload(&e, 4, 33).unwrap(), g.upload(&a, 7, 33).unwrap()];
    let rows_c = [cpu.upload(&d, 1, 33).unwrap(), cpu.upload(&e, 4, 33).unwrap(), cpu.upload(&a, 7, 33).unwrap()];
    let got = g.concat_rows(&rows_g.iter().collect::<Vec<_>>()).unwrap();
    assert_eq!(g.shape(&got), (12, 33));
    assert_bits("concat_rows", &g.download(&got).unwrap(), &cpu.concat_rows(&rows_c.iter().collect::<Vec<_>>()).unwrap().data);

    let idx = [6usize, 0, 0, 3, 6];
    assert_bits("gather_rows", &g.download(&g.gather_rows(&parts_g[0], &idx).unwrap()).unwrap(), &cpu.gather_rows(&parts_c[0], &idx).unwrap().data);

    // write_rows + compact_rows on a [40, 24] cache, with overlapping source and destination.
    let cache0 = r.vec(40 * 24);
    let src = r.vec(9 * 24);
    let mut gc = g.upload(&cache0, 40, 24).unwrap();
    let mut cc = cpu.upload(&cache0, 40, 24).unwrap();
    g.write_rows(&mut gc, 20, &g.upload(&src, 9, 24).unwrap()).unwrap();
    cpu.write_rows(&mut cc, 20, &cpu.upload(&src, 9, 24).unwrap()).unwrap();
    assert_bits("write_rows", &g.download(&gc).unwrap(), &cc.data);
    for keep in [vec![0usize, 2, 3, 7], vec![0, 1, 2], vec![0, 8], vec![1, 0, 5, 2]] {
        g.compact_rows(&mut gc, 20, &keep).unwrap();
        cpu.compact_rows(&mut cc, 20, &keep).unwrap();
        assert_bits(&format!("compact_rows {keep:?}"), &g.download(&gc).unwrap(), &cc.data);
    }
    assert_eq!(g.download_rows(&gc, 20, 3).unwrap(), cc.data[20 * 24..23 * 24].to_vec());
}

#[test]
fn zeros_upload_and_download_round_trip_even_from_recycled_buffers() {
    let g = gpu_or_skip!();
    for &(rows, cols) in &[(1usize, 1usize), (7, 33), (0, 5), (65, 576)] {
        let data: Vec<f32> = (0..rows * cols).map(|i| i as f32 + 0.5).collect();
        let t = g.upload(&data, rows, cols).unwrap();
        assert_eq!(g.download(&t).unwrap(), data);
        drop(t);
        // The same bucket comes back from the pool, dirty; zeros must clear it.
        let z = g.zeros(rows, cols).unwrap();
        assert!(g.download(&z).unwrap().iter().all(|&v| v == 0.0), "zeros [{rows},{cols}]");
    }
    assert!(g.pooled_idle_bytes() > 0, "dropped tensors go back to the pool");
}

#[test]
fn argmax_matches_cpu_with_ties_wide_rows_and_non_finite_values() {
    let g = gpu_or_skip!();
    let cpu = CpuBackend::new();
    let mut r = Rng(700);
    // Two vocab-wide rows whose maximum occurs several times: the lowest index must win.
    let cols = 49152;
    let mut x = r.vec(2 * cols);
    for &i in &[100usize, 30000, 49151] {
        x[i] = 5.0;
    }
    for &i in &[cols + 49151, cols + 7, cols + 8] {
        x[i] = 9.0;
    }
    let got = g.argmax(&g.upload(&x, 2, cols).unwrap()).unwrap();
    assert_eq!(got, vec![100, 7]);
    assert_eq!(got, cpu.argmax(&cpu.upload(&x, 2, cols).unwrap()).unwrap());
    // Awkward shapes and special values.
    let nan = f32::NAN;
    let ninf = f32::NEG_INFINITY;
    for (rows, cols, data) in [
        (1usize, 1usize, vec![-3.0f32]),
        (3, 4, vec![nan, 1.0, nan, 2.0, ninf, ninf, ninf, ninf, nan, nan, nan, nan]),
        (2, 3, vec![ninf, -1e30, -1e30, f32::INFINITY, 1.0, f32::INFINITY]),
        (7, 33, r.vec(7 * 33)),
        (1, 151936, r.vec(151936)),
    ] {
        let got = g.argmax(&g.upload(&data, rows, cols).unwrap()).unwrap();
        assert_eq!(got, cpu.argmax(&cpu.upload(&data, rows, cols).unwrap()).unwrap(), "[{rows},{cols}]");
    }
}

#[test]
fn sample_matches_cpu_for_every_filter() {
    let g = gpu_or_skip!();
    let cpu = CpuBackend::new();
    let mut r = Rng(800);
    let (rows, cols) = (5, 300);
    let x: Vec<f32> = r.vec(rows * cols).iter().map(|v| v * 4.0).collect();
    let (gx, cx) = (g.upload(&x, rows, cols).unwrap(), cpu.upload(&x, rows, cols).unwrap());
    for p in [
        SampleParams { temperature: 0.0, top_k: 0, top_p: 1.0 },
        SampleParams { temperature: 1.0, top_k: 0, top_p: 1.0 },
        SampleParams { temperature: 0.7, top_k: 20, top_p: 1.0 },
        SampleParams { temperature: 1.3, top_k: 0, top_p: 0.8 },
    ] {
        for trial in 0..4 {
            let u: Vec<f32> = (0..rows).map(|_| (r.uniform() + 1.0) / 2.0).collect();
            assert_eq!(g.sample(&gx, p, &u).unwrap(), cpu.sample(&cx, p, &u).unwrap(), "{p:?} trial {trial}");
        }
    }
    assert!(matches!(g.sample(&gx, SampleParams { temperature: 1.0, top_k: 0, top_p: 1.0 }, &[0.5]), Err(Error::Shape { .. })));
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let g = gpu_or_skip!();
    let a = g.upload(&[0.0; 6], 2, 3).unwrap();
    let b = g.upload(&[0.0; 8], 2, 4).unwrap();
    let w = g.upload_weight(vec![0.0; 12], 3, 4).unwrap();
    let shape = |r: sparkling_core::Result<_>| matches!(r, Err(Error::Shape { .. }));
    assert!(shape(g.upload(&[0.0; 5], 2, 3).map(|_| ())));
    assert!(shape(g.upload_weight(vec![0.0; 5], 2, 3).map(|_| ())));
    assert!(shape(g.matmul(&a, &w, None).map(|_| ())));
    assert!(shape(g.matmul(&b, &w, Some(&a)).map(|_| ())));
    assert!(shape(g.rms_norm(&a, &b, 3, 1e-6).map(|_| ())));
    assert!(shape(g.rms_norm(&a, &a, 0, 1e-6).map(|_| ())));
    let mut a2 = g.upload(&[0.0; 6], 2, 3).unwrap();
    assert!(shape(g.rope(&mut a2, &[0, 1], 3, 1e4)));
    assert!(shape(g.rope(&mut a2, &[0], 2, 1e4)));
    assert!(shape(g.silu_mul(&a, &b).map(|_| ())));
    assert!(shape(g.add_assign(&mut a2, &b)));
    assert!(shape(g.concat_cols(&[&a, &g.upload(&[0.0; 3], 1, 3).unwrap()]).map(|_| ())));
    assert!(shape(g.concat_rows(&[&a, &b]).map(|_| ())));
    assert!(shape(g.gather_rows(&a, &[2]).map(|_| ())));
    assert!(shape(g.write_rows(&mut a2, 1, &a)));
    assert!(shape(g.compact_rows(&mut a2, 1, &[1])));
    assert!(shape(g.download_rows(&a, 1, 2).map(|_| ())));
    assert!(shape(g.download_rows(&a, usize::MAX, 2).map(|_| ())));
}
