// Weight storage prelude: bfloat16 packed two per u32 (element 2i in the low half of word i).
// A bf16 is the top 16 bits of an f32, so unpacking is a shift (exact).
// Layout and functions as in weights_f32.wgsl: Wᵀ[K, stride], stride a multiple of 4.
@group(0) @binding(1) var<storage, read> w: array<u32>;

fn bf16_pair(word: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
}

fn load_w(k: u32, j: u32) -> f32 {
    let e = k * p.stride + j;
    let word = w[e >> 1u];
    return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (e & 1u) == 1u));
}

fn load_w4(k: u32, j: u32) -> vec4<f32> {
    let i = (k * p.stride + j) >> 1u;
    return vec4<f32>(bf16_pair(w[i]), bf16_pair(w[i + 1u]));
}

// Elements k .. k+3 of rows j .. j+3 (k and j multiples of 4): column t is `load_w4(k + t, j)`.
fn load_w16(k: u32, j: u32) -> mat4x4<f32> {
    return mat4x4<f32>(load_w4(k, j), load_w4(k + 1u, j), load_w4(k + 2u, j), load_w4(k + 3u, j));
}
