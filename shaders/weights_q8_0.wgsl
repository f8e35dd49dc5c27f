// Q8_0 (after weights_quant.wgsl): 32 values per block, payload = 32 signed bytes, one f16 d;
// x = q * d.
fn load_w4(k: u32, j: u32) -> vec4<f32> {
    let kb = k / 32u;
    let q = sext8(q_byte4(kb, k % 32u, j));
    return vec4<f32>(q) * q_half4(kb, 0u, j);
}

// Values k .. k+3 (k a multiple of 4: one payload word) of rows j .. j+3, as load_w4's.
fn load_w16(k: u32, j: u32) -> mat4x4<f32> {
    let kb = k / 32u;
    let wd = q_word4(kb, (k % 32u) / 4u, j);
    let d = q_half4(kb, 0u, j);
    return mat4x4<f32>(
        vec4<f32>(sext8(wd)) * d,
        vec4<f32>(sext8(wd >> vec4<u32>(8u))) * d,
        vec4<f32>(sext8(wd >> vec4<u32>(16u))) * d,
        vec4<f32>(sext8(wd >> vec4<u32>(24u))) * d,
    );
}
