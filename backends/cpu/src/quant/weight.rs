//! Storage of quantized weights: ggml's block formats repacked at load into the column-group
//! layout of the [module docs](super), and their scalar decoding (the reference every kernel
//! path is tested against).

use super::{GC, QK};
use half::f16;

/// Values per K-quant super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// Bytes of one high-bit plane per interleaved group and 32-value block (4 per column).
pub(super) const H_BYTES: usize = 32;

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
    /// 256-value super-blocks of eight 32-value sub-blocks: 4-bit codes, 6-bit sub-block scales
    /// and mins, f16 super-block `d` and `dmin`; `x = d·sc·q − dmin·m` (ggml type 12).
    Q4K,
    /// 256-value super-blocks of sixteen 16-value sub-blocks: 6-bit codes offset by 32, int8
    /// sub-block scales, f16 super-block `d`; `x = d·sc·(q − 32)` (ggml type 14).
    Q6K,
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
            ggml::Q4_K => Some(QFormat::Q4K),
            ggml::Q6_K => Some(QFormat::Q6K),
            _ => None,
        }
    }

    /// ggml's name of the format (`q4_1`, `q4_K`, …).
    pub fn name(self) -> &'static str {
        match self {
            QFormat::Q8_0 => "q8_0",
            QFormat::Q4_0 => "q4_0",
            QFormat::Q4_1 => "q4_1",
            QFormat::Q5_0 => "q5_0",
            QFormat::Q4K => "q4_K",
            QFormat::Q6K => "q6_K",
        }
    }

    /// Values per ggml block (32, or 256 for the K-quants).
    pub(super) fn block_values(self) -> usize {
        match self {
            QFormat::Q4K | QFormat::Q6K => QK_K,
            _ => QK,
        }
    }

    /// Bytes of one ggml block in a GGUF file.
    pub(super) fn ggml_block_bytes(self) -> usize {
        match self {
            QFormat::Q8_0 => 34,
            QFormat::Q4_0 => 18,
            QFormat::Q4_1 => 20,
            QFormat::Q5_0 => 22,
            QFormat::Q4K => 144,
            QFormat::Q6K => 210,
        }
    }

    /// Code bytes of one column's 32-value block (32 for 8-bit; 16 for every other format,
    /// whose codes keep their low 4 bits there and the rest in high-bit planes).
    pub(super) fn code_bytes(self) -> usize {
        match self {
            QFormat::Q8_0 => 32,
            _ => 16,
        }
    }

    /// High-bit planes above the 4-bit nibbles (Q5_0: 1, Q6_K: 2).
    pub(super) fn planes(self) -> usize {
        match self {
            QFormat::Q5_0 => 1,
            QFormat::Q6K => 2,
            _ => 0,
        }
    }

    /// The offset subtracted from the stored unsigned code (Q8_0's codes are signed already).
    pub(super) fn offset(self) -> i32 {
        match self {
            QFormat::Q4_0 => 8,
            QFormat::Q5_0 => 16,
            QFormat::Q6K => 32,
            _ => 0,
        }
    }

    pub(super) fn is_k_quant(self) -> bool {
        matches!(self, QFormat::Q4K | QFormat::Q6K)
    }
}

/// A `[n, k]` weight in a [`QFormat`] (layout in the module docs).
#[derive(Debug, Clone)]
pub struct QWeight {
    /// Block format.
    pub format: QFormat,
    /// Output features (rows of the original matrix).
    pub n: usize,
    /// Input features (a multiple of [`QK`]; of [`QK_K`] for the K-quants).
    pub k: usize,
    /// 32-value blocks per column.
    pub(super) nb: usize,
    /// Codes: Q8_0's bytes plus 128 (sign bit flipped), or the low 4 bits of every other format.
    pub(super) qs: Vec<u8>,
    /// High-bit planes, `planes · H_BYTES` bytes per group and block (empty without planes).
    pub(super) qh: Vec<u8>,
    /// f16 scales: per column and block; the K-quants' super-block `d` per column and super-block.
    pub(super) d: Vec<f16>,
    /// Q4_1's f16 mins per column and block; Q4_K's super-block `dmin` per column and super-block.
    pub(super) m: Vec<f16>,
    /// K-quants, per column and block: Q4_K's 6-bit scale; Q6_K's int8 scale of values 0–15.
    pub(super) sa: Vec<u8>,
    /// K-quants, per column and block: Q4_K's 6-bit min; Q6_K's int8 scale of values 16–31.
    pub(super) sb: Vec<u8>,
}

#[inline]
fn f16_le(b: &[u8], i: usize) -> f16 {
    f16::from_le_bytes([b[i], b[i + 1]])
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) of a Q4_K block's
/// 12 packed bytes.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Why ggml blocks could not be repacked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantError {
    /// `k` or the byte count does not fit the format (the message gives the counts).
    Shape(String),
    /// The bytes fit but hold a non-finite scale: corrupt weights (the message names the block).
    Corrupt(String),
}

impl std::fmt::Display for QuantError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QuantError::Shape(m) | QuantError::Corrupt(m) => f.write_str(m),
        }
    }
}

/// One decoded 32-value block of a ggml tensor: unsigned codes and its scale data.
struct Decoded {
    codes: [u8; QK],
    d: f16,
    m: f16,
    sa: u8,
    sb: u8,
}

impl QWeight {
    pub(super) fn empty(format: QFormat, n: usize, k: usize) -> QWeight {
        let nb = k / QK;
        let ng = n.div_ceil(GC);
        let per_block = ng * nb * GC;
        let (scales, mins) = match format {
            QFormat::Q4_1 => (per_block, per_block),
            QFormat::Q4K => (per_block / 8, per_block / 8),
            QFormat::Q6K => (per_block / 8, 0),
            _ => (per_block, 0),
        };
        let subs = if format.is_k_quant() { per_block } else { 0 };
        QWeight {
            format,
            n,
            k,
            nb,
            qs: vec![0; per_block * format.code_bytes()],
            qh: vec![0; ng * nb * H_BYTES * format.planes()],
            d: vec![f16::ZERO; scales],
            m: vec![f16::ZERO; mins],
            sa: vec![0; subs],
            sb: vec![0; subs],
        }
    }

    /// Byte offset of code byte `t` (0..code_bytes) of column `j`, block `b` in `qs`.
    #[inline]
    pub(super) fn code_at(&self, j: usize, b: usize, t: usize) -> usize {
        let cb = self.format.code_bytes();
        ((j / GC) * self.nb + b) * GC * cb + (t / 4) * 32 + (j % GC) * 4 + t % 4
    }

    /// Index of column `j`, block `b` in the per-block arrays (`d`, `m` of the 32-value
    /// formats; `sa`, `sb`).
    #[inline]
    pub(super) fn scale_at(&self, j: usize, b: usize) -> usize {
        ((j / GC) * self.nb + b) * GC + j % GC
    }

    /// Index of column `j`, super-block `s` in the K-quants' `d` and `m`.
    #[inline]
    pub(super) fn super_at(&self, j: usize, s: usize) -> usize {
        ((j / GC) * (self.nb / 8) + s) * GC + j % GC
    }

    /// Byte and bit of plane `p`'s bit of value `t` (0..32) of column `j`, block `b` in `qh`.
    #[inline]
    fn high_bit_at(&self, j: usize, b: usize, t: usize, p: usize) -> (usize, u32) {
        let (g, upper) = ((t % 16) / 4, t >= 16);
        let bit = 4 * (j % GC) + t % 4;
        let at = ((j / GC) * self.nb + b) * H_BYTES * self.format.planes() + p * H_BYTES + 8 * g + 4 * upper as usize + bit / 8;
        (at, (bit % 8) as u32)
    }

    /// Ask the cache for block `b` of column group `g` — its codes, high-bit planes and scales —
    /// ahead of use. The kernels call it for the groups after the ones they compute, on a
    /// task's first pass over its weights (a decode's one row, or a verify's first row tile),
    /// so the next groups arrive from memory while these are computed. Only addresses are
    /// formed (`wrapping_add`) and a prefetch never faults, so `g` may lie past the last group.
    ///
    /// # Safety
    /// None beyond running on x86-64 (prefetches read nothing the program sees).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(super) unsafe fn prefetch_block(&self, g: usize, b: usize) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let fetch = |p: *const u8| _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
        let at = g * self.nb + b;
        let cb = self.format.code_bytes() * GC;
        for line in (0..cb).step_by(64) {
            fetch(self.qs.as_ptr().wrapping_add(at * cb + line));
        }
        let pb = self.format.planes() * H_BYTES;
        for line in (0..pb).step_by(64) {
            fetch(self.qh.as_ptr().wrapping_add(at * pb + line));
        }
        if self.format.is_k_quant() {
            fetch(self.sa.as_ptr().wrapping_add(at * GC));
            fetch(self.sb.as_ptr().wrapping_add(at * GC));
            fetch(self.d.as_ptr().wrapping_add((g * (self.nb / 8) + b / 8) * GC) as *const u8);
            if self.format == QFormat::Q4K {
                fetch(self.m.as_ptr().wrapping_add((g * (self.nb / 8) + b / 8) * GC) as *const u8);
            }
        } else {
            fetch(self.d.as_ptr().wrapping_add(at * GC) as *const u8);
            if self.format == QFormat::Q4_1 {
                fetch(self.m.as_ptr().wrapping_add(at * GC) as *const u8);
            }
        }
    }

    /// Unsigned code of value `t` (0..32) of column `j`, block `b` (Q8_0: ggml's byte, the
    /// stored byte with its sign bit flipped back).
    #[inline]
    pub(super) fn ucode(&self, j: usize, b: usize, t: usize) -> u8 {
        if self.format == QFormat::Q8_0 {
            return self.qs[self.code_at(j, b, t)] ^ 0x80;
        }
        let byte = self.qs[self.code_at(j, b, t % 16)];
        let mut q = if t < 16 { byte & 0x0F } else { byte >> 4 };
        for p in 0..self.format.planes() {
            let (at, bit) = self.high_bit_at(j, b, t, p);
            q |= ((self.qh[at] >> bit) & 1) << (4 + p);
        }
        q
    }

    /// Signed integer code of value `t` (0..32) of block `b` of column `j` (Q4_1 and Q4_K:
    /// the unsigned nibble).
    #[inline]
    pub(super) fn code(&self, j: usize, b: usize, t: usize) -> i32 {
        match self.format {
            QFormat::Q8_0 => self.ucode(j, b, t) as i8 as i32,
            f => self.ucode(j, b, t) as i32 - f.offset(),
        }
    }

    /// Store the unsigned codes of column `j`, block `b` (ggml value order; Q8_0's as
    /// `code + 128`, module docs).
    fn put_codes(&mut self, j: usize, b: usize, codes: &[u8; QK]) {
        if self.format == QFormat::Q8_0 {
            for (t, &c) in codes.iter().enumerate() {
                let at = self.code_at(j, b, t);
                self.qs[at] = c ^ 0x80;
            }
            return;
        }
        for t in 0..16 {
            let at = self.code_at(j, b, t);
            self.qs[at] = (codes[t] & 0x0F) | ((codes[t + 16] & 0x0F) << 4);
        }
        for (t, &c) in codes.iter().enumerate() {
            for p in 0..self.format.planes() {
                let (at, bit) = self.high_bit_at(j, b, t, p);
                let v = (c >> (4 + p)) & 1;
                self.qh[at] = (self.qh[at] & !(1 << bit)) | (v << bit);
            }
        }
    }

    /// Store one decoded block of column `j`, block `b`.
    fn put(&mut self, j: usize, b: usize, x: &Decoded) {
        self.put_codes(j, b, &x.codes);
        if self.format.is_k_quant() {
            let s = self.scale_at(j, b);
            self.sa[s] = x.sa;
            self.sb[s] = x.sb;
            let u = self.super_at(j, b / 8);
            self.d[u] = x.d;
            if self.format == QFormat::Q4K {
                self.m[u] = x.m;
            }
        } else {
            let s = self.scale_at(j, b);
            self.d[s] = x.d;
            if self.format == QFormat::Q4_1 {
                self.m[s] = x.m;
            }
        }
    }

    /// Column `j`, block `b` as stored (the inverse of [`QWeight::put`]).
    fn get(&self, j: usize, b: usize) -> Decoded {
        let mut codes = [0u8; QK];
        for (t, c) in codes.iter_mut().enumerate() {
            *c = self.ucode(j, b, t);
        }
        if self.format.is_k_quant() {
            let (s, u) = (self.scale_at(j, b), self.super_at(j, b / 8));
            let m = if self.format == QFormat::Q4K { self.m[u] } else { f16::ZERO };
            Decoded { codes, d: self.d[u], m, sa: self.sa[s], sb: self.sb[s] }
        } else {
            let s = self.scale_at(j, b);
            let m = if self.format == QFormat::Q4_1 { self.m[s] } else { f16::ZERO };
            Decoded { codes, d: self.d[s], m, sa: 0, sb: 0 }
        }
    }

    /// Decode one ggml block (`block_values` values) into its 32-value blocks, in order.
    fn decode_ggml(format: QFormat, blk: &[u8]) -> Vec<Decoded> {
        let plain = |codes: [u8; QK], d: f16, m: f16| Decoded { codes, d, m, sa: 0, sb: 0 };
        let nibbles = |qs: &[u8]| {
            let mut c = [0u8; QK];
            for t in 0..16 {
                c[t] = qs[t] & 0x0F;
                c[t + 16] = qs[t] >> 4;
            }
            c
        };
        match format {
            QFormat::Q8_0 => vec![plain(blk[2..34].try_into().expect("32 code bytes"), f16_le(blk, 0), f16::ZERO)],
            QFormat::Q4_0 => vec![plain(nibbles(&blk[2..18]), f16_le(blk, 0), f16::ZERO)],
            QFormat::Q4_1 => vec![plain(nibbles(&blk[4..20]), f16_le(blk, 0), f16_le(blk, 2))],
            QFormat::Q5_0 => {
                let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                let mut c = nibbles(&blk[6..22]);
                for (t, v) in c.iter_mut().enumerate() {
                    *v |= (((qh >> t) & 1) as u8) << 4;
                }
                vec![plain(c, f16_le(blk, 0), f16::ZERO)]
            }
            QFormat::Q4K => {
                // d, dmin, scales[12], qs[128]: 32 bytes of qs per 64 values, the low nibbles
                // sub-block 2i, the high nibbles sub-block 2i+1 (ggml `dequantize_row_q4_K`).
                let (d, dmin, scales, qs) = (f16_le(blk, 0), f16_le(blk, 2), &blk[4..16], &blk[16..144]);
                (0..8)
                    .map(|j| {
                        let (sc, m) = scale_min_k4(j, scales);
                        let q = &qs[32 * (j / 2)..32 * (j / 2) + 32];
                        let codes = std::array::from_fn(|l| if j % 2 == 0 { q[l] & 0x0F } else { q[l] >> 4 });
                        Decoded { codes, d, m: dmin, sa: sc, sb: m }
                    })
                    .collect()
            }
            QFormat::Q6K => {
                // ql[128], qh[64], scales[16] (int8, one per 16 values), d (ggml
                // `dequantize_row_q6_K`): per 128 values, value 32·s + l (s = 0..4, l < 32)
                // has its low 4 bits in ql[l + 32·(s%2)] (high nibble when s ≥ 2) and its top
                // 2 bits at bit 2s of qh[l].
                let (ql, qh, scales, d) = (&blk[0..128], &blk[128..192], &blk[192..208], f16_le(blk, 208));
                (0..8)
                    .map(|j| {
                        let (half, s) = (j / 4, j % 4);
                        let (ql, qh) = (&ql[64 * half..64 * half + 64], &qh[32 * half..32 * half + 32]);
                        let codes = std::array::from_fn(|l| {
                            let lo = if s < 2 { ql[l + 32 * s] & 0x0F } else { ql[l + 32 * (s - 2)] >> 4 };
                            lo | (((qh[l] >> (2 * s)) & 3) << 4)
                        });
                        Decoded { codes, d, m: f16::ZERO, sa: scales[2 * j], sb: scales[2 * j + 1] }
                    })
                    .collect()
            }
        }
    }

    /// Repack `n` rows of ggml blocks (as stored in a GGUF file, rows back to back).
    ///
    /// # Errors
    /// [`QuantError::Shape`]: `k` not a positive multiple of the format's block (32 values; 256
    /// for the K-quants), or `bytes.len()` not `n · k/block · block_bytes` (the message gives
    /// both counts); [`QuantError::Corrupt`]: a non-finite f16 scale (the message names the row
    /// and block).
    pub fn from_ggml(format: QFormat, bytes: &[u8], n: usize, k: usize) -> Result<QWeight, QuantError> {
        let bv = format.block_values();
        if !k.is_multiple_of(bv) || k == 0 {
            return Err(QuantError::Shape(format!("{} weight [{n}, {k}]: K must be a positive multiple of {bv}", format.name())));
        }
        let bb = format.ggml_block_bytes();
        let want = n * (k / bv) * bb;
        if bytes.len() != want {
            return Err(QuantError::Shape(format!("{} weight [{n}, {k}] needs {want} bytes, got {}", format.name(), bytes.len())));
        }
        let mut w = QWeight::empty(format, n, k);
        let per_row = k / bv;
        for (idx, blk) in bytes.chunks_exact(bb).enumerate() {
            let (j, gb) = (idx / per_row, idx % per_row);
            for (sub, x) in QWeight::decode_ggml(format, blk).iter().enumerate() {
                // A NaN or infinite scale (a corrupt file) would turn whole rows into NaN and
                // the output into token 0 with exit 0: refuse it, naming the block.
                if !x.d.is_finite() || !x.m.is_finite() {
                    return Err(QuantError::Corrupt(format!(
                        "{} weight [{n}, {k}]: block {gb} of row {j} has a non-finite scale (d = {}, m = {}): corrupt weights",
                        format.name(),
                        x.d.to_f32(),
                        x.m.to_f32()
                    )));
                }
                w.put(j, gb * (bv / QK) + sub, x);
            }
        }
        Ok(w)
    }

    /// A weight of rows `rows` of this one (row `i` = row `rows[i]`), codes, scales and mins
    /// copied as they are (so its outputs equal this weight's outputs for those rows, bit for
    /// bit). Precondition: every id `< n`.
    pub fn gather_rows(&self, rows: &[u32]) -> QWeight {
        let mut w = QWeight::empty(self.format, rows.len(), self.k);
        for (j, &r) in rows.iter().enumerate() {
            for b in 0..self.nb {
                w.put(j, b, &self.get(r as usize, b));
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
        let mut codes = [0u8; QK];
        for (idx, x) in data.chunks_exact(QK).enumerate() {
            let d = super::quantize_block(x, &mut codes);
            w.put(idx / nb, idx % nb, &Decoded { codes, d: f16::from_f32(d), m: f16::ZERO, sa: 0, sb: 0 });
        }
        Ok(w)
    }

    /// Bytes held in memory (codes, planes and scales, padding included).
    pub fn bytes(&self) -> usize {
        self.qs.len() + self.qh.len() + 2 * (self.d.len() + self.m.len()) + self.sa.len() + self.sb.len()
    }

    /// Row `j` dequantized into `out` (`k` values) with ggml's formulas (`q·d`, `d·q + m`,
    /// Q4_K `(d·sc)·q − dmin·m`, Q6_K `d·sc·(q − 32)`), so the values equal the loader's f32
    /// dequantization of the same blocks.
    pub fn row_into(&self, j: usize, out: &mut [f32]) {
        for (b, y) in out.chunks_exact_mut(QK).enumerate().take(self.nb) {
            let x = self.get(j, b);
            let d = x.d.to_f32();
            match self.format {
                QFormat::Q4_1 => {
                    let m = x.m.to_f32();
                    for (t, v) in y.iter_mut().enumerate() {
                        *v = d * self.code(j, b, t) as f32 + m;
                    }
                }
                QFormat::Q4K => {
                    let (d1, m1) = (d * x.sa as f32, x.m.to_f32() * x.sb as f32);
                    for (t, v) in y.iter_mut().enumerate() {
                        *v = d1 * self.code(j, b, t) as f32 - m1;
                    }
                }
                QFormat::Q6K => {
                    for (t, v) in y.iter_mut().enumerate() {
                        let sc = if t < 16 { x.sa } else { x.sb } as i8;
                        *v = d * sc as f32 * self.code(j, b, t) as f32;
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
