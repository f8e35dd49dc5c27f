//! Quantized weights kept in ggml's block formats, and the integer matmul over them.
//!
//! # Storage ([`weight`])
//! Output columns (weight rows) are interleaved in groups of 8 so that one 256-bit register
//! holds 4 consecutive codes of each of the 8 columns (the layout idea of llama.cpp's repacked
//! `q4_0x8` blocks). Every format is stored in 32-value blocks (the K-quants' 256-value
//! super-blocks as 8 of them). For group `G` (columns `8G..8G+8`, the last group padded with
//! zero bytes and zero scales: codes 0, or −128 for Q8_0, that weigh nothing)
//! and block `b` (values `32b..32b+32`):
//! - `Q8_0`: 256 bytes in 8 chunks of 32; byte `4c + t` of chunk `g` is value `4g+t` of column
//!   `8G + c`, stored as `code + 128` (the sign bit flipped: the unsigned operand of VNNI's
//!   `vpdpbusd`, whose `Σ(q+128)·qx − 128·Σqx` is the signed sum; the AVX2 path flips it back);
//! - every other format: the low 4 bits of the unsigned codes in 128 bytes, 4 chunks of 32;
//!   byte `4c + t` of chunk `g` holds value `4g+t` of column `8G + c` in its low nibble and value
//!   `4g+t+16` in its high nibble (ggml's `Q4_0` byte order);
//! - `Q5_0` (bit 4) and `Q6_K` (bits 4 and 5): one 32-byte plane per high bit: for chunk `g`,
//!   the little-endian 32-bit mask at byte `8g` has bit `4c + t` = that bit of value `4g+t` of
//!   column `8G + c` (the chunk's low nibbles), the one at byte `8g + 4` the same for value
//!   `4g+t+16` (its high nibbles);
//! - scales: the 8 columns' f16 `d` per block (and `Q4_1`'s f16 mins `m`); for the K-quants one
//!   byte pair per column and block (Q4_K: 6-bit scale `sa` and min `sb`; Q6_K: the int8
//!   scales `sa`, `sb` of values 0–15 and 16–31) and the f16 super-block `d` (and Q4_K's `dmin`)
//!   per column and super-block.
//!
//! So every format keeps about ggml's bits per weight (Q4_0 4.5, Q4_1 5.0, Q5_0 5.5, Q8_0 8.5,
//! Q4_K 4.625 for ggml's 4.5, Q6_K 6.56).
//!
//! # Matmul `y[M,N] = x[M,K]·Wᵀ`
//! The activations are quantized once per call to 8-bit blocks like ggml's `Q8_0`/`Q8_1`
//! (per row and block: `dx = amax/127` in f32, codes `qx = round(x/dx)`, `Σqx`, the sum `hx` of
//! the first 16 codes, and `sx = dx·Σqx`). Output `(i, j)` is defined as follows, in exactly
//! this order for every path (scalar reference, AVX2, AVX-512 VNNI), every row count and every
//! thread split:
//! 1. per block `b` the exact integer dot product `isum = Σ_t w[t]·qx[t]` of the signed codes
//!    (`q−8` for Q4_0, `q−16` for Q5_0, `q` for Q4_1, Q4_K and Q8_0); Q4_K then multiplies it
//!    by its sub-block scale, `isum·sa`; Q6_K sums its two halves with their scales,
//!    `sa·Σ_{t<16}(q−32)·qx + sb·Σ_{t≥16}(q−32)·qx` (all exact in 32 bits);
//! 2. `acc = acc + f32(isum) · (d·dx)` (separate multiply and add, never fused; `d` the block's
//!    or the super-block's), then for Q4_1 `acc = acc + m·sx` (the value `d·q + m` against
//!    `dx·qx`: ggml's `Q4_1·Q8_1`) and for Q4_K `acc = acc − (dmin·f32(sb))·sx`;
//!    blocks `b = 0, 1, …, K/32 − 1` in order, `acc` starting at `+0`.
//!
//! So a row's outputs are bit-identical whether it is computed alone, in a 65-row verify, or on
//! any number of threads, and every SIMD path equals the scalar reference bit for bit.

use crate::isa::Isa;
use crate::team;

/// Values per block.
pub const QK: usize = 32;

/// Columns per interleaved group.
const GC: usize = 8;

// Format tags of the SIMD kernels (a const generic, so each format's tile is compiled apart).
#[cfg(target_arch = "x86_64")]
const F_Q8_0: u8 = 0;
#[cfg(target_arch = "x86_64")]
const F_Q4_0: u8 = 1;
#[cfg(target_arch = "x86_64")]
const F_Q4_1: u8 = 2;
#[cfg(target_arch = "x86_64")]
const F_Q5_0: u8 = 3;
#[cfg(target_arch = "x86_64")]
const F_Q4K: u8 = 4;
#[cfg(target_arch = "x86_64")]
const F_Q6K: u8 = 5;

mod weight;
#[cfg(target_arch = "x86_64")]
use weight::H_BYTES;
pub use weight::{QFormat, QWeight, QuantError, QK_K};

/// Quantize one block of 32 values to `q` and return its scale `d = amax/127` (ggml's
/// `quantize_row_q8_0`: `q = round(x·(1/d))`, ties to even as its SIMD versions round). Codes
/// are clamped to [-127, 127] and NaN codes become 0: only a block so small that `1/d`
/// overflows to inf, or one holding an inf, reaches either (ggml leaves those cases undefined);
/// never producing −128 keeps the AVX2 kernels' sign trick exact. Every operation is exactly
/// rounded IEEE arithmetic, so any instruction set gives the same codes.
#[inline(always)]
fn quantize_block(x: &[f32], q: &mut [u8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (qv, &v) in q.iter_mut().zip(x) {
        *qv = ((v * id).round_ties_even().clamp(-127.0, 127.0) as i8) as u8;
    }
    d
}

/// Activations `x[M, K]` quantized to 8-bit blocks (module docs): codes `[M, K]`; per row and
/// block the scale `dx`, the code sum `Σqx`, the sum `hx` of the first 16 codes and
/// `sx = dx·Σqx`, each `[M, K/32]`.
#[derive(Debug, Clone)]
pub struct QActs {
    m: usize,
    k: usize,
    nb: usize,
    qs: Vec<u8>,
    d: Vec<f32>,
    sq: Vec<i32>,
    sh: Vec<i32>,
    s: Vec<f32>,
}

/// One row's slices of [`QActs`] (codes, scales, code sums, half sums, scaled sums) with its
/// index.
type RowSlices<'a> = (usize, ((((&'a mut [u8], &'a mut [f32]), &'a mut [i32]), &'a mut [i32]), &'a mut [f32]));

/// Quantize `x` (`m` rows of `k` values, `k` a multiple of 32; checked by the caller). Rows
/// are independent (and run in parallel for large inputs); the AVX2 version does the same
/// exactly rounded operations as [`quantize_block`] (finite inputs give identical codes).
pub fn quantize_acts(x: &[f32], m: usize, k: usize) -> QActs {
    let nb = k / QK;
    let mut a = QActs { m, k, nb, qs: vec![0; m * k], d: vec![0.0; m * nb], sq: vec![0; m * nb], sh: vec![0; m * nb], s: vec![0.0; m * nb] };
    let avx2 = cfg!(target_arch = "x86_64") && crate::isa::detected() >= Isa::Avx2;
    let row = |(i, ((((q, d), sq), sh), s)): RowSlices<'_>| {
        let xr = &x[i * k..(i + 1) * k];
        for b in 0..nb {
            let (xb, qb) = (&xr[b * QK..(b + 1) * QK], &mut q[b * QK..(b + 1) * QK]);
            #[cfg(target_arch = "x86_64")]
            let (db, sum) = if avx2 {
                // SAFETY: avx2 was detected on this CPU; both slices hold 32 values.
                unsafe { avx2::quantize_block(xb, qb) }
            } else {
                let db = quantize_block(xb, qb);
                (db, qb.iter().map(|&v| v as i8 as i32).sum())
            };
            #[cfg(not(target_arch = "x86_64"))]
            let (db, sum) = {
                let _ = avx2;
                let db = quantize_block(xb, qb);
                (db, qb.iter().map(|&v| v as i8 as i32).sum::<i32>())
            };
            d[b] = db;
            sq[b] = sum;
            sh[b] = qb[..16].iter().map(|&v| v as i8 as i32).sum();
            s[b] = db * sum as f32;
        }
    };
    // Rows are tasks: a 1 + 8-row verify's 9 rows of 576 values split across the threads.
    if m >= 2 && m * k >= 1 << 12 {
        let (qs, d, sq, sh, s) = (
            team::Shared::new(&mut a.qs),
            team::Shared::new(&mut a.d),
            team::Shared::new(&mut a.sq),
            team::Shared::new(&mut a.sh),
            team::Shared::new(&mut a.s),
        );
        // SAFETY: task `i` touches only row `i` of each buffer, all borrowed mutably here.
        team::for_each(m, |i| unsafe {
            row((i, ((((qs.slice(i * k, k), d.slice(i * nb, nb)), sq.slice(i * nb, nb)), sh.slice(i * nb, nb)), s.slice(i * nb, nb))))
        });
    } else {
        a.qs.chunks_mut(k).zip(a.d.chunks_mut(nb)).zip(a.sq.chunks_mut(nb)).zip(a.sh.chunks_mut(nb)).zip(a.s.chunks_mut(nb)).enumerate().for_each(row);
    }
    a
}

/// Scalar reference: output `(i, j)` exactly as defined in the module docs.
pub fn dot_scalar(w: &QWeight, j: usize, a: &QActs, i: usize) -> f32 {
    let mut acc = 0.0f32;
    for b in 0..w.nb {
        let xq = &a.qs[i * a.k + b * QK..i * a.k + (b + 1) * QK];
        let dot = |ts: std::ops::Range<usize>| -> i32 { ts.map(|t| w.code(j, b, t) * (xq[t] as i8 as i32)).sum() };
        let (ab, sc) = (i * a.nb + b, w.scale_at(j, b));
        match w.format {
            QFormat::Q4K => {
                let u = w.super_at(j, b / 8);
                acc += (dot(0..QK) * w.sa[sc] as i32) as f32 * (w.d[u].to_f32() * a.d[ab]);
                acc -= (w.m[u].to_f32() * w.sb[sc] as f32) * a.s[ab];
            }
            QFormat::Q6K => {
                let u = w.super_at(j, b / 8);
                let isum = w.sa[sc] as i8 as i32 * dot(0..16) + w.sb[sc] as i8 as i32 * dot(16..QK);
                acc += isum as f32 * (w.d[u].to_f32() * a.d[ab]);
            }
            _ => {
                acc += dot(0..QK) as f32 * (w.d[sc].to_f32() * a.d[ab]);
                if w.format == QFormat::Q4_1 {
                    acc += w.m[sc].to_f32() * a.s[ab];
                }
            }
        }
    }
    acc
}

/// `y[M,N] = x[M,K]·Wᵀ + bias` on path `isa` (an unavailable path falls back to scalar).
/// Preconditions (checked by the caller): `x.len() == m·w.k`, `bias.len() == w.n` when given.
pub fn matmul(isa: Isa, x: &[f32], m: usize, w: &QWeight, bias: Option<&[f32]>) -> Vec<f32> {
    if m == 0 {
        return Vec::new();
    }
    let a = quantize_acts(x, m, w.k);
    let (gpt, tasks) = tasks(w, team::threads());
    let par = m * w.n * w.k >= crate::PAR_MIN_MACS;
    if let Some(mut d) = direct_output(w, m) {
        let out = crate::SendPtr(d.ptr());
        // SAFETY: `d` has room for `m·n` values, `n` a multiple of 8 (`direct_output`), and each
        // task writes only its own columns.
        let work = |t: usize| unsafe { task_into(isa, w, &a, t, gpt, out.get(), w.n) };
        if par {
            team::for_each(tasks, work);
        } else {
            (0..tasks).for_each(work);
        }
        // SAFETY: every task ran, so every column of every row was written.
        let mut y = unsafe { d.filled() };
        crate::add_bias(&mut y, w.n, bias);
        return y;
    }
    let work = |t: usize| task(isa, w, &a, t, gpt);
    let parts: Vec<Vec<f32>> = if par { team::map(tasks, work) } else { (0..tasks).map(work).collect() };
    crate::assemble_columns(&parts, m, w.n, gpt * GC, bias)
}

/// A `[m, n]` output that the tasks of a matmul over `w` write in place: `Some` when `n` is a
/// multiple of the 8-column group (every real model's matrices), so no task's padding columns
/// fall on the next row; `None` otherwise (the tasks then fill buffers of their own, copied
/// into place). Its memory is not zeroed first: the tasks write every value (with zeroing,
/// `memset` took 2.0 % of a batch-8 run's samples, without it 1.1 %: BENCHMARKS.md §32).
pub(crate) fn direct_output(w: &QWeight, m: usize) -> Option<DirectOutput> {
    w.n.is_multiple_of(GC).then(|| DirectOutput { y: Vec::with_capacity(m * w.n), len: m * w.n })
}

/// The output of [`direct_output`]: room for `len` values, none of them written yet.
pub(crate) struct DirectOutput {
    y: Vec<f32>,
    len: usize,
}

impl DirectOutput {
    /// Where the tasks write: row `i`, column `j` at `ptr() + i·n + j`.
    pub(crate) fn ptr(&mut self) -> *mut f32 {
        self.y.as_mut_ptr()
    }

    /// The written output.
    ///
    /// # Safety
    /// Every one of the `m·n` values was written: every task of [`tasks`] ran [`task_into`] on
    /// [`Self::ptr`] (each writes all rows of its columns, padding included).
    pub(crate) unsafe fn filled(mut self) -> Vec<f32> {
        // SAFETY: the capacity is `len` and the caller guarantees all `len` values written.
        unsafe { self.y.set_len(self.len) };
        self.y
    }
}

/// How a matmul over `w` splits into column tasks on `threads` threads: `(groups per task,
/// tasks)`. Enough tasks to balance the threads; each task's weights (its groups × K) stay in
/// cache while every row of the call passes over them.
pub(crate) fn tasks(w: &QWeight, threads: usize) -> (usize, usize) {
    let ng = w.n.div_ceil(GC);
    // An even count where there is more than one group: the AVX-512 path computes groups in
    // pairs, and a task boundary inside a pair would leave a half-filled register (a small
    // matrix on many threads gets fewer, paired tasks rather than one group each).
    let gpt = ng.div_ceil(4 * threads.max(1)).clamp(1, 16);
    let gpt = if ng > 1 { gpt.max(2).next_multiple_of(2) } else { gpt };
    (gpt, ng.div_ceil(gpt))
}

/// Task `t` of [`tasks`] (`gpt` groups per task): columns `t·gpt·8 ..` of every row of the
/// quantized activations `a`, as `[m, gn·8]` (padding columns included).
pub(crate) fn task(isa: Isa, w: &QWeight, a: &QActs, t: usize, gpt: usize) -> Vec<f32> {
    let ng = w.n.div_ceil(GC);
    let gn = gpt.min(ng - t * gpt);
    let mut buf = vec![0.0f32; a.m * gn * GC];
    // SAFETY: `buf` holds `m` rows of `gn·8` values.
    unsafe { compute_groups(isa, w, a, t * gpt, gn, buf.as_mut_ptr(), gn * GC) };
    buf
}

/// Task `t` of [`tasks`] written in place: its columns of row `i` at `y + i·stride + t·gpt·8`.
///
/// # Safety
/// `y` points to `m` rows of `stride ≥ w.n` values, `w.n` a multiple of 8 (so the task's
/// columns, padding included, lie inside the row), and nothing else touches these columns
/// during the call.
pub(crate) unsafe fn task_into(isa: Isa, w: &QWeight, a: &QActs, t: usize, gpt: usize, y: *mut f32, stride: usize) {
    let ng = w.n.div_ceil(GC);
    let (g0, gn) = (t * gpt, gpt.min(ng - t * gpt));
    compute_groups(isa, w, a, g0, gn, y.add(g0 * GC), stride);
}

/// Column groups `g0..g0+gn` of every row: row `i`'s `gn·8` values (padding columns included)
/// at `out + i·stride`.
///
/// # Safety
/// `out` is valid for writes of `m` rows of `gn·8` values spaced `stride` apart.
unsafe fn compute_groups(isa: Isa, w: &QWeight, a: &QActs, g0: usize, gn: usize, out: *mut f32, stride: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512Vnni && crate::isa::detected() >= Isa::Avx512Vnni {
            // SAFETY: avx512f/bw/vl/vnni (and the AVX2 set) were detected on this CPU.
            unsafe { avx512::compute_groups(w, a, g0, gn, out, stride) };
            return;
        }
        if isa >= Isa::Avx2 && crate::isa::detected() >= Isa::Avx2 {
            // SAFETY: avx2, fma and f16c were detected on this CPU.
            unsafe { avx2::compute_groups(w, a, g0, gn, out, stride) };
            return;
        }
    }
    let _ = isa;
    for i in 0..a.m {
        for jj in 0..gn * GC {
            let j = g0 * GC + jj;
            *out.add(i * stride + jj) = if j < w.n { dot_scalar(w, j, a, i) } else { 0.0 };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod tests;
