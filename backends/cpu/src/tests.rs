//! The CPU backend's ops through the `Backend` trait: uploads, matmuls, attention row
//! invariance, selection.

use super::*;
use sparkling_core::{ReadBack, NO_PARENT};

#[test]
fn a_decode_rows_attention_equals_its_row_in_a_long_causal_call_on_any_thread_count() {
    // 9 query heads on 3 KV heads (SmolLM2's shape): at 4 and 7 threads one row has fewer
    // (KV head, block) tasks than threads, so its KV heads' query heads are split across
    // tasks (at 1 and 2 they are not); a 40-row call
    // is split by blocks of rows. Both must give the row the same bits, for every cache type,
    // at 300 keys and at ≈ 1 100 (1 061 is not a multiple of 8). The other shapes: a query
    // group of 5 (a decode row's set scores in two passes of 3 + 2 heads, chunk by chunk), one
    // wider than a multi-query set (7 heads per KV head), a head dim of 16-value blocks past a
    // 64-value one (80), one whose last 8 values take the 256-bit value pass (72; a q8_0 cache
    // at that head dim runs the AVX2 body, as every head dim that is not a multiple of 16
    // does), and a single KV head.
    let shapes = [(9, 3, 64), (10, 2, 64), (14, 2, 64), (8, 2, 80), (4, 1, 72)];
    for (n_heads, n_kv_heads, head_dim) in shapes {
        let shape = AttnShape { n_heads, n_kv_heads, head_dim };
        let (qw, kw) = (n_heads * head_dim, n_kv_heads * head_dim);
        for (len, rows) in [(300usize, 40usize), (1100, 40)] {
            for kv in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0] {
                let b = CpuBackend::new().with_kv_dtype(kv);
                let mut k = b.kv_zeros(len, n_kv_heads, head_dim).unwrap();
                let mut v = b.kv_zeros(len, n_kv_heads, head_dim).unwrap();
                b.write_rows(&mut k, 0, &b.upload(&pseudo(len * kw, 3), len, kw).unwrap()).unwrap();
                b.write_rows(&mut v, 0, &b.upload(&pseudo(len * kw, 4), len, kw).unwrap()).unwrap();
                let q = b.upload(&pseudo(rows * qw, 5), rows, qw).unwrap();
                let all = b.attention(&q, &k, &v, len, shape, AttnMask::Causal).unwrap();
                for threads in [1, 2, 4, 7] {
                    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                    for r in [0usize, 17, rows - 1] {
                        let one = b.gather_rows(&q, &[r]).unwrap();
                        let kv_len = len - rows + r + 1;
                        let got = pool.install(|| b.attention(&one, &k, &v, kv_len, shape, AttnMask::Causal)).unwrap();
                        let want = &all.data[r * qw..(r + 1) * qw];
                        assert!(got.data.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()), "{shape:?} {kv:?} {len} keys, row {r}, {threads} threads");
                    }
                }
            }
        }
    }
}

fn pseudo(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0).collect()
}

/// The invariant tree verification relies on: a row's matmul output does not depend on how
/// many rows share the call (f32 and f16 weights, odd and even row counts).
#[test]
fn download_rows_out_of_range_is_an_error() {
    let b = CpuBackend::new();
    let t = b.upload(&[1.0, 2.0, 3.0, 4.0], 2, 2).unwrap();
    assert_eq!(b.download_rows(&t, 1, 1).unwrap(), vec![3.0, 4.0]);
    assert!(b.download_rows(&t, 1, 2).is_err());
    assert!(b.download_rows(&t, usize::MAX, 2).is_err(), "overflowing start must be an error, not a panic");
}

/// `weight_bytes` is the stored size: GGUF blocks kept as they are (Q4_1: 20 bytes per 32
/// weights, 0.625 B/weight), f16 2 B and f32 4 B per weight (NR-row panels, here whole).
#[test]
fn weight_bytes_are_the_stored_bytes() {
    let (n, k) = (16, 64);
    let native = CpuBackend::with_weight_dtype(WeightDtype::Native);
    // Q4_1 blocks: f16 d = 1, f16 m = 0, nibbles 0..16.
    let block: Vec<u8> = [half::f16::from_f32(1.0).to_le_bytes(), half::f16::from_f32(0.0).to_le_bytes()].concat().into_iter().chain(0..16u8).collect();
    let bytes: Vec<u8> = block.iter().copied().cycle().take(n * k / 32 * 20).collect();
    let w = native.upload_weight_ggml(GgmlWeight { ggml_type: ggml::Q4_1, n, k, bytes: bytes.clone() }).unwrap();
    assert_eq!(native.weight_bytes(&w), bytes.len());
    assert_eq!(native.weight_bytes(&w) * 8, n * k * 5, "Q4_1 is 5 bits per weight");
    for (dtype, per) in [(WeightDtype::F32, 4), (WeightDtype::F16, 2)] {
        let b = CpuBackend::with_weight_dtype(dtype);
        let w = b.upload_weight(pseudo(n * k, 1), n, k).unwrap();
        assert_eq!(b.weight_bytes(&w), n * k * per, "{dtype:?}");
    }
}

#[test]
fn matmul_rows_are_independent_of_batch_size() {
    for dtype in [WeightDtype::F32, WeightDtype::F16] {
        let b = CpuBackend::with_weight_dtype(dtype);
        let (m, n, k) = (7, 45, 77);
        let x = b.upload(&pseudo(m * k, 1), m, k).unwrap();
        let w = b.upload_weight(pseudo(n * k, 2), n, k).unwrap();
        let bias = b.upload(&pseudo(n, 3), 1, n).unwrap();
        let all = b.matmul(&x, &w, Some(&bias)).unwrap();
        for i in 0..m {
            let xi = b.gather_rows(&x, &[i]).unwrap();
            let one = b.matmul(&xi, &w, Some(&bias)).unwrap();
            assert_eq!(one.data, all.data[i * n..(i + 1) * n].to_vec(), "{dtype:?} row {i}");
        }
        // and against an f64 reference
        let mut wd = vec![0.0f32; n * k];
        for (j, row) in wd.chunks_mut(k).enumerate() {
            w.row_into(j, row);
        }
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k).map(|t| x.data[i * k + t] as f64 * wd[j * k + t] as f64).sum::<f64>() + bias.data[j] as f64;
                assert!((all.data[i * n + j] as f64 - want).abs() < 1e-4);
            }
        }
    }
}

#[test]
fn ggml_uploads_keep_or_quantize_by_weight_dtype() {
    let (n, k) = (9, 64);
    let vals = pseudo(n * k, 4);
    let f16_bytes: Vec<u8> = vals.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
    let g = |t: u32, bytes: Vec<u8>| GgmlWeight { ggml_type: t, n, k, bytes };
    let native = CpuBackend::with_weight_dtype(WeightDtype::Native);
    let q8 = CpuBackend::with_weight_dtype(WeightDtype::Q8_0);
    assert!(!CpuBackend::new().accepts_ggml(ggml::Q4_1), "f32 backends dequantize at the loader");
    assert!(native.accepts_ggml(ggml::Q4_1) && native.accepts_ggml(ggml::F16) && native.accepts_ggml(ggml::Q4_K) && native.accepts_ggml(ggml::Q6_K));
    assert!(!native.accepts_ggml(13), "Q5_K has no CPU kernel yet");
    assert_eq!(native.upload_weight_ggml(g(ggml::F16, f16_bytes.clone())).unwrap().format_name(), "f16");
    assert_eq!(q8.upload_weight_ggml(g(ggml::F16, f16_bytes.clone())).unwrap().format_name(), "q8_0");
    // Q8_0 blocks: d = 0.5, codes 0..32.
    let block: Vec<u8> = half::f16::from_f32(0.5).to_le_bytes().into_iter().chain(0u8..32).collect();
    let w = native.upload_weight_ggml(g(ggml::Q8_0, block.repeat(n * k / 32))).unwrap();
    assert_eq!((w.format_name(), w.bytes()), ("q8_0", 16 * k + 2 * 16 * 2));
    let mut row = vec![0.0f32; k];
    w.row_into(n - 1, &mut row);
    assert_eq!(row[31], 15.5);
    // Wrong byte counts and unknown types are errors naming the problem, not panics.
    assert!(matches!(native.upload_weight_ggml(g(ggml::F16, f16_bytes[1..].to_vec())), Err(Error::Shape { .. })));
    assert!(native.upload_weight_ggml(g(ggml::Q4_1, vec![0; 7])).is_err());
    assert!(matches!(native.upload_weight_ggml(g(13, vec![])), Err(Error::Unavailable(_))));
    // K-quants need K a multiple of 256: the message says so.
    let e = native.upload_weight_ggml(g(ggml::Q4_K, vec![0; 144])).unwrap_err().to_string();
    assert!(e.contains("multiple of 256"), "{e}");
}

#[test]
fn matmul_many_equals_one_matmul_per_weight_bit_for_bit() {
    // Mixed storages in one set (Q4_1 blocks, Q8_0 from f32, f16 panels), biases, widths that
    // are not multiples of the tiles and one that is a multiple of 8 (written in place); decode
    // (1 row), verify (9) and large (65).
    let native = CpuBackend::with_weight_dtype(WeightDtype::Native);
    let k = 96;
    let q41: Vec<u8> = (0..37 * k / 32)
        .flat_map(|i| {
            let mut blk = half::f16::from_f32(0.02).to_le_bytes().to_vec();
            blk.extend(half::f16::from_f32(-0.1).to_le_bytes());
            blk.extend((0..16u32).map(|t| ((i as u32 * 7 + t * 13) % 256) as u8));
            blk
        })
        .collect();
    let wa = native.upload_weight_ggml(GgmlWeight { ggml_type: ggml::Q4_1, n: 37, k, bytes: q41 }).unwrap();
    let wb = native.upload_draft_weight(pseudo(21 * k, 8), 21, k).unwrap();
    let wc = native.upload_weight(pseudo(50 * k, 9), 50, k).unwrap();
    assert_eq!((wa.format_name(), wb.format_name(), wc.format_name()), ("q4_1", "q8_0", "f16"));
    let wd = native.upload_draft_weight(pseudo(40 * k, 12), 40, k).unwrap();
    let bias = native.upload(&pseudo(21, 10), 1, 21).unwrap();
    let bias_d = native.upload(&pseudo(40, 13), 1, 40).unwrap();
    for m in [1usize, 9, 65] {
        let x = native.upload(&pseudo(m * k, 11 + m as u32), m, k).unwrap();
        let set = [(&wa, None), (&wb, Some(&bias)), (&wc, None), (&wd, Some(&bias_d))];
        let many = native.matmul_many(&x, &set).unwrap();
        assert_eq!(many.len(), 4);
        for ((w, bias), got) in set.iter().zip(&many) {
            let want = native.matmul(&x, w, *bias).unwrap();
            assert_eq!((got.rows, got.cols), (m, w.n));
            assert!(got.data.iter().zip(&want.data).all(|(a, b)| a.to_bits() == b.to_bits()), "m = {m}, weight [{}, {k}]", w.n);
        }
    }
    let x = native.upload(&pseudo(2 * 64, 3), 2, 64).unwrap();
    assert!(matches!(native.matmul_many(&x, &[(&wa, None)]), Err(Error::Shape { .. })), "K mismatch is a shape error");
}

/// An f16 KV cache (`kv_zeros` with `KvDtype::F16`): writes round to f16, downloads and
/// compaction see the rounded values, and attention over it equals attention over an f32
/// cache holding those values, bit for bit, for causal and tree masks.
#[test]
fn f16_kv_cache_rounds_on_write_and_attends_like_f32_over_the_rounded_values() {
    let b = CpuBackend::new().with_kv_dtype(KvDtype::F16);
    let f = CpuBackend::new();
    let (rows, width) = (6, 16);
    let mut k = b.kv_zeros(rows, 2, 8).unwrap();
    let mut v = b.kv_zeros(rows, 2, 8).unwrap();
    assert!(k.is_f16() && !f.kv_zeros(rows, 2, 8).unwrap().is_f16());
    assert_eq!(b.download(&k).unwrap(), vec![0.0; rows * width]);
    let (kx, vx) = (pseudo(rows * width, 3), pseudo(rows * width, 4));
    b.write_rows(&mut k, 0, &b.upload(&kx, rows, width).unwrap()).unwrap();
    b.write_rows(&mut v, 0, &b.upload(&vx, rows, width).unwrap()).unwrap();
    let round = |x: &[f32]| -> Vec<f32> { x.iter().map(|&y| half::f16::from_f32(y).to_f32()).collect() };
    assert_eq!(b.download(&k).unwrap(), round(&kx));
    assert_ne!(round(&kx), kx, "the test data must not be f16-exact");
    assert_eq!(b.download_rows(&v, 2, 3).unwrap(), round(&vx[2 * width..5 * width]));
    let (k32, v32) = (f.upload(&round(&kx), rows, width).unwrap(), f.upload(&round(&vx), rows, width).unwrap());
    let shape = AttnShape { n_heads: 4, n_kv_heads: 2, head_dim: 8 };
    let q = f.upload(&pseudo(3 * 32, 5), 3, 32).unwrap();
    for mask in [AttnMask::Causal, AttnMask::Tree { parents: &[NO_PARENT, 0, 0] }, AttnMask::Full] {
        let want = f.attention(&q, &k32, &v32, rows, shape, mask).unwrap();
        let got = b.attention(&q, &k, &v, rows, shape, mask).unwrap();
        assert!(got.data.iter().zip(&want.data).all(|(a, c)| a.to_bits() == c.to_bits()), "{mask:?}");
    }
    // Compaction keeps the rounded rows in path order; K and V must share a precision.
    b.compact_rows(&mut k, 2, &[0, 2, 3]).unwrap();
    let mut want = round(&kx);
    want.copy_within(4 * width..6 * width, 3 * width);
    assert_eq!(b.download_rows(&k, 0, 5).unwrap(), want[..5 * width].to_vec());
    let e = b.attention(&q, &k, &v32, rows, shape, AttnMask::Causal).unwrap_err().to_string();
    assert!(e.contains("stored differently"), "{e}");
}

/// The q8_0 cache: written rows read back as their dequantized blocks (rows of very
/// different magnitudes, so every row has its own scales), the attention equals the f32
/// attention over the dequantized values bit for bit (head dims 32, 24 and 8: the 512-bit and
/// the AVX2 bodies), compaction moves scales with codes, and a malformed or mixed cache is an
/// error.
#[test]
fn q8_0_kv_cache_attends_like_f32_over_the_dequantized_values() {
    let b = CpuBackend::new().with_kv_dtype(KvDtype::Q8_0);
    let f = CpuBackend::new();
    for hd in [32usize, 24, 8] {
        let (rows, width) = (6, 2 * hd);
        let mut k = b.kv_zeros(rows, 2, hd).unwrap();
        let mut v = b.kv_zeros(rows, 2, hd).unwrap();
        assert!(k.is_q8() && k.storage() == "q8_0");
        assert_eq!(b.download(&k).unwrap(), vec![0.0; rows * width]);
        let scaled = |x: Vec<f32>| -> Vec<f32> { x.iter().enumerate().map(|(i, &y)| y * [0.01f32, 3.0, 250.0][(i / width) % 3]).collect() };
        let (kx, vx) = (scaled(pseudo(rows * width, 3)), scaled(pseudo(rows * width, 4)));
        b.write_rows(&mut k, 0, &b.upload(&kx, rows, width).unwrap()).unwrap();
        b.write_rows(&mut v, 0, &b.upload(&vx, rows, width).unwrap()).unwrap();
        // Blocks of 32 within each head (the cache's panels): at hd 24 a block ends with its head.
        let deq = |x: &[f32]| -> Vec<f32> {
            let nb = crate::kv::q8::blocks(hd);
            let (mut c, mut d, mut out, mut row) = (vec![0i8; hd], vec![0.0f32; nb], Vec::new(), Vec::new());
            for r in x.chunks(hd) {
                crate::kv::q8::quantize_row(r, &mut c, &mut d);
                crate::kv::q8::dequantize(&c, &d, 0, hd, &mut row);
                out.extend_from_slice(&row);
            }
            out
        };
        let (kd, vd) = (deq(&kx), deq(&vx));
        assert_eq!(b.download(&k).unwrap(), kd);
        assert_eq!(b.download_rows(&v, 2, 3).unwrap(), vd[2 * width..5 * width].to_vec());
        assert_ne!(kd, kx, "the test data must not be q8_0-exact");
        // Each value within half a step (amax/127 of its block; f16 rounding of the scale aside).
        for (row, (dr, xr)) in kd.chunks(hd).zip(kx.chunks(hd)).enumerate() {
            for (blk, (db, xb)) in dr.chunks(32).zip(xr.chunks(32)).enumerate() {
                let step = xb.iter().fold(0.0f32, |m, x| m.max(x.abs())) / 127.0;
                for (a, x) in db.iter().zip(xb) {
                    assert!((a - x).abs() <= 0.51 * step + 1e-3 * x.abs(), "row {row} block {blk}: {a} vs {x}");
                }
            }
        }
        let (k32, v32) = (f.upload(&kd, rows, width).unwrap(), f.upload(&vd, rows, width).unwrap());
        let shape = AttnShape { n_heads: 4, n_kv_heads: 2, head_dim: hd };
        let q = f.upload(&pseudo(3 * 4 * hd, 5), 3, 4 * hd).unwrap();
        for mask in [AttnMask::Causal, AttnMask::Tree { parents: &[NO_PARENT, 0, 0] }, AttnMask::Full] {
            let want = f.attention(&q, &k32, &v32, rows, shape, mask).unwrap();
            let got = b.attention(&q, &k, &v, rows, shape, mask).unwrap();
            assert!(got.data.iter().zip(&want.data).all(|(a, c)| a.to_bits() == c.to_bits()), "hd {hd} {mask:?}");
        }
        // Compaction moves each row's scales with its codes (rows 3 and 5 differ in scale).
        b.compact_rows(&mut k, 2, &[0, 1, 3]).unwrap();
        let mut want = kd.clone();
        want.copy_within(5 * width..6 * width, 4 * width);
        assert_eq!(b.download_rows(&k, 0, 5).unwrap(), want[..5 * width].to_vec());
        let e = b.attention(&q, &k, &v32, rows, shape, AttnMask::Causal).unwrap_err().to_string();
        assert!(e.contains("stored differently") && e.contains("q8_0"), "{e}");
        let e = b.write_rows(&mut k32.clone(), 0, &k).unwrap_err().to_string();
        assert!(e.contains("stored in q8_0"), "{e}");
        // A cache whose scales do not cover its rows is refused, not read out of bounds.
        let mut bad = v.clone();
        bad.q8.d.truncate(1);
        let e = b.attention(&q, &k, &bad, rows, shape, AttnMask::Causal).unwrap_err().to_string();
        assert!(e.contains("holds") && e.contains("scales"), "{e}");
    }
}

/// A cache from `kv_zeros` keeps each KV head's rows contiguous (`CpuTensor::panels`):
/// written rows land in their heads' panels, download and compaction give the row-major
/// values back, and the attention over it equals the attention over a plain row-major tensor
/// of the same values bit for bit; a cache whose panels are not the call's KV heads is an
/// error.
#[test]
fn kv_cache_panels_hold_one_head_each_and_read_like_row_major() {
    let b = CpuBackend::new();
    let (rows, heads, hd) = (7, 3, 8);
    let width = heads * hd;
    let mut k = b.kv_zeros(rows, heads, hd).unwrap();
    let mut v = b.kv_zeros(rows, heads, hd).unwrap();
    assert_eq!((k.panels, k.panel_width()), (heads, hd));
    let (kx, vx) = (pseudo(rows * width, 3), pseudo(rows * width, 4));
    b.write_rows(&mut k, 0, &b.upload(&kx, rows, width).unwrap()).unwrap();
    b.write_rows(&mut v, 0, &b.upload(&vx, rows, width).unwrap()).unwrap();
    // Row 2's values of head 1 sit at panel 1, row 2.
    assert_eq!(&k.data[(rows + 2) * hd..(rows + 3) * hd], &kx[2 * width + hd..2 * width + 2 * hd]);
    assert_eq!(b.download(&k).unwrap(), kx);
    assert_eq!(b.download_rows(&v, 3, 2).unwrap(), vx[3 * width..5 * width].to_vec());
    let (kr, vr) = (b.upload(&kx, rows, width).unwrap(), b.upload(&vx, rows, width).unwrap());
    let shape = AttnShape { n_heads: 6, n_kv_heads: heads, head_dim: hd };
    let q = b.upload(&pseudo(3 * 6 * hd, 5), 3, 6 * hd).unwrap();
    for mask in [AttnMask::Causal, AttnMask::Tree { parents: &[NO_PARENT, 0, 1] }, AttnMask::Full] {
        let want = b.attention(&q, &kr, &vr, rows, shape, mask).unwrap();
        let got = b.attention(&q, &k, &v, rows, shape, mask).unwrap();
        assert!(got.data.iter().zip(&want.data).all(|(a, c)| a.to_bits() == c.to_bits()), "{mask:?}");
    }
    b.compact_rows(&mut k, 3, &[0, 2, 3]).unwrap();
    let mut want = kx.clone();
    want.copy_within(5 * width..7 * width, 4 * width);
    assert_eq!(b.download_rows(&k, 0, 6).unwrap(), want[..6 * width].to_vec());
    let two = AttnShape { n_heads: 4, n_kv_heads: 2, head_dim: 12 };
    let e = b.attention(&q, &k, &v, rows, two, AttnMask::Causal).unwrap_err().to_string();
    assert!(e.contains("3 panels") && e.contains("2 KV heads"), "{e}");
    assert!(b.kv_zeros(rows, 0, hd).is_err() && b.kv_zeros(rows, heads, 0).is_err());
}

#[test]
fn attention_tree_mask_sees_prefix_and_ancestors_only() {
    let b = CpuBackend::new();
    let shape = AttnShape { n_heads: 2, n_kv_heads: 1, head_dim: 4 };
    // 2 prefix rows + 3 tree rows: root, child of root, second child of root.
    let kv = 5;
    let k = b.upload(&pseudo(kv * 4, 5), kv, 4).unwrap();
    let v = b.upload(&pseudo(kv * 4, 6), kv, 4).unwrap();
    let q = b.upload(&pseudo(3 * 8, 7), 3, 8).unwrap();
    let tree = b.attention(&q, &k, &v, kv, shape, AttnMask::Tree { parents: &[NO_PARENT, 0, 0] }).unwrap();
    // Row 2 (second child) must equal attention over keys {0, 1, 2, 4} computed by a causal
    // call on a cache holding exactly those rows.
    let k2 = b.gather_rows(&k, &[0, 1, 2, 4]).unwrap();
    let v2 = b.gather_rows(&v, &[0, 1, 2, 4]).unwrap();
    let q2 = b.gather_rows(&q, &[2]).unwrap();
    let causal = b.attention(&q2, &k2, &v2, 4, shape, AttnMask::Causal).unwrap();
    assert_eq!(causal.data, tree.data[16..24].to_vec());
    // Bad parents are an error, not a panic.
    assert!(b.attention(&q, &k, &v, kv, shape, AttnMask::Tree { parents: &[NO_PARENT, 2, 0] }).is_err());
}
