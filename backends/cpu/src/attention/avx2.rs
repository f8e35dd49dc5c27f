//! The AVX2 path of [`super::attend_rows`] (its arithmetic is defined in the module docs of
//! [`super`]), and the same arithmetic on 512-bit registers where the CPU has AVX-512.

use super::{KvElem, KvHead, QueryRow, Visible};
use crate::vmath::avx2::exp8;
use std::arch::x86_64::*;

/// `r8` of each of 8 vectors (module docs), as one vector: lane `j` = `r8(a[j])`.
#[inline(always)]
unsafe fn reduce8x8(a: &[__m256; 8]) -> __m256 {
    let t0 = _mm256_hadd_ps(a[0], a[1]);
    let t1 = _mm256_hadd_ps(a[2], a[3]);
    let t2 = _mm256_hadd_ps(a[4], a[5]);
    let t3 = _mm256_hadd_ps(a[6], a[7]);
    let u0 = _mm256_hadd_ps(t0, t1);
    let u1 = _mm256_hadd_ps(t2, t3);
    _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31))
}

/// `r8` of one vector.
#[inline(always)]
unsafe fn reduce8(v: __m256) -> f32 {
    let t = _mm256_hadd_ps(v, v);
    let u = _mm256_hadd_ps(t, t);
    _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)))
}

/// `o[base..base + 8C] += Σ p_t·v_t[base..base + 8C]` over visible keys `t` in `t0..t1`
/// (fused, ascending), `o` read from and written back to `out`, so chunk after chunk
/// continues one chain per output value.
#[inline(always)]
unsafe fn values<E: KvElem, const C: usize>(kv: &KvHead<'_, E>, vis: &Visible<'_>, p: *const f32, t0: usize, t1: usize, base: usize, out: *mut f32) {
    let mut o = [_mm256_setzero_ps(); C];
    for (c, oc) in o.iter_mut().enumerate() {
        *oc = _mm256_loadu_ps(out.add(base + 8 * c));
    }
    let vp = kv.v.as_ptr().add(kv.off + base);
    for t in t0..t1 {
        let pb = _mm256_set1_ps(*p.add(t));
        let row = vp.add(vis.row(t) * kv.stride);
        for (c, oc) in o.iter_mut().enumerate() {
            *oc = _mm256_fmadd_ps(pb, E::load8(row.add(8 * c)), *oc);
        }
    }
    for (c, oc) in o.iter().enumerate() {
        _mm256_storeu_ps(out.add(base + 8 * c), *oc);
    }
}

/// [`values`] on 512-bit registers: `16·C` outputs, each lane the same fused chain as on
/// 256 bits (so the same bits). Caller runs with avx512f.
#[inline(always)]
unsafe fn values16<E: KvElem, const C: usize>(kv: &KvHead<'_, E>, vis: &Visible<'_>, p: *const f32, t0: usize, t1: usize, base: usize, out: *mut f32) {
    let mut o = [_mm512_setzero_ps(); C];
    for (c, oc) in o.iter_mut().enumerate() {
        *oc = _mm512_loadu_ps(out.add(base + 16 * c));
    }
    let vp = kv.v.as_ptr().add(kv.off + base);
    for t in t0..t1 {
        let pb = _mm512_set1_ps(*p.add(t));
        let row = vp.add(vis.row(t) * kv.stride);
        for (c, oc) in o.iter_mut().enumerate() {
            *oc = _mm512_fmadd_ps(pb, E::load16(row.add(16 * c)), *oc);
        }
    }
    for (c, oc) in o.iter().enumerate() {
        _mm512_storeu_ps(out.add(base + 16 * c), *oc);
    }
}

/// [`scores`] on 512-bit registers: keys `2i` and `2i+1` of a tile share a register
/// (lanes 0–7 and 8–15), the query's 8 values in both halves, so every lane runs the same
/// fused chain as on 256 bits and the tile is reduced by the same [`reduce8x8`] (the same
/// bits). Caller runs with avx512f.
#[inline(always)]
unsafe fn scores16<E: KvElem>(kv: &KvHead<'_, E>, vis: &Visible<'_>, qp: *const f32, t0: usize, t1: usize, scale: __m256, sp: *mut f32) {
    let (hd, n) = (kv.hd, vis.len());
    let kp = kv.k.as_ptr().add(kv.off);
    let mut t = t0;
    while t < t1 {
        let mut rows = [std::ptr::null::<E>(); 8];
        for (j, r) in rows.iter_mut().enumerate() {
            *r = kp.add(vis.row((t + j).min(n - 1)) * kv.stride);
        }
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut d = 0;
        while d < hd {
            let q8 = _mm256_loadu_ps(qp.add(d));
            let qv = _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(_mm512_castps256_ps512(q8)), _mm256_castps_pd(q8)));
            for (i, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(qv, E::load8x2(rows[2 * i].add(d), rows[2 * i + 1].add(d)), *a);
            }
            d += 8;
        }
        let mut halves = [_mm256_setzero_ps(); 8];
        for (i, a) in acc.iter().enumerate() {
            halves[2 * i] = _mm512_castps512_ps256(*a);
            halves[2 * i + 1] = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*a)));
        }
        _mm256_storeu_ps(sp.add(t), _mm256_mul_ps(reduce8x8(&halves), scale));
        t += 8;
    }
}

/// Scores of visible keys `t0..` (8 at a time, up to the tile holding `t1 − 1`) of one
/// query head `qp` into `sp[t]`; keys past `n` repeat the last one (their lanes are
/// overwritten by the softmax). `t0` is a multiple of 8.
#[inline(always)]
unsafe fn scores<E: KvElem>(kv: &KvHead<'_, E>, vis: &Visible<'_>, qp: *const f32, t0: usize, t1: usize, scale: __m256, sp: *mut f32) {
    let (hd, n) = (kv.hd, vis.len());
    let kp = kv.k.as_ptr().add(kv.off);
    let mut t = t0;
    while t < t1 {
        let mut rows = [std::ptr::null::<E>(); 8];
        for (j, r) in rows.iter_mut().enumerate() {
            *r = kp.add(vis.row((t + j).min(n - 1)) * kv.stride);
        }
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut d = 0;
        while d < hd {
            let qv = _mm256_loadu_ps(qp.add(d));
            for j in 0..8 {
                acc[j] = _mm256_fmadd_ps(qv, E::load8(rows[j].add(d)), acc[j]);
            }
            d += 8;
        }
        _mm256_storeu_ps(sp.add(t), _mm256_mul_ps(reduce8x8(&acc), scale));
        t += 8;
    }
}

/// The AVX2 path of [`super::attend_rows`]. Caller guarantees avx2 + fma + f16c and
/// `hd % 8 == 0`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_rows<E: KvElem>(rows: &[QueryRow<'_>], group: usize, kv: KvHead<'_, E>, scale: f32, out: &mut [f32], scratch: &mut Vec<f32>) {
    body::<E, false>(rows, group, kv, scale, out, scratch)
}

/// The AVX2 path's arithmetic on 512-bit registers (two keys, or 16 outputs, per
/// instruction): the same bits as [`attend_rows`]. Caller guarantees avx512f + avx512vl,
/// the AVX2 set and `hd % 8 == 0`.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn attend_rows_avx512<E: KvElem>(
    rows: &[QueryRow<'_>],
    group: usize,
    kv: KvHead<'_, E>,
    scale: f32,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    body::<E, true>(rows, group, kv, scale, out, scratch)
}

/// Both entry points (`WIDE`: 512-bit score and value passes).
#[inline(always)]
unsafe fn body<E: KvElem, const WIDE: bool>(rows: &[QueryRow<'_>], group: usize, kv: KvHead<'_, E>, scale: f32, out: &mut [f32], scratch: &mut Vec<f32>) {
    let hd = kv.hd;
    let w = group * hd;
    assert!(out.len() >= rows.len() * w && kv.off + hd <= kv.stride && kv.k.len() == kv.v.len());
    let mut nmax = 0;
    for row in rows {
        // The raw loads below stay inside the slices: the last visible row is the largest.
        let n = row.vis.len();
        let last = row.vis.extra.last().copied().unwrap_or(row.vis.prefix.saturating_sub(1));
        assert!(n > 0 && row.q.len() >= w && last * kv.stride + kv.off + hd <= kv.k.len());
        nmax = nmax.max(n);
    }
    // Scores (then probabilities) of row r, head g at `(r·group + g)·stride`, and the
    // heads' 1/sum after them.
    let stride = nmax.div_ceil(8) * 8;
    let heads = rows.len() * group;
    scratch.clear();
    scratch.resize(heads * stride + heads, 0.0);
    let sp = scratch.as_mut_ptr();
    let inv = sp.add(heads * stride);
    let scale_v = _mm256_set1_ps(scale);
    // 1. Scores, chunk by chunk of keys, every row over a chunk while it is in cache.
    let mut c0 = 0;
    while c0 < nmax {
        let c1 = (c0 + super::CHUNK).min(nmax);
        for (r, row) in rows.iter().enumerate() {
            let end = c1.min(row.vis.len());
            for g in 0..group {
                let (qp, spg) = (row.q.as_ptr().add(g * hd), sp.add((r * group + g) * stride));
                if WIDE {
                    scores16(&kv, &row.vis, qp, c0, end, scale_v, spg);
                } else {
                    scores(&kv, &row.vis, qp, c0, end, scale_v, spg);
                }
            }
        }
        c0 = c1;
    }
    // 2. Per head: max, probabilities (padding lanes 0), 1/sum.
    for (r, row) in rows.iter().enumerate() {
        let (n, n8) = (row.vis.len(), row.vis.len().div_ceil(8) * 8);
        for g in 0..group {
            let s = std::slice::from_raw_parts_mut(sp.add((r * group + g) * stride), n8);
            let mut mx = f32::NEG_INFINITY;
            for &v in &s[..n] {
                mx = mx.max(v);
            }
            let mv = _mm256_set1_ps(mx);
            let mut t = 0;
            while t < n8 {
                _mm256_storeu_ps(s.as_mut_ptr().add(t), exp8(_mm256_sub_ps(_mm256_loadu_ps(s.as_ptr().add(t)), mv)));
                t += 8;
            }
            s[n..].iter_mut().for_each(|v| *v = 0.0);
            let mut lanes = _mm256_setzero_ps();
            let mut t = 0;
            while t < n8 {
                lanes = _mm256_add_ps(lanes, _mm256_loadu_ps(s.as_ptr().add(t)));
                t += 8;
            }
            *inv.add(r * group + g) = 1.0 / reduce8(lanes);
        }
    }
    // 3. Values, chunk by chunk, 64 outputs of a head per pass; then `·1/sum`.
    out[..rows.len() * w].iter_mut().for_each(|v| *v = 0.0);
    let op = out.as_mut_ptr();
    let mut c0 = 0;
    while c0 < nmax {
        let c1 = (c0 + super::CHUNK).min(nmax);
        for (r, row) in rows.iter().enumerate() {
            let end = c1.min(row.vis.len());
            if c0 >= end {
                continue;
            }
            for g in 0..group {
                let (p, o) = (sp.add((r * group + g) * stride) as *const f32, op.add((r * group + g) * hd));
                let mut base = 0;
                while WIDE && base + 64 <= hd {
                    values16::<E, 4>(&kv, &row.vis, p, c0, end, base, o);
                    base += 64;
                }
                while WIDE && base + 16 <= hd {
                    values16::<E, 1>(&kv, &row.vis, p, c0, end, base, o);
                    base += 16;
                }
                while base + 64 <= hd {
                    values::<E, 8>(&kv, &row.vis, p, c0, end, base, o);
                    base += 64;
                }
                while base < hd {
                    values::<E, 1>(&kv, &row.vis, p, c0, end, base, o);
                    base += 8;
                }
            }
        }
        c0 = c1;
    }
    for h in 0..heads {
        let iv = _mm256_set1_ps(*inv.add(h));
        let o = op.add(h * hd);
        let mut d = 0;
        while d < hd {
            _mm256_storeu_ps(o.add(d), _mm256_mul_ps(_mm256_loadu_ps(o.add(d)), iv));
            d += 8;
        }
    }
}
