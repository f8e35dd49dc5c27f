//! The q8_0 KV cache format ([`crate::KvDtype::Q8_0`]): each cache row's values in blocks of
//! [`KV_BLOCK`] (the last block of a row may be shorter), each block stored as 8-bit codes and
//! one scale, as llama.cpp's `q8_0` cache type (`-ctk q8_0 -ctv q8_0`; `quantize_row_q8_0_ref`
//! in ggml-quants.c): `d = amax/127`, `code = round(x/d)` (half away from zero), the scale kept
//! as `f16(d)`. Here it is held as an f32 whose value is that f16, so a value's dequantization
//! `code · d` is **exact** in f32 (a 7-bit code times an 11-bit significand): the attention
//! over a q8_0 cache is the f32 attention over the dequantized values, bit for bit, and every
//! method still reads the same cache as `ar`. A row costs `cols + 4·⌈cols/32⌉` bytes, 0.56× an
//! f16 cache's: the attention of a batch of decode rows, or of one row at a long context, reads
//! its cache from memory, so it runs at about the bytes it reads (BENCHMARKS.md §32).

/// Values per block of a q8_0 cache row (llama.cpp's `QK8_0`).
pub const KV_BLOCK: usize = 32;

/// Blocks per row of `cols` values.
pub fn blocks(cols: usize) -> usize {
    cols.div_ceil(KV_BLOCK)
}

/// Quantize one row `x` into `codes` (`x.len()` of them) and `d` ([`blocks`]`(x.len())`
/// scales), as the module docs define. A block holding a NaN or an infinity gets a NaN or
/// infinite scale, so every value of the block reads back as NaN (an f32 cache would keep the
/// other values; the attention's result is NaN either way).
pub fn quantize_row(x: &[f32], codes: &mut [i8], d: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa::detected() >= crate::isa::Isa::Avx2 {
        // SAFETY: avx2 was detected on this CPU.
        unsafe { quantize_row_avx2(x, codes, d) };
        return;
    }
    quantize_row_body(x, codes, d);
}

/// [`quantize_row`] on AVX2, a whole block of 32 values per iteration: the same IEEE
/// operations per value as [`quantize_row_body`] (max of |x| is exact in any order; the
/// rounding is [`round_half_away`]'s; the packs saturate as `as i8` does), so the same codes and
/// scales. Blocks holding a NaN or an infinity, and a short last block, take the body.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_row_avx2(x: &[f32], codes: &mut [i8], d: &mut [f32]) {
    use std::arch::x86_64::*;
    let full = x.len() / KV_BLOCK;
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let (sign, half, one) = (_mm256_set1_ps(-0.0), _mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
    // After the two packs the 4-byte groups are v0[0..4], v1[0..4], v2[0..4], v3[0..4],
    // v0[4..8], …: back into value order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for b in 0..full {
        let p = x.as_ptr().add(b * KV_BLOCK);
        let v = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))];
        let a = v.map(|vi| _mm256_and_ps(vi, abs_mask));
        let a = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
        let nan = v.map(|vi| _mm256_cmp_ps::<_CMP_UNORD_Q>(vi, vi));
        let nan = _mm256_or_ps(_mm256_or_ps(nan[0], nan[1]), _mm256_or_ps(nan[2], nan[3]));
        let m4 = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)));
        let at = b * KV_BLOCK..(b + 1) * KV_BLOCK;
        if _mm256_movemask_ps(nan) != 0 || !amax.is_finite() {
            quantize_row_body(&x[at.clone()], &mut codes[at], &mut d[b..b + 1]);
            continue;
        }
        let scale = amax / 127.0;
        let inv = _mm256_set1_ps(if scale != 0.0 { 1.0 / scale } else { 0.0 });
        let q = v.map(|vi| {
            let p = _mm256_mul_ps(vi, inv);
            let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(p);
            let up = _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_and_ps(_mm256_sub_ps(p, t), abs_mask), half);
            _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(up, _mm256_or_ps(_mm256_and_ps(p, sign), one))))
        });
        let bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256(codes.as_mut_ptr().add(b * KV_BLOCK) as *mut __m256i, _mm256_permutevar8x32_epi32(bytes, order));
        d[b] = half::f16::from_f32(scale).to_f32();
    }
    if full * KV_BLOCK < x.len() {
        quantize_row_body(&x[full * KV_BLOCK..], &mut codes[full * KV_BLOCK..], &mut d[full..]);
    }
}

#[inline(always)]
fn quantize_row_body(x: &[f32], codes: &mut [i8], d: &mut [f32]) {
    for ((xb, cb), db) in x.chunks(KV_BLOCK).zip(codes.chunks_mut(KV_BLOCK)).zip(d.iter_mut()) {
        // NaN-propagating (`f32::max` would skip a NaN and hide it as code 0).
        let amax = xb.iter().fold(0.0f32, |m, &v| if v.is_nan() || m.is_nan() { f32::NAN } else { m.max(v.abs()) });
        let scale = amax / 127.0;
        let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        for (c, &v) in cb.iter_mut().zip(xb) {
            // `as` saturates (and maps NaN to 0); |v·inv| ≤ 127 up to rounding.
            *c = round_half_away(v * inv) as i8;
        }
        *db = half::f16::from_f32(scale).to_f32();
    }
}

/// `x.round()` (C's `roundf`: half away from zero) without the libm call `f32::round` makes:
/// `x − trunc(x)` is exact, so comparing it with ½ decides the same way for every finite `x`
/// (at |x| ≥ 2²³ every f32 is an integer and the difference is 0).
#[inline(always)]
fn round_half_away(x: f32) -> f32 {
    let t = x.trunc();
    if (x - t).abs() >= 0.5 {
        t + 1.0f32.copysign(x)
    } else {
        t
    }
}

/// Dequantize `n` values of a row from column `c0` (`codes` and `d` are the whole row's).
pub fn dequantize(codes: &[i8], d: &[f32], c0: usize, n: usize, out: &mut Vec<f32>) {
    out.clear();
    out.extend((c0..c0 + n).map(|c| codes[c] as f32 * d[c / KV_BLOCK]));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_roundf() {
        let mut x = 1.0e-3f32;
        let mut checked = 0;
        while x < 300.0 {
            for v in [x, -x, x.next_up(), x.next_down(), x.floor() + 0.5, -(x.floor() + 0.5), 0.49999997, -0.49999997] {
                assert_eq!(round_half_away(v).to_bits(), v.round().to_bits(), "{v}");
                checked += 1;
            }
            x *= 1.0007;
        }
        assert!(checked > 50_000);
        // The dispatched quantizer (AVX2 where detected) equals the portable body: random
        // blocks of many magnitudes, exact halves of the step, zeros and −0, a NaN, infinities,
        // a short last block.
        let mut seed = 7u64;
        let mut x: Vec<f32> = (0..32 * 400 + 13)
            .map(|i| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let u = ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
                u * [1e-6f32, 0.01, 1.0, 37.0, 6.0e4][(i / 32) % 5]
            })
            .collect();
        for (i, v) in x[32 * 10..32 * 11].iter_mut().enumerate() {
            *v = if i == 0 { 127.0 } else { i as f32 - 16.5 }; // d = 1: exact halves
        }
        for (b, special) in [(20usize, f32::NAN), (21, f32::INFINITY), (22, f32::NEG_INFINITY), (23, 0.0), (24, -0.0)] {
            if special == 0.0 {
                x[32 * b..32 * (b + 1)].iter_mut().for_each(|v| *v = special);
            } else {
                x[32 * b + 5] = special;
            }
        }
        let n = x.len();
        let (mut c1, mut d1, mut c2, mut d2) = (vec![0i8; n], vec![0.0f32; blocks(n)], vec![0i8; n], vec![0.0f32; blocks(n)]);
        quantize_row(&x, &mut c1, &mut d1);
        quantize_row_body(&x, &mut c2, &mut d2);
        assert_eq!(c1, c2);
        assert_eq!(d1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), d2.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        assert!(c1.contains(&127) && c1.contains(&-127));
        assert_eq!(round_half_away(8_388_609.0), 8_388_609.0);
        assert!(round_half_away(f32::NAN).is_nan());
    }

    #[test]
    fn quantizes_like_llamacpp_q8_0_and_dequantizes_exactly() {
        // amax 127: d = 1, codes round half away from zero (2.5 → 3, not 2 as to-even would).
        let mut x: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
        x[0] = -127.0;
        x[1] = 2.5;
        x[2] = -1.5;
        let (mut c, mut d) = (vec![0i8; 32], vec![0.0f32; 1]);
        quantize_row(&x, &mut c, &mut d);
        assert_eq!((d[0], c[0], c[1], c[2], c[3], c[31]), (1.0, -127, 3, -2, -13, 15));
        // amax 2.54: the scale is stored as f16(0.02) = 1311·2⁻¹⁶.
        let y: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.1).chain([2.54]).collect::<Vec<_>>()[1..].to_vec();
        quantize_row(&y, &mut c, &mut d);
        assert_eq!(d[0], 1311.0 / 65536.0);
        assert_eq!((c[31], c[0]), (127, -75));
        // Dequantization is exact: code·d equals the f64 product.
        let mut out = Vec::new();
        dequantize(&c, &d, 0, 32, &mut out);
        for (&v, &cc) in out.iter().zip(&c) {
            assert_eq!(v as f64, cc as f64 * d[0] as f64);
        }
        // A short last block and an all-zero block.
        let z: Vec<f32> = (0..40).map(|i| if i < 32 { 0.0 } else { i as f32 }).collect();
        let (mut c, mut d) = (vec![0i8; 40], vec![0.0f32; blocks(40)]);
        quantize_row(&z, &mut c, &mut d);
        assert_eq!(blocks(40), 2);
        assert_eq!((d[0], c[0], c[39]), (0.0, 0, 127));
        dequantize(&c, &d, 33, 3, &mut out);
        assert_eq!(out.len(), 3);
        assert!((out[2] - 35.0).abs() < 0.2, "{out:?}");
        // A NaN or an infinity makes its block read back as NaN, not as code 0; the other
        // block is untouched.
        for bad in [f32::NAN, f32::INFINITY] {
            let mut w = z.clone();
            w[35] = bad;
            quantize_row(&w, &mut c, &mut d);
            dequantize(&c, &d, 0, 40, &mut out);
            assert!(out[32..].iter().all(|v| v.is_nan()) && out[..32].iter().all(|&v| v == 0.0), "{bad}: {out:?}");
        }
    }
}
