//! Dequantization of ggml block formats to f32 (layouts in the doc comment of [`dequantize`]).

use super::*;

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Decode `n_elements` values of ggml type `ggml_type` from `bytes` into `out` (f32).
///
/// Supported types and their block layouts (per block of `B` values; f16 = IEEE half, LE):
/// - `F32` (0), `F16` (1), `BF16` (30): plain arrays of one value each.
/// - `Q4_0` (2), B=32, 18 bytes: scale `d` f16, 16 bytes of 4-bit codes; byte `j` holds value `j`
///   in its low nibble and value `j+16` in its high nibble; `x = d * (q - 8)`.
/// - `Q4_1` (3), B=32, 20 bytes: `d` f16, min `m` f16, 16 bytes of nibbles as Q4_0; `x = d*q + m`.
/// - `Q5_0` (6), B=32, 22 bytes: `d` f16, 32-bit LE mask of 5th bits (bit `i` for value `i`),
///   16 bytes of low nibbles as Q4_0; `x = d * (q - 16)`.
/// - `Q5_1` (7), B=32, 24 bytes: `d` f16, `m` f16, 5th-bit mask, nibbles; `x = d*q + m`.
/// - `Q8_0` (8), B=32, 34 bytes: `d` f16, 32 signed bytes; `x = d * q`.
/// - `Q2_K` (10), B=256, 84 bytes: 16 bytes of 4-bit (scale, min) pairs (low nibble scale),
///   64 bytes of 2-bit codes, `d` f16, `dmin` f16; 16 sub-blocks of 16 values,
///   `x = d*scale*q - dmin*min`.
/// - `Q3_K` (11), B=256, 110 bytes: 32-byte high-bit mask, 64 bytes of 2-bit low codes, 12 bytes
///   packing sixteen 6-bit scales, `d` f16; `x = d*(scale-32) * (low - (high bit clear ? 4 : 0))`.
/// - `Q4_K` (12), B=256, 144 bytes: `d`, `dmin` f16, 12 bytes packing eight 6-bit (scale, min)
///   pairs, 128 bytes of nibbles; 8 sub-blocks of 32, `x = d*scale*q - dmin*min`.
/// - `Q5_K` (13), B=256, 176 bytes: as Q4_K plus a 32-byte mask supplying each value's 5th bit.
/// - `Q6_K` (14), B=256, 210 bytes: 128 bytes of low nibbles, 64 bytes of 2-bit high parts,
///   sixteen signed 8-bit scales, `d` f16; `x = d*scale*(q - 32)`.
///
/// Products are evaluated in f32 in the same order as ggml's reference C code and gguf-py (no
/// fused multiply-add), so results are bit-identical to gguf-py's `gguf.quants.dequantize`.
///
/// # Errors
/// If the type is not one of the above (the message names it and lists the supported types), if
/// `n_elements` is not a multiple of the block size, or if `bytes.len()` / `out.len()` do not
/// match `n_elements`.
pub fn dequantize(ggml_type: u32, bytes: &[u8], n_elements: usize, out: &mut [f32]) -> Result<(), GgufError> {
    if !SUPPORTED.contains(&ggml_type) {
        return err(format!("ggml type {} (id {ggml_type}) cannot be dequantized; supported types: {}", type_name(ggml_type), supported_list()));
    }
    let Some((name, block, block_bytes)) = type_layout(ggml_type) else {
        return err(format!("ggml type id {ggml_type} has no known block layout"));
    };
    let expected = byte_size(ggml_type, n_elements as u64).map_err(GgufError)?;
    if bytes.len() as u64 != expected {
        return err(format!("{n_elements} values of type {name} need {expected} bytes, got {}", bytes.len()));
    }
    if out.len() != n_elements {
        return err(format!("output buffer has {} slots, expected {n_elements}", out.len()));
    }
    let blocks = bytes.chunks_exact(block_bytes).zip(out.chunks_exact_mut(block));
    match ggml_type {
        ggml_type::F32 => {
            for (b, y) in blocks {
                y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        ggml_type::F16 => {
            for (b, y) in blocks {
                y[0] = f16_at(b, 0);
            }
        }
        ggml_type::BF16 => {
            for (b, y) in blocks {
                y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        ggml_type::Q4_0 => blocks.for_each(|(b, y)| q4_0(b, y)),
        ggml_type::Q4_1 => blocks.for_each(|(b, y)| q4_1(b, y)),
        ggml_type::Q5_0 => blocks.for_each(|(b, y)| q5_0(b, y)),
        ggml_type::Q5_1 => blocks.for_each(|(b, y)| q5_1(b, y)),
        ggml_type::Q8_0 => blocks.for_each(|(b, y)| q8_0(b, y)),
        ggml_type::Q2_K => blocks.for_each(|(b, y)| q2_k(b, y)),
        ggml_type::Q3_K => blocks.for_each(|(b, y)| q3_k(b, y)),
        ggml_type::Q4_K => blocks.for_each(|(b, y)| q4_k(b, y)),
        ggml_type::Q5_K => blocks.for_each(|(b, y)| q5_k(b, y)),
        ggml_type::Q6_K => blocks.for_each(|(b, y)| q6_k(b, y)),
        _ => unreachable!("checked against SUPPORTED above"),
    }
    Ok(())
}

// Each block decoder takes exactly one block of bytes and writes exactly one block of values;
// `dequantize` guarantees both lengths.

fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qs = &b[4..20];
    for j in 0..16 {
        y[j] = d * (qs[j] & 0x0F) as f32 + m;
        y[j + 16] = d * (qs[j] >> 4) as f32 + m;
    }
}

fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let lo = (qs[j] & 0x0F) as u32 | (((qh >> j) & 1) << 4);
        let hi = (qs[j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
        y[j] = d * (lo as i32 - 16) as f32;
        y[j + 16] = d * (hi as i32 - 16) as f32;
    }
}

fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let lo = (qs[j] & 0x0F) as u32 | (((qh >> j) & 1) << 4);
        let hi = (qs[j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
        y[j] = d * lo as f32 + m;
        y[j + 16] = d * hi as f32 + m;
    }
}

fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[2..34]) {
        *v = (q as i8) as f32 * d;
    }
}

fn q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    // Two halves of 128 values; each uses 32 code bytes, four 2-bit planes of 32 values each,
    // and every 16 consecutive values share one (scale, min) byte.
    for half in 0..2 {
        let q = &qs[half * 32..half * 32 + 32];
        for plane in 0..4 {
            let shift = 2 * plane;
            for l in 0..32 {
                let sub = half * 8 + plane * 2 + l / 16;
                let sc = scales[sub];
                let dl = d * (sc & 0x0F) as f32;
                let ml = dmin * (sc >> 4) as f32;
                y[half * 128 + plane * 32 + l] = dl * ((q[l] >> shift) & 3) as f32 - ml;
            }
        }
    }
}

/// The sixteen 6-bit scales of a Q3_K block: low 4 bits from bytes 0..8 (low nibble for scales
/// 0..8, high nibble for 8..16), high 2 bits from bytes 8..12 (byte `8 + i%4`, bit pair `i/4`).
fn q3_k_scale(s: &[u8], i: usize) -> i32 {
    let low = if i < 8 { s[i] & 0x0F } else { s[i - 8] >> 4 };
    let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    (low | (high << 4)) as i32 - 32
}

fn q3_k(b: &[u8], y: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let scales = &b[96..108];
    let d = f16_at(b, 108);
    // Eight groups of 32 values: group g takes its 2 low bits from code bytes
    // `32*(g/4) ..` at bit pair `g%4`, and its high bit from bit `g` of the mask bytes.
    for g in 0..8 {
        let q = &qs[(g / 4) * 32..(g / 4) * 32 + 32];
        let shift = 2 * (g % 4);
        for l in 0..32 {
            let dl = d * q3_k_scale(scales, 2 * g + l / 16) as f32;
            let low = ((q[l] >> shift) & 3) as i32;
            let sub = if hmask[l] & (1 << g) != 0 { 0 } else { 4 };
            y[g * 32 + l] = dl * (low - sub) as f32;
        }
    }
}

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes of a Q4_K/Q5_K block: for
/// `j < 4` the low 6 bits of bytes `j` and `j+4`; otherwise the nibbles of byte `j+4` topped up by
/// the 2 spare high bits of bytes `j-4` and `j`.
fn k4_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qs = &b[16..144];
    // Four chunks of 64 values; chunk c uses code bytes 32c..32c+32: low nibbles are sub-block
    // 2c, high nibbles sub-block 2c+1.
    for c in 0..4 {
        let q = &qs[c * 32..c * 32 + 32];
        let (sc1, m1) = k4_scale_min(scales, 2 * c);
        let (sc2, m2) = k4_scale_min(scales, 2 * c + 1);
        let (d1, dm1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, dm2) = (d * sc2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            y[c * 64 + l] = d1 * (q[l] & 0x0F) as f32 - dm1;
            y[c * 64 + 32 + l] = d2 * (q[l] >> 4) as f32 - dm2;
        }
    }
}

fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    // As Q4_K; the 5th bit of value l of sub-block s is bit s of mask byte l.
    for c in 0..4 {
        let q = &qs[c * 32..c * 32 + 32];
        let (s1, s2) = (2 * c, 2 * c + 1);
        let (sc1, m1) = k4_scale_min(scales, s1);
        let (sc2, m2) = k4_scale_min(scales, s2);
        let (d1, dm1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, dm2) = (d * sc2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            let lo = (q[l] & 0x0F) | (((qh[l] >> s1) & 1) << 4);
            let hi = (q[l] >> 4) | (((qh[l] >> s2) & 1) << 4);
            y[c * 64 + l] = d1 * lo as f32 - dm1;
            y[c * 64 + 32 + l] = d2 * hi as f32 - dm2;
        }
    }
}

fn q6_k(b: &[u8], y: &mut [f32]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let sc = &b[192..208];
    let d = f16_at(b, 208);
    // Two halves of 128 values (64 low-nibble bytes, 32 high-bit bytes, 8 scales each). In a
    // half, quarter k (32 values) takes low nibbles from byte l (k even) or l+32 (k odd), low
    // nibble for k < 2 and high nibble otherwise, and its 2 high bits from bit pair k of qh[l].
    for h in 0..2 {
        let (ql, qh, sc, y) = (&ql[h * 64..], &qh[h * 32..], &sc[h * 8..], &mut y[h * 128..]);
        for k in 0..4 {
            for l in 0..32 {
                let byte = ql[l + 32 * (k % 2)];
                let low = if k < 2 { byte & 0x0F } else { byte >> 4 };
                let q = (low | (((qh[l] >> (2 * k)) & 3) << 4)) as i32 - 32;
                let scale = sc[2 * k + l / 16] as i8 as f32;
                y[32 * k + l] = d * scale * q as f32;
            }
        }
    }
}
