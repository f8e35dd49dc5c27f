//! AVX-512 VNNI path of the quantized matmul: `vpdpbusd` (64 unsigned × signed byte products
//! summed into 16 int32 lanes per instruction) on 512-bit registers holding two interleaved
//! column groups (16 columns: group `G` in lanes 0–7, group `G+1` in lanes 8–15).
//!
//! `vpdpbusd` multiplies an unsigned byte by a signed one, so each format puts its unsigned
//! operand where it has one:
//! - Q4_0 / Q4_1 / Q5_0: the codes (0–15, Q5_0 0–31: the nibble plus 16 under its fifth-bit
//!   mask, one masked byte add) are unsigned, the activation codes signed; the offsets are
//!   `Σ(q−o)·x = Σq·x − o·Σx` (o = 8 for Q4_0, 16 for Q5_0) as on the AVX2 path;
//! - Q8_0: both are signed, so the weights are stored as `w+128` (a sign-bit flip, made at
//!   load) and the shift taken back with the activations' code sum, which quantizing them
//!   already gives: `Σw·x = Σ(w+128)·x − 128·Σx`, one subtraction per row and block; the
//!   activation codes then feed `vpdpbusd` straight from memory as a broadcast operand.
//!
//! - Q4_K / Q6_K: as the nibble formats (Q6_K's two high bits from two planes), the integer
//!   sums then scaled by the sub-block scales (`vpmulld`); Q6_K keeps its two 16-value halves
//!   in separate sums, as they have separate scales.
//!
//! Every integer sum is exact (|Σ| ≤ 32·255·128 < 2³¹), and the float epilogue is the one the
//! module docs of [`super`] define (multiply, multiply, add; blocks in order), so this path
//! equals the scalar reference and the AVX2 path bit for bit, for every row count.

#![allow(clippy::needless_range_loop)] // register tiles are indexed by row
use super::{QActs, QFormat, QWeight, F_Q4K, F_Q4_0, F_Q4_1, F_Q5_0, F_Q6K, F_Q8_0, GC, H_BYTES, QK};
use std::arch::x86_64::*;

/// A high-bit plane's 32-bit masks at `p` (group `gq`) and `p + hstride` (group `gq+1`; zero
/// with `HALF`) as one 64-bit lane mask.
#[inline(always)]
unsafe fn plane_mask<const HALF: bool>(p: *const u8, hstride: usize) -> __mmask64 {
    let lo = (p as *const u32).read_unaligned() as u64;
    let hi = if HALF { 0 } else { (p.add(hstride) as *const u32).read_unaligned() as u64 };
    lo | (hi << 32)
}

/// Chunk bytes (32) of group `gq` at `p` and of group `gq+1` at `p + gstride` in one register;
/// with `HALF` the upper half is zero (the matrix's last, unpaired group).
#[inline(always)]
unsafe fn load_pair<const HALF: bool>(p: *const u8, gstride: usize) -> __m512i {
    let lo = _mm256_loadu_si256(p as *const __m256i);
    let hi = if HALF { _mm256_setzero_si256() } else { _mm256_loadu_si256(p.add(gstride) as *const __m256i) };
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// The two groups' 8 bytes at `p` and `p + gstride` (`HALF`: zeros) widened to 16 int32 lanes,
/// unsigned or (`SIGNED`) signed.
#[inline(always)]
unsafe fn load_bytes_pair<const HALF: bool, const SIGNED: bool>(p: *const u8, gstride: usize) -> __m512i {
    let lo = _mm_loadl_epi64(p as *const __m128i);
    let hi = if HALF { _mm_setzero_si128() } else { _mm_loadl_epi64(p.add(gstride) as *const __m128i) };
    let v = _mm_unpacklo_epi64(lo, hi);
    if SIGNED {
        _mm512_cvtepi8_epi32(v)
    } else {
        _mm512_cvtepu8_epi32(v)
    }
}

/// The two groups' 8 f16 values at `p` and `p + gstride` widened to 16 f32 lanes (exact).
#[inline(always)]
unsafe fn load_f16_pair<const HALF: bool>(p: *const half::f16, gstride: usize) -> __m512 {
    let lo = _mm_loadu_si128(p as *const __m128i);
    let hi = if HALF { _mm_setzero_si128() } else { _mm_loadu_si128(p.add(gstride) as *const __m128i) };
    _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi))
}

/// 4 activation codes at `p` broadcast to every 32-bit lane.
#[inline(always)]
unsafe fn bcast4(p: *const u8) -> __m512i {
    _mm512_set1_epi32((p as *const i32).read_unaligned())
}

/// Register tile: rows `i0..i0+MR` × `NP` pairs of column groups from `g0` (16 columns each;
/// with `HALF`, `NP` = 1 and only group `g0`). Each weight chunk is loaded once for all `MR`
/// rows. Writes `out[r·stride + 16p + c]` (`c < 8` with `HALF`).
#[inline(always)]
unsafe fn tile<const F: u8, const MR: usize, const NP: usize, const HALF: bool>(w: &QWeight, g0: usize, a: &QActs, i0: usize, out: *mut f32, stride: usize) {
    let low4 = _mm512_set1_epi8(0x0F);
    let cb = w.format.code_bytes() * GC;
    let gstride = w.nb * cb;
    let sstride = w.nb * GC;
    let groups = if HALF { 1 } else { 2 * NP };
    let mut acc = [[_mm512_setzero_ps(); NP]; MR];
    for b in 0..w.nb {
        if MR == 1 || i0 == 0 {
            // As on the AVX2 path: fetch this block of the next groups while these are computed.
            for q in 0..groups {
                w.prefetch_block(g0 + groups + q, b);
            }
        }
        let mut isum = [[_mm512_setzero_si512(); NP]; MR];
        if F == F_Q8_0 {
            for g in 0..8 {
                let mut wv = [_mm512_setzero_si512(); NP];
                for p in 0..NP {
                    wv[p] = load_pair::<HALF>(w.qs.as_ptr().add(((g0 + 2 * p) * w.nb + b) * cb + 32 * g), gstride);
                }
                for r in 0..MR {
                    let x = bcast4(a.qs.as_ptr().add((i0 + r) * a.k + b * QK + 4 * g));
                    for p in 0..NP {
                        isum[r][p] = _mm512_dpbusd_epi32(isum[r][p], wv[p], x);
                    }
                }
            }
            for r in 0..MR {
                // Σ(w+128)·x − 128·Σx.
                let off = _mm512_set1_epi32(128 * *a.sq.get_unchecked((i0 + r) * a.nb + b));
                for p in 0..NP {
                    isum[r][p] = _mm512_sub_epi32(isum[r][p], off);
                }
            }
        } else {
            // Q6_K: values 0–15 (low nibbles) in `isum`, 16–31 (high nibbles) in `isum2`.
            let mut isum2 = [[_mm512_setzero_si512(); NP]; MR];
            for g in 0..4 {
                let mut lo = [_mm512_setzero_si512(); NP];
                let mut hi = [_mm512_setzero_si512(); NP];
                for p in 0..NP {
                    let v = load_pair::<HALF>(w.qs.as_ptr().add(((g0 + 2 * p) * w.nb + b) * cb + 32 * g), gstride);
                    lo[p] = _mm512_and_si512(v, low4);
                    hi[p] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4);
                    if F == F_Q5_0 || F == F_Q6K {
                        let planes = if F == F_Q5_0 { 1 } else { 2 };
                        let hstride = w.nb * H_BYTES * planes;
                        for k in 0..planes {
                            let hp = w.qh.as_ptr().add(((g0 + 2 * p) * w.nb + b) * H_BYTES * planes + k * H_BYTES + 8 * g);
                            let add = _mm512_set1_epi8(0x10 << k);
                            lo[p] = _mm512_mask_add_epi8(lo[p], plane_mask::<HALF>(hp, hstride), lo[p], add);
                            hi[p] = _mm512_mask_add_epi8(hi[p], plane_mask::<HALF>(hp.add(4), hstride), hi[p], add);
                        }
                    }
                }
                for r in 0..MR {
                    let xp = a.qs.as_ptr().add((i0 + r) * a.k + b * QK + 4 * g);
                    let (xl, xh) = (bcast4(xp), bcast4(xp.add(16)));
                    for p in 0..NP {
                        isum[r][p] = _mm512_dpbusd_epi32(isum[r][p], lo[p], xl);
                        if F == F_Q6K {
                            isum2[r][p] = _mm512_dpbusd_epi32(isum2[r][p], hi[p], xh);
                        } else {
                            isum[r][p] = _mm512_dpbusd_epi32(isum[r][p], hi[p], xh);
                        }
                    }
                }
            }
            if F == F_Q4_0 || F == F_Q5_0 {
                let o = if F == F_Q4_0 { 8 } else { 16 };
                for r in 0..MR {
                    // Σ(q−o)·x = Σq·x − o·Σx.
                    let off = _mm512_set1_epi32(o * *a.sq.get_unchecked((i0 + r) * a.nb + b));
                    for p in 0..NP {
                        isum[r][p] = _mm512_sub_epi32(isum[r][p], off);
                    }
                }
            }
            if F == F_Q4K || F == F_Q6K {
                for p in 0..NP {
                    let at = ((g0 + 2 * p) * w.nb + b) * GC;
                    if F == F_Q4K {
                        let sav = load_bytes_pair::<HALF, false>(w.sa.as_ptr().add(at), sstride);
                        for r in 0..MR {
                            isum[r][p] = _mm512_mullo_epi32(isum[r][p], sav);
                        }
                    } else {
                        let sav = load_bytes_pair::<HALF, true>(w.sa.as_ptr().add(at), sstride);
                        let sbv = load_bytes_pair::<HALF, true>(w.sb.as_ptr().add(at), sstride);
                        for r in 0..MR {
                            // sa·Σ_{t<16}(q−32)·x + sb·Σ_{t≥16}(q−32)·x.
                            let ab = (i0 + r) * a.nb + b;
                            let (h, all) = (*a.sh.get_unchecked(ab), *a.sq.get_unchecked(ab));
                            let ia = _mm512_sub_epi32(isum[r][p], _mm512_set1_epi32(32 * h));
                            let ib = _mm512_sub_epi32(isum2[r][p], _mm512_set1_epi32(32 * (all - h)));
                            isum[r][p] = _mm512_add_epi32(_mm512_mullo_epi32(ia, sav), _mm512_mullo_epi32(ib, sbv));
                        }
                    }
                }
            }
        }
        let mut dw = [_mm512_setzero_ps(); NP];
        let mut mw = [_mm512_setzero_ps(); NP];
        for p in 0..NP {
            if F == F_Q4K || F == F_Q6K {
                let at = ((g0 + 2 * p) * (w.nb / 8) + b / 8) * GC;
                let ustride = (w.nb / 8) * GC;
                dw[p] = load_f16_pair::<HALF>(w.d.as_ptr().add(at), ustride);
                if F == F_Q4K {
                    // dmin·f32(min), subtracted times sx below.
                    let mins = _mm512_cvtepi32_ps(load_bytes_pair::<HALF, false>(w.sb.as_ptr().add(((g0 + 2 * p) * w.nb + b) * GC), sstride));
                    mw[p] = _mm512_mul_ps(load_f16_pair::<HALF>(w.m.as_ptr().add(at), ustride), mins);
                }
            } else {
                let at = ((g0 + 2 * p) * w.nb + b) * GC;
                dw[p] = load_f16_pair::<HALF>(w.d.as_ptr().add(at), sstride);
                if F == F_Q4_1 {
                    mw[p] = load_f16_pair::<HALF>(w.m.as_ptr().add(at), sstride);
                }
            }
        }
        for r in 0..MR {
            let dx = _mm512_set1_ps(*a.d.get_unchecked((i0 + r) * a.nb + b));
            for p in 0..NP {
                let t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[r][p]), _mm512_mul_ps(dw[p], dx));
                acc[r][p] = _mm512_add_ps(acc[r][p], t);
                if F == F_Q4_1 || F == F_Q4K {
                    let sx = _mm512_set1_ps(*a.s.get_unchecked((i0 + r) * a.nb + b));
                    let ms = _mm512_mul_ps(mw[p], sx);
                    acc[r][p] = if F == F_Q4_1 { _mm512_add_ps(acc[r][p], ms) } else { _mm512_sub_ps(acc[r][p], ms) };
                }
            }
        }
    }
    for r in 0..MR {
        for p in 0..NP {
            let o = out.add(r * stride + p * 2 * GC);
            if HALF {
                _mm512_mask_storeu_ps(o, 0x00FF, acc[r][p]);
            } else {
                _mm512_storeu_ps(o, acc[r][p]);
            }
        }
    }
}

/// Rows `i0..i0+MR` over every group of the task: pairs, then the unpaired last group.
#[inline(always)]
unsafe fn rows<const F: u8, const MR: usize>(w: &QWeight, a: &QActs, g0: usize, gn: usize, i0: usize, out: *mut f32, width: usize) {
    let mut q = 0;
    while q + 2 <= gn {
        tile::<F, MR, 1, false>(w, g0 + q, a, i0, out.add(i0 * width + q * GC), width);
        q += 2;
    }
    if q < gn {
        tile::<F, MR, 1, true>(w, g0 + q, a, i0, out.add(i0 * width + q * GC), width);
    }
}

/// Most rows in one register tile: accumulators and integer sums take two registers per row,
/// Q6_K's second integer sum a third, so it stops at 6; Q8_0 at 9, where 33- and 65-row calls
/// ran faster than with 10–12-row passes (an in-process A/B of every cap from 8 to 12,
/// BENCHMARKS §27), while the nibble formats gain nothing below 12.
const fn max_rows(f: u8) -> usize {
    match f {
        F_Q6K => 6,
        F_Q8_0 => 9,
        _ => 12,
    }
}

/// The call's rows `span` (1 to [`max_rows`] of them) as one pass over the task's weights;
/// row `i` of the output at `out + i·width`.
#[inline(always)]
unsafe fn pass<const F: u8>(w: &QWeight, a: &QActs, g0: usize, gn: usize, span: std::ops::Range<usize>, out: *mut f32, width: usize) {
    let (i0, mr) = (span.start, span.len());
    match mr {
        1 => {
            // One row (a decode step): two pairs per tile, two independent dot-product chains.
            let mut q = 0;
            while q + 4 <= gn {
                tile::<F, 1, 2, false>(w, g0 + q, a, i0, out.add(i0 * width + q * GC), width);
                q += 4;
            }
            rows::<F, 1>(w, a, g0 + q, gn - q, i0, out.add(q * GC), width);
        }
        2 => rows::<F, 2>(w, a, g0, gn, i0, out, width),
        3 => rows::<F, 3>(w, a, g0, gn, i0, out, width),
        4 => rows::<F, 4>(w, a, g0, gn, i0, out, width),
        5 => rows::<F, 5>(w, a, g0, gn, i0, out, width),
        6 => rows::<F, 6>(w, a, g0, gn, i0, out, width),
        7 if max_rows(F) >= 7 => rows::<F, 7>(w, a, g0, gn, i0, out, width),
        8 if max_rows(F) >= 8 => rows::<F, 8>(w, a, g0, gn, i0, out, width),
        9 if max_rows(F) >= 9 => rows::<F, 9>(w, a, g0, gn, i0, out, width),
        10 if max_rows(F) >= 10 => rows::<F, 10>(w, a, g0, gn, i0, out, width),
        11 if max_rows(F) >= 11 => rows::<F, 11>(w, a, g0, gn, i0, out, width),
        12 if max_rows(F) >= 12 => rows::<F, 12>(w, a, g0, gn, i0, out, width),
        _ => unreachable!("a pass holds 1..={} rows", max_rows(F)),
    }
}

/// Every row of the call over the task's groups: as few passes over the weights as the register
/// tile allows, the rows split evenly between them (a 1+8-row verify is one 9-row pass, not an
/// 8-row pass and a 1-row pass). Each row's arithmetic is the same in any pass.
#[inline(always)]
unsafe fn run<const F: u8>(w: &QWeight, a: &QActs, g0: usize, gn: usize, out: *mut f32, stride: usize) {
    let passes = a.m.div_ceil(max_rows(F));
    let (base, extra) = (a.m / passes.max(1), a.m % passes.max(1));
    let mut i = 0;
    for p in 0..passes {
        let mr = base + usize::from(p < extra);
        pass::<F>(w, a, g0, gn, i..i + mr, out, stride);
        i += mr;
    }
}

/// AVX-512 VNNI path of `compute_groups`. Caller guarantees avx512f, avx512bw, avx512vnni
/// (and the AVX2 set), and `out` as `compute_groups` requires.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
