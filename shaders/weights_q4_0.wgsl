// Q4_0 (after weights_quant.wgsl): 32 values per block, payload = 16 bytes, value i in the low
// nibble of byte i (i < 16) or the high nibble of byte i - 16; one f16 d; x = (q - 8) * d.
fn load_w4(k: u32, j: u32) -> vec4<f32> {
    let kb = k / 32u;
    let i = k % 32u;
    let q = (q_byte4(kb, i % 16u, j) >> vec4<u32>((i / 16u) * 4u)) & vec4<u32>(15u);
    return vec4<f32>(vec4<i32>(q) - vec4<i32>(8)) * q_half4(kb, 0u, j);
}

// Values k .. k+3 (k a multiple of 4: the same nibble of one payload word) of rows j .. j+3.
fn load_w16(k: u32, j: u32) -> mat4x4<f32> {
    let kb = k / 32u;
    let i = k % 32u;
    let q = q_fields4(q_word4(kb, (i % 16u) / 4u, j), (i / 16u) * 4u, 4u);
    let d = q_half4(kb, 0u, j);
    var r: mat4x4<f32>;
    for (var t = 0u; t < 4u; t++) {
        r[t] = vec4<f32>(vec4<i32>(q[t]) - vec4<i32>(8)) * d;
    }
    return r;
}
