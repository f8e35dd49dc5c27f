// Candidate rows of the Markov W2, transposed (first step of the candidate table, reference
// §5.2 c):  e2t[j, c] = W2[id_c, j]   for j < r, c < n;   W2: [V, r] f32, e2t: [r, n].
// The candidate buffer is [n, id_0, ..., id_{n-1}] (header word n, written by the host or by
// candidate_union.wgsl), so the count is known only on the device: the host dispatches for
// an upper bound n_max·r outputs and invocations at or beyond n·r exit.
// The transposition lets markov_bias.wgsl read consecutive addresses across invocations.
// One invocation per output, 256 per workgroup.

struct Params {
    r: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w2: array<f32>;
@group(0) @binding(2) var<storage, read> cand: array<u32>;
@group(0) @binding(3) var<storage, read_write> e2t: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n = cand[0];
    let idx = linear_group(wid, nwg) * 256u + li;
    if (idx >= n * p.r) {
        return;
    }
    let j = idx / n;
    let c = idx % n;
    e2t[idx] = w2[cand[1u + c] * p.r + j];
}
