//! Quantized weights kept in ggml's 32-value block formats, and the integer matmul over them.
//!
//! # Storage (per weight row `j`, block `b` of 32 values; `nb = K/32`)
//! - codes: `Q8_0` 32 signed bytes; `Q4_0`/`Q4_1`/`Q5_0` 16 bytes of nibbles exactly as ggml
//!   stores them (byte `t` holds value `t` in its low nibble, value `t+16` in its high nibble);
//!   `Q5_0` also keeps its 32-bit mask of 5th bits;
//! - scale `d` (and `Q4_1`'s min `m`) as f16 in per-row arrays padded with zeros to a multiple
//!   of 8 blocks.
//! So every format keeps ggml's bits per weight (Q4_0 4.5, Q4_1 5.0, Q5_0 5.5, Q8_0 8.5).
//!
//! # Matmul `y[M,N] = x[M,K]·Wᵀ`
//! The activations are quantized once per call to 8-bit blocks like ggml's `Q8_0`/`Q8_1`
//! (per row and block: `dx = amax/127` in f32, `qx = round(x/dx)`, and `sx = dx·Σqx` for
//! formats with a min). For output `(i, j)` the result is defined as follows, in exactly this
//! order for every path (scalar reference, AVX2), every row count and every thread split:
//! 1. per block `b`, eight exact integer partial sums `p[l] = Σ_{t<4} w[4l+t]·qx[4l+t]`
//!    (`w` the signed code: `q−8` for Q4_0, `q−16` for Q5_0, `q` for Q4_1 and Q8_0);
//! 2. eight f32 lanes `acc[l] = acc[l] + f32(p[l]) · (d_w·dx)` for `b = 0, 1, …, nb−1`
//!    (separate multiply and add, never fused);
//! 3. `y = hsum(acc)` with `hsum(a) = ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`;
//! 4. Q4_1 only: `y = y + hsum(macc)` where `macc[l] = macc[l] + m_w[b]·sx[b]` over
//!    `b = l, l+8, l+16, …` (the value `d·q + m` summed against `dx·qx`: ggml's `Q4_1·Q8_1` dot).
//!
//! So a row's outputs are bit-identical whether it is computed alone, in a 65-row verify, or on
//! any number of threads, and the AVX2 path equals the scalar reference bit for bit.

use crate::isa::Isa;
use half::f16;
use rayon::prelude::*;

/// Values per block.
pub const QK: usize = 32;

/// Scale arrays are padded to a multiple of this many blocks (one 8-lane vector).
const PAD: usize = 8;

/// A ggml block format the CPU kernels run on natively.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QFormat {
    /// 8-bit codes, one f16 scale (ggml type 8).
    Q8_0,
    /// 4-bit codes offset by 8, one f16 scale (ggml type 2).
    Q4_0,
    /// 4-bit codes, f16 scale and f16 min (ggml type 3).
    Q4_1,
    /// 5-bit codes offset by 16, one f16 scale (ggml type 6).
    Q5_0,
}

impl QFormat {
    /// The format of ggml type id `t`, if the CPU kernels run it natively.
    pub fn from_ggml(t: u32) -> Option<QFormat> {
        use sparkling_core::ggml;
        match t {
            ggml::Q8_0 => Some(QFormat::Q8_0),
            ggml::Q4_0 => Some(QFormat::Q4_0),
            ggml::Q4_1 => Some(QFormat::Q4_1),
            ggml::Q5_0 => Some(QFormat::Q5_0),
            _ => None,
        }
    }

    /// ggml's name of the format (`q4_1`, …).
    pub fn name(self) -> &'static str {
        match self {
            QFormat::Q8_0 => "q8_0",
            QFormat::Q4_0 => "q4_0",
            QFormat::Q4_1 => "q4_1",
            QFormat::Q5_0 => "q5_0",
        }
    }

    /// Bytes of one block in a GGUF file.
    fn ggml_block_bytes(self) -> usize {
        match self {
            QFormat::Q8_0 => 34,
            QFormat::Q4_0 => 18,
            QFormat::Q4_1 => 20,
            QFormat::Q5_0 => 22,
        }
    }

    /// Code bytes per block in our layout.
    fn code_bytes(self) -> usize {
        match self {
            QFormat::Q8_0 => 32,
            _ => 16,
        }
    }
}

/// A `[n, k]` weight in a [`QFormat`] (layout in the module docs).
#[derive(Debug, Clone)]
pub struct QWeight {
    /// Block format.
    pub format: QFormat,
    /// Output features (rows).
    pub n: usize,
    /// Input features (a multiple of [`QK`]).
    pub k: usize,
    nb: usize,
    nbp: usize,
    qs: Vec<u8>,
    qh: Vec<u32>,
    d: Vec<f16>,
    m: Vec<f16>,
}

#[inline]
fn f16_le(b: &[u8], i: usize) -> f16 {
    f16::from_le_bytes([b[i], b[i + 1]])
}

impl QWeight {
    fn empty(format: QFormat, n: usize, k: usize) -> QWeight {
        let nb = k / QK;
        let nbp = nb.div_ceil(PAD) * PAD;
        QWeight {
            format,
            n,
            k,
            nb,
            nbp,
            qs: vec![0; n * nb * format.code_bytes()],
            qh: if format == QFormat::Q5_0 { vec![0; n * nb] } else { Vec::new() },
            d: vec![f16::ZERO; n * nbp],
            m: if format == QFormat::Q4_1 { vec![f16::ZERO; n * nbp] } else { Vec::new() },
        }
    }

    /// Repack `n` rows of ggml blocks (as stored in a GGUF file, rows back to back).
    ///
    /// # Errors
    /// `k` not a multiple of 32, or `bytes.len()` not `n · k/32 · block_bytes` (the message
    /// gives both counts).
    pub fn from_ggml(format: QFormat, bytes: &[u8], n: usize, k: usize) -> Result<QWeight, String> {
        if k % QK != 0 || k == 0 {
            return Err(format!("{} weight [{n}, {k}]: K must be a positive multiple of {QK}", format.name()));
        }
        let bb = format.ggml_block_bytes();
        let want = n * (k / QK) * bb;
        if bytes.len() != want {
            return Err(format!("{} weight [{n}, {k}] needs {want} bytes, got {}", format.name(), bytes.len()));
        }
        let mut w = QWeight::empty(format, n, k);
        let (nb, nbp, cb) = (w.nb, w.nbp, format.code_bytes());
        for (idx, blk) in bytes.chunks_exact(bb).enumerate() {
            let (j, b) = (idx / nb, idx % nb);
            w.d[j * nbp + b] = f16_le(blk, 0);
            let codes = match format {
                QFormat::Q8_0 | QFormat::Q4_0 => &blk[2..],
                QFormat::Q4_1 => {
                    w.m[j * nbp + b] = f16_le(blk, 2);
                    &blk[4..]
                }
                QFormat::Q5_0 => {
                    w.qh[idx] = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                    &blk[6..]
                }
            };
            w.qs[idx * cb..(idx + 1) * cb].copy_from_slice(codes);
        }
        Ok(w)
    }

    /// Quantize a row-major f32 `[n, k]` matrix to Q8_0 as ggml's reference quantizer does
    /// (`quantize_row_q8_0_ref`: per block `d = amax/127`, `q = round(x/d)`, `d` stored as f16).
    ///
    /// # Errors
    /// `k` not a multiple of 32, or `data.len() != n·k`.
    pub fn quantize_q8_0(data: &[f32], n: usize, k: usize) -> Result<QWeight, String> {
        if k % QK != 0 || k == 0 {
            return Err(format!("q8_0 weight [{n}, {k}]: K must be a positive multiple of {QK}"));
        }
        if data.len() != n * k {
            return Err(format!("q8_0 weight [{n}, {k}]: {} values", data.len()));
        }
        let mut w = QWeight::empty(QFormat::Q8_0, n, k);
        let (nb, nbp) = (w.nb, w.nbp);
        for (idx, (x, q)) in data.chunks_exact(QK).zip(w.qs.chunks_exact_mut(QK)).enumerate() {
            let d = quantize_block(x, q);
            w.d[(idx / nb) * nbp + idx % nb] = f16::from_f32(d);
        }
        Ok(w)
    }

    /// Bytes held in memory (codes, high bits and scales).
    pub fn bytes(&self) -> usize {
        self.qs.len() + 4 * self.qh.len() + 2 * (self.d.len() + self.m.len())
    }

    /// Signed integer code of value `t` (0..32) of block `b` of row `j` (the `w` of the module
    /// docs; Q4_1 codes are the unsigned nibble).
    #[inline]
    fn code(&self, j: usize, b: usize, t: usize) -> i32 {
        let idx = j * self.nb + b;
        let cb = self.format.code_bytes();
        let q = &self.qs[idx * cb..(idx + 1) * cb];
        let nib = |t: usize| if t < 16 { (q[t] & 0x0F) as i32 } else { (q[t - 16] >> 4) as i32 };
        match self.format {
            QFormat::Q8_0 => q[t] as i8 as i32,
            QFormat::Q4_0 => nib(t) - 8,
            QFormat::Q4_1 => nib(t),
            QFormat::Q5_0 => (nib(t) | ((((self.qh[idx] >> t) & 1) as i32) << 4)) - 16,
        }
    }

    /// Row `j` dequantized into `out` (`k` values) with ggml's formulas (`d·q`, `d·q + m`), so
    /// the values equal the loader's f32 dequantization of the same blocks.
    pub fn row_into(&self, j: usize, out: &mut [f32]) {
        for (b, y) in out.chunks_exact_mut(QK).enumerate().take(self.nb) {
            let d = self.d[j * self.nbp + b].to_f32();
            match self.format {
                QFormat::Q4_1 => {
                    let m = self.m[j * self.nbp + b].to_f32();
                    for (t, v) in y.iter_mut().enumerate() {
                        *v = d * self.code(j, b, t) as f32 + m;
                    }
                }
                _ => {
                    for (t, v) in y.iter_mut().enumerate() {
                        *v = self.code(j, b, t) as f32 * d;
                    }
                }
            }
        }
    }
}

/// Quantize one block of 32 values to `q` and return its scale `d = amax/127` (ggml's
/// `quantize_row_q8_0_ref`, rounding half away from zero; NaN codes become 0).
#[inline]
fn quantize_block(x: &[f32], q: &mut [u8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (qv, &v) in q.iter_mut().zip(x) {
        *qv = ((v * id).round() as i8) as u8;
    }
    d
}

/// Activations `x[M, K]` quantized to 8-bit blocks (module docs): codes `[M, K]`, scales and
/// scaled sums `[M, nbp]` (zero-padded).
#[derive(Debug, Clone)]
pub struct QActs {
    m: usize,
    nb: usize,
    nbp: usize,
    qs: Vec<u8>,
    d: Vec<f32>,
    s: Vec<f32>,
}

/// Quantize `x` (`m` rows of `k` values, `k` a multiple of 32; checked by the caller).
pub fn quantize_acts(x: &[f32], m: usize, k: usize) -> QActs {
    let nb = k / QK;
    let nbp = nb.div_ceil(PAD) * PAD;
    let mut a = QActs { m, nb, nbp, qs: vec![0; m * k], d: vec![0.0; m * nbp], s: vec![0.0; m * nbp] };
    let row = |(i, ((q, d), s)): (usize, ((&mut [u8], &mut [f32]), &mut [f32]))| {
        for b in 0..nb {
            let qb = &mut q[b * QK..(b + 1) * QK];
            let db = quantize_block(&x[i * k + b * QK..i * k + (b + 1) * QK], qb);
            let sum: i32 = qb.iter().map(|&v| v as i8 as i32).sum();
            d[b] = db;
            s[b] = db * sum as f32;
        }
    };
    let it = a.qs.chunks_mut(k).zip(a.d.chunks_mut(nbp)).zip(a.s.chunks_mut(nbp)).enumerate();
    if m * k >= 1 << 15 {
        a.qs.par_chunks_mut(k).zip(a.d.par_chunks_mut(nbp)).zip(a.s.par_chunks_mut(nbp)).enumerate().for_each(row);
    } else {
        it.for_each(row);
    }
    a
}

/// The fixed 8-lane horizontal sum of the module docs.
#[inline]
fn hsum8(a: &[f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

/// Scalar reference: output `(i, j)` exactly as defined in the module docs.
pub fn dot_scalar(w: &QWeight, j: usize, a: &QActs, i: usize) -> f32 {
    let mut acc = [0.0f32; 8];
    for b in 0..w.nb {
        let s = w.d[j * w.nbp + b].to_f32() * a.d[i * a.nbp + b];
        let xq = &a.qs[(i * a.nb + b) * QK..(i * a.nb + b + 1) * QK];
        for (l, acc_l) in acc.iter_mut().enumerate() {
            let p: i32 = (0..4).map(|t| w.code(j, b, 4 * l + t) * (xq[4 * l + t] as i8 as i32)).sum();
            *acc_l = *acc_l + p as f32 * s;
        }
    }
    let mut y = hsum8(&acc);
    if w.format == QFormat::Q4_1 {
        let mut macc = [0.0f32; 8];
        for c in 0..w.nbp / PAD {
            for (l, macc_l) in macc.iter_mut().enumerate() {
                let b = c * PAD + l;
                *macc_l = *macc_l + w.m[j * w.nbp + b].to_f32() * a.s[i * a.nbp + b];
            }
        }
        y = y + hsum8(&macc);
    }
    y
}

/// Below this many multiply-adds a matmul runs on the calling thread.
const PAR_MIN_MACS: usize = 1 << 18;

/// `y[M,N] = x[M,K]·Wᵀ + bias` on path `isa` (an unavailable path falls back to scalar).
/// Preconditions (checked by the caller): `x.len() == m·w.k`, `bias.len() == w.n` when given.
pub fn matmul(isa: Isa, x: &[f32], m: usize, w: &QWeight, bias: Option<&[f32]>) -> Vec<f32> {
    let n = w.n;
    let a = quantize_acts(x, m, w.k);
    let threads = rayon::current_num_threads().max(1);
    // Enough tasks to balance the threads; each task's weights (width × K) stay in L2 while
    // every row of the call passes over them.
    let width = (n / (4 * threads)).clamp(8, 64) / 8 * 8;
    let tasks = n.div_ceil(width);
    let work = |t: usize| {
        let c0 = t * width;
        let wd = width.min(n - c0);
        let mut buf = vec![0.0f32; m * wd];
        compute_cols(isa, w, &a, c0, wd, &mut buf);
        buf
    };
    let parts: Vec<Vec<f32>> =
        if m * n * w.k >= PAR_MIN_MACS { (0..tasks).into_par_iter().map(work).collect() } else { (0..tasks).map(work).collect() };
    let mut y = vec![0.0f32; m * n];
    for (t, buf) in parts.iter().enumerate() {
        let c0 = t * width;
        let wd = width.min(n - c0);
        for i in 0..m {
            y[i * n + c0..i * n + c0 + wd].copy_from_slice(&buf[i * wd..(i + 1) * wd]);
        }
    }
    if let Some(b) = bias {
        for row in y.chunks_mut(n) {
            for (v, bb) in row.iter_mut().zip(b) {
                *v += bb;
            }
        }
    }
    y
}

/// Columns `c0..c0+width` of every row into `buf[m, width]`.
fn compute_cols(isa: Isa, w: &QWeight, a: &QActs, c0: usize, width: usize, buf: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx2 && crate::isa::detected() >= Isa::Avx2 {
            // SAFETY: avx2, fma and f16c were detected on this CPU.
            unsafe { avx2::compute_cols(w, a, c0, width, buf) };
            return;
        }
    }
    let _ = isa;
    for i in 0..a.m {
        for jj in 0..width {
            buf[i * width + jj] = dot_scalar(w, c0 + jj, a, i);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{QActs, QFormat, QWeight, PAD, QK};
    use std::arch::x86_64::*;

    const F_Q8_0: u8 = 0;
    const F_Q4_0: u8 = 1;
    const F_Q4_1: u8 = 2;
    const F_Q5_0: u8 = 3;

    /// f16 bits → f32, broadcast (exact, like `half::f16::to_f32`).
    #[inline(always)]
    unsafe fn bcast_f16(h: half::f16) -> __m256 {
        _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32)))
    }

    /// The 32 codes of block `idx` (row-major block index) as bytes in value order:
    /// `(magnitude operand, sign source)` for `vpmaddubsw`. Q4_1: `(q, q)` unsigned.
    #[inline(always)]
    unsafe fn load_block<const F: u8>(w: &QWeight, idx: usize) -> (__m256i, __m256i) {
        if F == F_Q8_0 {
            let v = _mm256_loadu_si256(w.qs.as_ptr().add(idx * 32) as *const __m256i);
            return (_mm256_sign_epi8(v, v), v);
        }
        let raw = _mm_loadu_si128(w.qs.as_ptr().add(idx * 16) as *const __m128i);
        let nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
        match F {
            F_Q4_1 => (nib, nib),
            F_Q4_0 => {
                let v = _mm256_sub_epi8(nib, _mm256_set1_epi8(8));
                (_mm256_sign_epi8(v, v), v)
            }
            _ => {
                // Q5_0: byte t gets bit t of the mask; value = nibble | 16·bit − 16.
                let bits = _mm256_shuffle_epi8(
                    _mm256_set1_epi32(*w.qh.get_unchecked(idx) as i32),
                    _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0),
                );
                let sel = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(bits, sel), sel);
                // bit clear: nibble − 16 = nibble | 0xF0 (two's complement); bit set: nibble.
                let v = _mm256_or_si256(nib, _mm256_andnot_si256(set, _mm256_set1_epi8(0xF0u8 as i8)));
                (_mm256_sign_epi8(v, v), v)
            }
        }
    }

    /// The fixed horizontal sum `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`.
    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)))
    }

    /// Q4_1's min term of output `(i, j)` (step 4 of the module docs).
    #[inline(always)]
    unsafe fn min_term(w: &QWeight, j: usize, a: &QActs, i: usize) -> f32 {
        let mut macc = _mm256_setzero_ps();
        let mp = w.m.as_ptr().add(j * w.nbp) as *const __m128i;
        let sp = a.s.as_ptr().add(i * a.nbp);
        for c in 0..w.nbp / PAD {
            let m = _mm256_cvtph_ps(_mm_loadu_si128(mp.add(c)));
            macc = _mm256_add_ps(macc, _mm256_mul_ps(m, _mm256_loadu_ps(sp.add(c * PAD))));
        }
        hsum(macc)
    }

    /// Register tile: rows `i0..i0+MR` × columns `j0..j0+NC`, each weight block loaded once
    /// and used for all `MR` rows; writes `out[r·stride + c]`.
    #[inline(always)]
    unsafe fn tile<const F: u8, const MR: usize, const NC: usize>(w: &QWeight, j0: usize, a: &QActs, i0: usize, out: *mut f32, stride: usize) {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); NC]; MR];
        let xq = a.qs.as_ptr();
        for b in 0..w.nb {
            let mut wa = [_mm256_setzero_si256(); NC];
            let mut ws = [_mm256_setzero_si256(); NC];
            let mut dw = [_mm256_setzero_ps(); NC];
            for c in 0..NC {
                let (m, s) = load_block::<F>(w, (j0 + c) * w.nb + b);
                wa[c] = m;
                ws[c] = s;
                dw[c] = bcast_f16(*w.d.get_unchecked((j0 + c) * w.nbp + b));
            }
            for r in 0..MR {
                let xv = _mm256_loadu_si256(xq.add(((i0 + r) * a.nb + b) * QK) as *const __m256i);
                let dx = _mm256_broadcast_ss(a.d.get_unchecked((i0 + r) * a.nbp + b));
                for c in 0..NC {
                    let prod = if F == F_Q4_1 {
                        _mm256_maddubs_epi16(wa[c], xv)
                    } else {
                        _mm256_maddubs_epi16(wa[c], _mm256_sign_epi8(xv, ws[c]))
                    };
                    let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(prod, ones));
                    acc[r][c] = _mm256_add_ps(acc[r][c], _mm256_mul_ps(p, _mm256_mul_ps(dw[c], dx)));
                }
            }
        }
        for r in 0..MR {
            for c in 0..NC {
                let mut y = hsum(acc[r][c]);
                if F == F_Q4_1 {
                    y = y + min_term(w, j0 + c, a, i0 + r);
                }
                *out.add(r * stride + c) = y;
            }
        }
    }

    #[inline(always)]
    unsafe fn run<const F: u8>(w: &QWeight, a: &QActs, c0: usize, width: usize, buf: &mut [f32]) {
        let out = buf.as_mut_ptr();
        let mut i = 0;
        while i + 4 <= a.m {
            let mut c = 0;
            while c + 2 <= width {
                tile::<F, 4, 2>(w, c0 + c, a, i, out.add(i * width + c), width);
                c += 2;
            }
            while c < width {
                tile::<F, 4, 1>(w, c0 + c, a, i, out.add(i * width + c), width);
                c += 1;
            }
            i += 4;
        }
        while i < a.m {
            let mut c = 0;
            while c + 4 <= width {
                tile::<F, 1, 4>(w, c0 + c, a, i, out.add(i * width + c), width);
                c += 4;
            }
            while c < width {
                tile::<F, 1, 1>(w, c0 + c, a, i, out.add(i * width + c), width);
                c += 1;
            }
            i += 1;
        }
    }

    /// AVX2 path of `compute_cols`. Caller guarantees avx2, fma and f16c.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn compute_cols(w: &QWeight, a: &QActs, c0: usize, width: usize, buf: &mut [f32]) {
        match w.format {
            QFormat::Q8_0 => run::<F_Q8_0>(w, a, c0, width, buf),
            QFormat::Q4_0 => run::<F_Q4_0>(w, a, c0, width, buf),
            QFormat::Q4_1 => run::<F_Q4_1>(w, a, c0, width, buf),
            QFormat::Q5_0 => run::<F_Q5_0>(w, a, c0, width, buf),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Random ggml blocks of `format` for `[n, k]` (random codes, small positive scales).
    fn random_ggml(format: QFormat, n: usize, k: usize, seed: u64) -> Vec<u8> {
        let nblk = n * k / QK;
        let bb = format.ggml_block_bytes();
        let r = pseudo(nblk * bb, seed);
        let mut out = Vec::with_capacity(nblk * bb);
        for blk in 0..nblk {
            let rb = &r[blk * bb..(blk + 1) * bb];
            let mut bytes: Vec<u8> = rb.iter().map(|v| ((v + 1.0) * 127.9) as u8).collect();
            let d = f16::from_f32(0.01 + 0.02 * rb[0].abs()).to_le_bytes();
            bytes[0] = d[0];
            bytes[1] = d[1];
            if format == QFormat::Q4_1 {
                let m = f16::from_f32(-0.1 * rb[1].abs()).to_le_bytes();
                bytes[2] = m[0];
                bytes[3] = m[1];
            }
            out.extend_from_slice(&bytes);
        }
        out
    }

    const FORMATS: [QFormat; 4] = [QFormat::Q8_0, QFormat::Q4_0, QFormat::Q4_1, QFormat::Q5_0];

    #[test]
    fn every_path_equals_the_scalar_reference_bit_for_bit() {
        // K a multiple of 32 but not of 256; N not a multiple of any tile; M = 1..=65.
        for &format in &FORMATS {
            for &(n, k) in &[(37usize, 96usize), (5, 32), (19, 288)] {
                let w = QWeight::from_ggml(format, &random_ggml(format, n, k, 7), n, k).unwrap();
                for m in [1usize, 2, 3, 4, 5, 7, 9, 17, 65] {
                    let x = pseudo(m * k, 100 + m as u64);
                    let a = quantize_acts(&x, m, k);
                    let want: Vec<f32> = (0..m).flat_map(|i| (0..n).map(move |j| (i, j))).map(|(i, j)| dot_scalar(&w, j, &a, i)).collect();
                    for isa in crate::isa::available() {
                        let got = matmul(isa, &x, m, &w, None);
                        let same = got.iter().zip(&want).all(|(g, r)| g.to_bits() == r.to_bits());
                        assert!(same, "{format:?} {isa:?} m={m} n={n} k={k}");
                    }
                }
            }
        }
    }

    #[test]
    fn rows_are_bit_identical_alone_in_a_verify_and_on_any_thread_count() {
        let (n, k) = (70, 160);
        let x = pseudo(65 * k, 3);
        for &format in &FORMATS {
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

    #[test]
    fn matmul_is_close_to_the_f64_product_of_the_dequantized_weights() {
        let (m, n, k) = (3, 21, 128);
        let x = pseudo(m * k, 5);
        for &format in &FORMATS {
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
        assert_eq!(w.bytes(), n * k + 2 * n * 8);
        assert!(QWeight::quantize_q8_0(&x, n, 60).is_err());
        assert!(QWeight::from_ggml(QFormat::Q4_1, &[0u8; 39], 1, 64).is_err());
        assert!(QWeight::from_ggml(QFormat::Q4_1, &[0u8; 40], 1, 48).is_err());
    }
}
