// Row-wise sampling from softmax(logits / T) restricted by top-k / top-p, by inverse CDF over
// the kept tokens in ascending id order with a host-given uniform per row: the CPU backend's
// `sample_row` (backends/cpu/src/kernels.rs) in f32. One workgroup per row.
//
//   m = max_j x_j;  q_j = exp((x_j - m) · inv_t)               (f32; CPU: f64)
//   kept: the order is x descending, ties by the lower id (f32::total_cmp); element e at rank
//     r with mass_before(e) = Σ q over elements before it is kept iff
//     r == 0, or r < K and mass_before(e) < top_p · Σ_j q_j.
//     (use_filter == 0: every token is kept.)
//   goal = u · Σ_{kept} q; the draw is the first kept id (ascending) with q > 0 whose
//     running CDF exceeds goal, else the last kept id with q > 0; 0 for a row whose max is
//     not finite (what the CPU reference returns there).
//
// The kept set is found without sorting: an 8-pass radix descent over the f32 keys, 4 bits
// per pass, with per-bin counts and masses (red_bins); at each pass the chosen bin is the
// lowest one whose first element (in the order) is still kept. The result is the key `thr` of
// the last kept element, the rank and mass of everything above it, and how many of the
// elements equal to `thr` are kept (lowest ids first).
//
// Precision (WGSL has no f64): each invocation owns a contiguous chunk of ids and sums its kept
// q in two levels (blocks of 32 ids, then blocks into a running total); chunk sums are combined
// by an exclusive workgroup scan (reduce*.wgsl). The running CDF at id i is
// chunk_base + (blocks_so_far + block_partial), monotone in i and equal to the scan's inclusive
// value at the chunk end, so the walk always lands in the chunk the scan chose. The CDF's
// relative error is about (32 + chunk/32 + 2·log2 WG) ulp ≈ 4e-6 at 152k ids, plus the f32
// `exp` (a few ulp·|argument|) — so a draw can differ from the CPU's only when u lies within
// ~1e-5 (relative) of a CDF boundary, or top_p within ~1e-5 of a cumulative-mass boundary.

struct Params {
    rows: u32,
    cols: u32,
    inv_t: f32,
    top_k: u32,
    top_p: f32,
    use_filter: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> uni: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

const NONE: u32 = 0xffffffffu;

var<private> row_base: u32;
var<private> row_max: f32;
var<private> thr: u32;
var<private> n_ties: u32;
var<private> filtered: bool;

var<workgroup> smp_best: atomic<u32>;
var<workgroup> smp_last: atomic<u32>;
var<workgroup> smp_word: u32;

// Tempered, max-shifted probability weight of element i.
fn prob(i: u32) -> f32 {
    return exp((x[row_base + i] - row_max) * p.inv_t);
}

struct Chunk {
    sum: f32,
    last: u32,
    hit: u32,
}

// One pass over ids lo..hi (ascending) of the kept elements with q > 0: their two-level sum,
// the last such id, and (walk) the first id whose running CDF base + sum-so-far > goal.
// `tie0`: ties (key == thr) before lo, for the lowest-ids-first rule.
fn chunk_pass(lo: u32, hi: u32, tie0: u32, base: f32, goal: f32, walk: bool) -> Chunk {
    var s_hi = 0.0;
    var s_lo = 0.0;
    var tie = tie0;
    var last = NONE;
    var hit = NONE;
    for (var i = lo; i < hi; i = i + 1u) {
        var keep = true;
        if (filtered) {
            let key = f32_key(x[row_base + i]);
            keep = key > thr || (key == thr && tie < n_ties);
            if (key == thr) {
                tie = tie + 1u;
            }
        }
        if (keep) {
            let q = prob(i);
            if (q > 0.0) {
                s_lo = s_lo + q;
                last = i;
                if (walk && base + (s_hi + s_lo) > goal) {
                    hit = i;
                    break;
                }
            }
        }
        if ((i - lo) % 32u == 31u) {
            s_hi = s_hi + s_lo;
            s_lo = 0.0;
        }
    }
    return Chunk(s_hi + s_lo, last, hit);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, lane: Lane) {
    let row = linear_group(wid, nwg);
    if (row >= p.rows) {
        return;
    }
    let li = lane.li;
    let n = p.cols;
    row_base = row * n;

    var m = x[row_base];
    for (var i = li; i < n; i = i + WG) {
        m = max(m, x[row_base + i]);
    }
    m = red_max(lane, m);
    if (!(abs(m) <= MAX_F32)) {
        if (li == 0u) {
            out[row] = 0u;
        }
        return;
    }
    row_max = m;
    filtered = p.use_filter != 0u;
    thr = 0u;
    n_ties = 0u;
    var all_ties = 1u;

    if (p.use_filter != 0u) {
        // Total mass, two-level per invocation.
        var s = 0.0;
        for (var i0 = li; i0 < n; i0 = i0 + 32u * WG) {
            var blk = 0.0;
            for (var j = 0u; j < 32u; j = j + 1u) {
                let i = i0 + j * WG;
                if (i < n) {
                    blk = blk + prob(i);
                }
            }
            s = s + blk;
        }
        let ps = p.top_p * red_sum(lane, s);
        var prefix = 0u;
        var cnt_above = 0u;
        var mass_above = 0.0;
        var tie_total = 0u;
        for (var dg = 0u; dg < 8u; dg = dg + 1u) {
            let shift = 28u - 4u * dg;
            var mask = 0u;
            if (dg > 0u) {
                mask = 0xffffffffu << (shift + 4u);
            }
            for (var b = 0u; b < NB; b = b + 1u) {
                bins_f[b] = 0.0;
                bins_u[b] = 0u;
            }
            for (var i = li; i < n; i = i + WG) {
                let key = f32_key(x[row_base + i]);
                if ((key & mask) == prefix) {
                    let b = (key >> shift) & 15u;
                    bins_u[b] = bins_u[b] + 1u;
                    bins_f[b] = bins_f[b] + prob(i);
                }
            }
            red_bins(lane);
            // Every invocation holds the same totals and takes the same decision.
            var ca = cnt_above;
            var ma = mass_above;
            var chosen = 0u;
            for (var bb = 0u; bb < 16u; bb = bb + 1u) {
                let b = 15u - bb;
                let c = bins_u[b];
                if (c == 0u) {
                    continue;
                }
                if (!(ca == 0u || (ca < p.top_k && ma < ps))) {
                    break;
                }
                chosen = b;
                cnt_above = ca;
                mass_above = ma;
                tie_total = c;
                ca = ca + c;
                ma = ma + bins_f[b];
            }
            prefix = prefix | (chosen << shift);
        }
        thr = prefix;
        // Ties of thr (equal q): the j-th (j ≥ 1) is kept iff its rank < K and the mass
        // before it < ps.
        let q_tie = exp((key_f32(thr) - row_max) * p.inv_t);
        let lim = min(tie_total, p.top_k - cnt_above);
        var nt = 1u;
        while (nt < lim && mass_above + f32(nt) * q_tie < ps) {
            nt = nt + 1u;
        }
        n_ties = nt;
        if (li == 0u) {
            smp_word = select(0u, 1u, nt == tie_total);
        }
        all_ties = workgroupUniformLoad(&smp_word);
    }

    let chunk = (n + WG - 1u) / WG;
    let lo = min(n, li * chunk);
    let hi = min(n, lo + chunk);
    var tie0 = 0u;
    if (all_ties == 0u) {
        var c = 0u;
        for (var i = lo; i < hi; i = i + 1u) {
            if (f32_key(x[row_base + i]) == thr) {
                c = c + 1u;
            }
        }
        tie0 = scan_excl_u(lane, c);
    }
    let r = chunk_pass(lo, hi, tie0, 0.0, 0.0, false);
    let excl = scan_excl_f(lane, r.sum);
    let incl = excl + r.sum;
    let total = red_sum(lane, r.sum);
    let goal = uni[row] * total;
    if (li == 0u) {
        atomicStore(&smp_best, NONE);
        atomicStore(&smp_last, 0u);
    }
    workgroupBarrier();
    if (r.sum > 0.0 && incl > goal) {
        atomicMin(&smp_best, li);
    }
    if (r.last != NONE) {
        atomicMax(&smp_last, r.last + 1u);
    }
    workgroupBarrier();
    if (li == 0u) {
        smp_word = atomicLoad(&smp_best);
    }
    let best = workgroupUniformLoad(&smp_word);
    if (best == NONE) {
        if (li == 0u) {
            let l = atomicLoad(&smp_last);
            out[row] = select(l - 1u, 0u, l == 0u);
        }
    } else if (li == best) {
        let w = chunk_pass(lo, hi, tie0, excl, goal, true);
        out[row] = select(r.last, w.hit, w.hit != NONE);
    }
}
