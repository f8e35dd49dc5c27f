// Q4_1 (after weights_quant.wgsl): nibbles as Q4_0, f16 d and m; x = d * q + m.
fn load_w4(k: u32, j: u32) -> vec4<f32> {
    let kb = k / 32u;
    let i = k % 32u;
    let q = (q_byte4(kb, i % 16u, j) >> vec4<u32>((i / 16u) * 4u)) & vec4<u32>(15u);
    let dm = q_pairs4(kb, j);
    return dm[0] * vec4<f32>(q) + dm[1];
}

// Values k .. k+3 (k a multiple of 4: the same nibble of one payload word) of rows j .. j+3.
fn load_w16(k: u32, j: u32) -> mat4x4<f32> {
    let kb = k / 32u;
    let i = k % 32u;
    let q = q_fields4(q_word4(kb, (i % 16u) / 4u, j), (i / 16u) * 4u, 4u);
    let dm = q_pairs4(kb, j);
    var r: mat4x4<f32>;
    for (var t = 0u; t < 4u; t++) {
        r[t] = dm[0] * vec4<f32>(q[t]) + dm[1];
    }
    return r;
}
