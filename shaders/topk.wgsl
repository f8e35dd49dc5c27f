// Row-wise top-k + log-sum-exp (design §3; DDTree §5.1 step 2, SparklingTree candidate union
// §5.2 b): for each row of x [rows, cols],
//   lse = m + ln Σ_j exp(x_j - m),  m = max_j x_j   (lse = m when m is ±inf or NaN)
//   the k largest entries in f32::total_cmp order, ties by the lower id (select.wgsl).
// One workgroup per row. Output per row, (2k + 1) words at row·(2k + 1):
//   [ids: k u32][vals: k f32 bits, the raw logits][lse: f32 bits]
// so the host reads back exactly rows·(2k + 1) numbers.
//
// Precision: the exponentials are f32 `exp` and the sum is two-level (each invocation sums its
// strided elements in blocks of 32, blocks into a running total, then the workgroup
// reduction), so the relative error of Σ is about (32 + cols/(32·WG) + log2 WG) ulp and
// |lse - lse_f64| stays below ~1e-6·(1 + |lse|) plus the adapter's `exp` error. Ids and vals
// are exact (pure integer selection on the bit patterns).
// Subgroup variant: the max / sum reductions and the scans of select.wgsl come from
// reduce_subgroup.wgsl instead of reduce.wgsl.

struct Params {
    rows: u32,
    cols: u32,
    k: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<storage, read_write> scratch: array<u32>;

var<private> row_base: u32;
var<private> out_base: u32;

fn sel_key(i: u32) -> u32 {
    return f32_key(x[row_base + i]);
}

fn sel_emit(rank: u32, key: u32, i: u32) {
    out[out_base + rank] = i;
    out[out_base + p.k + rank] = bitcast<u32>(key_f32(key));
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
    out_base = row * (2u * p.k + 1u);

    // Pass 1: the row max, and the first radix digit. Every invocation starts from element 0,
    // so the max is exact even for ±inf rows.
    var s = sel_begin(lane, p.k);
    var m = x[row_base];
    for (var i = li; i < n; i = i + WG) {
        let v = x[row_base + i];
        m = max(m, v);
        sel_count(s, f32_key(v));
    }
    m = red_max(lane, m);
    s = sel_decide(lane, s);
    // Pass 2: Σ exp(x - m), two-level, and the second digit.
    var sum = 0.0;
    for (var i0 = li; i0 < n; i0 = i0 + 32u * WG) {
        var blk = 0.0;
        for (var j = 0u; j < 32u; j = j + 1u) {
            let i = i0 + j * WG;
            if (i < n) {
                let v = x[row_base + i];
                blk = blk + exp(v - m);
                sel_count(s, f32_key(v));
            }
        }
        sum = sum + blk;
    }
    sum = red_sum(lane, sum);
    s = sel_decide(lane, s);
    if (li == 0u) {
        var lse = m;
        if (abs(m) <= MAX_F32) {
            lse = m + log(sum);
        }
        out[out_base + 2u * p.k] = bitcast<u32>(lse);
    }
    s = sel_run(lane, s, n);
    sel_finish(lane, s, n, p.k, row * 2u * p.k);
}
