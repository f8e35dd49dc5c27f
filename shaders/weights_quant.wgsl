// Weight storage prelude for GGUF blocks kept quantized: the helpers every quantized format's
// prelude (weights_q8_0.wgsl, weights_q4_k.wgsl, …) builds its `load_w4` on. The host prepends
// the format's constants QK (values per block), QW (payload words per block) and QH (f16
// scales per block); the layout of a chunk (backends/wgpu/src/quant.rs) is
// - payload word wi of block kb of chunk row j at (kb * QW + wi) * stride + j,
// - then, from word (K / QK) * QW * stride, f16 scale h of block kb of row j as half
//   (kb * stride + j) * QH + h, two per word, the even one in the low 16 bits.
// Each value is dequantized in registers to f32 with the products of the loader's reference
// (src/loader/gguf/dequant.rs, ggml's order) and fed to the kernel's f32 fma chain.
// `load_w(k, j)` / `load_w4(k, j)` are the functions of weights_f32.wgsl (element k of chunk
// row j; of rows j .. j+3 for j a multiple of 4); the including kernel's uniform `p` has the
// chunk's `stride` and the full `k`.
@group(0) @binding(1) var<storage, read> w: array<u32>;

// Payload word wi of block kb for chunk rows j .. j+3.
fn q_word4(kb: u32, wi: u32, j: u32) -> vec4<u32> {
    let o = (kb * QW + wi) * p.stride + j;
    return vec4<u32>(w[o], w[o + 1u], w[o + 2u], w[o + 3u]);
}

// Payload byte b of block kb for rows j .. j+3.
fn q_byte4(kb: u32, b: u32, j: u32) -> vec4<u32> {
    return (q_word4(kb, b >> 2u, j) >> vec4<u32>((b & 3u) * 8u)) & vec4<u32>(255u);
}

// f16 scale h of block kb for rows j .. j+3 (j a multiple of 4, so with QH = 1 the four
// halves are two whole words, with QH = 2 one word per row holds both scales).
fn q_half4(kb: u32, h: u32, j: u32) -> vec4<f32> {
    let base = (p.k / QK) * QW * p.stride;
    if (QH == 1u) {
        let o = base + ((kb * p.stride + j) >> 1u);
        return vec4<f32>(unpack2x16float(w[o]), unpack2x16float(w[o + 1u]));
    }
    let pairs = q_pairs4(kb, j);
    return select(pairs[0], pairs[1], h == 1u);
}

// Both f16 scales of block kb (QH = 2: d and m, or d and dmin) for rows j .. j+3: column 0 the
// first scale of each row, column 1 the second.
fn q_pairs4(kb: u32, j: u32) -> mat2x4<f32> {
    let o = (p.k / QK) * QW * p.stride + kb * p.stride + j;
    let a = unpack2x16float(w[o]);
    let b = unpack2x16float(w[o + 1u]);
    let c = unpack2x16float(w[o + 2u]);
    let d = unpack2x16float(w[o + 3u]);
    return mat2x4<f32>(vec4<f32>(a.x, b.x, c.x, d.x), vec4<f32>(a.y, b.y, c.y, d.y));
}

// The low 8 bits of each lane as a signed byte.
fn sext8(v: vec4<u32>) -> vec4<i32> {
    return bitcast<vec4<i32>>(v << vec4<u32>(24u)) >> vec4<u32>(24u);
}

fn load_w(k: u32, j: u32) -> f32 {
    return load_w4(k, j & ~3u)[j & 3u];
}

// The four bit fields of width `bits` at bit offsets shift, shift + 8, shift + 16, shift + 24 of
// each lane: one byte's field per value t, for rows j .. j+3 (lane) — column t of the result
// holds value t of the four rows.
fn q_fields4(wd: vec4<u32>, shift: u32, bits: u32) -> array<vec4<u32>, 4> {
    let m = vec4<u32>((1u << bits) - 1u);
    return array<vec4<u32>, 4>(
        (wd >> vec4<u32>(shift)) & m,
        (wd >> vec4<u32>(shift + 8u)) & m,
        (wd >> vec4<u32>(shift + 16u)) & m,
        (wd >> vec4<u32>(shift + 24u)) & m,
    );
}
