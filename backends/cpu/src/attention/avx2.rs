//! The AVX2 path of [`super::attend_rows`] (its arithmetic is defined in the module docs of
//! [`super`]), and the same arithmetic on 512-bit registers where the CPU has AVX-512.

use super::{KvElem, KvHead, QueryRow, Visible};
use crate::vmath::avx2::{exp16, exp8};
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

/// The 8 scores of one 8-key tile from its 512-bit accumulators (key pair `(2i, 2i + 1)` in
/// `acc[i]`'s lanes 0–7 and 8–15): each key's lanes reduced by [`reduce8x8`], times `scale`,
/// stored at `dst[0..8]`. Caller runs with avx512f.
#[inline(always)]
unsafe fn store_tile(acc: &[__m512; 4], scale: __m256, dst: *mut f32) {
    let mut halves = [_mm256_setzero_ps(); 8];
    for (i, a) in acc.iter().enumerate() {
        halves[2 * i] = _mm512_castps512_ps256(*a);
        halves[2 * i + 1] = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*a)));
    }
    _mm256_storeu_ps(dst, _mm256_mul_ps(reduce8x8(&halves), scale));
}

/// How far ahead (in keys) the multi-query passes prefetch key and value rows, within the
/// pass's own keys (one [`super::CHUNK`], or all the call's keys when its heads form one query
/// set): prefetching on into the next chunk while the chunk's other query sets still use this
/// one measured slower (BENCHMARKS.md §28).
const PREFETCH_KEYS: usize = 32;

/// Prefetch the cache lines of `n` elements from row `row` (`stride` elements per row) of the
/// cache at `base` into L1. A hint only: the address is formed with wrapping arithmetic and
/// never read, so a row past the cache's end is harmless.
#[inline(always)]
unsafe fn prefetch_row<E>(base: *const E, row: usize, stride: usize, n: usize) {
    let start = base.wrapping_add(row * stride) as usize;
    let end = start + n * std::mem::size_of::<E>();
    // Every line the `n` elements touch, from the line holding the first.
    let mut line = start & !63;
    while line < end {
        _mm_prefetch::<_MM_HINT_T0>(line as *const i8);
        line += 64;
    }
}

/// Most query heads one multi-query pass keeps in registers: 4 accumulators each (8 keys of
/// scores, or 64 outputs of values) plus 4 registers of keys or values, within AVX-512's 32.
const MULTI: usize = 6;

/// [`scores16`] for `Q` query heads at once over keys `t0..t1` (whole 8-key tiles, every key a
/// prefix row of every query's row, so cache row = `t`): each tile of keys is loaded and
/// converted once for all `Q` heads instead of once per head. Head `i`'s query, duplicated into
/// both 256-bit halves chunk by chunk, is at `qd[i]` (`2·hd` values); its scores go to
/// `sp[i][t]`. Each head's lanes run [`scores16`]'s chains in the same order (the same bits).
/// Keys [`PREFETCH_KEYS`] ahead are prefetched while inside `t0..t1`.
#[inline(always)]
unsafe fn scores16_multi<E: KvElem, const Q: usize>(kv: &KvHead<'_, E>, qd: &[*const f32; MULTI], t0: usize, t1: usize, scale: __m256, sp: &[*mut f32; MULTI]) {
    let hd = kv.hd;
    let kp = kv.k.as_ptr().add(kv.off);
    let mut t = t0;
    while t < t1 {
        let base = kp.add(t * kv.stride);
        // The keys a few tiles ahead (a head's rows are `stride` apart, so the hardware's
        // stream prefetch alone leaves the pass waiting on memory at long contexts).
        if t + PREFETCH_KEYS < t1 {
            for j in 0..8 {
                prefetch_row(base, PREFETCH_KEYS + j, kv.stride, hd);
            }
        }
        let mut acc = [[_mm512_setzero_ps(); 4]; Q];
        let mut d = 0;
        while d < hd {
            // A q8_0 cache: the steps of `d` inside one 32-value block share each key pair's
            // scales, built once per block rather than per load (f32 / f16: one segment).
            let mut sv = [_mm512_setzero_ps(); 4];
            let seg = if E::SCALED {
                for (i, v) in sv.iter_mut().enumerate() {
                    *v = super::scale_pair(kv.ks(t + 2 * i, d), kv.ks(t + 2 * i + 1, d));
                }
                (((kv.off + d) / crate::kv::q8::KV_BLOCK + 1) * crate::kv::q8::KV_BLOCK - kv.off).min(hd)
            } else {
                hd
            };
            while d < seg {
                let mut kt = [_mm512_setzero_ps(); 4];
                for (i, k) in kt.iter_mut().enumerate() {
                    *k = E::load8x2_sv(base.add(2 * i * kv.stride + d), base.add((2 * i + 1) * kv.stride + d), sv[i]);
                }
                for (h, a) in acc.iter_mut().enumerate() {
                    let qv = _mm512_loadu_ps(qd[h].add(2 * d));
                    for (i, ai) in a.iter_mut().enumerate() {
                        *ai = _mm512_fmadd_ps(qv, kt[i], *ai);
                    }
                }
                d += 8;
            }
        }
        for (h, a) in acc.iter().enumerate() {
            store_tile(a, scale, sp[h].add(t));
        }
        t += 8;
    }
}

/// [`values16`] for `Q` query heads at once over keys `t0..t1` (prefix rows of every query's
/// row, cache row = `t`): each value row's `16·C` values from `base` are loaded and converted
/// once for all heads. Head `i`'s probabilities at `p[i]`, outputs at `out[i]`; each output is
/// the same fused chain, in the same order, as in [`values16`] (the same bits). Value rows
/// [`PREFETCH_KEYS`] ahead are prefetched while inside `t0..t1`.
#[inline(always)]
unsafe fn values16_multi<E: KvElem, const C: usize, const Q: usize>(
    kv: &KvHead<'_, E>,
    p: &[*const f32; MULTI],
    t0: usize,
    t1: usize,
    base: usize,
    out: &[*mut f32; MULTI],
) {
    let mut o = [[_mm512_setzero_ps(); C]; Q];
    for (h, oh) in o.iter_mut().enumerate() {
        for (c, oc) in oh.iter_mut().enumerate() {
            *oc = _mm512_loadu_ps(out[h].add(base + 16 * c));
        }
    }
    let vp = kv.v.as_ptr().add(kv.off + base);
    for t in t0..t1 {
        let row = vp.add(t * kv.stride);
        if t + PREFETCH_KEYS < t1 {
            prefetch_row(row, PREFETCH_KEYS, kv.stride, 16 * C);
        }
        let mut vt = [_mm512_setzero_ps(); C];
        for (c, v) in vt.iter_mut().enumerate() {
            *v = E::load16(row.add(16 * c), kv.vs(t, base + 16 * c));
        }
        for (h, oh) in o.iter_mut().enumerate() {
            let pb = _mm512_set1_ps(*p[h].add(t));
            for (c, oc) in oh.iter_mut().enumerate() {
                *oc = _mm512_fmadd_ps(pb, vt[c], *oc);
            }
        }
    }
    for (h, oh) in o.iter().enumerate() {
        for (c, oc) in oh.iter().enumerate() {
            _mm512_storeu_ps(out[h].add(base + 16 * c), *oc);
        }
    }
}

/// Converts the keys `t0..t1` (whole 8-key tiles, prefix rows: cache row = `t`) to f32 once
/// for every query set of a chunk, laid out as [`scores16_multi`] loads them: for each tile,
/// for each 8-value step `d` of the head, the 4 key pairs `(2i, 2i + 1)` as 16 lanes (lanes 0–7
/// key `2i`'s values `d..d + 8`, lanes 8–15 key `2i + 1`'s), `(t1 − t0)·hd` values at `dst`.
/// The values are the ones [`KvElem::load8x2`] gives (exact conversions), so a pass over the
/// packed tiles ([`scores16_packed`]) gives the same bits.
#[inline(always)]
unsafe fn pack_keys<E: KvElem>(kv: &KvHead<'_, E>, t0: usize, t1: usize, dst: *mut f32) {
    let hd = kv.hd;
    let kp = kv.k.as_ptr().add(kv.off);
    let mut o = dst;
    let mut t = t0;
    while t < t1 {
        let base = kp.add(t * kv.stride);
        // On into the next chunk: its keys are packed only once every set has scored this one.
        for j in 0..8 {
            prefetch_row(base, PREFETCH_KEYS + j, kv.stride, hd);
        }
        let mut d = 0;
        while d < hd {
            for i in 0..4 {
                let (r0, r1) = (t + 2 * i, t + 2 * i + 1);
                let v = E::load8x2(base.add(2 * i * kv.stride + d), kv.ks(r0, d), base.add((2 * i + 1) * kv.stride + d), kv.ks(r1, d));
                _mm512_storeu_ps(o, v);
                o = o.add(16);
            }
            d += 8;
        }
        t += 8;
    }
}

/// [`scores16_multi`] over keys `t0..t1` packed by [`pack_keys`] (`tiles`: key `t0`'s tile):
/// each key pair is one load from L1 instead of two loads, an insert and a conversion per
/// query set. The same chains in the same order: the same bits, and less work wherever
/// several query sets read one chunk: a verify's or a prefill's rows (BENCHMARKS.md §37).
#[inline(always)]
unsafe fn scores16_packed<const Q: usize>(hd: usize, tiles: *const f32, qd: &[*const f32; MULTI], t0: usize, t1: usize, scale: __m256, sp: &[*mut f32; MULTI]) {
    let mut kt_ptr = tiles;
    let mut t = t0;
    while t < t1 {
        let mut acc = [[_mm512_setzero_ps(); 4]; Q];
        let mut d = 0;
        while d < hd {
            let mut kt = [_mm512_setzero_ps(); 4];
            for (i, k) in kt.iter_mut().enumerate() {
                *k = _mm512_loadu_ps(kt_ptr.add(16 * i));
            }
            kt_ptr = kt_ptr.add(64);
            for (h, a) in acc.iter_mut().enumerate() {
                let qv = _mm512_loadu_ps(qd[h].add(2 * d));
                for (i, ai) in a.iter_mut().enumerate() {
                    *ai = _mm512_fmadd_ps(qv, kt[i], *ai);
                }
            }
            d += 8;
        }
        for (h, a) in acc.iter().enumerate() {
            store_tile(a, scale, sp[h].add(t));
        }
        t += 8;
    }
}

/// [`scores16_packed`] for the `q` (1 to [`MULTI`]) heads of a query set, in passes of at
/// most [`SCORE_MULTI`] heads (the packed keys stay in L1 between passes).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn scores16_packed_set(q: usize, hd: usize, tiles: *const f32, qd: &[*const f32; MULTI], t0: usize, t1: usize, scale: __m256, sp: &[*mut f32; MULTI]) {
    if q <= SCORE_MULTI {
        return scores16_packed_pass(q, hd, tiles, qd, t0, t1, scale, sp);
    }
    let a = q.div_ceil(2);
    let (mut qd2, mut sp2) = ([std::ptr::null(); MULTI], [std::ptr::null_mut(); MULTI]);
    qd2[..q - a].copy_from_slice(&qd[a..q]);
    sp2[..q - a].copy_from_slice(&sp[a..q]);
    scores16_packed_pass(a, hd, tiles, qd, t0, t1, scale, sp);
    scores16_packed_pass(q - a, hd, tiles, &qd2, t0, t1, scale, &sp2);
}

/// One [`scores16_packed`] pass over `q` (1 to [`SCORE_MULTI`]) heads. (A `match` in a
/// function, not a closure: a closure would not inherit the caller's target features, and
/// the intrinsics would become calls.)
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn scores16_packed_pass(q: usize, hd: usize, tiles: *const f32, qd: &[*const f32; MULTI], t0: usize, t1: usize, scale: __m256, sp: &[*mut f32; MULTI]) {
    match q {
        1 => scores16_packed::<1>(hd, tiles, qd, t0, t1, scale, sp),
        2 => scores16_packed::<2>(hd, tiles, qd, t0, t1, scale, sp),
        3 => scores16_packed::<3>(hd, tiles, qd, t0, t1, scale, sp),
        4 => scores16_packed::<4>(hd, tiles, qd, t0, t1, scale, sp),
        _ => unreachable!("a score pass holds 1..={SCORE_MULTI} heads"),
    }
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
        let r = vis.row(t);
        let row = vp.add(r * kv.stride);
        for (c, oc) in o.iter_mut().enumerate() {
            *oc = _mm256_fmadd_ps(pb, E::load8(row.add(8 * c), kv.vs(r, base + 8 * c)), *oc);
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
        let r = vis.row(t);
        let row = vp.add(r * kv.stride);
        for (c, oc) in o.iter_mut().enumerate() {
            *oc = _mm512_fmadd_ps(pb, E::load16(row.add(16 * c), kv.vs(r, base + 16 * c)), *oc);
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
        let mut idx = [0usize; 8];
        for (j, r) in rows.iter_mut().enumerate() {
            idx[j] = vis.row((t + j).min(n - 1));
            *r = kp.add(idx[j] * kv.stride);
        }
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut d = 0;
        while d < hd {
            let q8 = _mm256_loadu_ps(qp.add(d));
            let qv = _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(_mm512_castps256_ps512(q8)), _mm256_castps_pd(q8)));
            for (i, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(qv, E::load8x2(rows[2 * i].add(d), kv.ks(idx[2 * i], d), rows[2 * i + 1].add(d), kv.ks(idx[2 * i + 1], d)), *a);
            }
            d += 8;
        }
        store_tile(&acc, scale, sp.add(t));
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
        let mut idx = [0usize; 8];
        for (j, r) in rows.iter_mut().enumerate() {
            idx[j] = vis.row((t + j).min(n - 1));
            *r = kp.add(idx[j] * kv.stride);
        }
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut d = 0;
        while d < hd {
            let qv = _mm256_loadu_ps(qp.add(d));
            for j in 0..8 {
                acc[j] = _mm256_fmadd_ps(qv, E::load8(rows[j].add(d), kv.ks(idx[j], d)), acc[j]);
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

/// Most query heads one score pass ([`scores16_multi`]) keeps in registers: 4 accumulators
/// each, plus 4 key registers, the query and (q8_0) 4 scale vectors, within AVX-512's 32. With
/// 6 heads (24 accumulators) the compiler spilled accumulators to the stack at every fused
/// multiply-add (`perf annotate`), and a 1 + 8-row verify's attention over 4 096 keys was
/// slower with 6-head passes than with passes of at most 4 heads (alternated processes,
/// BENCHMARKS.md §33). 5-head passes were not measured apart.
const SCORE_MULTI: usize = 4;
const _: () = assert!(SCORE_MULTI <= MULTI && 2 * SCORE_MULTI >= MULTI);

/// [`scores16_multi`] for the `q` (1 to [`MULTI`]) heads of a query set: one pass, or, where
/// `q` exceeds [`SCORE_MULTI`], two passes of about half the heads each, taken chunk by chunk
/// of [`super::CHUNK`] keys so that the second pass finds each chunk's keys in cache even when
/// the set walks all of a long call's keys at once (a decode row or a 1 + 1 verify with 5–6
/// heads). Each head's scores are its own chains, tile by tile, whichever heads share its pass
/// and however the keys are cut into whole tiles: the same bits.
#[inline(always)]
unsafe fn scores16_set<E: KvElem>(q: usize, kv: &KvHead<'_, E>, qd: &[*const f32; MULTI], t0: usize, t1: usize, scale: __m256, sp: &[*mut f32; MULTI]) {
    if q <= SCORE_MULTI {
        return scores16_pass(q, kv, qd, t0, t1, scale, sp);
    }
    let a = q.div_ceil(2);
    let (mut qd2, mut sp2) = ([std::ptr::null(); MULTI], [std::ptr::null_mut(); MULTI]);
    qd2[..q - a].copy_from_slice(&qd[a..q]);
    sp2[..q - a].copy_from_slice(&sp[a..q]);
    // `t0` and the chunk ends are multiples of 8: whole tiles, as one pass would take them.
    let mut c0 = t0;
    while c0 < t1 {
        let c1 = (c0 + super::CHUNK).min(t1);
        scores16_pass(a, kv, qd, c0, c1, scale, sp);
        scores16_pass(q - a, kv, &qd2, c0, c1, scale, &sp2);
        c0 = c1;
    }
}

/// One [`scores16_multi`] pass over `q` (1 to [`SCORE_MULTI`]) heads.
#[inline(always)]
unsafe fn scores16_pass<E: KvElem>(q: usize, kv: &KvHead<'_, E>, qd: &[*const f32; MULTI], t0: usize, t1: usize, scale: __m256, sp: &[*mut f32; MULTI]) {
    match q {
        1 => scores16_multi::<E, 1>(kv, qd, t0, t1, scale, sp),
        2 => scores16_multi::<E, 2>(kv, qd, t0, t1, scale, sp),
        3 => scores16_multi::<E, 3>(kv, qd, t0, t1, scale, sp),
        4 => scores16_multi::<E, 4>(kv, qd, t0, t1, scale, sp),
        _ => unreachable!("a score pass holds 1..={SCORE_MULTI} heads"),
    }
}

/// [`values16_multi`] for the `q` (1 to [`MULTI`]) heads of a query set.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn values16_set<E: KvElem, const C: usize>(
    q: usize,
    kv: &KvHead<'_, E>,
    p: &[*const f32; MULTI],
    t0: usize,
    t1: usize,
    base: usize,
    out: &[*mut f32; MULTI],
) {
    match q {
        1 => values16_multi::<E, C, 1>(kv, p, t0, t1, base, out),
        2 => values16_multi::<E, C, 2>(kv, p, t0, t1, base, out),
        3 => values16_multi::<E, C, 3>(kv, p, t0, t1, base, out),
        4 => values16_multi::<E, C, 4>(kv, p, t0, t1, base, out),
        5 => values16_multi::<E, C, 5>(kv, p, t0, t1, base, out),
        _ => values16_multi::<E, C, 6>(kv, p, t0, t1, base, out),
    }
}

/// Both entry points (`WIDE`: 512-bit score and value passes; query heads whose rows share a
/// prefix of keys also share their loads, [`scores16_multi`] / [`values16_multi`]).
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
        // A q8_0 cache's scales are read unchecked (`KvHead::ks` / `vs`).
        let scales = (last + 1) * kv.stride.div_ceil(crate::kv::q8::KV_BLOCK);
        assert!(!E::SCALED || (kv.kd.len() >= scales && kv.vd.len() >= scales));
        nmax = nmax.max(n);
    }
    // Scores (then probabilities) of row r, head g at `(r·group + g)·stride`, the heads'
    // 1/sum after them, then (WIDE) each head's query duplicated into both 256-bit halves.
    let stride = nmax.div_ceil(8) * 8;
    let heads = rows.len() * group;
    let dup = if WIDE { heads * 2 * hd } else { 0 };
    // Several query sets per chunk (a tree verify's or a prefill's rows, a drafter's block):
    // each chunk's shared prefix keys are converted once into packed f32 tiles (`pack_keys`)
    // that every set's score pass then reads from L1.
    let pack = WIDE && heads > MULTI;
    let pmax = rows.iter().map(|r| r.vis.prefix).max().unwrap_or(0);
    let packed_len = if pack { super::CHUNK * hd } else { 0 };
    scratch.clear();
    scratch.resize(heads * stride + heads + dup + packed_len, 0.0);
    let sp = scratch.as_mut_ptr();
    let inv = sp.add(heads * stride);
    let qdp = inv.add(heads);
    let kbuf = qdp.add(dup);
    let qp = |h: usize| rows[h / group].q.as_ptr().add((h % group) * hd);
    if WIDE {
        for h in 0..heads {
            let mut d = 0;
            while d < hd {
                std::ptr::copy_nonoverlapping(qp(h).add(d), qdp.add(h * 2 * hd + 2 * d), 8);
                std::ptr::copy_nonoverlapping(qp(h).add(d), qdp.add(h * 2 * hd + 2 * d + 8), 8);
                d += 8;
            }
        }
    }
    // Query sets of the multi-query passes: up to MULTI consecutive heads (row after row) and
    // the keys every one of their rows sees as prefix rows.
    let set = |s0: usize| {
        let s1 = (s0 + MULTI).min(heads);
        let common = (s0 / group..=(s1 - 1) / group).map(|r| rows[r].vis.prefix).min().unwrap_or(0);
        (s1, common)
    };
    let scale_v = _mm256_set1_ps(scale);
    // Chunks keep a chunk of keys in cache while several query sets read it. A call whose
    // heads form one set (a decode row, a batch's decode rows) reads each key from memory once
    // anyway, so it walks all its keys in one pass: cut into chunks, each chunk's first
    // PREFETCH_KEYS keys waited on memory (the prefetch stays inside a pass); a set of 5–6
    // heads scores in two passes chunk by chunk (`scores16_set`). Chunking changes no bit.
    let chunk = if WIDE && heads <= MULTI { nmax } else { super::CHUNK };
    // 1. Scores, chunk by chunk of keys, every row over a chunk while it is in cache.
    let mut c0 = 0;
    while c0 < nmax {
        let c1 = (c0 + chunk).min(nmax);
        if WIDE {
            // The chunk's keys that some set scores in its shared pass, packed once.
            let pk1 = if pack && pmax > c0 { c0 + (c1.min(pmax) - c0) / 8 * 8 } else { c0 };
            if pk1 > c0 {
                pack_keys(&kv, c0, pk1, kbuf);
            }
            let mut s0 = 0;
            while s0 < heads {
                let (s1, common) = set(s0);
                // Whole tiles of shared prefix keys in this chunk, then each head's own rest.
                let m1 = if common > c0 { c0 + (c1.min(common) - c0) / 8 * 8 } else { c0 };
                if m1 > c0 {
                    let (mut qd, mut so) = ([std::ptr::null(); MULTI], [std::ptr::null_mut(); MULTI]);
                    for h in s0..s1 {
                        qd[h - s0] = qdp.add(h * 2 * hd) as *const f32;
                        so[h - s0] = sp.add(h * stride);
                    }
                    if pk1 > c0 {
                        // m1 ≤ pk1: a set's common prefix is at most the largest.
                        scores16_packed_set(s1 - s0, hd, kbuf, &qd, c0, m1, scale_v, &so);
                    } else {
                        scores16_set(s1 - s0, &kv, &qd, c0, m1, scale_v, &so);
                    }
                }
                for h in s0..s1 {
                    let vis = &rows[h / group].vis;
                    scores16(&kv, vis, qp(h), m1, c1.min(vis.len()), scale_v, sp.add(h * stride));
                }
                s0 = s1;
            }
        } else {
            for (r, row) in rows.iter().enumerate() {
                let end = c1.min(row.vis.len());
                for g in 0..group {
                    scores(&kv, &row.vis, qp(r * group + g), c0, end, scale_v, sp.add((r * group + g) * stride));
                }
            }
        }
        c0 = c1;
    }
    // 2. Per head: max (exact in any order: one vector pass, NaN scores ignored as
    //    `f32::max` ignores them), probabilities (padding lanes 0), 1/sum.
    for (r, row) in rows.iter().enumerate() {
        let (n, n8) = (row.vis.len(), row.vis.len().div_ceil(8) * 8);
        for g in 0..group {
            let s = std::slice::from_raw_parts_mut(sp.add((r * group + g) * stride), n8);
            let mut lanes = _mm256_set1_ps(f32::NEG_INFINITY);
            let mut t = 0;
            while t + 8 <= n {
                lanes = _mm256_max_ps(_mm256_loadu_ps(s.as_ptr().add(t)), lanes);
                t += 8;
            }
            let mut l8 = [0.0f32; 8];
            _mm256_storeu_ps(l8.as_mut_ptr(), lanes);
            let mx = l8.iter().chain(&s[t..n]).fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let mv = _mm256_set1_ps(mx);
            let mut t = 0;
            if WIDE {
                // 16 lanes at a time: each lane is exp8's arithmetic (the same bits).
                let mv16 = _mm512_set1_ps(mx);
                while t + 16 <= n8 {
                    _mm512_storeu_ps(s.as_mut_ptr().add(t), exp16(_mm512_sub_ps(_mm512_loadu_ps(s.as_ptr().add(t)), mv16)));
                    t += 16;
                }
            }
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
        let c1 = (c0 + chunk).min(nmax);
        let mut s0 = 0;
        while s0 < heads {
            let (s1, common) = if WIDE { set(s0) } else { (s0 + 1, 0) };
            // Shared prefix keys of this chunk for the whole set, then each head's own rest.
            let m1 = c1.min(common).max(c0);
            if m1 > c0 {
                let (mut pp, mut oo) = ([std::ptr::null(); MULTI], [std::ptr::null_mut(); MULTI]);
                for h in s0..s1 {
                    pp[h - s0] = sp.add(h * stride) as *const f32;
                    oo[h - s0] = op.add(h * hd);
                }
                let mut base = 0;
                while base + 64 <= hd {
                    values16_set::<E, 4>(s1 - s0, &kv, &pp, c0, m1, base, &oo);
                    base += 64;
                }
                while base + 16 <= hd {
                    values16_set::<E, 1>(s1 - s0, &kv, &pp, c0, m1, base, &oo);
                    base += 16;
                }
                for h in s0..s1 {
                    let mut b = base;
                    while b < hd {
                        values::<E, 1>(&kv, &rows[h / group].vis, pp[h - s0], c0, m1, b, oo[h - s0]);
                        b += 8;
                    }
                }
            }
            for h in s0..s1 {
                let vis = &rows[h / group].vis;
                let end = c1.min(vis.len());
                if m1 < end {
                    values_head::<E, WIDE>(&kv, vis, sp.add(h * stride), m1, end, op.add(h * hd));
                }
            }
            s0 = s1;
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

/// One head's value pass over visible keys `t0..t1`: every output of the head (module docs,
/// step 4), in 64-, then 16- (`WIDE`) or 8-value blocks.
#[inline(always)]
unsafe fn values_head<E: KvElem, const WIDE: bool>(kv: &KvHead<'_, E>, vis: &Visible<'_>, p: *const f32, t0: usize, t1: usize, o: *mut f32) {
    let hd = kv.hd;
    let mut base = 0;
    while WIDE && base + 64 <= hd {
        values16::<E, 4>(kv, vis, p, t0, t1, base, o);
        base += 64;
    }
    while WIDE && base + 16 <= hd {
        values16::<E, 1>(kv, vis, p, t0, t1, base, o);
        base += 16;
    }
    while base + 64 <= hd {
        values::<E, 8>(kv, vis, p, t0, t1, base, o);
        base += 64;
    }
    while base < hd {
        values::<E, 1>(kv, vis, p, t0, t1, base, o);
        base += 8;
    }
}
