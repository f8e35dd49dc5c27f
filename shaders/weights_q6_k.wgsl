// Q6_K (after weights_quant.wgsl): 256 values per block; payload = ql (128 bytes of low
// nibbles), qh (64 bytes of 2-bit high parts), sixteen signed 8-bit scales; one f16 d. In half
// h = i / 128, quarter t = (i % 128) / 32, lane l = i % 32: the low nibble of ql byte
// 64h + l + 32(t % 2) (t < 2) or its high nibble (t ≥ 2), the 2 high bits from bit pair t of
// qh byte 32h + l, scale 8h + 2t + l / 16; x = (d * scale) * (q - 32).
fn load_w4(k: u32, j: u32) -> vec4<f32> {
    let kb = k / 256u;
    let i = k % 256u;
    let h = i / 128u;
    let t = (i % 128u) / 32u;
    let l = i % 32u;
    let b = q_byte4(kb, 64u * h + l + 32u * (t % 2u), j);
    let low = select(b & vec4<u32>(15u), b >> vec4<u32>(4u), t >= 2u);
    let hi = (q_byte4(kb, 128u + 32u * h + l, j) >> vec4<u32>(2u * t)) & vec4<u32>(3u);
    let q = vec4<i32>(low | (hi << vec4<u32>(4u))) - vec4<i32>(32);
    return q6k_scale(kb, h, t, l, j) * vec4<f32>(q);
}

// Values k .. k+3 (k a multiple of 4: one scale, one ql word, one qh word) of rows j .. j+3.
fn load_w16(k: u32, j: u32) -> mat4x4<f32> {
    let kb = k / 256u;
    let i = k % 256u;
    let h = i / 128u;
    let t = (i % 128u) / 32u;
    let l = i % 32u;
    let low = q_fields4(q_word4(kb, (64u * h + l + 32u * (t % 2u)) / 4u, j), select(0u, 4u, t >= 2u), 4u);
    let hi = q_fields4(q_word4(kb, (128u + 32u * h + l) / 4u, j), 2u * t, 2u);
    let ds = q6k_scale(kb, h, t, l, j);
    var r: mat4x4<f32>;
    for (var u = 0u; u < 4u; u++) {
        r[u] = ds * vec4<f32>(vec4<i32>(low[u] | (hi[u] << vec4<u32>(4u))) - vec4<i32>(32));
    }
    return r;
}

// d·scale of value (h, t, l) of super-block kb for rows j .. j+3 (signed 8-bit scale 8h + 2t + l/16).
fn q6k_scale(kb: u32, h: u32, t: u32, l: u32, j: u32) -> vec4<f32> {
    return q_half4(kb, 0u, j) * vec4<f32>(sext8(q_byte4(kb, 192u + 8u * h + 2u * t + l / 16u, j)));
}
