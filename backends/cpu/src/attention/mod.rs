//! Softmax attention of one query row's heads over the cache rows it sees: the inner kernel of
//! the CPU backend's `attention` / `attention_ragged` (causal decode, prefill and the tree
//! verify's ancestor-only mask all reduce to "these cache rows, in ascending order").
//!
//! Every path computes each output head row from that row's query and its visible keys and
//! values alone, in an order fixed by the path (below), so a row's result is bit-identical
//! whether it is decoded alone, verified inside a tree block or packed with other sequences —
//! the property the exactness tests rest on. The path is chosen once per process
//! ([`crate::isa::active`]), so `ar` and every speculative method run the same one.
//!
//! # The AVX2 path (head dim a multiple of 8)
//! For each query head, with `t` running over the visible keys in ascending order:
//! 1. `s_t = r8(lanes)·scale`: lane `l` is the fused multiply-add chain of `q[d]·k_t[d]` over
//!    `d ≡ l (mod 8)` ascending, and `r8(l) = ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7))`;
//! 2. `m = max_t s_t`; `p_t = exp8(s_t − m)` ([`crate::vmath`]: a Cephes-style polynomial, ≤ 2 ulp);
//! 3. `sum = r8(lanes)`, lane `l` the sum of `p_t` over `t ≡ l (mod 8)` ascending;
//! 4. `o[d]` = the fused chain of `p_t·v_t[d]` over `t` ascending, then `o[d]·(1/sum)`.
//!
//! Scores are formed 8 keys at a time with the query in registers, and the value pass keeps
//! 64 output values in registers, so a key costs about 20 vector instructions per head
//! (scalar `exp` and a load/store per value before). On CPUs with AVX-512 the same arithmetic
//! runs on 512-bit registers (two keys per score instruction, 16 outputs per value
//! instruction), every lane doing the same operations in the same order: the same bits. There,
//! up to six query heads of a call (a GQA group's heads, and the rows of a tree verify or a
//! prefill) run together over the keys that all their rows see as prefix rows, so each key and
//! value row is loaded and converted once for the six instead of once per head; each head's
//! chains are unchanged (the same bits). Where several such sets read one chunk of keys (a
//! verify's, a prefill's or a drafter block's rows), the chunk's keys are converted to f32
//! once, into tiles laid out as the score pass loads them, which every set then reads from L1
//! (the same values: the same bits). The max of step 2 is one vector pass (exact in any
//! order).
//!
//! A KV cache from `kv_zeros` keeps each KV head's rows contiguous (one panel per head,
//! `CpuTensor::panels`): a head's keys and values are read as one stream (`stride` = head
//! dim), which a decode row at a long context waits on; a plain row-major tensor (`stride` =
//! all heads) is read the same way, with the same bits.
//!
//! # The portable path
//! `s_t = dot(q, k_t)·scale` ([`crate::kernels::dot`]'s blocked order), `m = max s_t`, then for
//! `t` ascending `p = exp(s_t − m)`, `sum += p`, `o += p·v_t` (multiply, then add), finally
//! `o *= 1/sum`. The AVX2 build runs it for head dims that are not a multiple of 8.

use crate::{shape_err, CpuTensor, PAR_MIN_ELEMS};
use sparkling_core::select::ancestor_table;
use sparkling_core::{AttnMask, AttnShape, RaggedSeq, Result};

/// The cache rows one query row attends to, in ascending order: rows `0..prefix`, then the
/// rows in `extra` (a tree row's ancestors in its block, itself included).
#[derive(Debug, Clone, Copy)]
pub struct Visible<'a> {
    /// Leading cache rows seen in full.
    pub prefix: usize,
    /// Further cache rows, ascending, each `≥ prefix`.
    pub extra: &'a [usize],
}

impl Visible<'_> {
    /// Number of visible rows.
    pub fn len(&self) -> usize {
        self.prefix + self.extra.len()
    }

    /// Cache row of visible key `t`.
    #[inline(always)]
    fn row(&self, t: usize) -> usize {
        if t < self.prefix {
            t
        } else {
            self.extra[t - self.prefix]
        }
    }
}

/// An element of a KV cache: `f32`, `half::f16` (an f16 cache, `KvDtype::F16`) or `i8` (the
/// codes of a q8_0 cache, `KvDtype::Q8_0`, each block of [`crate::kv::q8::KV_BLOCK`] values
/// with its scale `d`). Every path converts a loaded value exactly to f32 (for a code, `code·d`,
/// exact: [`crate::kv::q8`]), so each cache type gives the same bits as an f32 cache holding the
/// same (rounded) values.
pub trait KvElem: Copy + Send + Sync + 'static {
    /// Whether values carry a block scale (`i8` codes); the loads ignore their scale otherwise.
    // Read only by the x86-64 kernels (the wasm32 build has none of them).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    const SCALED: bool;

    /// Values `c0..c0 + n` of row `r` (`cols` values per row; `d`: the cache's block scales,
    /// `SCALED` only) as f32: the cache's own slice for f32, else converted into `buf`.
    fn row_f32<'b>(data: &'b [Self], d: &[f32], cols: usize, r: usize, c0: usize, n: usize, buf: &'b mut Vec<f32>) -> &'b [f32];

    /// 8 values at `p` (scale `s` where `SCALED`) as f32 lanes (AVX2 path; F16C converts f16).
    ///
    /// # Safety
    /// `p` must be valid for 8 reads; the caller runs with avx2 + f16c.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self, s: f32) -> std::arch::x86_64::__m256;

    /// 8 values at `p` (scale `s`) in lanes 0–7 and 8 at `p2` (scale `s2`) in lanes 8–15, as
    /// f32 (AVX-512 path).
    ///
    /// # Safety
    /// `p` and `p2` valid for 8 reads each; the caller runs with avx512f + f16c.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8x2(p: *const Self, s: f32, p2: *const Self, s2: f32) -> std::arch::x86_64::__m512;

    /// [`Self::load8x2`] with the two scales given as one vector (`s` in lanes 0–7, `s2` in
    /// 8–15; ignored where not `SCALED`), for a caller that reuses it across loads.
    ///
    /// # Safety
    /// As [`Self::load8x2`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8x2_sv(p: *const Self, p2: *const Self, sv: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512;

    /// 16 values at `p` (scale `s`; all in one block) as f32 lanes (AVX-512 path).
    ///
    /// # Safety
    /// `p` valid for 16 reads; the caller runs with avx512f.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self, s: f32) -> std::arch::x86_64::__m512;
}

impl KvElem for f32 {
    const SCALED: bool = false;

    #[inline(always)]
    fn row_f32<'b>(data: &'b [f32], _: &[f32], cols: usize, r: usize, c0: usize, n: usize, _: &'b mut Vec<f32>) -> &'b [f32] {
        &data[r * cols + c0..r * cols + c0 + n]
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32, _: f32) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8x2(p: *const f32, _: f32, p2: *const f32, _: f32) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        let lo = _mm512_castps256_ps512(_mm256_loadu_ps(p));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(lo), _mm256_castps_pd(_mm256_loadu_ps(p2))))
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8x2_sv(p: *const f32, p2: *const f32, _: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
        Self::load8x2(p, 1.0, p2, 1.0)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32, _: f32) -> std::arch::x86_64::__m512 {
        std::arch::x86_64::_mm512_loadu_ps(p)
    }
}

impl KvElem for half::f16 {
    const SCALED: bool = false;

    fn row_f32<'b>(data: &'b [half::f16], _: &[f32], cols: usize, r: usize, c0: usize, n: usize, buf: &'b mut Vec<f32>) -> &'b [f32] {
        buf.clear();
        buf.extend(data[r * cols + c0..r * cols + c0 + n].iter().map(|h| h.to_f32()));
        buf
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const half::f16, _: f32) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8x2(p: *const half::f16, _: f32, p2: *const half::f16, _: f32) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        let both = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(_mm_loadu_si128(p as *const __m128i)), _mm_loadu_si128(p2 as *const __m128i));
        _mm512_cvtph_ps(both)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8x2_sv(p: *const half::f16, p2: *const half::f16, _: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
        Self::load8x2(p, 1.0, p2, 1.0)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const half::f16, _: f32) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
}

impl KvElem for i8 {
    const SCALED: bool = true;

    fn row_f32<'b>(data: &'b [i8], d: &[f32], cols: usize, r: usize, c0: usize, n: usize, buf: &'b mut Vec<f32>) -> &'b [f32] {
        let nb = crate::kv::q8::blocks(cols);
        crate::kv::q8::dequantize(&data[r * cols..(r + 1) * cols], &d[r * nb..(r + 1) * nb], c0, n, buf);
        buf
    }

    // `code·d`: exact in f32 (crate::kv::q8), so the same value on every path.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const i8, s: f32) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i))), _mm256_set1_ps(s))
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8x2(p: *const i8, s: f32, p2: *const i8, s2: f32) -> std::arch::x86_64::__m512 {
        Self::load8x2_sv(p, p2, scale_pair(s, s2))
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8x2_sv(p: *const i8, p2: *const i8, sv: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        let codes = _mm_unpacklo_epi64(_mm_loadl_epi64(p as *const __m128i), _mm_loadl_epi64(p2 as *const __m128i));
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes)), sv)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const i8, s: f32) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i))), _mm512_set1_ps(s))
    }
}

/// `s` in lanes 0–7 and `s2` in lanes 8–15 (the scales of a [`KvElem::load8x2`] pair).
///
/// # Safety
/// The caller runs with avx512f.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scale_pair(s: f32, s2: f32) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(_mm512_set1_ps(s)), _mm256_castps_pd(_mm256_set1_ps(s2))))
}

/// One KV head's cache: key and value rows `stride` values apart, the head's `hd` values at
/// `off..off + hd` of each row; elements f32, f16 or q8_0 codes ([`KvElem`]).
#[derive(Debug, Clone, Copy)]
pub struct KvHead<'a, E = f32> {
    /// Key cache, row-major.
    pub k: &'a [E],
    /// Value cache, same shape as `k`.
    pub v: &'a [E],
    /// Key block scales of a q8_0 cache, [`crate::kv::q8::blocks`]`(stride)` per row; empty
    /// for f32 / f16.
    pub kd: &'a [f32],
    /// Value block scales, as `kd`.
    pub vd: &'a [f32],
    /// Values per cache row (all KV heads).
    pub stride: usize,
    /// This head's first value in a row.
    pub off: usize,
    /// Head dimension.
    pub hd: usize,
}

impl<'a, E: KvElem> KvHead<'a, E> {
    /// An f32 or f16 cache's head (no block scales).
    pub fn new(k: &'a [E], v: &'a [E], stride: usize, off: usize, hd: usize) -> Self {
        KvHead { k, v, kd: &[], vd: &[], stride, off, hd }
    }

    /// Key row `r`'s head values as f32 (converted into `buf` unless f32).
    #[inline(always)]
    fn key_f32<'b>(&'b self, r: usize, buf: &'b mut Vec<f32>) -> &'b [f32] {
        E::row_f32(self.k, self.kd, self.stride, r, self.off, self.hd, buf)
    }

    /// Value row `r`'s head values as f32.
    #[inline(always)]
    fn value_f32<'b>(&'b self, r: usize, buf: &'b mut Vec<f32>) -> &'b [f32] {
        E::row_f32(self.v, self.vd, self.stride, r, self.off, self.hd, buf)
    }

    /// The scale of key row `r`'s head value `d` (1 without scales).
    ///
    /// # Safety
    /// `r` is a row of the cache and `d < hd`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn ks(&self, r: usize, d: usize) -> f32 {
        self.block_scale(self.kd, r, d)
    }

    /// The scale of value row `r`'s head value `d` (1 without scales).
    ///
    /// # Safety
    /// As [`Self::ks`].
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn vs(&self, r: usize, d: usize) -> f32 {
        self.block_scale(self.vd, r, d)
    }

    /// Scale of the block holding row `r`'s head value `d` in `scales` (`kd` or `vd`).
    ///
    /// # Safety
    /// As [`Self::ks`]; `body` checks that the scales cover the rows it reads.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn block_scale(&self, scales: &[f32], r: usize, d: usize) -> f32 {
        use crate::kv::q8::KV_BLOCK;
        if E::SCALED {
            *scales.get_unchecked(r * self.stride.div_ceil(KV_BLOCK) + (self.off + d) / KV_BLOCK)
        } else {
            1.0
        }
    }
}

/// One query row of an [`attend_rows`] call: its `group` query heads (`group·hd` values, head
/// after head) and the cache rows it sees.
#[derive(Debug, Clone, Copy)]
pub struct QueryRow<'a> {
    /// The row's query heads of this KV head.
    pub q: &'a [f32],
    /// Its visible cache rows (at least one).
    pub vis: Visible<'a>,
}

/// Attention of several query rows that share the KV head `kv`, each over its own visible
/// rows, scaled by `scale`; writes row `r`'s `group` heads to `out[r·group·hd ..]`. The AVX2
/// path walks the keys in chunks of [`CHUNK`] and runs every row over a chunk while it is in
/// cache, so a tree block's rows (or a prefill's) read their shared prefix from memory once
/// instead of once per row; each row's result is the same bits as when it is alone. `scratch`
/// is reused between calls. Panics on slices shorter than the shapes say (the caller checks
/// shapes).
pub fn attend_rows<E: KvElem>(rows: &[QueryRow<'_>], group: usize, kv: KvHead<'_, E>, scale: f32, out: &mut [f32], scratch: &mut Vec<f32>) {
    #[cfg(target_arch = "x86_64")]
    {
        // The AVX2 body loads 8 values at multiples of 8 of a head, the 512-bit body also 16 at
        // multiples of 16 of the head's first value: inside one 32-value block of a q8_0 cache
        // (one scale) when the head dim is a multiple of 16. Otherwise a q8_0 cache takes the
        // AVX2 body, whose arithmetic is the same (the same bits), so every cache type runs
        // the vector arithmetic for every head dim that is a multiple of 8.
        let whole = kv.hd.is_multiple_of(8);
        let wide_ok = !E::SCALED || kv.hd.is_multiple_of(16);
        if whole && wide_ok && crate::isa::active() >= crate::isa::Isa::Avx512Vnni {
            // SAFETY: `isa::active` only reports Avx512Vnni when avx512f/bw/vl (and the AVX2
            // set) were detected.
            unsafe { avx2::attend_rows_avx512(rows, group, kv, scale, out, scratch) };
            return;
        }
        if whole && crate::isa::active() >= crate::isa::Isa::Avx2 {
            // SAFETY: `isa::active` only reports Avx2 when avx2, fma and f16c were detected.
            unsafe { avx2::attend_rows(rows, group, kv, scale, out, scratch) };
            return;
        }
    }
    let w = group * kv.hd;
    let mut key = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        portable(row.q, group, kv, row.vis, scale, &mut out[r * w..(r + 1) * w], scratch, &mut key);
    }
}

/// Keys per pass of the AVX2 path over the cache (64 rows of one head: 16 KB of keys at
/// head dim 64, which stay in L1/L2 while every row of the call uses them).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub const CHUNK: usize = 64;

/// One task of [`attend`]: (KV head, (first packed row, rows), (first, end) query head of that
/// KV head's group).
type AttnTask = (usize, (usize, usize), (usize, usize));

/// Attention for one or more sequences (the query blocks of `seqs` back to back in `q`), each
/// against its own cache: one parallel pass over every (row, head). Each output head row is
/// one softmax over that row's visible keys in ascending order, computed the same way whatever
/// the other rows, sequences or the thread split, so [`Backend::attention_ragged`] equals
/// [`Backend::attention`] per sequence bit for bit.
pub(crate) fn attend(q: &CpuTensor, seqs: &[RaggedSeq<'_, CpuTensor>], shape: AttnShape) -> Result<CpuTensor> {
    let AttnShape { n_heads, n_kv_heads, head_dim } = shape;
    let total = q.rows;
    if n_kv_heads == 0 || n_heads % n_kv_heads != 0 || q.cols != n_heads * head_dim {
        return Err(shape_err("attention", format!("q [{total}, {}] for {n_heads}x{head_dim} heads / {n_kv_heads} kv", q.cols)));
    }
    // Per packed query row: its sequence, and the cache rows it sees: rows `0..prefix`, then
    // `extra` (a tree row's ancestors; empty for causal and full masks).
    let mut row_seq: Vec<usize> = Vec::with_capacity(total);
    let mut visible: Vec<(usize, Vec<usize>)> = Vec::with_capacity(total);
    for (si, s) in seqs.iter().enumerate() {
        let (t, kv_len, k_cache, v_cache) = (s.q_rows, s.kv_len, s.k_cache, s.v_cache);
        if k_cache.cols != n_kv_heads * head_dim || v_cache.cols != k_cache.cols || v_cache.rows != k_cache.rows || kv_len > k_cache.rows || t > kv_len {
            return Err(shape_err("attention", format!("kv [{}, {}] len {kv_len} for {t} queries", k_cache.rows, k_cache.cols)));
        }
        for c in [k_cache, v_cache] {
            // A cache in panels (`CpuTensor::panels`) holds one KV head per panel.
            if c.panels != 1 && (c.panels != n_kv_heads || c.panel_width() * c.panels != c.cols) {
                return Err(shape_err("attention", format!("a cache of {} panels of [{}, {}] for {n_kv_heads} KV heads", c.panels, c.rows, c.panel_width())));
            }
            // The attention reads a q8_0 cache's scales unchecked: both arrays must be whole.
            if c.is_q8() && (c.q8.codes.len() != c.rows * c.cols || c.q8.d.len() != c.rows * c.panels * crate::kv::q8::blocks(c.panel_width())) {
                return Err(shape_err(
                    "attention",
                    format!("a q8_0 cache of [{}, {}] holds {} codes and {} scales", c.rows, c.cols, c.q8.codes.len(), c.q8.d.len()),
                ));
            }
        }
        if k_cache.storage() != v_cache.storage() || k_cache.panels != v_cache.panels {
            return Err(shape_err(
                "attention",
                format!(
                    "the K and V caches are stored differently ({} in {} panels vs {} in {})",
                    k_cache.storage(),
                    k_cache.panels,
                    v_cache.storage(),
                    v_cache.panels
                ),
            ));
        }
        let prefix = kv_len - t;
        match s.mask {
            AttnMask::Causal => visible.extend((0..t).map(|i| (prefix + i + 1, Vec::new()))),
            AttnMask::Full => visible.extend((0..t).map(|_| (kv_len, Vec::new()))),
            AttnMask::Tree { parents } => {
                if parents.len() != t {
                    return Err(shape_err("attention", format!("{} parents for {t} tree rows", parents.len())));
                }
                let table = ancestor_table(parents)?;
                let (offs, entries) = table.split_at(t + 1);
                for i in 0..t {
                    visible.push((prefix, entries[offs[i] as usize..offs[i + 1] as usize].iter().map(|&a| prefix + a as usize).collect()));
                }
            }
        }
        row_seq.extend(std::iter::repeat_n(si, t));
    }
    if visible.len() != total {
        return Err(shape_err("attention", format!("query blocks of {} rows for a q of {total} rows", visible.len())));
    }
    let group = n_heads / n_kv_heads;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let w = group * head_dim;
    // Tasks: (KV head, a block of one sequence's rows, a range of that KV head's query heads).
    // The rows of a block read each chunk of their shared cache once (attend_rows); blocks are
    // cut so that there are at least two tasks per thread, and at most 32 rows each (a prefill
    // has many).
    let per_seq_blocks = (2 * crate::team::threads()).div_ceil(n_kv_heads).max(1);
    let mut blocks: Vec<(usize, usize)> = Vec::new();
    let mut r0 = 0;
    for s in seqs {
        let rb = s.q_rows.div_ceil(per_seq_blocks).clamp(1, 32);
        let mut i = 0;
        while i < s.q_rows {
            let len = rb.min(s.q_rows - i);
            blocks.push((r0 + i, len));
            i += len;
        }
        r0 += s.q_rows;
    }
    // Fewer (KV head, block) tasks than threads — a decode step of a model with fewer KV
    // heads than threads — split each KV head's query heads into parts too, so that every
    // thread has work: every head's result is computed the same way whichever heads share its
    // call, so the split changes no bit. Only then: parts of one KV head each read all of its
    // keys and values, and a decode row waits on those reads (splitting SmolLM2's 3 KV heads
    // for 2 threads made its decode attention 10–25 % slower; BENCHMARKS.md §37).
    let threads = crate::team::threads();
    let tasks0 = n_kv_heads * blocks.len();
    let per_head_parts = if tasks0 < threads { threads.div_ceil(tasks0).min(group) } else { 1 };
    let head_parts: Vec<(usize, usize)> =
        (0..per_head_parts).map(|p| (p * group / per_head_parts, (p + 1) * group / per_head_parts)).filter(|(a, b)| a < b).collect();
    let tasks: Vec<AttnTask> =
        (0..n_kv_heads).flat_map(|kh| blocks.iter().flat_map(|&b| head_parts.iter().map(move |&g| (kh, b, g))).collect::<Vec<_>>()).collect();
    let work: usize = visible.iter().map(|v| v.0 + v.1.len()).sum::<usize>() * n_heads * head_dim;
    let task = |scratch: &mut Vec<f32>, &(kh, (i0, len), (g0, g1)): &AttnTask| -> Vec<f32> {
        let s = &seqs[row_seq[i0]];
        let (h0, h1) = (kh * w + g0 * head_dim, kh * w + g1 * head_dim);
        let rows: Vec<QueryRow<'_>> = (i0..i0 + len)
            .map(|i| QueryRow { q: &q.data[i * q.cols + h0..i * q.cols + h1], vis: Visible { prefix: visible[i].0, extra: &visible[i].1 } })
            .collect();
        let mut o = vec![0.0f32; len * (h1 - h0)];
        // This KV head's values: its own panel (rows `hd` apart), or a slice of each row.
        let (c, paneled) = (s.k_cache, s.k_cache.panels > 1);
        let (stride, off) = if paneled { (head_dim, 0) } else { (c.cols, kh * head_dim) };
        let span = |n: usize, per_row: usize| if paneled { kh * n * per_row..(kh + 1) * n * per_row } else { 0..n * per_row };
        let (vals, scales) = (span(c.rows, stride), span(c.rows, crate::kv::q8::blocks(stride)));
        if c.is_f16() {
            let kv = KvHead::new(&c.half[vals.clone()], &s.v_cache.half[vals], stride, off, head_dim);
            attend_rows(&rows, g1 - g0, kv, scale, &mut o, scratch);
        } else if c.is_q8() {
            let (k, v) = (&c.q8, &s.v_cache.q8);
            let kv = KvHead { k: &k.codes[vals.clone()], v: &v.codes[vals], kd: &k.d[scales.clone()], vd: &v.d[scales], stride, off, hd: head_dim };
            attend_rows(&rows, g1 - g0, kv, scale, &mut o, scratch);
        } else {
            let kv = KvHead::new(&c.data[vals.clone()], &s.v_cache.data[vals], stride, off, head_dim);
            attend_rows(&rows, g1 - g0, kv, scale, &mut o, scratch);
        }
        o
    };
    let parts: Vec<Vec<f32>> = if work >= PAR_MIN_ELEMS {
        crate::team::map(tasks.len(), |i| SCRATCH.with(|s| task(&mut s.borrow_mut(), &tasks[i])))
    } else {
        let mut scratch = Vec::new();
        tasks.iter().map(|t| task(&mut scratch, t)).collect()
    };
    let mut out = vec![0.0f32; total * q.cols];
    for (&(kh, (i0, len), (g0, g1)), o) in tasks.iter().zip(&parts) {
        let (h0, h1) = (kh * w + g0 * head_dim, kh * w + g1 * head_dim);
        let hw = h1 - h0;
        for r in 0..len {
            let i = i0 + r;
            out[i * q.cols + h0..i * q.cols + h1].copy_from_slice(&o[r * hw..(r + 1) * hw]);
        }
    }
    Ok(CpuTensor::from_f32(total, q.cols, out))
}

thread_local! {
    /// Each thread's score scratch for [`attend_rows`], reused from call to call.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The portable path (module docs); `key` is scratch for a key or value row as f32.
#[allow(clippy::too_many_arguments)]
fn portable<E: KvElem>(q: &[f32], group: usize, kv: KvHead<'_, E>, vis: Visible<'_>, scale: f32, out: &mut [f32], scores: &mut Vec<f32>, key: &mut Vec<f32>) {
    let (hd, n) = (kv.hd, vis.len());
    scores.clear();
    scores.resize(group * n, 0.0);
    for t in 0..n {
        let kr = kv.key_f32(vis.row(t), key);
        for g in 0..group {
            scores[g * n + t] = crate::kernels::dot(&q[g * hd..(g + 1) * hd], kr) * scale;
        }
    }
    for g in 0..group {
        let sc = &scores[g * n..(g + 1) * n];
        let max = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let o = &mut out[g * hd..(g + 1) * hd];
        o.iter_mut().for_each(|a| *a = 0.0);
        let mut sum = 0.0f32;
        for (t, &s) in sc.iter().enumerate() {
            let p = (s - max).exp();
            sum += p;
            for (x, y) in o.iter_mut().zip(kv.value_f32(vis.row(t), key)) {
                *x += p * y;
            }
        }
        let inv = 1.0 / sum;
        o.iter_mut().for_each(|a| *a *= inv);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(test)]
mod tests;
