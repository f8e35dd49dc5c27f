// Q4_1 (after weights_quant.wgsl): nibbles as Q4_0, f16 d and m; x = d * q + m.
fn load_w4(k: u32, j: u32) -> vec4<f32> {
    let kb = k / 32u;
    let i = k % 32u;
    let q = (q_byte4(kb, i % 16u, j) >> vec4<u32>((i / 16u) * 4u)) & vec4<u32>(15u);
    let dm = q_pairs4(kb, j);
    return dm[0] * vec4<f32>(q) + dm[1];
}
