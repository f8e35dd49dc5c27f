// Q4_0 (after weights_quant.wgsl): 32 values per block, payload = 16 bytes, value i in the low
// nibble of byte i (i < 16) or the high nibble of byte i - 16; one f16 d; x = (q - 8) * d.
fn load_w4(k: u32, j: u32) -> vec4<f32> {
    let kb = k / 32u;
    let i = k % 32u;
    let q = (q_byte4(kb, i % 16u, j) >> vec4<u32>((i / 16u) * 4u)) & vec4<u32>(15u);
    return vec4<f32>(vec4<i32>(q) - vec4<i32>(8)) * q_half4(kb, 0u, j);
}
