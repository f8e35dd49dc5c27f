// Weight storage prelude: bfloat16 packed two per u32 (element 2i in the low half of word i).
// A bf16 is the top 16 bits of an f32, so unpacking is a shift (exact).
@group(0) @binding(1) var<storage, read> w: array<u32>;

fn load_w(e: u32) -> f32 {
    let word = w[e >> 1u];
    return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (e & 1u) == 1u));
}
