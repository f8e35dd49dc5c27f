// Markov bias over the candidate union (DSpark §3.6, reference §5.2 c), for a chunk of parent
// slots p0 .. p0 + pc:
//   bias[pl, c] = Σ_{j < r} W1[id_{p0 + pl}, j] · W2[id_c, j]      (pl < pc, c < n)
// accumulated sequentially over j = 0..r in f32 (the CPU reference's order; the adapter may
// fuse the multiply-add, so results agree within a few ulp of Σ|W1·W2|). W1: [V, r] f32;
// W2 arrives as e2t [r, n] (markov_gather.wgsl), so invocations read consecutive addresses.
// The candidate buffer is [n, id_0, ..., id_{n-1}] (header word n); the host sizes the grid
// and the chunk for an upper bound n_max ≥ n, so rows at or beyond n (and chunks starting
// there) exit; strides use the actual n.
// A workgroup covers 64 consecutive candidates c × PB parents (each W1 value is read once per
// workgroup row and reused across the 64 candidates; each e2t value feeds PB outputs).
// Grid: at least ceil(rows / PB) × ceil(n / 64) workgroups, linearised and decoded with
// col_groups = ceil(n / 64) from the actual n (indirect grids are exactly that; host grids
// sized for n_max are larger and their extra workgroups exit).

const PB: u32 = 4u;

struct Params {
    r: u32,
    p0: u32,
    pc: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w1: array<f32>;
@group(0) @binding(2) var<storage, read> e2t: array<f32>;
@group(0) @binding(3) var<storage, read> cand: array<u32>;
@group(0) @binding(4) var<storage, read_write> bias: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n = cand[0];
    let g = linear_group(wid, nwg);
    // Candidate groups per parent block, from the actual n (the grid is ceil(rows/4)·this).
    let col_groups = (n + 63u) / 64u;
    let pb = g / col_groups;
    let c = (g % col_groups) * 64u + li;
    let pl0 = pb * PB;
    // Parents of this chunk that exist (p0 + pc may pass n when pc was sized for n_max).
    let pc = min(p.pc, max(n, p.p0) - p.p0);
    if (pl0 >= pc || c >= n) {
        return;
    }
    let rows = min(PB, pc - pl0);
    var a: array<u32, PB>;
    for (var q = 0u; q < PB; q = q + 1u) {
        a[q] = cand[1u + p.p0 + pl0 + min(q, rows - 1u)] * p.r;
    }
    var acc = array<f32, PB>(0.0, 0.0, 0.0, 0.0);
    for (var j = 0u; j < p.r; j = j + 1u) {
        let e = e2t[j * n + c];
        for (var q = 0u; q < PB; q = q + 1u) {
            acc[q] = acc[q] + w1[a[q] + j] * e;
        }
    }
    for (var q = 0u; q < rows; q = q + 1u) {
        bias[(pl0 + q) * n + c] = acc[q];
    }
}
