//! SparklingTree precompute form (reference §5.2 c): the candidate-union transition table
//! `[Ld, n, k]` built in one pass, and the best-first heap over it. This is the GPU-shaped
//! layout (one batched kernel, one packed transfer); the CPU engine uses the lazy builder of
//! `sparkling_lazy.rs`, which yields the same tree.

use super::sparkling::{check_inputs, MarkovHead};
use super::{exp_nonpos, log_prob, log_sum_exp, row_max, topk_desc, CandidateTable, DraftTree, Heap};

/// Build the SparklingTree precompute table (§5.2 (c), the expensive part).
///
/// - `base`: `U`, `[ld, vocab]` row-major f32 (finite); `markov`: optional head (`None` =
///   zero bias); `anchor`: root token `< vocab`.
/// - `c`: per-depth top-C of `U` taken into the candidate union (`c >= vocab` → the whole
///   vocabulary, which makes the builder reproduce [`build_sparkling_reference`] exactly);
/// - `k`: children kept per (depth, parent), clamped to the union size `n` (a tree of
///   `budget` nodes with at most `max_fanout` children per node needs
///   `min(max_fanout, budget)`).
///
/// Method (with a head): gather `W1[cand]`, `W2[cand]`; compute the dense `[n, n]` bias in
/// blocks of 4 parent rows (register-tiled, sequential-over-rank accumulation, bit-identical
/// to [`MarkovHead::bias_at`]); the normaliser of row (d, p) is factorised as
/// `mu_d + mb_p + ln sum_c exp(U[d,c] - mu_d) exp(bias[p,c] - mb_p)` (an f64 dot product;
/// n² + ld·n exponentials instead of ld·n², with an exact per-row fallback when the sum is
/// tiny), and the top-k of each row is an exact buffered partial selection that visits
/// candidates in descending `U[d,·]` and stops once `U[d,c] + max_c bias[p,c]` cannot reach the
/// current k-th value.
/// Values therefore match a direct per-row log-softmax to f32 rounding (~1e-7), not bit for
/// bit. Without a head every parent row equals the depth's log-softmax over the union (computed
/// once per depth). Cost O(n²·r + ld·n² ) multiply-adds, O(ld·n·k + n·r + ld·n) memory
/// (n ≈ ld·C when depths disagree). With `k == 0` or `ld == 0` the table is empty.
///
///
/// # Panics
/// Only on precondition violations: `base.len() < ld*vocab`, `anchor >= vocab`, or a
/// head whose `vocab`/weights do not match.
pub fn candidate_table(base: &[f32], ld: usize, vocab: usize, markov: Option<&MarkovHead>, anchor: u32, c: usize, k: usize) -> CandidateTable {
    check_inputs(base, ld, vocab, markov, anchor);
    if vocab == 0 {
        return CandidateTable { ld, ..Default::default() };
    }
    let cand = candidate_union(base, ld, vocab, anchor, c);
    let n = cand.len();
    let k = k.min(n);
    let mut table = CandidateTable { cand, ld, k, vals: Vec::new(), slots: Vec::new() };
    if k == 0 || ld == 0 {
        return table;
    }
    let cand = &table.cand;
    let mut vals = vec![0.0f32; ld * n * k];
    let mut slots = vec![0u32; ld * n * k];
    // U[:, cand]
    let mut ub = vec![0.0f32; ld * n];
    for d in 0..ld {
        let row = &base[d * vocab..(d + 1) * vocab];
        for (o, &t) in ub[d * n..(d + 1) * n].iter_mut().zip(cand) {
            *o = row[t as usize];
        }
    }
    let mut sel = Vec::with_capacity(k);
    match markov {
        None => {
            // Zero bias: every parent row of depth d equals log_softmax(U[d, cand]).
            for d in 0..ld {
                let z = &ub[d * n..(d + 1) * n];
                let lse = log_sum_exp(z);
                topk_desc(z, k, &mut sel);
                let o0 = d * n * k;
                for (j, &(v, s)) in sel.iter().enumerate() {
                    vals[o0 + j] = log_prob(v, lse);
                    slots[o0 + j] = s;
                }
                for p in 1..n {
                    vals.copy_within(o0..o0 + k, o0 + p * k);
                    slots.copy_within(o0..o0 + k, o0 + p * k);
                }
            }
        }
        Some(m) => markov_table(m, cand, &ub, ld, k, &mut vals, &mut slots),
    }
    table.vals = vals;
    table.slots = slots;
    table
}

/// The SparklingTree candidate set (§5.2 b/c): the union of each depth's top-`c` tokens of
/// `base` (`[ld, vocab]`) plus the anchor, sorted ascending; `c >= vocab` → every token.
pub fn candidate_union(base: &[f32], ld: usize, vocab: usize, anchor: u32, c: usize) -> Vec<u32> {
    let cc = c.min(vocab);
    if cc == vocab {
        return (0..vocab as u32).collect();
    }
    let mut u = Vec::with_capacity(ld * cc + 1);
    let mut sel = Vec::with_capacity(cc);
    for d in 0..ld {
        topk_desc(&base[d * vocab..(d + 1) * vocab], cc, &mut sel);
        u.extend(sel.iter().map(|&(_, id)| id));
    }
    u.push(anchor);
    u.sort_unstable();
    u.dedup();
    u
}

/// Markov case of [`candidate_table`].
///
/// Normaliser: `logsumexp_c(U[d,c] + bias[p,c]) = mu_d + mb_p + ln S[d,p]` with
/// `S[d,p] = sum_c G[d,c] E[p,c]`, `G = exp(U[d,·] - mu_d)`, `E = exp(bias[p,·] - mb_p)`
/// (f32 exponentials, products summed in f64): O(n² + ld·n) exponentials instead of
/// O(ld·n²). Rows whose `S` is tiny (the joint maximum far from both separate maxima, where
/// flushed factors could matter) fall back to the direct row log-sum-exp.
/// Top-k: candidates are visited in descending `U[d,·]` order and the scan stops once
/// `U[d,c] + mb_p` cannot beat the current k-th value (exact: f32 addition is monotone).
fn markov_table(m: &MarkovHead, cand: &[u32], ub: &[f32], ld: usize, k: usize, vals: &mut [f32], slots: &mut [u32]) {
    let n = cand.len();
    let r = m.rank;
    let npad = n.div_ceil(TILE_C) * TILE_C;
    let prow = n.div_ceil(TILE_P) * TILE_P;
    // W2[cand] transposed to [r, npad]; W1[cand] as [prow, r] (zero padding).
    let mut w2t = vec![0.0f32; r * npad];
    let mut w1c = vec![0.0f32; prow * r];
    for (i, &t) in cand.iter().enumerate() {
        let t = t as usize;
        let w2row = &m.w2[t * r..(t + 1) * r];
        for j in 0..r {
            w2t[j * npad + i] = w2row[j];
        }
        w1c[i * r..(i + 1) * r].copy_from_slice(&m.w1[t * r..(t + 1) * r]);
    }
    // Per-depth shift, exp factors and visiting order (descending U, then ascending slot).
    let mut mu = vec![0.0f32; ld];
    let mut g = vec![0.0f64; ld * n];
    let mut order = vec![0u32; ld * n];
    let mut tmp = vec![0.0f32; n];
    for d in 0..ld {
        let row = &ub[d * n..(d + 1) * n];
        mu[d] = row_max(row);
        for (o, &x) in tmp.iter_mut().zip(row) {
            *o = exp_nonpos(x - mu[d]);
        }
        for (o, &e) in g[d * n..(d + 1) * n].iter_mut().zip(&tmp) {
            *o = e as f64;
        }
        let ord = &mut order[d * n..(d + 1) * n];
        for (i, o) in ord.iter_mut().enumerate() {
            *o = i as u32;
        }
        ord.sort_unstable_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    }
    let mut brow = vec![0.0f32; TILE_P * npad];
    let mut erow = vec![0.0f64; n];
    let mut z = vec![0.0f32; n];
    let mut heap: Vec<(f32, u32)> = Vec::with_capacity(k);
    let mut keybuf: Vec<u64> = Vec::with_capacity(4 * k);
    for p0 in (0..n).step_by(TILE_P) {
        bias_block(&w1c[p0 * r..(p0 + TILE_P) * r], &w2t, r, npad, &mut brow);
        for a in 0..TILE_P.min(n - p0) {
            let p = p0 + a;
            let b = &brow[a * npad..a * npad + n];
            let mb = row_max(b);
            for (o, &x) in tmp.iter_mut().zip(b) {
                *o = exp_nonpos(x - mb);
            }
            for (o, &e) in erow.iter_mut().zip(&tmp) {
                *o = e as f64;
            }
            for d in 0..ld {
                let urow = &ub[d * n..(d + 1) * n];
                let sum = dot_f64(&g[d * n..(d + 1) * n], &erow);
                let lse = if sum > 1e-30 {
                    mu[d] as f64 + mb as f64 + sum.ln()
                } else {
                    for ((zi, &u), &bi) in z.iter_mut().zip(urow).zip(b) {
                        *zi = u + bi;
                    }
                    log_sum_exp(&z)
                };
                pruned_topk(urow, b, mb, &order[d * n..(d + 1) * n], k, &mut keybuf, &mut heap);
                let o = (d * n + p) * k;
                for (j, &(v, s)) in heap.iter().enumerate() {
                    vals[o + j] = log_prob(v, lse);
                    slots[o + j] = s;
                }
            }
        }
    }
}

/// Sort key: ascending key = descending value, then ascending slot.
#[inline(always)]
pub(super) fn rank_key(v: f32, slot: u32) -> u64 {
    let b = v.to_bits();
    let mono = if b & 0x8000_0000 != 0 { !b } else { b | 0x8000_0000 };
    ((!mono as u64) << 32) | slot as u64
}

/// Inverse of [`rank_key`]: `(value, slot)`.
#[inline(always)]
pub(super) fn key_parts(key: u64) -> (f32, u32) {
    let mono = !((key >> 32) as u32);
    let b = if mono & 0x8000_0000 != 0 { mono & 0x7FFF_FFFF } else { !mono };
    (f32::from_bits(b), key as u32)
}

/// Top-k of `z[c] = u[c] + b[c]` (best first; ties: lower slot), visiting `c` in `order`
/// (descending `u`) and stopping once `u[c] + bmax` is below the current k-th value.
/// Buffered selection on packed u64 keys: keys better than the current k-th are appended and
/// the buffer is cut back to k with `select_nth_unstable` when it reaches 4k.
/// `buf` is scratch; the result (k `(value, slot)` pairs, best first) is written to `out`.
fn pruned_topk(u: &[f32], b: &[f32], bmax: f32, order: &[u32], k: usize, buf: &mut Vec<u64>, out: &mut Vec<(f32, u32)>) {
    out.clear();
    if k == 0 {
        return;
    }
    let cap = 4 * k;
    buf.clear();
    buf.resize(cap + 1, 0);
    let mut len = 0usize;
    let mut thr_key = u64::MAX;
    let mut thr_val = f32::NEG_INFINITY;
    let mut limit = k;
    for &c in order {
        let ci = c as usize;
        let uc = u[ci];
        if uc + bmax < thr_val {
            break;
        }
        let key = rank_key(uc + b[ci], c);
        // Branch-free append: always write, advance only if the key beats the k-th.
        buf[len] = key;
        len += (key < thr_key) as usize;
        if len == limit {
            if limit > k {
                buf[..len].select_nth_unstable(k - 1);
                len = k;
            }
            thr_key = buf[..k].iter().copied().max().unwrap_or(u64::MAX);
            thr_val = key_parts(thr_key).0;
            limit = cap;
        }
    }
    if len > k {
        buf[..len].select_nth_unstable(k - 1);
        len = k;
    }
    let kept = &mut buf[..len];
    kept.sort_unstable();
    out.extend(kept.iter().map(|&key| key_parts(key)));
}

/// f64 dot product with 4 independent lanes (vectorisable).
#[inline]
fn dot_f64(a: &[f64], b: &[f64]) -> f64 {
    let mut lanes = [0.0f64; 4];
    let ca = a.chunks_exact(4);
    let cb = b.chunks_exact(4);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..4 {
            lanes[l] += x[l] * y[l];
        }
    }
    let mut s = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

const TILE_P: usize = 4;
const TILE_C: usize = 16;

/// `out[a][c] = sum_j w1[a][j] * w2t[j][c]` for `a in 0..TILE_P`, `c in 0..npad`, accumulated
/// sequentially over `j` (same order as [`dot_seq`]).
fn bias_block(w1: &[f32], w2t: &[f32], r: usize, npad: usize, out: &mut [f32]) {
    for c0 in (0..npad).step_by(TILE_C) {
        let mut acc = [[0.0f32; TILE_C]; TILE_P];
        for j in 0..r {
            let w2 = &w2t[j * npad + c0..j * npad + c0 + TILE_C];
            for a in 0..TILE_P {
                let w = w1[a * r + j];
                for l in 0..TILE_C {
                    acc[a][l] += w * w2[l];
                }
            }
        }
        for a in 0..TILE_P {
            out[a * npad + c0..a * npad + c0 + TILE_C].copy_from_slice(&acc[a]);
        }
    }
}

#[derive(Clone, Copy)]
struct PreEntry {
    logw: f64,
    counter: u32,
    parent: u32,
    depth: u32,
    rank: u32,
}

/// SparklingTree precompute builder (§5.2 (c), the final SparklingTree heap).
///
/// Best-first over the [`CandidateTable`]: each node stores its `(depth, slot)`; the root is
/// `(0, slot_of(anchor))` found by binary search in `t.cand`. Pop → node with token
/// `cand[slots[pd, ps, rank]]`; sibling `rank + 1 < t.k` with
/// `logw - vals[pd,ps,rank] + vals[pd,ps,rank+1]`; child (if `depth < t.ld`) with
/// `logw + vals[depth, slot, 0]` (f64 arithmetic). Ties: insertion counter (FIFO).
/// `budget` counts **non-root** nodes; result in pop order. `budget == 0`, `t.ld == 0` or
/// `t.k == 0` → root only. With a table built at `c >= vocab` and `max_fanout >= budget` the
/// tree equals [`build_sparkling_reference`] (same tokens, parents, depths; scores to f32
/// rounding) unless two path scores are within ~1e-6 of each other (§9.4).
///
///
/// # Panics
/// Only on precondition violations: `anchor` not in `t.cand` (use the anchor the table
/// was built with), or `t.vals`/`t.slots` shorter than `ld * n * k`.
pub fn build_sparkling_precompute(t: &CandidateTable, anchor: u32, budget: usize) -> DraftTree {
    let mut tree = DraftTree::root(anchor);
    let (n, k, ld) = (t.cand.len(), t.k, t.ld);
    if budget == 0 || ld == 0 || k == 0 || n == 0 {
        return tree;
    }
    assert!(t.vals.len() >= ld * n * k && t.slots.len() >= ld * n * k, "CandidateTable: vals/slots too short");
    let root_slot = t.cand.binary_search(&anchor).expect("build_sparkling_precompute: anchor not in the candidate set");
    tree.tokens.reserve(budget);
    tree.parents.reserve(budget);
    tree.depths.reserve(budget);
    tree.scores.reserve(budget);
    let mut node_slot: Vec<u32> = Vec::with_capacity(budget + 1);
    node_slot.push(root_slot as u32);
    let row = |d: usize, s: usize| (d * n + s) * k;
    let first = |a: &PreEntry, b: &PreEntry| {
        if a.logw != b.logw {
            return a.logw > b.logw;
        }
        a.counter < b.counter
    };
    let mut heap: Heap<PreEntry> = Heap::with_capacity(2 * budget + 1);
    let mut counter = 0u32;
    heap.push(PreEntry { logw: t.vals[row(0, root_slot)] as f64, counter, parent: 0, depth: 1, rank: 0 }, first);
    while tree.num_nodes() < budget {
        let Some(e) = heap.pop(first) else { break };
        let base = row(e.depth as usize - 1, node_slot[e.parent as usize] as usize);
        let r = base + e.rank as usize;
        let slot = t.slots[r];
        let idx = tree.len() as u32;
        tree.tokens.push(t.cand[slot as usize]);
        tree.parents.push(e.parent);
        tree.depths.push(e.depth);
        tree.scores.push(e.logw as f32);
        node_slot.push(slot);
        if (e.rank as usize) + 1 < k {
            counter += 1;
            let logw = e.logw - t.vals[r] as f64 + t.vals[r + 1] as f64;
            heap.push(PreEntry { logw, counter, rank: e.rank + 1, ..e }, first);
        }
        if (e.depth as usize) < ld {
            counter += 1;
            let logw = e.logw + t.vals[row(e.depth as usize, slot as usize)] as f64;
            heap.push(PreEntry { logw, counter, parent: idx, depth: e.depth + 1, rank: 0 }, first);
        }
    }
    tree
}
