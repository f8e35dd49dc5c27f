//! The host reference of the selection math (design §3, reference §5.2 b–c): log-sum-exp,
//! top-k, the candidate union and the Markov candidate table, plus the argument checks every
//! backend shares. The CPU backend runs these (in parallel over rows); the device backends'
//! fallbacks call them on read-back copies, and the conformance tests compare the device
//! kernels against them.
//!
//! Numerics: log-sum-exp with f32 exponentials after a max shift and block sums in f64 (~1e-7
//! relative to an all-f64 sum), the Markov bias as sequential f32 dots over the rank, exact top-k
//! in `f32::total_cmp` order (ties: lower index first). The engine's tree builders
//! (`sparkling::tree`) use these same functions, so host trees and backend tables agree.

use crate::tree::{CandidateTable, TopK};
use crate::{Error, Result};

/// `exp(x)` for `x ≤ 0` in f32, vectorisable: Cody–Waite reduction by ln 2 and a degree-6
/// polynomial (relative error ≤ 3e-7); exactly 1 for `x == 0` and 0 for `x < -80` (negligible
/// next to the max term of a log-sum-exp). NaN in, NaN out.
#[inline(always)]
pub fn exp_nonpos(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4; // 0.693359375, exact in f32
    const LN2_LO: f32 = -2.121_944_4e-4;
    const SHIFTER: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let under = x < -80.0;
    let xc = if under { -80.0 } else { x };
    let t = xc * LOG2E + SHIFTER;
    let n = t - SHIFTER;
    let ni = (t.to_bits() as i32).wrapping_sub(SHIFTER.to_bits() as i32);
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    let scale = f32::from_bits((ni.wrapping_add(127) as u32) << 23);
    if under {
        0.0
    } else {
        e * scale
    }
}

/// Maximum of `row` ignoring NaN (`-inf` for an empty or all-NaN row); 8 lanes, so the
/// compiler vectorises it (max is order-independent, so the result is exact).
#[inline]
pub fn row_max(row: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            lanes[l] = if c[l] > lanes[l] { c[l] } else { lanes[l] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &v in lanes.iter().chain(chunks.remainder()) {
        m = if v > m { v } else { m };
    }
    m
}

/// `ln Σ exp(row)` as f64: `max + ln Σ exp(x − max)` with the f32 [`exp_nonpos`], summed in 8
/// f32 lanes per 256-value block (fixed order) and the blocks in f64, so it agrees with an all-f64
/// evaluation to ~1e-7 relative and every caller gets the same bits for the same row. A row whose
/// maximum is not finite (empty: `-inf`; all `-inf`; a `+inf` entry) returns that maximum; a NaN
/// entry makes the result NaN.
pub fn log_sum_exp(row: &[f32]) -> f64 {
    let m = row_max(row);
    if !m.is_finite() {
        return m as f64;
    }
    let mut total = 0.0f64;
    let mut buf = [0.0f32; 256];
    for block in row.chunks(256) {
        let e = &mut buf[..block.len()];
        for (o, &x) in e.iter_mut().zip(block) {
            *o = exp_nonpos(x - m);
        }
        total += sum_block(e);
    }
    m as f64 + total.ln()
}

/// Sum of one block: 8 f32 lanes in a fixed order, the lanes and the remainder added in f64.
#[inline]
fn sum_block(e: &[f32]) -> f64 {
    let mut lanes = [0.0f32; 8];
    let mut chunks = e.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            lanes[l] += c[l];
        }
    }
    let mut bs = 0.0f64;
    for &v in chunks.remainder() {
        bs += v as f64;
    }
    for v in lanes {
        bs += v as f64;
    }
    bs
}

/// `f32::total_cmp` order as an integer key: `a.total_cmp(&b) == key(a).cmp(&key(b))`
/// (`-0.0 < +0.0`; a NaN with the sign bit clear ranks above `+inf`).
#[inline(always)]
fn order_key(v: f32) -> i32 {
    let b = v.to_bits() as i32;
    b ^ (((b >> 31) as u32) >> 1) as i32
}

/// `a` ranks strictly before `b`: larger key, then lower index.
#[inline(always)]
fn ranks_before(a: (i32, u32), b: (i32, u32)) -> bool {
    a.0 > b.0 || (a.0 == b.0 && a.1 < b.1)
}

/// The `min(k, vals.len())` largest of `vals` as `(value, index)`, best first in the order of
/// `f32::total_cmp` (ties: lower index first), written into `out` (cleared first). Partial
/// selection: a size-k min-heap plus a per-16-value block maximum that skips blocks which cannot
/// enter, O(n + k log k) typical, no allocation beyond `out`.
pub fn topk_desc(vals: &[f32], k: usize, out: &mut Vec<(f32, u32)>) {
    out.clear();
    let n = vals.len();
    let k = k.min(n);
    if k == 0 {
        return;
    }
    let key = |e: &(f32, u32)| (order_key(e.0), e.1);
    // Min-heap in rank order: out[0] is the worst element kept.
    let sift_down = |h: &mut [(f32, u32)], mut i: usize| {
        let len = h.len();
        loop {
            let l = 2 * i + 1;
            if l >= len {
                break;
            }
            let r = l + 1;
            let w = if r < len && ranks_before(key(&h[l]), key(&h[r])) { r } else { l };
            if ranks_before(key(&h[i]), key(&h[w])) {
                h.swap(i, w);
                i = w;
            } else {
                break;
            }
        }
    };
    for (i, &v) in vals[..k].iter().enumerate() {
        out.push((v, i as u32));
        let mut c = i;
        while c > 0 {
            let p = (c - 1) / 2;
            if ranks_before(key(&out[p]), key(&out[c])) {
                out.swap(p, c);
                c = p;
            } else {
                break;
            }
        }
    }
    // Ascending indices: a value equal to the worst kept one never enters (its index is higher).
    let mut thr = order_key(out[0].0);
    let mut i = k;
    while i < n {
        let end = (i + 16).min(n);
        let blk = &vals[i..end];
        let bm = blk.iter().map(|&v| order_key(v)).fold(i32::MIN, i32::max);
        if bm > thr {
            for (j, &v) in blk.iter().enumerate() {
                if order_key(v) > thr {
                    out[0] = (v, (i + j) as u32);
                    sift_down(out, 0);
                    thr = order_key(out[0].0);
                }
            }
        }
        i = end;
    }
    out.sort_unstable_by(|a, b| key(b).0.cmp(&key(a).0).then(a.1.cmp(&b.1)));
}

/// Indices of the `k` largest values of `row` (`k ≤ row.len()`, larger `k` is clamped), sorted
/// by value descending in the order of `f32::total_cmp`, ties: lower index first
/// ([`topk_desc`]).
pub fn topk_indices(row: &[f32], k: usize) -> Vec<u32> {
    let mut sel = Vec::with_capacity(k.min(row.len()));
    topk_desc(row, k, &mut sel);
    sel.into_iter().map(|(_, i)| i).collect()
}

/// Append one row's top-`k` ids, raw values and log-sum-exp to `out` (the row step of
/// [`topk`]; `k ≤ row.len()`).
pub fn topk_row(row: &[f32], k: usize, out: &mut TopK) {
    let ids = topk_indices(row, k);
    out.vals.extend(ids.iter().map(|&i| row[i as usize]));
    out.ids.extend(ids);
    out.lse.push(log_sum_exp(row) as f32);
}

/// [`crate::Backend::topk_async`] on host logits `[rows, cols]`: raw values and the [`log_sum_exp`] (f64)
/// rounded to f32. Errors: `k == 0` ([`Error::Invalid`]); `logits` shorter than `rows·cols`
/// ([`Error::Shape`]).
pub fn topk(logits: &[f32], rows: usize, cols: usize, k: usize) -> Result<TopK> {
    if k == 0 {
        return Err(Error::Invalid("topk: k must be at least 1".into()));
    }
    if logits.len() < rows * cols {
        return Err(Error::Shape { op: "topk", detail: format!("{} values for [{rows}, {cols}]", logits.len()) });
    }
    let k = k.min(cols);
    let mut out = TopK { k, ids: Vec::with_capacity(rows * k), vals: Vec::with_capacity(rows * k), lse: Vec::with_capacity(rows) };
    if k == 0 {
        return Ok(out);
    }
    for row in logits[..rows * cols].chunks(cols) {
        topk_row(row, k, &mut out);
    }
    Ok(out)
}

/// The candidate union of reference §5.2 b from per-row top-C ids (any order, duplicates
/// allowed) and the anchor: ascending and distinct.
pub fn candidate_union(mut ids: Vec<u32>, anchor: u32) -> Vec<u32> {
    ids.push(anchor);
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// `Σ_j a[j]·b[j]` accumulated sequentially in f32 over `j` (the Markov bias order).
#[inline]
pub fn dot_seq(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        acc += x * y;
    }
    acc
}

/// The Markov bias row of parent token `parent` over the candidates:
/// `out[c] = Σ_j W1[parent, j]·W2[cand[c], j]` (sequential f32 dots; `w1`, `w2` are
/// `[vocab, r]`).
pub fn markov_bias_row(w1: &[f32], w2: &[f32], r: usize, parent: u32, cand: &[u32], out: &mut [f32]) {
    let e = &w1[parent as usize * r..][..r];
    for (o, &c) in out.iter_mut().zip(cand) {
        *o = dot_seq(e, &w2[c as usize * r..][..r]);
    }
}

/// `U[:, cand]`: the candidates' columns of `base [ld, vocab]`, `[ld, n]`.
pub fn gather_candidates(base: &[f32], ld: usize, vocab: usize, cand: &[u32]) -> Vec<f32> {
    (0..ld).flat_map(|d| cand.iter().map(move |&c| base[d * vocab + c as usize])).collect()
}

/// One `(d, p)` row of the Markov table: `z = u + bias` (`bias = None`: zero), then the top
/// `vals.len()` entries of `z - lse(z)` with their slots. `u` and `bias` are `n` long.
pub fn markov_table_row(u: &[f32], bias: Option<&[f32]>, vals: &mut [f32], slots: &mut [u32]) {
    let z: Vec<f32> = match bias {
        Some(b) => u.iter().zip(b).map(|(x, y)| x + y).collect(),
        None => u.to_vec(),
    };
    let lse = log_sum_exp(&z);
    for (j, &c) in topk_indices(&z, vals.len()).iter().enumerate() {
        vals[j] = (z[c as usize] as f64 - lse) as f32;
        slots[j] = c;
    }
}

/// The Markov candidate table of [`crate::Backend::markov_table_async`] by direct per-row evaluation
/// ([`markov_bias_row`], [`markov_table_row`]), one row after another. `base` is
/// `[ld, vocab]`; `markov` is `(W1, W2, rank)` with `[vocab, rank]` matrices.
/// Preconditions (see [`check_markov_table_args`]): ids `< vocab`, `1 ≤ k ≤ cand.len()`.
pub fn markov_table(base: &[f32], ld: usize, vocab: usize, markov: Option<(&[f32], &[f32], usize)>, cand: &[u32], k: usize) -> CandidateTable {
    let n = cand.len();
    let bias: Option<Vec<f32>> = markov.map(|(w1, w2, r)| {
        let mut b = vec![0.0f32; n * n];
        for (p, out) in b.chunks_mut(n.max(1)).enumerate() {
            markov_bias_row(w1, w2, r, cand[p], cand, out);
        }
        b
    });
    let ub = gather_candidates(base, ld, vocab, cand);
    let mut vals = vec![0.0f32; ld * n * k];
    let mut slots = vec![0u32; ld * n * k];
    for (row, (v, s)) in vals.chunks_mut(k.max(1)).zip(slots.chunks_mut(k.max(1))).enumerate() {
        let (d, p) = (row / n, row % n);
        markov_table_row(&ub[d * n..(d + 1) * n], bias.as_ref().map(|b| &b[p * n..(p + 1) * n]), v, s);
    }
    CandidateTable { cand: cand.to_vec(), ld, k, vals, slots }
}

/// Argument checks of [`crate::Backend::markov_table_async`] shared by the backends: candidates
/// non-empty, ascending, distinct and `< vocab`; `k ≥ 1`; W1 and W2 (given as `(rows, cols)`)
/// both `[vocab, r]` with `r ≥ 1`.
pub fn check_markov_table_args(vocab: usize, markov: Option<((usize, usize), (usize, usize))>, cand: &[u32], k: usize) -> Result<()> {
    if cand.is_empty() || k == 0 {
        return Err(Error::Invalid(format!("markov_table: need at least one candidate and k ≥ 1 (got {} candidates, k = {k})", cand.len())));
    }
    if let Some(w) = cand.windows(2).find(|w| w[0] >= w[1]) {
        return Err(Error::Invalid(format!("markov_table: candidates must be ascending and distinct (found {} before {})", w[0], w[1])));
    }
    if let Some(&bad) = cand.iter().find(|&&c| c as usize >= vocab) {
        return Err(Error::Invalid(format!("markov_table: candidate id {bad} is outside the vocabulary of {vocab}")));
    }
    if let Some((a, b)) = markov {
        if a.0 != vocab || b != a || a.1 == 0 {
            return Err(Error::Shape { op: "markov_table", detail: format!("W1 {a:?} and W2 {b:?} must both be [vocab = {vocab}, r ≥ 1]") });
        }
    }
    Ok(())
}

/// Argument checks of [`crate::Backend::candidate_table_async`], shared by every implementation:
/// `k ≥ 1`, `candidates ≥ 1` and `anchor < vocab`, else [`Error::Invalid`] naming the argument.
pub fn check_candidate_table_args(vocab: usize, candidates: usize, anchor: u32, k: usize) -> Result<()> {
    if k == 0 {
        return Err(Error::Invalid("candidate_table: k (children per row) must be at least 1".into()));
    }
    if candidates == 0 {
        return Err(Error::Invalid("candidate_table: candidates (top-C per depth row) must be at least 1".into()));
    }
    if anchor as usize >= vocab {
        return Err(Error::Invalid(format!("candidate_table: anchor token {anchor} is outside the vocabulary of {vocab}")));
    }
    Ok(())
}

/// How the attention kernels (WGSL `attention.wgsl`, CUDA `attention.cu`) read the mask of a
/// block of `t` query rows: mode 0 causal, 1 full, 2 tree with its [`ancestor_table`].
/// Errors: a tree mask whose parent count is not `t` → [`Error::Shape`] (op `attention`);
/// invalid parents as [`ancestor_table`].
pub fn attention_mask_mode(mask: crate::AttnMask<'_>, t: usize) -> Result<(u32, Option<Vec<u32>>)> {
    match mask {
        crate::AttnMask::Causal => Ok((0, None)),
        crate::AttnMask::Full => Ok((1, None)),
        crate::AttnMask::Tree { parents } => {
            if parents.len() != t {
                return Err(Error::Shape { op: "attention", detail: format!("{} parents for {t} tree rows", parents.len()) });
            }
            Ok((2, Some(ancestor_table(parents)?)))
        }
    }
}

/// The ancestor table of a tree attention mask ([`crate::AttnMask::Tree`]), as the attention
/// kernels read it: `[off_0, …, off_t, entries…]` where entries `off_i .. off_{i+1}` are the
/// block indices of the ancestors-or-self of row `i` in ascending order (DDTree §4.8
/// visibility). Errors: a parent that is not an earlier row (`parents[i] ≥ i`) →
/// [`Error::Invalid`].
pub fn ancestor_table(parents: &[u32]) -> Result<Vec<u32>> {
    let t = parents.len();
    let mut offs = Vec::with_capacity(t + 1);
    let mut entries: Vec<u32> = Vec::new();
    offs.push(0u32);
    let mut anc = Vec::new();
    for i in 0..t {
        anc.clear();
        anc.push(i as u32);
        let mut cur = i;
        while parents[cur] != crate::tree::NO_PARENT {
            let p = parents[cur] as usize;
            if p >= cur {
                return Err(Error::Invalid(format!("tree parent {p} of row {cur} is not an earlier row")));
            }
            anc.push(p as u32);
            cur = p;
        }
        entries.extend(anc.iter().rev());
        offs.push(entries.len() as u32);
    }
    offs.extend(entries);
    Ok(offs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::NO_PARENT;

    #[test]
    fn topk_orders_by_value_then_lower_index() {
        let row = [1.0, 5.0, 3.0, 5.0, -2.0, 3.0];
        assert_eq!(topk_indices(&row, 4), vec![1, 3, 2, 5]);
        assert_eq!(topk_indices(&row, 10), vec![1, 3, 2, 5, 0, 4]);
        assert!(topk_indices(&row, 0).is_empty());
        let t = topk(&row, 2, 3, 2).unwrap();
        assert_eq!((t.k, t.ids, t.vals), (2, vec![1, 2, 0, 2], vec![5.0, 3.0, 5.0, 3.0]));
        assert!(topk(&row, 2, 3, 0).is_err());
    }

    #[test]
    fn log_sum_exp_matches_direct_sum() {
        let row = [0.5f32, -1.0, 2.0, 0.0];
        let want = row.iter().map(|&v| (v as f64).exp()).sum::<f64>().ln();
        assert!((log_sum_exp(&row) - want).abs() < 1e-6);
        // shift-invariance at large magnitude (a naive sum would overflow)
        let big: Vec<f32> = row.iter().map(|v| v + 1000.0).collect();
        assert!((log_sum_exp(&big) - (want + 1000.0)).abs() < 1e-6 * 1000.0);
        // non-finite maxima and NaN
        assert_eq!(log_sum_exp(&[]), f64::NEG_INFINITY);
        assert_eq!(log_sum_exp(&[f32::NEG_INFINITY; 3]), f64::NEG_INFINITY);
        assert_eq!(log_sum_exp(&[1.0, f32::INFINITY]), f64::INFINITY);
        assert!(log_sum_exp(&[1.0, f32::NAN, 2.0]).is_nan());
        assert_eq!(log_sum_exp(&[3.0]), 3.0);
        // -inf entries contribute nothing
        assert!((log_sum_exp(&[0.5, f32::NEG_INFINITY, -1.0, 2.0, 0.0]) - want).abs() < 1e-6);
    }

    /// A small deterministic generator (LCG) for the numerics tests.
    fn pseudo(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0) * scale
            })
            .collect()
    }

    #[test]
    fn exp_nonpos_accuracy() {
        let mut worst = 0.0f64;
        let mut x = -80.0f32;
        while x <= 0.0 {
            let got = exp_nonpos(x) as f64;
            let want = (x as f64).exp();
            worst = worst.max(((got - want) / want).abs());
            x += 0.00731;
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert_eq!(exp_nonpos(0.0), 1.0);
        assert_eq!(exp_nonpos(-80.5), 0.0);
        assert_eq!(exp_nonpos(-1e30), 0.0);
        assert_eq!(exp_nonpos(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn log_sum_exp_matches_f64_on_vocab_wide_rows() {
        for (seed, &n) in [1usize, 5, 8, 255, 256, 257, 1000, 49152].iter().enumerate() {
            let row = pseudo(n, seed as u64, 12.0);
            let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            let want = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
            let got = log_sum_exp(&row);
            assert!((got - want).abs() < 1e-6 * want.abs().max(1.0), "n={n}: {got} vs {want}");
        }
    }

    #[test]
    fn topk_desc_matches_a_full_total_order_sort_with_ties_and_specials() {
        let mut out = Vec::new();
        for (seed, &n) in [1usize, 3, 17, 100, 1000].iter().enumerate() {
            for &k in &[0usize, 1, 2, 5, 16, 64, 2000] {
                // coarse values => many ties; then NaN, ±inf and ±0 mixed in
                let mut vals: Vec<f32> = pseudo(n, 40 + seed as u64, 3.5).iter().map(|v| v.round()).collect();
                for (i, sp) in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.0, -f32::NAN].into_iter().enumerate() {
                    if n > 10 {
                        vals[(7 * i + 3) % n] = sp;
                    }
                }
                topk_desc(&vals, k, &mut out);
                let mut all: Vec<(f32, u32)> = vals.iter().enumerate().map(|(i, &v)| (v, i as u32)).collect();
                all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                all.truncate(k.min(n));
                let bits = |v: &[(f32, u32)]| v.iter().map(|&(x, i)| (x.to_bits(), i)).collect::<Vec<_>>();
                assert_eq!(bits(&out), bits(&all), "n={n} k={k}");
                assert_eq!(topk_indices(&vals, k), all.iter().map(|e| e.1).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn markov_table_rows_are_normalised_log_softmax_with_bias() {
        // V = 5, r = 2, two depth rows, candidates {0, 2, 3}.
        let base = [0.0, 1.0, 2.0, 3.0, 4.0, 4.0, 3.0, 2.0, 1.0, 0.0];
        let w1 = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 1.0, 1.0, 0.0, 0.0];
        let w2 = [0.0, 2.0, 1.0, 1.0, 3.0, 0.0, -1.0, 0.5, 2.0, 2.0];
        let cand = [0u32, 2, 3];
        let t = markov_table(&base, 2, 5, Some((&w1, &w2, 2)), &cand, 3);
        assert_eq!((t.cand.as_slice(), t.ld, t.k), (&cand[..], 2, 3));
        for d in 0..2 {
            for (p, &pt) in cand.iter().enumerate() {
                let z: Vec<f64> = cand
                    .iter()
                    .map(|&c| {
                        let b: f32 = (0..2).map(|j| w1[pt as usize * 2 + j] * w2[c as usize * 2 + j]).sum();
                        base[d * 5 + c as usize] as f64 + b as f64
                    })
                    .collect();
                let lse = z.iter().map(|v| v.exp()).sum::<f64>().ln();
                let row = (d * 3 + p) * 3;
                let mut prev = f32::INFINITY;
                for j in 0..3 {
                    let c = t.slots[row + j] as usize;
                    assert!((t.vals[row + j] as f64 - (z[c] - lse)).abs() < 1e-6);
                    assert!(t.vals[row + j] <= prev);
                    prev = t.vals[row + j];
                }
            }
        }
        // Probabilities of a full row sum to one.
        let s: f64 = t.vals[..3].iter().map(|&v| (v as f64).exp()).sum();
        assert!((s - 1.0).abs() < 1e-6);
    }

    #[test]
    fn ancestor_table_lists_ancestors_in_ascending_order() {
        let t = ancestor_table(&[NO_PARENT, 0, 0, 1]).unwrap();
        assert_eq!(t, vec![0, 1, 3, 5, 8, 0, 0, 1, 0, 2, 0, 1, 3]);
        assert!(ancestor_table(&[NO_PARENT, 1]).is_err());
        assert_eq!(candidate_union(vec![5, 2, 5, 9], 2), vec![2, 5, 9]);
    }
}
