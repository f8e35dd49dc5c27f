// Weight storage prelude: f32. A weight chunk is stored transposed and column-padded,
// Wᵀ[K, stride] with stride = nc rounded up to a multiple of 4 (padding is zero), and bound at
// binding 1 as vec4s. `load_w(e)` returns element e; `load_w4(e)` the 4 consecutive elements
// e .. e+3 (e a multiple of 4).
@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;

fn load_w(e: u32) -> f32 {
    return w[e >> 2u][e & 3u];
}

fn load_w4(e: u32) -> vec4<f32> {
    return w[e >> 2u];
}
