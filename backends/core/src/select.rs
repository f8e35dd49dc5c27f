//! The host reference of the selection math (design §3, reference §5.2 b–c): log-sum-exp,
//! top-k, the candidate union and the Markov candidate table, plus the argument checks every
//! backend shares. The CPU backend runs these (in parallel over rows); the device backends'
//! fallbacks call them on read-back copies, and the conformance tests compare the device
//! kernels against them.
//!
//! Numerics: exponentials and sums in f64 after a max shift, the Markov bias as sequential f32
//! dots over the rank, exact top-k (ties: lower index first). The engine's tree builders
//! (`sparkling::tree`) use a faster f32 log-sum-exp whose results agree to ~1e-7 relative.

use crate::tree::{CandidateTable, TopK};
use crate::{Error, Result};

/// `ln Σ exp(row)`, max-shifted, exponentials and sum in f64 (`-inf` for an empty row).
pub fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max as f64;
    }
    let m = max as f64;
    m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln()
}

/// Indices of the `k` largest values of `row` (`k ≤ row.len()`), sorted by value descending,
/// ties: lower index first. O(V + k log k) by partial selection.
pub fn topk_indices(row: &[f32], k: usize) -> Vec<u32> {
    let k = k.min(row.len());
    if k == 0 {
        return Vec::new();
    }
    let cmp = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, cmp);
        idx.truncate(k);
    }
    idx.sort_unstable_by(cmp);
    idx
}

/// Append one row's top-`k` ids, raw values and log-sum-exp to `out` (the row step of
/// [`topk`]; `k ≤ row.len()`).
pub fn topk_row(row: &[f32], k: usize, out: &mut TopK) {
    let ids = topk_indices(row, k);
    out.vals.extend(ids.iter().map(|&i| row[i as usize]));
    out.ids.extend(ids);
    out.lse.push(log_sum_exp(row) as f32);
}

/// [`crate::Backend::topk`] on host logits `[rows, cols]`: raw values and the f64 log-sum-exp
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

/// The Markov candidate table of [`crate::Backend::markov_table`] by direct per-row evaluation
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

/// Argument checks of [`crate::Backend::markov_table`] shared by the backends: candidates
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

/// Argument checks of [`crate::Backend::candidate_table`], shared by every implementation:
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
        assert!((log_sum_exp(&row) - want).abs() < 1e-12);
        // shift-invariance at large magnitude (a naive sum would overflow)
        let big: Vec<f32> = row.iter().map(|v| v + 1000.0).collect();
        assert!((log_sum_exp(&big) - (want + 1000.0)).abs() < 1e-9);
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
