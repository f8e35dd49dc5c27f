//! Every kernel path against the scalar reference, row invariance, and the repacking against
//! ggml's own dequantization formulas.

use super::*;
use half::f16;

fn pseudo(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn f16_le(b: &[u8], i: usize) -> f16 {
    f16::from_le_bytes([b[i], b[i + 1]])
}

/// Random ggml blocks of `format` for `[n, k]` (random codes and sub-block scales, small
/// positive f16 scales; Q4_1's min negative).
fn random_ggml(format: QFormat, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let nblk = n * k / format.block_values();
    let bb = format.ggml_block_bytes();
    let r = pseudo(nblk * bb, seed);
    let mut out = Vec::with_capacity(nblk * bb);
    for blk in 0..nblk {
        let rb = &r[blk * bb..(blk + 1) * bb];
        let mut bytes: Vec<u8> = rb.iter().map(|v| ((v + 1.0) * 127.9) as u8).collect();
        let mut set = |at: usize, v: f32| bytes[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        match format {
            QFormat::Q6K => set(208, 0.001 + 0.002 * rb[0].abs()),
            QFormat::Q4K => {
                set(0, 0.001 + 0.002 * rb[0].abs());
                set(2, 0.001 + 0.004 * rb[1].abs());
            }
            QFormat::Q4_1 => {
                set(0, 0.01 + 0.02 * rb[0].abs());
                set(2, -0.1 * rb[1].abs());
            }
            _ => set(0, 0.01 + 0.02 * rb[0].abs()),
        }
        out.extend_from_slice(&bytes);
    }
    out
}

const FORMATS: [QFormat; 6] = [QFormat::Q8_0, QFormat::Q4_0, QFormat::Q4_1, QFormat::Q5_0, QFormat::Q4K, QFormat::Q6K];

/// `k` rounded up to the format's block (256 values for the K-quants).
fn fit_k(format: QFormat, k: usize) -> usize {
    k.next_multiple_of(format.block_values())
}

#[test]
fn every_path_equals_the_scalar_reference_bit_for_bit() {
    // K a multiple of 32 but not of 256; N not a multiple of any tile; M = 1..=65.
    eprintln!("quant kernel paths tested on this CPU: {:?} (SPARKLING_CPU_ISA selects the one in use: {:?})", crate::isa::available(), crate::isa::active());
    let pools: Vec<rayon::ThreadPool> = [1, 3].iter().map(|&t| rayon::ThreadPoolBuilder::new().num_threads(t).build().unwrap()).collect();
    for &format in &FORMATS {
        // Column groups of 8: 5, 1, 3 (an unpaired last group on the AVX-512 path), 6 and
        // 17 (several pairs per task, and two-pair one-row tiles); 6 and 17 with N a multiple of
        // 8, written in place (`direct_output`), as are 1 (an unpaired group only) and 2 (one pair).
        for &(n, k) in &[(37usize, 96usize), (5, 32), (19, 288), (48, 64), (130, 160), (136, 96), (8, 64), (16, 32)] {
            let k = fit_k(format, k);
            let w = QWeight::from_ggml(format, &random_ggml(format, n, k, 7), n, k).unwrap();
            for m in [1usize, 2, 3, 4, 5, 7, 8, 9, 12, 13, 15, 16, 17, 25, 65] {
                let x = pseudo(m * k, 100 + m as u64);
                let a = quantize_acts(&x, m, k);
                let want: Vec<f32> = (0..m).flat_map(|i| (0..n).map(move |j| (i, j))).map(|(i, j)| dot_scalar(&w, j, &a, i)).collect();
                for isa in crate::isa::available() {
                    // 1 thread (one task per few pairs) and 3 (more, smaller tasks), whatever
                    // this machine's core count.
                    for pool in &pools {
                        let got = pool.install(|| matmul(isa, &x, m, &w, None));
                        let same = got.iter().zip(&want).all(|(g, r)| g.to_bits() == r.to_bits());
                        assert!(same, "{format:?} {isa:?} m={m} n={n} k={k} threads={}", pool.current_num_threads());
                    }
                }
            }
        }
    }
}

#[test]
fn rows_are_bit_identical_alone_in_a_verify_and_on_any_thread_count() {
    for &format in &FORMATS {
        let (n, k) = (70, fit_k(format, 160));
        let x = pseudo(65 * k, 3);
        let w = QWeight::from_ggml(format, &random_ggml(format, n, k, 11), n, k).unwrap();
        for isa in crate::isa::available() {
            let all = matmul(isa, &x, 65, &w, None);
            for threads in [1, 2] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let again = pool.install(|| matmul(isa, &x, 65, &w, None));
                assert!(all.iter().zip(&again).all(|(a, b)| a.to_bits() == b.to_bits()), "{format:?} {isa:?} {threads} threads");
                for i in [0usize, 1, 31, 64] {
                    let one = pool.install(|| matmul(isa, &x[i * k..(i + 1) * k], 1, &w, None));
                    let same = one.iter().zip(&all[i * n..(i + 1) * n]).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{format:?} {isa:?} row {i} alone vs in 65 rows ({threads} threads)");
                }
            }
        }
    }
}

/// ggml's dequantization of one block straight from its bytes (gguf.md / ggml-quants.c
/// `dequantize_row_*`), independent of the repacked layout.
fn ggml_dequant_block(format: QFormat, blk: &[u8]) -> Vec<f32> {
    let d = f16_le(blk, 0).to_f32();
    match format {
        QFormat::Q8_0 => blk[2..34].iter().map(|&q| q as i8 as f32 * d).collect(),
        QFormat::Q4_0 => (0..32).map(|t| ((if t < 16 { blk[2 + t] & 15 } else { blk[2 + t - 16] >> 4 }) as f32 - 8.0) * d).collect(),
        QFormat::Q4_1 => {
            let m = f16_le(blk, 2).to_f32();
            (0..32).map(|t| d * (if t < 16 { blk[4 + t] & 15 } else { blk[4 + t - 16] >> 4 }) as f32 + m).collect()
        }
        QFormat::Q5_0 => {
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            (0..32)
                .map(|t| {
                    let lo = if t < 16 { blk[6 + t] & 15 } else { blk[6 + t - 16] >> 4 };
                    ((lo as u32 | ((qh >> t) & 1) << 4) as f32 - 16.0) * d
                })
                .collect()
        }
        QFormat::Q4K => {
            // ggml's loop: per 64 values two sub-blocks, `get_scale_min_k4`, low then high nibbles.
            let (d, dmin, sc, q) = (f16_le(blk, 0).to_f32(), f16_le(blk, 2).to_f32(), &blk[4..16], &blk[16..144]);
            let get = |j: usize| -> (f32, f32) {
                let (s, m) =
                    if j < 4 { (sc[j] & 63, sc[j + 4] & 63) } else { ((sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)) };
                (s as f32, m as f32)
            };
            let mut y = Vec::with_capacity(256);
            for (i, q) in q.chunks_exact(32).enumerate() {
                let ((s1, m1), (s2, m2)) = (get(2 * i), get(2 * i + 1));
                let (d1, m1, d2, m2) = (d * s1, dmin * m1, d * s2, dmin * m2);
                y.extend(q.iter().map(|&v| d1 * (v & 0xF) as f32 - m1));
                y.extend(q.iter().map(|&v| d2 * (v >> 4) as f32 - m2));
            }
            y
        }
        QFormat::Q6K => {
            let (d, sc) = (f16_le(blk, 208).to_f32(), &blk[192..208]);
            let mut y = vec![0.0f32; 256];
            for n in 0..2 {
                let (ql, qh, sc, y) = (&blk[64 * n..64 * n + 64], &blk[128 + 32 * n..160 + 32 * n], &sc[8 * n..8 * n + 8], &mut y[128 * n..128 * n + 128]);
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    y[l] = d * sc[is] as i8 as f32 * q1 as f32;
                    y[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
                    y[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
                    y[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
                }
            }
            y
        }
    }
}

#[test]
fn repacked_rows_dequantize_as_ggml_does_and_gathered_rows_are_the_same_blocks() {
    for &format in &FORMATS {
        let (n, k) = (19, fit_k(format, 96));
        let raw = random_ggml(format, n, k, 23);
        let w = QWeight::from_ggml(format, &raw, n, k).unwrap();
        let (bb, per_row) = (format.ggml_block_bytes(), k / format.block_values());
        let mut row = vec![0.0f32; k];
        for j in 0..n {
            w.row_into(j, &mut row);
            let want: Vec<f32> = raw[j * per_row * bb..(j + 1) * per_row * bb].chunks_exact(bb).flat_map(|blk| ggml_dequant_block(format, blk)).collect();
            assert_eq!(row, want, "{format:?} row {j}");
        }
        let g = w.gather_rows(&[18, 0, 9]);
        for (i, &j) in [18usize, 0, 9].iter().enumerate() {
            let (mut a, mut b) = (vec![0.0f32; k], vec![0.0f32; k]);
            g.row_into(i, &mut a);
            w.row_into(j, &mut b);
            assert_eq!(a, b, "{format:?} gathered row {i} = row {j}");
        }
    }
}

#[test]
fn matmul_is_close_to_the_f64_product_of_the_dequantized_weights() {
    for &format in &FORMATS {
        let (m, n, k) = (3, 21, fit_k(format, 128));
        let x = pseudo(m * k, 5);
        let w = QWeight::from_ggml(format, &random_ggml(format, n, k, 13), n, k).unwrap();
        let mut wd = vec![0.0f32; n * k];
        for (j, row) in wd.chunks_mut(k).enumerate() {
            w.row_into(j, row);
        }
        let y = matmul(crate::isa::active(), &x, m, &w, None);
        for i in 0..m {
            for j in 0..n {
                let exact: f64 = (0..k).map(|t| x[i * k + t] as f64 * wd[j * k + t] as f64).sum();
                let scale: f64 = (0..k).map(|t| (x[i * k + t] as f64 * wd[j * k + t] as f64).abs()).sum();
                // 8-bit activations: relative error ≲ 1/254 of Σ|x·w|.
                assert!((y[i * n + j] as f64 - exact).abs() <= 6e-3 * scale + 1e-6, "{format:?} ({i},{j}): {} vs {exact}", y[i * n + j]);
            }
        }
    }
}

#[test]
fn avx2_activation_quantizer_equals_the_scalar_one() {
    #[cfg(target_arch = "x86_64")]
    if crate::isa::detected() >= Isa::Avx2 {
        let mut x = pseudo(32 * 200, 17);
        // Ties, zeros, a zero block, huge and tiny magnitudes.
        x[3] = 0.5;
        x[5] = -2.5;
        x[32..64].iter_mut().for_each(|v| *v = 0.0);
        x[70] = 1e30;
        x[100] = -1e-30;
        // A block so small that 1/d overflows to inf (codes saturate, zeros stay 0), and one
        // holding an inf (d = inf, every code 0).
        x[128..160].iter_mut().enumerate().for_each(|(i, v)| *v = if i % 3 == 0 { 0.0 } else { 1e-37 * (i as f32 - 16.0) });
        x[170] = f32::INFINITY;
        for (blk, q) in x.chunks_exact(32).zip(0..) {
            let (mut qa, mut qb) = ([0u8; 32], [0u8; 32]);
            let d = quantize_block(blk, &mut qa);
            let sum: i32 = qa.iter().map(|&v| v as i8 as i32).sum();
            let (d2, sum2) = unsafe { avx2::quantize_block(blk, &mut qb) };
            assert_eq!((d.to_bits(), sum, qa), (d2.to_bits(), sum2, qb), "block {q}");
        }
    }
}

/// Whether quantizing `blk` overflows `1/d` (the codes saturate at ±127).
fn a_codes_saturate(blk: &[f32]) -> bool {
    let mut q = [0u8; 32];
    let d = quantize_block(blk, &mut q);
    (1.0 / d).is_infinite() && q.iter().all(|&c| c as i8 == 127 || c as i8 == -127)
}

#[test]
fn every_path_equals_the_scalar_reference_on_extreme_activation_blocks() {
    // Blocks whose 1/d overflows (codes saturate) and blocks holding an inf (d = inf, codes 0)
    // reach the code sums that Q8_0 (on VNNI), Q4_0, Q5_0 and Q6_K subtract: every path still
    // gives the reference's values (NaN where the reference is NaN). m = 0 gives nothing.
    let (n, k, m) = (24usize, 256usize, 3usize);
    let mut x = pseudo(m * k, 23);
    x[0..32].iter_mut().enumerate().for_each(|(i, v)| *v = 1e-37 * (i as f32 - 16.0));
    x[k + 40] = f32::INFINITY;
    // Row 2: one block of tiny values alone (its 1/d is inf; every code saturates), so its
    // integer sum decides the output.
    x[2 * k..3 * k].iter_mut().for_each(|v| *v = 0.0);
    x[2 * k + 64..2 * k + 96].iter_mut().enumerate().for_each(|(i, v)| *v = if i % 2 == 0 { -3e-38 } else { 2e-38 });
    assert!(a_codes_saturate(&x[2 * k + 64..2 * k + 96]), "the test block must overflow 1/d");
    let a = quantize_acts(&x, m, k);
    for &format in &FORMATS {
        let w = QWeight::from_ggml(format, &random_ggml(format, n, k, 5), n, k).unwrap();
        let want: Vec<f32> = (0..m).flat_map(|i| (0..n).map(move |j| (i, j))).map(|(i, j)| dot_scalar(&w, j, &a, i)).collect();
        for isa in crate::isa::available() {
            let got = matmul(isa, &x, m, &w, None);
            let same = got.iter().zip(&want).all(|(g, r)| g.to_bits() == r.to_bits() || (g.is_nan() && r.is_nan()));
            assert!(same, "{format:?} {isa:?}");
            assert!(matmul(isa, &[], 0, &w, None).is_empty(), "{format:?} {isa:?}: m = 0");
        }
    }
}

#[test]
fn q8_0_quantizer_round_trips_and_bad_shapes_are_errors() {
    let (n, k) = (3, 64);
    let x = pseudo(n * k, 9);
    let w = QWeight::quantize_q8_0(&x, n, k).unwrap();
    let mut row = vec![0.0f32; k];
    for j in 0..n {
        w.row_into(j, &mut row);
        for t in 0..k {
            assert!((row[t] - x[j * k + t]).abs() <= 1.0 / 127.0 * 0.51 + 1e-3);
        }
    }
    assert_eq!(w.bytes(), 8 * k + 2 * 8 * 2);
    assert!(QWeight::quantize_q8_0(&x, n, 60).is_err());
    assert!(QWeight::from_ggml(QFormat::Q4_1, &[0u8; 39], 1, 64).is_err());
    assert!(QWeight::from_ggml(QFormat::Q4_1, &[0u8; 40], 1, 48).is_err());
    // Non-finite block scales (d, or Q4_1's min m) are corrupt weights, named by block.
    let mut blocks = [0u8; 40];
    assert!(QWeight::from_ggml(QFormat::Q4_1, &blocks, 1, 64).is_ok());
    blocks[20 + 2..20 + 4].copy_from_slice(&f16::NAN.to_le_bytes());
    let e = QWeight::from_ggml(QFormat::Q4_1, &blocks, 1, 64).unwrap_err();
    assert!(matches!(&e, QuantError::Corrupt(m) if m.contains("block 1 of row 0") && m.contains("non-finite")), "{e}");
    let mut q8 = [0u8; 34];
    q8[..2].copy_from_slice(&f16::INFINITY.to_le_bytes());
    assert!(QWeight::from_ggml(QFormat::Q8_0, &q8, 1, 32).is_err());
}
