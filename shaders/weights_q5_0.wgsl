// Q5_0 (after weights_quant.wgsl): payload = the 32-bit mask of fifth bits (bit i for value i),
// then 16 nibble bytes as Q4_0; one f16 d; x = d * (q - 16).
fn load_w4(k: u32, j: u32) -> vec4<f32> {
    let kb = k / 32u;
    let i = k % 32u;
    let hb = (q_word4(kb, 0u, j) >> vec4<u32>(i)) & vec4<u32>(1u);
    let lo = (q_byte4(kb, 4u + i % 16u, j) >> vec4<u32>((i / 16u) * 4u)) & vec4<u32>(15u);
    let q = vec4<i32>(lo | (hb << vec4<u32>(4u))) - vec4<i32>(16);
    return q_half4(kb, 0u, j) * vec4<f32>(q);
}
