// Weight storage prelude: f32. A weight chunk is stored transposed and column-padded,
// Wᵀ[K, stride] with stride = nc rounded up to a multiple of 4 (padding is zero), and bound at
// binding 1 as vec4s. `load_w(k, j)` returns element k of chunk row j (weight row n0 + j);
// `load_w4(k, j)` element k of the 4 rows j .. j+3 (j a multiple of 4). The including kernel's
// uniform `p` has the chunk's `stride`.
@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;

fn load_w(k: u32, j: u32) -> f32 {
    let e = k * p.stride + j;
    return w[e >> 2u][e & 3u];
}

fn load_w4(k: u32, j: u32) -> vec4<f32> {
    return w[(k * p.stride + j) >> 2u];
}

// Elements k .. k+3 of rows j .. j+3 (k and j multiples of 4): column t is `load_w4(k + t, j)`.
fn load_w16(k: u32, j: u32) -> mat4x4<f32> {
    return mat4x4<f32>(load_w4(k, j), load_w4(k + 1u, j), load_w4(k + 2u, j), load_w4(k + 3u, j));
}
