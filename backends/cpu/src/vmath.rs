//! Vector math of the CPU backend's AVX2 paths: `exp` on 8 lanes (the attention softmax and
//! the MLP's SiLU) and SiLU·up. Every output depends only on its own input value, so rows stay
//! bit-identical however many share a call; the portable paths use `f32::exp`.

/// `exp(x)` as [`avx2::exp8`] computes it, one lane (its scalar twin, for tests): `n = round(x·log2 e)`, `r = x − n·c1 − n·c2` (fused), a degree-7 polynomial in
/// Horner form (fused), times `2ⁿ`; `x < −87.3` gives 0, NaN stays NaN, `x > 88.37` is
/// clamped (attention only passes `x ≤ 0`). Cephes `expf` coefficients.
#[cfg(test)]
pub(crate) fn exp8_scalar(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let xc = x.clamp(EXP_LO, EXP_HI);
    let n = (xc * std::f32::consts::LOG2_E).round_ties_even();
    let r = (-n).mul_add(EXP_C2, (-n).mul_add(EXP_C1, xc));
    let mut y = EXP_P[0];
    for &c in &EXP_P[1..] {
        y = y.mul_add(r, c);
    }
    let y = y.mul_add(r * r, r) + 1.0;
    let scaled = y * f32::from_bits((((n as i32) + 127) as u32) << 23);
    if x < EXP_UNDERFLOW {
        0.0
    } else {
        scaled
    }
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const EXP_HI: f32 = 88.376_26;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const EXP_LO: f32 = -88.376_26;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const EXP_UNDERFLOW: f32 = -87.3;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const EXP_C1: f32 = 0.693_359_4;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const EXP_C2: f32 = -2.121_944_4e-4;
/// Cephes `expf` polynomial, highest power first (`P0..P5`; then `·r² + r + 1`).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const EXP_P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

/// `silu(g)·u = g / (1 + exp(−g)) · u` elementwise into `out` (equal lengths; the caller
/// checks). AVX2: [`avx2::exp8`] on 8 values at a time (a tail is padded to 8 lanes, so every
/// value takes the same path wherever it sits); portable: `f32::exp`.
pub fn silu_mul(g: &[f32], u: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::isa::active() >= crate::isa::Isa::Avx2 {
            // SAFETY: `isa::active` only reports Avx2 when avx2 and fma were detected.
            unsafe { avx2::silu_mul(g, u, out) };
            return;
        }
    }
    for ((o, g), u) in out.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::{EXP_C1, EXP_C2, EXP_HI, EXP_LO, EXP_P, EXP_UNDERFLOW};
    use std::arch::x86_64::*;

    /// `exp(x)` on 8 lanes: `n = round(x·log2 e)`, `r = x − n·c1 − n·c2` (fused), a degree-7
    /// polynomial in Horner form (fused), times `2ⁿ`; `x < −87.3` gives 0, NaN stays NaN,
    /// `x > 88.37` is clamped to 88.37 first (a finite result near `f32::MAX`; the attention
    /// passes only `x ≤ 0`, SiLU `−g`). Cephes `expf` coefficients, ≤ 2 ulp on `[−87, 0]`.
    /// Caller guarantees avx2 + fma.
    #[inline(always)]
    pub(crate) unsafe fn exp8(x: __m256) -> __m256 {
        let xc = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(EXP_HI)), _mm256_set1_ps(EXP_LO));
        let n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(std::f32::consts::LOG2_E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        let nn = _mm256_sub_ps(_mm256_setzero_ps(), n);
        let r = _mm256_fmadd_ps(nn, _mm256_set1_ps(EXP_C2), _mm256_fmadd_ps(nn, _mm256_set1_ps(EXP_C1), xc));
        let mut y = _mm256_set1_ps(EXP_P[0]);
        for &c in &EXP_P[1..] {
            y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
        }
        let y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0));
        let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
        let scaled = _mm256_mul_ps(y, pow2);
        let under = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_UNDERFLOW), _CMP_LT_OQ);
        let nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
        _mm256_blendv_ps(_mm256_andnot_ps(under, scaled), x, nan)
    }

    /// [`exp8`] on 16 lanes (AVX-512): every lane runs exactly [`exp8`]'s operations in the
    /// same order (round to nearest even, the same fused steps, the same clamps), so each lane
    /// gives the bits [`exp8`] gives for it. Caller guarantees avx512f (and the AVX2 set).
    #[inline(always)]
    pub(crate) unsafe fn exp16(x: __m512) -> __m512 {
        let xc = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(EXP_HI)), _mm512_set1_ps(EXP_LO));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(xc, _mm512_set1_ps(std::f32::consts::LOG2_E)));
        let nn = _mm512_sub_ps(_mm512_setzero_ps(), n);
        let r = _mm512_fmadd_ps(nn, _mm512_set1_ps(EXP_C2), _mm512_fmadd_ps(nn, _mm512_set1_ps(EXP_C1), xc));
        let mut y = _mm512_set1_ps(EXP_P[0]);
        for &c in &EXP_P[1..] {
            y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c));
        }
        let y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0));
        let pow2 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127))));
        let scaled = _mm512_mul_ps(y, pow2);
        let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(EXP_UNDERFLOW));
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        _mm512_mask_blend_ps(nan, _mm512_maskz_mov_ps(!under, scaled), x)
    }

    /// [`super::silu_mul`] on AVX2. Caller guarantees avx2 + fma and equal lengths.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn silu_mul(g: &[f32], u: &[f32], out: &mut [f32]) {
        let n = g.len().min(u.len()).min(out.len());
        let one = _mm256_set1_ps(1.0);
        let silu = |gv: __m256, uv: __m256| _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv)))), uv);
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(out.as_mut_ptr().add(i), silu(_mm256_loadu_ps(g.as_ptr().add(i)), _mm256_loadu_ps(u.as_ptr().add(i))));
            i += 8;
        }
        if i < n {
            let (mut gb, mut ub, mut ob) = ([0.0f32; 8], [0.0f32; 8], [0.0f32; 8]);
            gb[..n - i].copy_from_slice(&g[i..n]);
            ub[..n - i].copy_from_slice(&u[i..n]);
            _mm256_storeu_ps(ob.as_mut_ptr(), silu(_mm256_loadu_ps(gb.as_ptr()), _mm256_loadu_ps(ub.as_ptr())));
            out[i..n].copy_from_slice(&ob[..n - i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp8_is_within_two_ulp_of_exp_and_handles_the_edges() {
        let mut x = -87.0f32;
        while x <= 0.0 {
            let (got, want) = (exp8_scalar(x), (x as f64).exp());
            assert!(((got as f64 - want) / want).abs() < 2.5e-7, "exp8({x}) = {got}, exp = {want}");
            x += 0.0137;
        }
        assert_eq!(exp8_scalar(0.0), 1.0);
        assert_eq!(exp8_scalar(-100.0), 0.0);
        assert_eq!(exp8_scalar(f32::NEG_INFINITY), 0.0);
        assert!(exp8_scalar(f32::NAN).is_nan());
        #[cfg(target_arch = "x86_64")]
        if crate::isa::detected() >= crate::isa::Isa::Avx2 {
            // The vector code equals its scalar twin lane for lane.
            let edges = [f32::NAN, f32::NEG_INFINITY, -0.0, 1e-30, f32::INFINITY, 88.5, -87.3, -87.31];
            let xs: Vec<f32> = edges.into_iter().chain((0..3992).map(|i| -90.0 + i as f32 * 0.0231)).collect();
            assert_eq!(xs.len() % 8, 0, "every value in a full 8-lane chunk");
            for chunk in xs.chunks(8) {
                let mut out = [0.0f32; 8];
                unsafe {
                    use std::arch::x86_64::*;
                    #[target_feature(enable = "avx2,fma")]
                    unsafe fn run(x: &[f32], out: &mut [f32; 8]) {
                        _mm256_storeu_ps(out.as_mut_ptr(), avx2::exp8(_mm256_loadu_ps(x.as_ptr())));
                    }
                    run(chunk, &mut out);
                }
                for (a, b) in chunk.iter().zip(out) {
                    let want = exp8_scalar(*a);
                    assert!(want.to_bits() == b.to_bits() || (want.is_nan() && b.is_nan()), "exp8({a}): vector {b}, scalar {want}");
                }
            }
        }
    }

    /// The 16-lane exp (the attention's softmax on AVX-512) equals [`avx2::exp8`] lane for
    /// lane (two 8-lane calls on the same values): the edges (NaN, ±∞, ±0, the clamps ±88.37
    /// and the underflow bound −87.3 with its neighbours) and inputs whose `x·log2 e` lies on
    /// or next to a rounding tie (`k + 0.5`), where the two roundings would differ first.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp16_equals_exp8_lane_for_lane() {
        if crate::isa::detected() < crate::isa::Isa::Avx512Vnni {
            eprintln!("SKIPPED: exp16 needs AVX-512 (this CPU: {:?})", crate::isa::detected());
            return;
        }
        let mut xs = vec![f32::NAN, f32::NEG_INFINITY, f32::INFINITY, 0.0, -0.0, 1e-30, EXP_HI, EXP_LO, 88.5, -88.5, EXP_UNDERFLOW];
        xs.extend([EXP_UNDERFLOW.next_up(), EXP_UNDERFLOW.next_down()]);
        for k in -126..127 {
            let tie = (k as f32 + 0.5) / std::f32::consts::LOG2_E;
            xs.extend([tie.next_down(), tie, tie.next_up()]);
        }
        xs.extend((0..4000).map(|i| -95.0 + i as f32 * 0.0237));
        xs.resize(xs.len().next_multiple_of(16), -1.0);
        for chunk in xs.chunks(16) {
            let (mut wide, mut narrow) = ([0.0f32; 16], [0.0f32; 16]);
            // SAFETY: avx512f was detected (Avx512Vnni implies it and the AVX2 set); every
            // chunk holds 16 values.
            unsafe {
                use std::arch::x86_64::*;
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn run(x: &[f32], wide: &mut [f32; 16], narrow: &mut [f32; 16]) {
                    _mm512_storeu_ps(wide.as_mut_ptr(), avx2::exp16(_mm512_loadu_ps(x.as_ptr())));
                    _mm256_storeu_ps(narrow.as_mut_ptr(), avx2::exp8(_mm256_loadu_ps(x.as_ptr())));
                    _mm256_storeu_ps(narrow.as_mut_ptr().add(8), avx2::exp8(_mm256_loadu_ps(x.as_ptr().add(8))));
                }
                run(chunk, &mut wide, &mut narrow);
            }
            for ((a, w), n) in chunk.iter().zip(wide).zip(narrow) {
                assert!(w.to_bits() == n.to_bits() || (w.is_nan() && n.is_nan()), "exp16({a}) = {w}, exp8 {n}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn silu_mul_is_close_to_f64_and_position_independent() {
        let g: Vec<f32> = (0..203).map(|i| (i as f32 - 100.0) * 0.37).chain([f32::NAN, -200.0, 200.0]).collect();
        let u: Vec<f32> = (0..g.len()).map(|i| 1.0 + (i % 7) as f32 * 0.5).collect();
        let mut out = vec![0.0f32; g.len()];
        silu_mul(&g, &u, &mut out);
        for i in 0..g.len() {
            let (gd, ud) = (g[i] as f64, u[i] as f64);
            let want = gd / (1.0 + (-gd).exp()) * ud;
            if g[i].is_nan() {
                assert!(out[i].is_nan());
            } else {
                assert!((out[i] as f64 - want).abs() <= 1e-6 * want.abs() + 1e-30, "silu({}) · {}: {} vs {want}", g[i], u[i], out[i]);
            }
            // The same value alone (a tail of one) gives the same bits.
            let mut one = [0.0f32];
            silu_mul(&g[i..i + 1], &u[i..i + 1], &mut one);
            assert!(one[0].to_bits() == out[i].to_bits() || (one[0].is_nan() && out[i].is_nan()), "position {i}");
        }
    }
}
