// Shared prelude of every SparklingTree kernel (prepended by the host, backends/wgpu/src/pipelines.rs).
//
// Dispatch convention: the host folds G workgroups into a 2-D grid (gx, gy) with
// gx, gy <= max_compute_workgroups_per_dimension (65,535 on every WebGPU adapter) and
// gx * gy >= G; a kernel recovers its linear workgroup index with `linear_group` and returns
// (workgroup-uniformly) when it is >= G.
//
// Subgroups: none of these kernels use subgroup operations. A subgroup variant would get its
// own prelude line (`enable subgroups;` for browsers, nothing for naga, platform.md §1) and
// would replace the shared-memory tree reductions in rms_norm / attention / argmax.

fn linear_group(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

// Most negative finite f32, used as "minus infinity" for masked scores (WGSL const expressions
// cannot produce an infinity).
const NEG_BIG: f32 = -3.40282347e+38;
