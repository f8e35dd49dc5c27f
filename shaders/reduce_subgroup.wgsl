// Workgroup-wide reductions and scans built on subgroup operations: the twin of reduce.wgsl
// (same `Lane` struct, same functions, same contract — read that file first), compiled only
// when the adapter reports `wgpu::Features::SUBGROUP` and the host enabled it (WgpuOptions /
// SPARKLING_WGPU_SUBGROUPS). The host prepends the per-backend subgroup prelude
// (`enable subgroups;` where the WGSL compiler requires it, nothing for naga, which rejects it;
// platform.md §1).
//
// Each subgroup reduces with one subgroup operation (no barrier), lane 0 of subgroup `sid`
// stores the subgroup's result in slot `sid`, and after one barrier every invocation combines
// the `nsg` slots serially in slot order. The summation shape is fixed by the adapter's
// subgroup layout, so results are deterministic on one adapter; they differ from
// reduce.wgsl's only by f32 summation order (integer results and max / argmax are identical).
// Subgroup slots are indexed by `@builtin(subgroup_id)`, so no assumption is made about how
// invocations are grouped into subgroups, or about the subgroup size (the host only requires
// subgroup_max_size <= WG). naga implements `subgroup_id` / `num_subgroups` for every native
// backend (HLSL derives them from the lane count); a browser's WGSL compiler additionally needs
// its `subgroup_id` language extension (moot with wgpu 30, whose WebGPU backend exposes no
// subgroups).

struct Lane {
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_invocation_id) sl: u32,
    @builtin(subgroup_id) sid: u32,
    @builtin(num_subgroups) nsg: u32,
}

var<workgroup> red_f: array<f32, WG>;
var<workgroup> red_u: array<u32, WG>;
var<workgroup> red_bf: array<f32, NB * WG>;
var<workgroup> red_bu: array<u32, NB * WG>;
var<workgroup> red_out_f: f32;
var<workgroup> red_out_u: u32;

var<private> bins_f: array<f32, NB>;
var<private> bins_u: array<u32, NB>;

const RED_NONE: u32 = 0xffffffffu;

fn red_max(lane: Lane, v: f32) -> f32 {
    let s = subgroupMax(v);
    if (lane.sl == 0u) {
        red_f[lane.sid] = s;
    }
    workgroupBarrier();
    if (lane.li == 0u) {
        var m = red_f[0];
        for (var j = 1u; j < lane.nsg; j = j + 1u) {
            m = max(m, red_f[j]);
        }
        red_out_f = m;
    }
    return workgroupUniformLoad(&red_out_f);
}

fn red_sum(lane: Lane, v: f32) -> f32 {
    let s = subgroupAdd(v);
    if (lane.sl == 0u) {
        red_f[lane.sid] = s;
    }
    workgroupBarrier();
    if (lane.li == 0u) {
        var m = red_f[0];
        for (var j = 1u; j < lane.nsg; j = j + 1u) {
            m = m + red_f[j];
        }
        red_out_f = m;
    }
    return workgroupUniformLoad(&red_out_f);
}

fn scan_excl_f(lane: Lane, v: f32) -> f32 {
    let e = subgroupExclusiveAdd(v);
    let s = subgroupAdd(v);
    if (lane.sl == 0u) {
        red_f[lane.sid] = s;
    }
    workgroupBarrier();
    var base = 0.0;
    for (var j = 0u; j < lane.sid; j = j + 1u) {
        base = base + red_f[j];
    }
    workgroupBarrier();
    return base + e;
}

fn scan_excl_u(lane: Lane, v: u32) -> u32 {
    let e = subgroupExclusiveAdd(v);
    let s = subgroupAdd(v);
    if (lane.sl == 0u) {
        red_u[lane.sid] = s;
    }
    workgroupBarrier();
    var base = 0u;
    for (var j = 0u; j < lane.sid; j = j + 1u) {
        base = base + red_u[j];
    }
    workgroupBarrier();
    return base + e;
}

fn red_argmax(lane: Lane, v: f32, i: u32) -> u32 {
    // Candidates only: a lane without one offers the most negative value and RED_NONE, and
    // is never chosen by the index minimum below.
    let has = i != RED_NONE;
    let cv = select(NEG_BIG, v, has);
    let m = subgroupMax(cv);
    let ci = subgroupMin(select(RED_NONE, i, has && cv == m));
    if (lane.sl == 0u) {
        red_f[lane.sid] = m;
        red_u[lane.sid] = ci;
    }
    workgroupBarrier();
    if (lane.li == 0u) {
        var bv = 0.0;
        var bi = RED_NONE;
        for (var j = 0u; j < lane.nsg; j = j + 1u) {
            let ov = red_f[j];
            let oi = red_u[j];
            if (oi != RED_NONE && (bi == RED_NONE || ov > bv || (ov == bv && oi < bi))) {
                bv = ov;
                bi = oi;
            }
        }
        red_out_u = bi;
    }
    return workgroupUniformLoad(&red_out_u);
}

fn red_bins(lane: Lane) {
    for (var b = 0u; b < NB; b = b + 1u) {
        let sf = subgroupAdd(bins_f[b]);
        let su = subgroupAdd(bins_u[b]);
        if (lane.sl == 0u) {
            red_bf[b * WG + lane.sid] = sf;
            red_bu[b * WG + lane.sid] = su;
        }
    }
    workgroupBarrier();
    // Invocation b < NB totals bin b over the subgroups, in subgroup order.
    if (lane.li < NB) {
        let b = lane.li;
        var sf = red_bf[b * WG];
        var su = red_bu[b * WG];
        for (var j = 1u; j < lane.nsg; j = j + 1u) {
            sf = sf + red_bf[b * WG + j];
            su = su + red_bu[b * WG + j];
        }
        red_bf[b * WG] = sf;
        red_bu[b * WG] = su;
    }
    workgroupBarrier();
    for (var b = 0u; b < NB; b = b + 1u) {
        bins_f[b] = red_bf[b * WG];
        bins_u[b] = red_bu[b * WG];
    }
    workgroupBarrier();
}
