//! Packed-panel matrix multiply `y[M,N] = x[M,K] · W[N,K]ᵀ` for the CPU backend.
//!
//! Weights are packed once at upload into panels of [`NR`] output columns: panel `p` holds
//! `W[p*NR + j][k]` at `(p*K + k)*NR + j` (columns past `N` are zero). A register tile of up to
//! 4 activation rows × 1–4 panels broadcasts `x[i][k]` and multiplies it into the panel's k-th
//! row, so every output element is ONE sequential fused-multiply-add chain over `k = 0..K`.
//! That chain does not depend on the tile shape, the number of rows in the call or the thread
//! split, so a row's result is bit-identical whether it is computed alone (decode) or inside a
//! 65-row tree verify — the property the exactness tests rely on.

/// Output columns per packed panel (two 8-wide AVX registers).
pub const NR: usize = 16;

/// Packed weight values.
#[derive(Debug, Clone)]
pub enum Panels {
    /// f32 panels.
    F32(Vec<f32>),
    /// f16 panels (widened in registers; halves the bytes read per decode step).
    F16(Vec<half::f16>),
}

/// A weight matrix `[n, k]` packed into `ceil(n / NR)` panels.
#[derive(Debug, Clone)]
pub struct Packed {
    /// Output features N.
    pub n: usize,
    /// Input features K.
    pub k: usize,
    /// Panel data, `ceil(n/NR) * k * NR` values.
    pub panels: Panels,
}

impl Packed {
    /// Pack a row-major `[n, k]` matrix, optionally rounding to f16.
    pub fn pack(data: &[f32], n: usize, k: usize, f16: bool) -> Packed {
        fn fill<T: Copy + Send>(data: &[f32], n: usize, k: usize, zero: T, conv: impl Fn(f32) -> T + Sync) -> Vec<T> {
            let np = n.div_ceil(NR);
            let mut out = vec![zero; np * k * NR];
            crate::team::for_each_chunk(&mut out, k * NR, |p, panel| {
                for j in 0..NR.min(n - p * NR) {
                    let row = &data[(p * NR + j) * k..(p * NR + j + 1) * k];
                    for (kk, &v) in row.iter().enumerate() {
                        panel[kk * NR + j] = conv(v);
                    }
                }
            });
            out
        }
        let panels = if f16 { Panels::F16(fill(data, n, k, half::f16::ZERO, half::f16::from_f32)) } else { Panels::F32(fill(data, n, k, 0.0f32, |v| v)) };
        Packed { n, k, panels }
    }

    /// Row `r` of the original matrix (length `k`) into `out`.
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let (p, j) = (r / NR, r % NR);
        let base = p * self.k * NR + j;
        match &self.panels {
            Panels::F32(d) => out.iter_mut().enumerate().for_each(|(kk, o)| *o = d[base + kk * NR]),
            Panels::F16(d) => out.iter_mut().enumerate().for_each(|(kk, o)| *o = d[base + kk * NR].to_f32()),
        }
    }
}

/// Panels per parallel task (64 output columns).
pub(crate) const TASK_PANELS: usize = 4;

/// `y[M,N] = x[M,K]·Wᵀ + bias`, row-major output. Preconditions (checked by the caller):
/// `x.len() == m*w.k`, `bias.len() == w.n` when given.
pub fn matmul(x: &[f32], m: usize, w: &Packed, bias: Option<&[f32]>) -> Vec<f32> {
    let work = |g: usize| task(x, m, w, g);
    let groups = tasks(w);
    // Small products are not worth a parallel dispatch.
    let parts: Vec<Vec<f32>> = if m * w.n * w.k >= crate::PAR_MIN_MACS { crate::team::map(groups, work) } else { (0..groups).map(work).collect() };
    crate::assemble_columns(&parts, m, w.n, TASK_PANELS * NR, bias)
}

/// Column tasks of a matmul over `w`: groups of [`TASK_PANELS`] panels.
pub(crate) fn tasks(w: &Packed) -> usize {
    w.n.div_ceil(NR).div_ceil(TASK_PANELS)
}

/// Task `g` of [`tasks`]: panels `g·TASK_PANELS ..` of every row, as `[m, width]` (padding
/// columns included).
pub(crate) fn task(x: &[f32], m: usize, w: &Packed, g: usize) -> Vec<f32> {
    let np = w.n.div_ceil(NR);
    let p0 = g * TASK_PANELS;
    let pn = TASK_PANELS.min(np - p0);
    let width = pn * NR;
    let mut buf = vec![0.0f32; m * width];
    compute_group(x, m, w.k, w, p0, pn, &mut buf, width);
    buf
}

/// Compute panels `p0..p0+pn` for all rows into `buf[m, width]`.
#[allow(clippy::too_many_arguments)]
fn compute_group(x: &[f32], m: usize, k: usize, w: &Packed, p0: usize, pn: usize, buf: &mut [f32], width: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::isa::active() >= crate::isa::Isa::Avx2 {
            // SAFETY: `isa::active` only reports Avx2 when avx2, fma and f16c were detected.
            unsafe { avx::compute_group(x, m, k, w, p0, pn, buf, width) };
            return;
        }
    }
    portable_group(x, m, k, w, p0, pn, buf, width);
}

/// Portable path: the same per-output sequential chain (multiply then add, no FMA).
#[allow(clippy::too_many_arguments)]
fn portable_group(x: &[f32], m: usize, k: usize, w: &Packed, p0: usize, pn: usize, buf: &mut [f32], width: usize) {
    let mut wrow = [0.0f32; NR];
    for pi in 0..pn {
        let base = (p0 + pi) * k * NR;
        for i in 0..m {
            let mut acc = [0.0f32; NR];
            for kk in 0..k {
                match &w.panels {
                    Panels::F32(d) => wrow.copy_from_slice(&d[base + kk * NR..base + (kk + 1) * NR]),
                    Panels::F16(d) => wrow.iter_mut().zip(&d[base + kk * NR..base + (kk + 1) * NR]).for_each(|(o, h)| *o = h.to_f32()),
                }
                let xv = x[i * k + kk];
                for j in 0..NR {
                    acc[j] += xv * wrow[j];
                }
            }
            buf[i * width + pi * NR..i * width + (pi + 1) * NR].copy_from_slice(&acc);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use super::{Packed, Panels, NR};
    use std::arch::x86_64::*;

    /// Load one panel row (16 values) as two 8-wide vectors.
    trait PanelLoad {
        unsafe fn load(p: *const Self, off: usize) -> (__m256, __m256);
    }
    impl PanelLoad for f32 {
        #[inline(always)]
        unsafe fn load(p: *const f32, off: usize) -> (__m256, __m256) {
            (_mm256_loadu_ps(p.add(off)), _mm256_loadu_ps(p.add(off + 8)))
        }
    }
    impl PanelLoad for half::f16 {
        #[inline(always)]
        unsafe fn load(p: *const half::f16, off: usize) -> (__m256, __m256) {
            let q = p as *const u16;
            (_mm256_cvtph_ps(_mm_loadu_si128(q.add(off) as *const __m128i)), _mm256_cvtph_ps(_mm_loadu_si128(q.add(off + 8) as *const __m128i)))
        }
    }

    /// Register tile: `MR` rows × `PP` panels; accumulators `[MR][PP][2]` of 8 lanes.
    #[inline(always)]
    unsafe fn tile<T: PanelLoad, const MR: usize, const PP: usize>(
        x: *const f32,
        k: usize,
        w: *const T,
        panel_stride: usize,
        out: *mut f32,
        out_stride: usize,
    ) {
        let mut acc = [[[_mm256_setzero_ps(); 2]; PP]; MR];
        // Registers: MR broadcasts + 2 panel vectors + 2·MR·PP accumulators (≤ 14 of 16).
        for kk in 0..k {
            let mut xb = [_mm256_setzero_ps(); MR];
            for (i, xbi) in xb.iter_mut().enumerate() {
                *xbi = _mm256_set1_ps(*x.add(i * k + kk));
            }
            for p in 0..PP {
                let (a, b) = T::load(w, p * panel_stride + kk * NR);
                for i in 0..MR {
                    acc[i][p][0] = _mm256_fmadd_ps(xb[i], a, acc[i][p][0]);
                    acc[i][p][1] = _mm256_fmadd_ps(xb[i], b, acc[i][p][1]);
                }
            }
        }
        for (i, acc_i) in acc.iter().enumerate() {
            for (p, acc_ip) in acc_i.iter().enumerate() {
                let o = out.add(i * out_stride + p * NR);
                _mm256_storeu_ps(o, acc_ip[0]);
                _mm256_storeu_ps(o.add(8), acc_ip[1]);
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn compute_group(x: &[f32], m: usize, k: usize, w: &Packed, p0: usize, pn: usize, buf: &mut [f32], width: usize) {
        match &w.panels {
            Panels::F32(d) => run::<f32>(x, m, k, d.as_ptr().add(p0 * k * NR), pn, buf, width),
            Panels::F16(d) => run::<half::f16>(x, m, k, d.as_ptr().add(p0 * k * NR), pn, buf, width),
        }
    }

    #[inline(always)]
    unsafe fn run<T: PanelLoad>(x: &[f32], m: usize, k: usize, w: *const T, pn: usize, buf: &mut [f32], width: usize) {
        let ps = k * NR;
        let xp = x.as_ptr();
        let op = buf.as_mut_ptr();
        let mut i = 0;
        // 4-row tiles, one panel at a time (8 accumulators).
        while i + 4 <= m {
            for p in 0..pn {
                tile::<T, 4, 1>(xp.add(i * k), k, w.add(p * ps), ps, op.add(i * width + p * NR), width);
            }
            i += 4;
        }
        // Remaining rows: one row across up to 4 panels (8 accumulators for the decode step).
        while i < m {
            let mut p = 0;
            while p + 4 <= pn {
                tile::<T, 1, 4>(xp.add(i * k), k, w.add(p * ps), ps, op.add(i * width + p * NR), width);
                p += 4;
            }
            while p < pn {
                tile::<T, 1, 1>(xp.add(i * k), k, w.add(p * ps), ps, op.add(i * width + p * NR), width);
                p += 1;
            }
            i += 1;
        }
    }
}
