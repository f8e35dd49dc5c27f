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

// Values k .. k+3 (k a multiple of 4: one nibble word, four bits of the mask) of rows j .. j+3.
fn load_w16(k: u32, j: u32) -> mat4x4<f32> {
    let kb = k / 32u;
    let i = k % 32u;
    let mask = q_word4(kb, 0u, j);
    let lo = q_fields4(q_word4(kb, 1u + (i % 16u) / 4u, j), (i / 16u) * 4u, 4u);
    let d = q_half4(kb, 0u, j);
    var r: mat4x4<f32>;
    for (var t = 0u; t < 4u; t++) {
        let hb = (mask >> vec4<u32>(i + t)) & vec4<u32>(1u);
        r[t] = d * vec4<f32>(vec4<i32>(lo[t] | (hb << vec4<u32>(4u))) - vec4<i32>(16));
    }
    return r;
}
