//! AVX2 path of the quantized matmul: int8 dot products with `vpmaddubsw` / `vpmaddwd` on
//! 256-bit registers (8 columns of one interleaved group per register), the float epilogue in the
//! order the module docs of [`super`] define.

#![allow(clippy::needless_range_loop)] // register tiles are indexed by row and column group
use super::{QActs, QFormat, QWeight, F_Q4K, F_Q4_0, F_Q4_1, F_Q5_0, F_Q6K, F_Q8_0, GC, H_BYTES, QK};
use std::arch::x86_64::*;

/// A high-bit plane's 32 bits as bytes: byte `i` of the result is `v` where bit `i` of `mask`
/// is set, else 0 (Q5_0's bit 4: `v` = 0x10; Q6_K's bits 4 and 5: 0x10 and 0x20).
#[inline(always)]
unsafe fn plane_bits(mask: u32, v: i8) -> __m256i {
    let m = _mm256_set1_epi32(mask as i32);
    let idx = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let hit = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(m, idx), sel), sel);
    _mm256_and_si256(hit, _mm256_set1_epi8(v))
}

/// [`super::quantize_block`] on AVX2 (same exactly rounded steps: |x| max, `amax/127`,
/// `1/d`, `x·id` rounded to nearest even, clamped to [-127, 127] with NaN as 0) plus the sum
/// of the stored codes.
/// Caller guarantees avx2 and 32-value slices.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_block(x: &[f32], q: &mut [u8]) -> (f32, i32) {
    let p = x.as_ptr();
    let v = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))];
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut mx = _mm256_and_ps(v[0], abs);
    for vi in &v[1..] {
        mx = _mm256_max_ps(mx, _mm256_and_ps(*vi, abs));
    }
    let m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
    // As the scalar version: clamp to [-127, 127] and zero NaN (`cvtps` would give i32::MIN for
    // both: an infinite `1/d` of a tiny block, or an inf input times 0); the codes then fit a
    // byte and `sum` is the sum of the stored codes.
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    let mut iv = [_mm256_setzero_si256(); 4];
    for (o, vi) in iv.iter_mut().zip(&v) {
        let r = _mm256_round_ps(_mm256_mul_ps(*vi, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        let ordered = _mm256_cmp_ps::<_CMP_ORD_Q>(r, r);
        *o = _mm256_cvtps_epi32(_mm256_and_ps(_mm256_min_ps(_mm256_max_ps(r, lo), hi), ordered));
    }
    let sum4 = _mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]), _mm256_add_epi32(iv[2], iv[3]));
    let s4 = _mm_add_epi32(_mm256_castsi256_si128(sum4), _mm256_extracti128_si256(sum4, 1));
    let s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0b01_00_11_10));
    let sum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0b10_11_00_01)));
    // packs work per 128-bit lane: restore value order with a lane permutation.
    let p16a = _mm256_packs_epi32(iv[0], iv[1]);
    let p16b = _mm256_packs_epi32(iv[2], iv[3]);
    let p8 = _mm256_packs_epi16(p16a, p16b);
    let ordered = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, ordered);
    (d, sum)
}

/// The 8 columns' f16 values at `p` widened to f32 (exact).
#[inline(always)]
unsafe fn load_f16x8(p: *const half::f16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// 4 activation codes at `p` broadcast to every 32-bit lane.
#[inline(always)]
unsafe fn bcast4(p: *const u8) -> __m256i {
    _mm256_set1_epi32((p as *const i32).read_unaligned())
}

/// Register tile: rows `i0..i0+MR` × column groups `g0..g0+NG` (8 columns each). Each
/// weight chunk is loaded once and used for all `MR` rows. Writes `out[r·stride + 8q + c]`.
#[inline(always)]
unsafe fn tile<const F: u8, const MR: usize, const NG: usize>(w: &QWeight, g0: usize, a: &QActs, i0: usize, out: *mut f32, stride: usize) {
    let ones = _mm256_set1_epi16(1);
    let low4 = _mm256_set1_epi8(0x0F);
    let sign = _mm256_set1_epi8(-128);
    let cb = w.format.code_bytes() * GC;
    let mut acc = [[_mm256_setzero_ps(); NG]; MR];
    for b in 0..w.nb {
        if MR == 1 || i0 == 0 {
            // A task's first pass over its weights streams them from memory: fetch this block
            // of the next NG groups while these are computed.
            for q in 0..NG {
                w.prefetch_block(g0 + NG + q, b);
            }
        }
        let mut isum = [[_mm256_setzero_si256(); NG]; MR];
        if F == F_Q8_0 {
            for g in 0..8 {
                let mut wv = [_mm256_setzero_si256(); NG];
                let mut wa = [_mm256_setzero_si256(); NG];
                for q in 0..NG {
                    // The stored `code + 128` back to the signed code (once per chunk, every row).
                    wv[q] = _mm256_xor_si256(_mm256_loadu_si256(w.qs.as_ptr().add(((g0 + q) * w.nb + b) * cb + 32 * g) as *const __m256i), sign);
                    wa[q] = _mm256_sign_epi8(wv[q], wv[q]);
                }
                for r in 0..MR {
                    let xb = bcast4(a.qs.as_ptr().add((i0 + r) * a.k + b * QK + 4 * g));
                    for q in 0..NG {
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wa[q], _mm256_sign_epi8(xb, wv[q])), ones);
                        isum[r][q] = _mm256_add_epi32(isum[r][q], p);
                    }
                }
            }
        } else {
            // Nibble formats. 4-bit codes: 16-bit sums of 16 products each, |Σ| ≤ 16·15·127 =
            // 30480 < 2^15, exact. Q5_0's 5-bit codes (≤ 31) widen to 32 bits after every chunk
            // (4 products: ≤ 15748); Q6_K's 6-bit codes (≤ 63) after every `maddubs` (2
            // products: ≤ 16002), its two halves (values 0–15 in the low nibbles, 16–31 in the
            // high ones: two sub-blocks with their own scales) in `isum` and `isum2`.
            let mut s16 = [[_mm256_setzero_si256(); NG]; MR];
            let mut isum2 = [[_mm256_setzero_si256(); NG]; MR];
            for g in 0..4 {
                let mut lo = [_mm256_setzero_si256(); NG];
                let mut hi = [_mm256_setzero_si256(); NG];
                for q in 0..NG {
                    let v = _mm256_loadu_si256(w.qs.as_ptr().add(((g0 + q) * w.nb + b) * cb + 32 * g) as *const __m256i);
                    lo[q] = _mm256_and_si256(v, low4);
                    hi[q] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
                    if F == F_Q5_0 || F == F_Q6K {
                        let planes = if F == F_Q5_0 { 1 } else { 2 };
                        for p in 0..planes {
                            let hp = w.qh.as_ptr().add(((g0 + q) * w.nb + b) * H_BYTES * planes + p * H_BYTES + 8 * g) as *const u32;
                            let v = (0x10 << p) as i8;
                            lo[q] = _mm256_or_si256(lo[q], plane_bits(hp.read_unaligned(), v));
                            hi[q] = _mm256_or_si256(hi[q], plane_bits(hp.add(1).read_unaligned(), v));
                        }
                    }
                }
                for r in 0..MR {
                    let xp = a.qs.as_ptr().add((i0 + r) * a.k + b * QK + 4 * g);
                    let (xl, xh) = (bcast4(xp), bcast4(xp.add(16)));
                    for q in 0..NG {
                        if F == F_Q6K {
                            isum[r][q] = _mm256_add_epi32(isum[r][q], _mm256_madd_epi16(_mm256_maddubs_epi16(lo[q], xl), ones));
                            isum2[r][q] = _mm256_add_epi32(isum2[r][q], _mm256_madd_epi16(_mm256_maddubs_epi16(hi[q], xh), ones));
                            continue;
                        }
                        let p = _mm256_add_epi16(_mm256_maddubs_epi16(lo[q], xl), _mm256_maddubs_epi16(hi[q], xh));
                        if F == F_Q5_0 {
                            isum[r][q] = _mm256_add_epi32(isum[r][q], _mm256_madd_epi16(p, ones));
                        } else {
                            s16[r][q] = _mm256_add_epi16(s16[r][q], p);
                        }
                    }
                }
            }
            // K-quant sub-block scales of the NG groups (Q4_K unsigned 6-bit, Q6_K int8).
            let mut sav = [_mm256_setzero_si256(); NG];
            let mut sbv = [_mm256_setzero_si256(); NG];
            if F == F_Q4K || F == F_Q6K {
                for q in 0..NG {
                    let at = ((g0 + q) * w.nb + b) * GC;
                    let (pa, pb) = (_mm_loadl_epi64(w.sa.as_ptr().add(at) as *const __m128i), _mm_loadl_epi64(w.sb.as_ptr().add(at) as *const __m128i));
                    if F == F_Q4K {
                        sav[q] = _mm256_cvtepu8_epi32(pa);
                    } else {
                        sav[q] = _mm256_cvtepi8_epi32(pa);
                        sbv[q] = _mm256_cvtepi8_epi32(pb);
                    }
                }
            }
            for r in 0..MR {
                let ab = (i0 + r) * a.nb + b;
                for q in 0..NG {
                    if F != F_Q5_0 && F != F_Q6K {
                        isum[r][q] = _mm256_madd_epi16(s16[r][q], ones);
                    }
                    // Σ(q−o)·x = Σq·x − o·Σx (offset o = 8 for Q4_0, 16 for Q5_0).
                    if F == F_Q4_0 || F == F_Q5_0 {
                        let o = if F == F_Q4_0 { 8 } else { 16 };
                        let off = _mm256_set1_epi32(o * *a.sq.get_unchecked(ab));
                        isum[r][q] = _mm256_sub_epi32(isum[r][q], off);
                    }
                    if F == F_Q4K {
                        isum[r][q] = _mm256_mullo_epi32(isum[r][q], sav[q]);
                    }
                    if F == F_Q6K {
                        // sa·Σ_{t<16}(q−32)·x + sb·Σ_{t≥16}(q−32)·x.
                        let (h, all) = (*a.sh.get_unchecked(ab), *a.sq.get_unchecked(ab));
                        let ia = _mm256_sub_epi32(isum[r][q], _mm256_set1_epi32(32 * h));
                        let ib = _mm256_sub_epi32(isum2[r][q], _mm256_set1_epi32(32 * (all - h)));
                        isum[r][q] = _mm256_add_epi32(_mm256_mullo_epi32(ia, sav[q]), _mm256_mullo_epi32(ib, sbv[q]));
                    }
                }
            }
        }
        let mut dw = [_mm256_setzero_ps(); NG];
        let mut mw = [_mm256_setzero_ps(); NG];
        for q in 0..NG {
            if F == F_Q4K || F == F_Q6K {
                let at = ((g0 + q) * (w.nb / 8) + b / 8) * GC;
                dw[q] = load_f16x8(w.d.as_ptr().add(at));
                if F == F_Q4K {
                    // dmin·f32(min), subtracted times sx below.
                    let mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(w.sb.as_ptr().add(((g0 + q) * w.nb + b) * GC) as *const __m128i)));
                    mw[q] = _mm256_mul_ps(load_f16x8(w.m.as_ptr().add(at)), mins);
                }
            } else {
                let at = ((g0 + q) * w.nb + b) * GC;
                dw[q] = load_f16x8(w.d.as_ptr().add(at));
                if F == F_Q4_1 {
                    mw[q] = load_f16x8(w.m.as_ptr().add(at));
                }
            }
        }
        for r in 0..MR {
            let dx = _mm256_broadcast_ss(a.d.get_unchecked((i0 + r) * a.nb + b));
            for q in 0..NG {
                let t = _mm256_mul_ps(_mm256_cvtepi32_ps(isum[r][q]), _mm256_mul_ps(dw[q], dx));
                acc[r][q] = _mm256_add_ps(acc[r][q], t);
                if F == F_Q4_1 || F == F_Q4K {
                    let sx = _mm256_broadcast_ss(a.s.get_unchecked((i0 + r) * a.nb + b));
                    let ms = _mm256_mul_ps(mw[q], sx);
                    acc[r][q] = if F == F_Q4_1 { _mm256_add_ps(acc[r][q], ms) } else { _mm256_sub_ps(acc[r][q], ms) };
                }
            }
        }
    }
    for r in 0..MR {
        for q in 0..NG {
            _mm256_storeu_ps(out.add(r * stride + q * GC), acc[r][q]);
        }
    }
}

#[inline(always)]
unsafe fn run<const F: u8>(w: &QWeight, a: &QActs, g0: usize, gn: usize, out: *mut f32, stride: usize) {
    let mut i = 0;
    while i + 4 <= a.m {
        for q in 0..gn {
            tile::<F, 4, 1>(w, g0 + q, a, i, out.add(i * stride + q * GC), stride);
        }
        i += 4;
    }
    // 2 or 3 leftover rows share each weight load too.
    let rest = a.m - i;
    if rest >= 2 {
        for q in 0..gn {
            let o = out.add(i * stride + q * GC);
            if rest == 3 {
                tile::<F, 3, 1>(w, g0 + q, a, i, o, stride);
            } else {
                tile::<F, 2, 1>(w, g0 + q, a, i, o, stride);
            }
        }
        i += rest;
    }
    while i < a.m {
        let mut q = 0;
        while q + 2 <= gn {
            tile::<F, 1, 2>(w, g0 + q, a, i, out.add(i * stride + q * GC), stride);
            q += 2;
        }
        while q < gn {
            tile::<F, 1, 1>(w, g0 + q, a, i, out.add(i * stride + q * GC), stride);
            q += 1;
        }
        i += 1;
    }
}

/// AVX2 path of `compute_groups`. Caller guarantees avx2, fma and f16c, and `out` as
/// `compute_groups` requires.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn compute_groups(w: &QWeight, a: &QActs, g0: usize, gn: usize, out: *mut f32, stride: usize) {
    match w.format {
        QFormat::Q8_0 => run::<F_Q8_0>(w, a, g0, gn, out, stride),
        QFormat::Q4_0 => run::<F_Q4_0>(w, a, g0, gn, out, stride),
        QFormat::Q4_1 => run::<F_Q4_1>(w, a, g0, gn, out, stride),
        QFormat::Q5_0 => run::<F_Q5_0>(w, a, g0, gn, out, stride),
        QFormat::Q4K => run::<F_Q4K>(w, a, g0, gn, out, stride),
        QFormat::Q6K => run::<F_Q6K>(w, a, g0, gn, out, stride),
    }
}
