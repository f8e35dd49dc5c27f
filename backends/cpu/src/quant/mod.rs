//! Quantized weights kept in ggml's 32-value block formats, and the integer matmul over them.
//!
//! # Storage
//! Output columns (weight rows) are interleaved in groups of 8 so that one 256-bit register
//! holds 4 consecutive codes of each of the 8 columns (the layout idea of llama.cpp's repacked
//! `q4_0x8` blocks). For group `G` (columns `8G..8G+8`, the last group zero-padded) and block
//! `b` (values `32b..32b+32`):
//! - `Q4_0`/`Q4_1`: 128 bytes in 4 chunks of 32; byte `4c + t` of chunk `g` is ggml's code byte
//!   `4g + t` of column `8G + c` (low nibble: value `4g+t`, high nibble: value `4g+t+16`);
//! - `Q8_0`: 256 bytes in 8 chunks of 32; byte `4c + t` of chunk `g` is value `4g+t` of column
//!   `8G + c`;
//! - `Q5_0`: the low 4 bits of each code as `Q4_0`, and the fifth bits in a plane of 32 bytes:
//!   for chunk `g`, the little-endian 32-bit mask at byte `8g` has bit `4c + t` = fifth bit of
//!   value `4g+t` of column `8G + c` (the values of the chunk's low nibbles), the one at byte
//!   `8g + 4` the same for value `4g+t+16` (its high nibbles);
//! - the 8 columns' f16 scales `d` (and `Q4_1`'s f16 mins `m`).
//!
//! So every format keeps ggml's bits per weight (Q4_0 4.5, Q4_1 5.0, Q5_0 5.5, Q8_0 8.5).
//!
//! # Matmul `y[M,N] = x[M,K]·Wᵀ`
//! The activations are quantized once per call to 8-bit blocks like ggml's `Q8_0`/`Q8_1`
//! (per row and block: `dx = amax/127` in f32, codes `qx = round(x/dx)`, `Σqx`, and
//! `sx = dx·Σqx`). Output `(i, j)` is defined as follows, in exactly this order for every path
//! (scalar reference, AVX2, AVX-512 VNNI), every row count and every thread split:
//! 1. per block `b` the exact integer dot product `isum = Σ_t w[t]·qx[t]` of the signed codes
//!    (`q−8` for Q4_0, `q−16` for Q5_0, `q` for Q4_1 and Q8_0);
//! 2. `acc = acc + f32(isum) · (d_w·dx)` (separate multiply and add, never fused), and for
//!    Q4_1 then `acc = acc + m_w·sx` (the value `d·q + m` against `dx·qx`: ggml's `Q4_1·Q8_1`);
//!    blocks `b = 0, 1, …, K/32 − 1` in order, `acc` starting at `+0`.
//!
//! So a row's outputs are bit-identical whether it is computed alone, in a 65-row verify, or on
//! any number of threads, and every SIMD path equals the scalar reference bit for bit.

use crate::isa::Isa;
use half::f16;
use rayon::prelude::*;

/// Values per block.
pub const QK: usize = 32;

/// Columns per interleaved group.
const GC: usize = 8;

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

    /// Code bytes of one column's block (16 for 4-bit and Q5_0's low bits, 32 for 8-bit).
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
    /// Output features (rows of the original matrix).
    pub n: usize,
    /// Input features (a multiple of [`QK`]).
    pub k: usize,
    nb: usize,
    qs: Vec<u8>,
    /// Q5_0's fifth-bit planes, [`H_BYTES`] per group and block (empty for other formats).
    qh: Vec<u8>,
    d: Vec<f16>,
    m: Vec<f16>,
}

/// Bytes of Q5_0's fifth-bit plane per interleaved group and block (4 per column).
const H_BYTES: usize = 32;

#[inline]
fn f16_le(b: &[u8], i: usize) -> f16 {
    f16::from_le_bytes([b[i], b[i + 1]])
}

impl QWeight {
    fn empty(format: QFormat, n: usize, k: usize) -> QWeight {
        let nb = k / QK;
        let ng = n.div_ceil(GC);
        QWeight {
            format,
            n,
            k,
            nb,
            qs: vec![0; ng * nb * GC * format.code_bytes()],
            qh: if format == QFormat::Q5_0 { vec![0; ng * nb * H_BYTES] } else { Vec::new() },
            d: vec![f16::ZERO; ng * nb * GC],
            m: if format == QFormat::Q4_1 { vec![f16::ZERO; ng * nb * GC] } else { Vec::new() },
        }
    }

    /// Byte offset of code byte `t` (0..code_bytes) of column `j`, block `b` in `qs`.
    #[inline]
    fn code_at(&self, j: usize, b: usize, t: usize) -> usize {
        let cb = self.format.code_bytes();
        ((j / GC) * self.nb + b) * GC * cb + (t / 4) * 32 + (j % GC) * 4 + t % 4
    }

    /// Index of column `j`, block `b` in the scale arrays.
    #[inline]
    fn scale_at(&self, j: usize, b: usize) -> usize {
        ((j / GC) * self.nb + b) * GC + j % GC
    }

    /// Byte and bit of the fifth bit of value `t` (0..32) of column `j`, block `b` in `qh`.
    #[inline]
    fn high_bit_at(&self, j: usize, b: usize, t: usize) -> (usize, u32) {
        let (g, upper) = ((t % 16) / 4, t >= 16);
        let bit = 4 * (j % GC) + t % 4;
        (((j / GC) * self.nb + b) * H_BYTES + 8 * g + 4 * upper as usize + bit / 8, (bit % 8) as u32)
    }

    /// Q5_0: set the fifth bits of column `j`, block `b` from ggml's `qh` (bit `t` = value `t`).
    fn put_high_bits(&mut self, j: usize, b: usize, qh: u32) {
        for t in 0..QK {
            let (at, bit) = self.high_bit_at(j, b, t);
            let v = ((qh >> t) & 1) as u8;
            self.qh[at] = (self.qh[at] & !(1 << bit)) | (v << bit);
        }
    }

    /// Q5_0: the fifth bits of column `j`, block `b` as ggml's `qh`.
    fn high_bits(&self, j: usize, b: usize) -> u32 {
        (0..QK).fold(0u32, |acc, t| {
            let (at, bit) = self.high_bit_at(j, b, t);
            acc | ((((self.qh[at] >> bit) & 1) as u32) << t)
        })
    }

    /// Store one column-block: `codes` in ggml order (16 or 32 bytes), scale, min.
    fn put(&mut self, j: usize, b: usize, codes: &[u8], d: f16, m: f16) {
        for (t, &c) in codes.iter().enumerate() {
            let at = self.code_at(j, b, t);
            self.qs[at] = c;
        }
        let s = self.scale_at(j, b);
        self.d[s] = d;
        if self.format == QFormat::Q4_1 {
            self.m[s] = m;
        }
    }

    /// Repack `n` rows of ggml blocks (as stored in a GGUF file, rows back to back).
    ///
    /// # Errors
    /// `k` not a positive multiple of 32, or `bytes.len()` not `n · k/32 · block_bytes` (the
    /// message gives both counts).
    pub fn from_ggml(format: QFormat, bytes: &[u8], n: usize, k: usize) -> Result<QWeight, String> {
        if !k.is_multiple_of(QK) || k == 0 {
            return Err(format!("{} weight [{n}, {k}]: K must be a positive multiple of {QK}", format.name()));
        }
        let bb = format.ggml_block_bytes();
        let want = n * (k / QK) * bb;
        if bytes.len() != want {
            return Err(format!("{} weight [{n}, {k}] needs {want} bytes, got {}", format.name(), bytes.len()));
        }
        let mut w = QWeight::empty(format, n, k);
        let nb = w.nb;
        for (idx, blk) in bytes.chunks_exact(bb).enumerate() {
            let (j, b) = (idx / nb, idx % nb);
            // A NaN or infinite block scale (a corrupt file) would turn whole rows into NaN
            // and the output into token 0 with exit 0 (issue 15): refuse it, naming the block.
            let (d, m) = (f16_le(blk, 0), if format == QFormat::Q4_1 { f16_le(blk, 2) } else { f16::ZERO });
            if !d.is_finite() || !m.is_finite() {
                return Err(format!(
                    "{} weight [{n}, {k}]: block {b} of row {j} has a non-finite scale (d = {}, m = {}): corrupt weights",
                    format.name(),
                    d.to_f32(),
                    m.to_f32()
                ));
            }
            match format {
                QFormat::Q8_0 | QFormat::Q4_0 => w.put(j, b, &blk[2..], f16_le(blk, 0), f16::ZERO),
                QFormat::Q4_1 => w.put(j, b, &blk[4..], f16_le(blk, 0), f16_le(blk, 2)),
                QFormat::Q5_0 => {
                    w.put(j, b, &blk[6..], f16_le(blk, 0), f16::ZERO);
                    w.put_high_bits(j, b, u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]));
                }
            }
        }
        Ok(w)
    }

    /// A weight of rows `rows` of this one (row `i` = row `rows[i]`), codes, scales and mins
    /// copied as they are (so its outputs equal this weight's outputs for those rows, bit for
    /// bit). Precondition: every id `< n`.
    pub fn gather_rows(&self, rows: &[u32]) -> QWeight {
        let mut w = QWeight::empty(self.format, rows.len(), self.k);
        let cb = self.format.code_bytes();
        for (j, &r) in rows.iter().enumerate() {
            let r = r as usize;
            for b in 0..self.nb {
                for t in 0..cb {
                    let (from, to) = (self.code_at(r, b, t), w.code_at(j, b, t));
                    w.qs[to] = self.qs[from];
                }
                let (s, o) = (self.scale_at(r, b), w.scale_at(j, b));
                w.d[o] = self.d[s];
                if self.format == QFormat::Q4_1 {
                    w.m[o] = self.m[s];
                }
                if self.format == QFormat::Q5_0 {
                    w.put_high_bits(j, b, self.high_bits(r, b));
                }
            }
        }
        w
    }

    /// Quantize a row-major f32 `[n, k]` matrix to Q8_0 as ggml's reference quantizer does
    /// (`quantize_row_q8_0`: per block `d = amax/127`, `q = round(x/d)` with ties to even, `d`
    /// stored as f16).
    ///
    /// # Errors
    /// `k` not a positive multiple of 32, or `data.len() != n·k`.
    pub fn quantize_q8_0(data: &[f32], n: usize, k: usize) -> Result<QWeight, String> {
        if !k.is_multiple_of(QK) || k == 0 {
            return Err(format!("q8_0 weight [{n}, {k}]: K must be a positive multiple of {QK}"));
        }
        if data.len() != n * k {
            return Err(format!("q8_0 weight [{n}, {k}]: {} values", data.len()));
        }
        let mut w = QWeight::empty(QFormat::Q8_0, n, k);
        let nb = w.nb;
        let mut q = [0u8; QK];
        for (idx, x) in data.chunks_exact(QK).enumerate() {
            let d = quantize_block(x, &mut q);
            w.put(idx / nb, idx % nb, &q, f16::from_f32(d), f16::ZERO);
        }
        Ok(w)
    }

    /// Bytes held in memory (codes and scales, padding included).
    pub fn bytes(&self) -> usize {
        self.qs.len() + self.qh.len() + 2 * (self.d.len() + self.m.len())
    }

    /// Signed integer code of value `t` (0..32) of block `b` of column `j` (Q4_1: the unsigned
    /// nibble).
    #[inline]
    fn code(&self, j: usize, b: usize, t: usize) -> i32 {
        match self.format {
            QFormat::Q8_0 => self.qs[self.code_at(j, b, t)] as i8 as i32,
            _ => {
                let byte = self.qs[self.code_at(j, b, t % 16)];
                let q = if t < 16 { byte & 0x0F } else { byte >> 4 } as i32;
                match self.format {
                    QFormat::Q4_0 => q - 8,
                    QFormat::Q5_0 => {
                        let (at, bit) = self.high_bit_at(j, b, t);
                        (q | ((((self.qh[at] >> bit) & 1) as i32) << 4)) - 16
                    }
                    _ => q,
                }
            }
        }
    }

    /// Row `j` dequantized into `out` (`k` values) with ggml's formulas (`q·d`, `d·q + m`), so
    /// the values equal the loader's f32 dequantization of the same blocks.
    pub fn row_into(&self, j: usize, out: &mut [f32]) {
        for (b, y) in out.chunks_exact_mut(QK).enumerate().take(self.nb) {
            let s = self.scale_at(j, b);
            let d = self.d[s].to_f32();
            if self.format == QFormat::Q4_1 {
                let m = self.m[s].to_f32();
                for (t, v) in y.iter_mut().enumerate() {
                    *v = d * self.code(j, b, t) as f32 + m;
                }
            } else {
                for (t, v) in y.iter_mut().enumerate() {
                    *v = self.code(j, b, t) as f32 * d;
                }
            }
        }
    }
}

/// Quantize one block of 32 values to `q` and return its scale `d = amax/127` (ggml's
/// `quantize_row_q8_0`: `q = round(x·(1/d))`, ties to even as its SIMD versions round; NaN
/// codes become 0). Every operation is exactly rounded IEEE arithmetic, so any instruction set
/// gives the same codes.
#[inline(always)]
fn quantize_block(x: &[f32], q: &mut [u8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (qv, &v) in q.iter_mut().zip(x) {
        *qv = ((v * id).round_ties_even() as i8) as u8;
    }
    d
}

/// Activations `x[M, K]` quantized to 8-bit blocks (module docs): codes `[M, K]`; per row and
/// block the scale `dx`, the code sum `Σqx` and `sx = dx·Σqx`, each `[M, K/32]`.
#[derive(Debug, Clone)]
pub struct QActs {
    m: usize,
    k: usize,
    nb: usize,
    qs: Vec<u8>,
    d: Vec<f32>,
    sq: Vec<i32>,
    s: Vec<f32>,
}

/// One row's slices of [`QActs`] (codes, scales, code sums, scaled sums) with its index.
type RowSlices<'a> = (usize, (((&'a mut [u8], &'a mut [f32]), &'a mut [i32]), &'a mut [f32]));

/// Quantize `x` (`m` rows of `k` values, `k` a multiple of 32; checked by the caller). Rows
/// are independent (and run in parallel for large inputs); the AVX2 version does the same
/// exactly rounded operations as [`quantize_block`] (finite inputs give identical codes).
pub fn quantize_acts(x: &[f32], m: usize, k: usize) -> QActs {
    let nb = k / QK;
    let mut a = QActs { m, k, nb, qs: vec![0; m * k], d: vec![0.0; m * nb], sq: vec![0; m * nb], s: vec![0.0; m * nb] };
    let avx2 = cfg!(target_arch = "x86_64") && crate::isa::detected() >= Isa::Avx2;
    let row = |(i, (((q, d), sq), s)): RowSlices<'_>| {
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
            s[b] = db * sum as f32;
        }
    };
    if m * k >= 1 << 16 {
        a.qs.par_chunks_mut(k).zip(a.d.par_chunks_mut(nb)).zip(a.sq.par_chunks_mut(nb)).zip(a.s.par_chunks_mut(nb)).enumerate().for_each(row);
    } else {
        a.qs.chunks_mut(k).zip(a.d.chunks_mut(nb)).zip(a.sq.chunks_mut(nb)).zip(a.s.chunks_mut(nb)).enumerate().for_each(row);
    }
    a
}

/// Scalar reference: output `(i, j)` exactly as defined in the module docs.
pub fn dot_scalar(w: &QWeight, j: usize, a: &QActs, i: usize) -> f32 {
    let mut acc = 0.0f32;
    for b in 0..w.nb {
        let xq = &a.qs[i * a.k + b * QK..i * a.k + (b + 1) * QK];
        let isum: i32 = (0..QK).map(|t| w.code(j, b, t) * (xq[t] as i8 as i32)).sum();
        let sc = w.scale_at(j, b);
        acc += isum as f32 * (w.d[sc].to_f32() * a.d[i * a.nb + b]);
        if w.format == QFormat::Q4_1 {
            acc += w.m[sc].to_f32() * a.s[i * a.nb + b];
        }
    }
    acc
}

/// `y[M,N] = x[M,K]·Wᵀ + bias` on path `isa` (an unavailable path falls back to scalar).
/// Preconditions (checked by the caller): `x.len() == m·w.k`, `bias.len() == w.n` when given.
pub fn matmul(isa: Isa, x: &[f32], m: usize, w: &QWeight, bias: Option<&[f32]>) -> Vec<f32> {
    let a = quantize_acts(x, m, w.k);
    let (gpt, tasks) = tasks(w, rayon::current_num_threads());
    let work = |t: usize| task(isa, w, &a, t, gpt);
    let parts: Vec<Vec<f32>> =
        if m * w.n * w.k >= crate::PAR_MIN_MACS { (0..tasks).into_par_iter().map(work).collect() } else { (0..tasks).map(work).collect() };
    crate::assemble_columns(&parts, m, w.n, gpt * GC, bias)
}

/// How a matmul over `w` splits into column tasks on `threads` threads: `(groups per task,
/// tasks)`. Enough tasks to balance the threads; each task's weights (its groups × K) stay in
/// cache while every row of the call passes over them.
pub(crate) fn tasks(w: &QWeight, threads: usize) -> (usize, usize) {
    let ng = w.n.div_ceil(GC);
    // An even count where there is more than one group: the AVX-512 path computes groups in
    // pairs, and a task boundary inside a pair would leave a half-filled register.
    let gpt = ng.div_ceil(4 * threads.max(1)).clamp(1, 16);
    let gpt = if gpt > 1 { gpt.next_multiple_of(2) } else { gpt };
    (gpt, ng.div_ceil(gpt))
}

/// Task `t` of [`tasks`] (`gpt` groups per task): columns `t·gpt·8 ..` of every row of the
/// quantized activations `a`, as `[m, gn·8]` (padding columns included).
pub(crate) fn task(isa: Isa, w: &QWeight, a: &QActs, t: usize, gpt: usize) -> Vec<f32> {
    let ng = w.n.div_ceil(GC);
    let g0 = t * gpt;
    let gn = gpt.min(ng - g0);
    let mut buf = vec![0.0f32; a.m * gn * GC];
    compute_groups(isa, w, a, g0, gn, &mut buf);
    buf
}

/// Column groups `g0..g0+gn` of every row into `buf[m, gn·8]` (padding columns included).
fn compute_groups(isa: Isa, w: &QWeight, a: &QActs, g0: usize, gn: usize, buf: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512Vnni && crate::isa::detected() >= Isa::Avx512Vnni {
            // SAFETY: avx512f/bw/vl/vnni (and the AVX2 set) were detected on this CPU.
            unsafe { avx512::compute_groups(w, a, g0, gn, buf) };
            return;
        }
        if isa >= Isa::Avx2 && crate::isa::detected() >= Isa::Avx2 {
            // SAFETY: avx2, fma and f16c were detected on this CPU.
            unsafe { avx2::compute_groups(w, a, g0, gn, buf) };
            return;
        }
    }
    let _ = isa;
    let width = gn * GC;
    for i in 0..a.m {
        for jj in 0..width {
            let j = g0 * GC + jj;
            buf[i * width + jj] = if j < w.n { dot_scalar(w, j, a, i) } else { 0.0 };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

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
        eprintln!(
            "quant kernel paths tested on this CPU: {:?} (SPARKLING_CPU_ISA selects the one in use: {:?})",
            crate::isa::available(),
            crate::isa::active()
        );
        for &format in &FORMATS {
            // Column groups of 8: 5, 1, 3 (an unpaired last group on the AVX-512 path), 6 and
            // 17 (tasks of several pairs).
            for &(n, k) in &[(37usize, 96usize), (5, 32), (19, 288), (48, 64), (130, 160)] {
                let w = QWeight::from_ggml(format, &random_ggml(format, n, k, 7), n, k).unwrap();
                for m in [1usize, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 65] {
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

    /// ggml's dequantization of one block straight from its bytes (gguf.md / ggml-quants.c
    /// `dequantize_row_*`), independent of the repacked layout.
    fn ggml_dequant_block(format: QFormat, blk: &[u8]) -> Vec<f32> {
        let d = f16_le(blk, 0).to_f32();
        match format {
            QFormat::Q8_0 => blk[2..34].iter().map(|&q| q as i8 as f32 * d).collect(),
            QFormat::Q4_0 => (0..32).map(|t| ((if t < 16 { blk[2 + t] & 15 } else { blk[2 + t - 16] >> 4 }) as f32 - 8.0) * d).collect(),
            QFormat::Q4_1 => {
                let m = f16_le(blk, 2).to_f32();
                (0..32).map(|t| d * (if t < 16 { blk[4 + t] & 15 } else { blk[4 + t - 16] >> 4 }) as f32 + m).collect()
            }
            QFormat::Q5_0 => {
                let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                (0..32)
                    .map(|t| {
                        let lo = if t < 16 { blk[6 + t] & 15 } else { blk[6 + t - 16] >> 4 };
                        ((lo as u32 | ((qh >> t) & 1) << 4) as f32 - 16.0) * d
                    })
                    .collect()
            }
        }
    }

    #[test]
    fn repacked_rows_dequantize_as_ggml_does_and_gathered_rows_are_the_same_blocks() {
        for &format in &FORMATS {
            let (n, k) = (19, 96);
            let raw = random_ggml(format, n, k, 23);
            let w = QWeight::from_ggml(format, &raw, n, k).unwrap();
            let bb = format.ggml_block_bytes();
            let mut row = vec![0.0f32; k];
            for j in 0..n {
                w.row_into(j, &mut row);
                let want: Vec<f32> = raw[j * (k / QK) * bb..(j + 1) * (k / QK) * bb].chunks_exact(bb).flat_map(|blk| ggml_dequant_block(format, blk)).collect();
                assert_eq!(row, want, "{format:?} row {j}");
            }
            let g = w.gather_rows(&[18, 0, 9]);
            for (i, &j) in [18usize, 0, 9].iter().enumerate() {
                let (mut a, mut b) = (vec![0.0f32; k], vec![0.0f32; k]);
                g.row_into(i, &mut a);
                w.row_into(j, &mut b);
                assert_eq!(a, b, "{format:?} gathered row {i} = row {j}");
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
    fn avx2_activation_quantizer_equals_the_scalar_one() {
        #[cfg(target_arch = "x86_64")]
        if crate::isa::detected() >= Isa::Avx2 {
            let mut x = pseudo(32 * 200, 17);
            // Ties, zeros, a zero block, huge and tiny magnitudes.
            x[3] = 0.5;
            x[5] = -2.5;
            x[32..64].iter_mut().for_each(|v| *v = 0.0);
            x[70] = 1e30;
            x[100] = -1e-30;
            for (blk, q) in x.chunks_exact(32).zip(0..) {
                let (mut qa, mut qb) = ([0u8; 32], [0u8; 32]);
                let d = quantize_block(blk, &mut qa);
                let sum: i32 = qa.iter().map(|&v| v as i8 as i32).sum();
                let (d2, sum2) = unsafe { avx2::quantize_block(blk, &mut qb) };
                assert_eq!((d.to_bits(), sum, qa), (d2.to_bits(), sum2, qb), "block {q}");
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
        assert_eq!(w.bytes(), 8 * k + 2 * 8 * 2);
        assert!(QWeight::quantize_q8_0(&x, n, 60).is_err());
        assert!(QWeight::from_ggml(QFormat::Q4_1, &[0u8; 39], 1, 64).is_err());
        assert!(QWeight::from_ggml(QFormat::Q4_1, &[0u8; 40], 1, 48).is_err());
        // Non-finite block scales (d, or Q4_1's min m) are corrupt weights, named by block.
        let mut blocks = [0u8; 40];
        assert!(QWeight::from_ggml(QFormat::Q4_1, &blocks, 1, 64).is_ok());
        blocks[20 + 2..20 + 4].copy_from_slice(&f16::NAN.to_le_bytes());
        let e = QWeight::from_ggml(QFormat::Q4_1, &blocks, 1, 64).unwrap_err();
        assert!(e.contains("block 1 of row 0") && e.contains("non-finite"), "{e}");
        let mut q8 = [0u8; 34];
        q8[..2].copy_from_slice(&f16::INFINITY.to_le_bytes());
        assert!(QWeight::from_ggml(QFormat::Q8_0, &q8, 1, 32).is_err());
    }
}
