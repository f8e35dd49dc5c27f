//! GGUF block formats kept quantized on the GPU: their layouts and the load-time repack of a
//! chunk of weight rows into the layout the WGSL preludes read (`shaders/weights_quant.wgsl`
//! plus one `weights_<format>.wgsl` each).
//!
//! A ggml block of `QK` values is `block_bytes` bytes: one or two f16 scales (`d`, and `m` or
//! `dmin`) and a payload of codes (and, for the K-quants, packed sub-block scales). On the
//! device a chunk of `rows` weight rows (`stride` = `rows` rounded up to 4, padding rows zero)
//! is one `u32` buffer of two regions:
//!
//! - **payload**: word `wi` of block `kb` of chunk row `j` at `(kb·QW + wi)·stride + j`, so the
//!   invocations owning neighbouring output columns read neighbouring words (coalesced, and a
//!   `vec4` of words for the direct kernel's 4 columns);
//! - **scales**: from word `(K/QK)·QW·stride`, f16 number `h` of block `kb` of row `j` is half
//!   `(kb·stride + j)·QH + h`, two halves per word, the even one in the low 16 bits.
//!
//! Nothing is added but the row padding (`stride − rows` ≤ 3 rows per chunk), so the stored
//! bytes equal the file's tensor bytes up to that padding. The values the kernels compute are
//! those of the loader's `dequantize` (`src/loader/gguf/dequant.rs`, ggml's reference order).

use sparkling_core::ggml;

/// A quantized storage format of the wgpu backend (a GGUF / ggml block type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QFormat {
    /// ggml Q8_0: 32 values, `d` f16 + 32 signed bytes; `x = q·d`.
    Q8_0,
    /// ggml Q4_0: 32 values, `d` f16 + 16 nibble bytes; `x = (q − 8)·d`.
    Q4_0,
    /// ggml Q4_1: 32 values, `d`, `m` f16 + 16 nibble bytes; `x = d·q + m`.
    Q4_1,
    /// ggml Q5_0: 32 values, `d` f16 + 32 fifth bits + 16 nibble bytes; `x = d·(q − 16)`.
    Q5_0,
    /// ggml Q4_K: 256 values, `d`, `dmin` f16 + 12 bytes of eight 6-bit (scale, min) pairs +
    /// 128 nibble bytes; `x = (d·sc)·q − dmin·mn`.
    Q4K,
    /// ggml Q6_K: 256 values, 128 low-nibble bytes + 64 bytes of 2-bit high parts + sixteen
    /// signed 8-bit scales + `d` f16; `x = (d·sc)·(q − 32)`.
    Q6K,
}

/// Where a format's f16 scales and payload sit in one ggml block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QLayout {
    /// Values per block (`QK`).
    pub(crate) values: usize,
    /// Bytes per block in the GGUF file.
    pub(crate) block_bytes: usize,
    /// Byte offsets of the block's f16 scales, in the order the shader numbers them (`QH` of them).
    pub(crate) halves: &'static [usize],
    /// Byte offset of the payload; it runs for `4·QW` bytes.
    pub(crate) payload: usize,
    /// Payload words per block (`QW`).
    pub(crate) words: usize,
}

impl QFormat {
    /// Every format, in ggml id order.
    pub const ALL: [QFormat; 6] = [QFormat::Q4_0, QFormat::Q4_1, QFormat::Q5_0, QFormat::Q8_0, QFormat::Q4K, QFormat::Q6K];

    /// The format of ggml type `ggml_type`, if the wgpu backend keeps it quantized.
    pub fn from_ggml(ggml_type: u32) -> Option<QFormat> {
        match ggml_type {
            ggml::Q8_0 => Some(QFormat::Q8_0),
            ggml::Q4_0 => Some(QFormat::Q4_0),
            ggml::Q4_1 => Some(QFormat::Q4_1),
            ggml::Q5_0 => Some(QFormat::Q5_0),
            ggml::Q4_K => Some(QFormat::Q4K),
            ggml::Q6_K => Some(QFormat::Q6K),
            _ => None,
        }
    }

    /// The ggml type id.
    pub fn ggml_type(self) -> u32 {
        match self {
            QFormat::Q8_0 => ggml::Q8_0,
            QFormat::Q4_0 => ggml::Q4_0,
            QFormat::Q4_1 => ggml::Q4_1,
            QFormat::Q5_0 => ggml::Q5_0,
            QFormat::Q4K => ggml::Q4_K,
            QFormat::Q6K => ggml::Q6_K,
        }
    }

    /// Short name as ggml writes it (`q8_0`, `q4_k`, …).
    pub fn name(self) -> &'static str {
        match self {
            QFormat::Q8_0 => "q8_0",
            QFormat::Q4_0 => "q4_0",
            QFormat::Q4_1 => "q4_1",
            QFormat::Q5_0 => "q5_0",
            QFormat::Q4K => "q4_k",
            QFormat::Q6K => "q6_k",
        }
    }

    pub(crate) fn layout(self) -> QLayout {
        match self {
            QFormat::Q8_0 => QLayout { values: 32, block_bytes: 34, halves: &[0], payload: 2, words: 8 },
            QFormat::Q4_0 => QLayout { values: 32, block_bytes: 18, halves: &[0], payload: 2, words: 4 },
            QFormat::Q4_1 => QLayout { values: 32, block_bytes: 20, halves: &[0, 2], payload: 4, words: 4 },
            // Payload: the 32-bit fifth-bit mask, then the 16 nibble bytes.
            QFormat::Q5_0 => QLayout { values: 32, block_bytes: 22, halves: &[0], payload: 2, words: 5 },
            // Payload: the 12 packed scale bytes, then the 128 nibble bytes.
            QFormat::Q4K => QLayout { values: 256, block_bytes: 144, halves: &[0, 2], payload: 4, words: 35 },
            // Payload: ql (128 bytes), qh (64), the 16 scales; `d` is the block's last 2 bytes.
            QFormat::Q6K => QLayout { values: 256, block_bytes: 210, halves: &[208], payload: 0, words: 52 },
        }
    }

    /// Bytes of `n` rows of `k` values in the GGUF file (`k` a multiple of the block).
    pub(crate) fn file_bytes(self, n: usize, k: usize) -> usize {
        let l = self.layout();
        n * (k / l.values) * l.block_bytes
    }

    /// Bytes of a stored chunk of `rows` rows of `k` values (row padding included).
    pub(crate) fn chunk_bytes(self, k: usize, rows: usize) -> u64 {
        let l = self.layout();
        let stride = crate::tensor::chunk_stride(rows) as u64;
        let nb = (k / l.values) as u64;
        4 * (nb * l.words as u64 * stride + (nb * stride * l.halves.len() as u64).div_ceil(2))
    }

    /// Rows per chunk (a multiple of 4) so that one stored chunk of `k`-value rows fits
    /// `limit` bytes; 0 when even 4 rows do not.
    pub(crate) fn rows_per_chunk(self, k: usize, limit: u64) -> usize {
        let l = self.layout();
        let per_row = ((k / l.values) * (4 * l.words + 2 * l.halves.len())).max(1) as u64;
        let mut r = (limit / per_row) / 4 * 4;
        while r > 0 && self.chunk_bytes(k, r as usize) > limit {
            r -= 4;
        }
        r.min(usize::MAX as u64) as usize
    }

    /// The `const` lines the WGSL preludes need (`QK`, `QW`, `QH`).
    pub(crate) fn wgsl_consts(self) -> String {
        let l = self.layout();
        format!("const QK: u32 = {}u;\nconst QW: u32 = {}u;\nconst QH: u32 = {}u;\n", l.values, l.words, l.halves.len())
    }

    /// Repack rows `row0 .. row0 + rows` of a `[n, k]` weight stored as ggml blocks (`bytes`,
    /// rows back to back, as [`sparkling_core::GgmlWeight`] holds them) into the chunk layout
    /// of the module docs. The caller has checked `bytes.len()` against `[n, k]`.
    pub(crate) fn repack_chunk(self, bytes: &[u8], k: usize, row0: usize, rows: usize) -> Vec<u32> {
        let l = self.layout();
        let stride = crate::tensor::chunk_stride(rows);
        let nb = k / l.values;
        let qh = l.halves.len();
        let row_bytes = nb * l.block_bytes;
        let scales_at = nb * l.words * stride;
        let mut out = vec![0u32; scales_at + (nb * stride * qh).div_ceil(2)];
        for j in 0..rows {
            let row = &bytes[(row0 + j) * row_bytes..(row0 + j + 1) * row_bytes];
            for (kb, block) in row.chunks_exact(l.block_bytes).enumerate() {
                let payload = &block[l.payload..l.payload + 4 * l.words];
                for (wi, word) in payload.chunks_exact(4).enumerate() {
                    out[(kb * l.words + wi) * stride + j] = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                }
                for (h, &at) in l.halves.iter().enumerate() {
                    let half = (kb * stride + j) * qh + h;
                    let bits = u16::from_le_bytes([block[at], block[at + 1]]) as u32;
                    out[scales_at + half / 2] |= bits << (16 * (half % 2));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_cover_each_block_exactly_once() {
        for f in QFormat::ALL {
            let l = f.layout();
            let mut used = vec![0u8; l.block_bytes];
            for &h in l.halves {
                used[h] += 1;
                used[h + 1] += 1;
            }
            for b in &mut used[l.payload..l.payload + 4 * l.words] {
                *b += 1;
            }
            assert!(used.iter().all(|&u| u == 1), "{f:?}: {used:?}");
            assert_eq!(QFormat::from_ggml(f.ggml_type()), Some(f));
        }
        assert_eq!(QFormat::from_ggml(ggml::F16), None);
    }

    #[test]
    fn stored_bytes_are_the_file_bytes_plus_row_padding() {
        for f in QFormat::ALL {
            let k = 2 * f.layout().values;
            // 8 rows: no padding, exactly the file's bytes.
            assert_eq!(f.chunk_bytes(k, 8), f.file_bytes(8, k) as u64, "{f:?}");
            // 5 rows are stored as 8.
            assert_eq!(f.chunk_bytes(k, 5), f.file_bytes(8, k) as u64, "{f:?}");
            let r = f.rows_per_chunk(k, 10_000);
            assert!(r > 0 && r.is_multiple_of(4) && f.chunk_bytes(k, r) <= 10_000 && f.chunk_bytes(k, r + 4) > 10_000, "{f:?}: {r}");
        }
    }

    #[test]
    fn repack_puts_words_column_major_and_scales_after() {
        // Two Q4_1 rows of one block each: d/m halves and four payload words per row.
        let mut bytes = Vec::new();
        for r in 0..2u8 {
            bytes.extend_from_slice(&[10 + r, 0, 20 + r, 0]);
            bytes.extend((0..16u8).map(|i| i + 16 * r));
        }
        let w = QFormat::Q4_1.repack_chunk(&bytes, 32, 0, 2);
        let stride = 4;
        assert_eq!(w.len(), 4 * stride + 4);
        for r in 0..2usize {
            for wi in 0..4usize {
                let b = |i: usize| (4 * wi + i + 16 * r) as u32;
                assert_eq!(w[wi * stride + r], b(0) | b(1) << 8 | b(2) << 16 | b(3) << 24, "row {r} word {wi}");
            }
            // Halves (d, m) of row r: one word, d low.
            assert_eq!(w[4 * stride + r], (10 + r as u32) | (20 + r as u32) << 16);
        }
        // Padding rows stay zero.
        assert_eq!(w[2], 0);
        assert_eq!(w[4 * stride + 3], 0);
    }
}
