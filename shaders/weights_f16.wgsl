// Weight storage prelude: IEEE half floats packed two per u32 (element 2i in the low half of
// word i, element 2i+1 in the high half), unpacked in-shader with the core builtin
// `unpack2x16float` (no `enable f16;` needed, so it runs on adapters without SHADER_F16).
// Layout and functions as in weights_f32.wgsl: Wᵀ[K, stride], stride a multiple of 4.
@group(0) @binding(1) var<storage, read> w: array<u32>;

fn load_w(k: u32, j: u32) -> f32 {
    let e = k * p.stride + j;
    let pair = unpack2x16float(w[e >> 1u]);
    return select(pair.x, pair.y, (e & 1u) == 1u);
}

fn load_w4(k: u32, j: u32) -> vec4<f32> {
    let i = (k * p.stride + j) >> 1u;
    return vec4<f32>(unpack2x16float(w[i]), unpack2x16float(w[i + 1u]));
}

// Elements k .. k+3 of rows j .. j+3 (k and j multiples of 4): column t is `load_w4(k + t, j)`.
fn load_w16(k: u32, j: u32) -> mat4x4<f32> {
    return mat4x4<f32>(load_w4(k, j), load_w4(k + 1u, j), load_w4(k + 2u, j), load_w4(k + 3u, j));
}
