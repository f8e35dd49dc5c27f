// Shared prelude of every SparklingTree kernel (prepended by the host, backends/wgpu/src/pipelines.rs).
//
// Dispatch convention: the host folds G workgroups into a 2-D grid (gx, gy) with
// gx, gy <= max_compute_workgroups_per_dimension (65,535 on every WebGPU adapter) and
// gx * gy >= G; a kernel recovers its linear workgroup index with `linear_group` and returns
// (workgroup-uniformly) when it is >= G.
//
// Subgroups: kernels with workgroup reductions (argmax, topk, table_topk, sample) are built
// from reduce.wgsl (shared memory only, always available) or, when the adapter reports
// `wgpu::Features::SUBGROUP`, from reduce_subgroup.wgsl. A subgroup kernel's source starts
// with the per-backend subgroup directive before this prelude (`enable subgroups;` where the
// WGSL compiler requires it, as Chrome does; nothing for naga, which rejects it; platform.md §1).

fn linear_group(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

// Most negative finite f32, used as "minus infinity" for masked scores (WGSL const expressions
// cannot produce an infinity). Written in hex: browsers' WGSL compiler (Tint) rejects the
// decimal 3.40282347e+38 as not representable, although naga rounds it to f32::MAX.
const NEG_BIG: f32 = -0x1.fffffep+127f;
// Largest finite f32 (`abs(v) <= MAX_F32` is false exactly for ±inf and NaN).
const MAX_F32: f32 = 0x1.fffffep+127f;

// Order-preserving u32 key of an f32: unsigned key order == Rust's `f32::total_cmp` (the CPU
// reference's order for top-k), so -0 < +0 and NaNs sort at the ends by sign.
fn f32_key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

// Inverse of `f32_key`.
fn key_f32(k: u32) -> f32 {
    return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
}
