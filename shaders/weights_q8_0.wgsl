// Q8_0 (after weights_quant.wgsl): 32 values per block, payload = 32 signed bytes, one f16 d;
// x = q * d.
fn load_w4(k: u32, j: u32) -> vec4<f32> {
    let kb = k / 32u;
    let q = sext8(q_byte4(kb, k % 32u, j));
    return vec4<f32>(q) * q_half4(kb, 0u, j);
}
