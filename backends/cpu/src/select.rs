//! Top-k and the Markov candidate table on the CPU: the host reference of
//! [`sparkling_core::select`], run in parallel over rows (each row is computed exactly as the
//! reference computes it, so the results are the same bit for bit).

use crate::team;
use sparkling_core::select::{gather_candidates, markov_bias_row, markov_table_row, topk_row};
use sparkling_core::{CandidateTable, TopK};

/// [`sparkling_core::select::topk`] parallel over rows (`1 ≤ k ≤ cols`, `cols ≥ 1`).
pub fn topk(logits: &[f32], rows: usize, cols: usize, k: usize) -> TopK {
    let parts: Vec<TopK> = team::map(rows, |i| {
        let mut t = TopK { k, ids: Vec::with_capacity(k), vals: Vec::with_capacity(k), lse: Vec::with_capacity(1) };
        topk_row(&logits[i * cols..(i + 1) * cols], k, &mut t);
        t
    });
    let mut out = TopK { k, ids: Vec::with_capacity(rows * k), vals: Vec::with_capacity(rows * k), lse: Vec::with_capacity(rows) };
    for p in parts {
        out.ids.extend(p.ids);
        out.vals.extend(p.vals);
        out.lse.extend(p.lse);
    }
    out
}

/// [`sparkling_core::select::markov_table`] parallel over rows. `base` is `[ld, vocab]`;
/// `markov` is `(W1, W2, rank)` with `[vocab, rank]` matrices. Preconditions (checked by the
/// caller): ids `< vocab`, `1 ≤ k ≤ cand.len()`.
pub fn markov_table(base: &[f32], ld: usize, vocab: usize, markov: Option<(&[f32], &[f32], usize)>, cand: &[u32], k: usize) -> CandidateTable {
    let n = cand.len();
    // Dense bias [n, n] (row = parent slot), or none.
    let bias: Option<Vec<f32>> = markov.map(|(w1, w2, r)| {
        let mut b = vec![0.0f32; n * n];
        team::for_each_chunk(&mut b, n.max(1), |p, out| markov_bias_row(w1, w2, r, cand[p], cand, out));
        b
    });
    let ub = gather_candidates(base, ld, vocab, cand);
    let mut vals = vec![0.0f32; ld * n * k];
    let mut slots = vec![0u32; ld * n * k];
    let (vp, sp) = (team::Shared::new(&mut vals), team::Shared::new(&mut slots));
    team::for_each(ld * n, |row| {
        let (d, p) = (row / n, row % n);
        // SAFETY: task `row` alone touches row `row` (`k` values) of `vals` and of `slots`.
        let (v, s) = unsafe { (vp.slice(row * k, k), sp.slice(row * k, k)) };
        markov_table_row(&ub[d * n..(d + 1) * n], bias.as_ref().map(|b| &b[p * n..(p + 1) * n]), v, s);
    });
    CandidateTable { cand: cand.to_vec(), ld, k, vals, slots }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sparkling_core::select;

    #[test]
    fn parallel_rows_equal_the_core_reference() {
        let (ld, vocab, r) = (3, 41, 4);
        let base: Vec<f32> = (0..ld * vocab).map(|i| ((i * 37 % 101) as f32 - 50.0) / 9.0).collect();
        let w1: Vec<f32> = (0..vocab * r).map(|i| ((i * 13 % 29) as f32 - 14.0) / 20.0).collect();
        let w2: Vec<f32> = (0..vocab * r).map(|i| ((i * 17 % 31) as f32 - 15.0) / 20.0).collect();
        let cand = [0u32, 3, 7, 8, 20, 40];
        for m in [None, Some((&w1[..], &w2[..], r))] {
            assert_eq!(markov_table(&base, ld, vocab, m, &cand, 4), select::markov_table(&base, ld, vocab, m, &cand, 4));
        }
        assert_eq!(topk(&base, ld, vocab, 5), select::topk(&base, ld, vocab, 5).unwrap());
    }
}
