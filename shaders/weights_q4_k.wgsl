// Q4_K (after weights_quant.wgsl): 256 values per block; payload = 12 bytes packing eight 6-bit
// (scale, min) pairs, then 128 nibble bytes; f16 d and dmin. Value i is in chunk c = i / 64:
// byte 32c + i % 32 of the nibbles, low nibble for i % 64 < 32 (sub-block 2c), high otherwise
// (sub-block 2c + 1); x = (d * scale) * q - dmin * min.
fn load_w4(k: u32, j: u32) -> vec4<f32> {
    let kb = k / 256u;
    let i = k % 256u;
    let c = i / 64u;
    let l = i % 64u;
    let s = 2u * c + l / 32u;
    let q = (q_byte4(kb, 12u + 32u * c + l % 32u, j) >> vec4<u32>((l / 32u) * 4u)) & vec4<u32>(15u);
    let dm = q4k_scale_min(kb, s, j);
    let d1 = dm[0];
    let m1 = dm[1];
    return d1 * vec4<f32>(q) - m1;
}

// Values k .. k+3 (k a multiple of 4: one sub-block, so one scale and min, and one nibble word)
// of rows j .. j+3.
fn load_w16(k: u32, j: u32) -> mat4x4<f32> {
    let kb = k / 256u;
    let i = k % 256u;
    let c = i / 64u;
    let l = i % 64u;
    let s = 2u * c + l / 32u;
    let q = q_fields4(q_word4(kb, 3u + 8u * c + (l % 32u) / 4u, j), (l / 32u) * 4u, 4u);
    let dm = q4k_scale_min(kb, s, j);
    let d1 = dm[0];
    let m1 = dm[1];
    var r: mat4x4<f32>;
    for (var t = 0u; t < 4u; t++) {
        r[t] = d1 * vec4<f32>(q[t]) - m1;
    }
    return r;
}

// Sub-block s's effective scale and min for rows j .. j+3: column 0 d·scale, column 1
// dmin·min (the 6-bit pair unpacked as ggml's get_scale_min_k4).
fn q4k_scale_min(kb: u32, s: u32, j: u32) -> mat2x4<f32> {
    var sc: vec4<u32>;
    var mn: vec4<u32>;
    if (s < 4u) {
        sc = q_byte4(kb, s, j) & vec4<u32>(63u);
        mn = q_byte4(kb, s + 4u, j) & vec4<u32>(63u);
    } else {
        let hi = q_byte4(kb, s + 4u, j);
        sc = (hi & vec4<u32>(15u)) | ((q_byte4(kb, s - 4u, j) >> vec4<u32>(6u)) << vec4<u32>(4u));
        mn = (hi >> vec4<u32>(4u)) | ((q_byte4(kb, s, j) >> vec4<u32>(6u)) << vec4<u32>(4u));
    }
    let dm = q_pairs4(kb, j);
    let d1 = dm[0] * vec4<f32>(sc);
    let m1 = dm[1] * vec4<f32>(mn);
    return mat2x4<f32>(d1, m1);
}
