//! Top-k selection, log-sum-exp and the Markov candidate table (design §3, reference §5.2 c):
//! the reference implementations the device backends are checked against.

use rayon::prelude::*;
use sparkling_core::MarkovTable;

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

/// `Σ_j a[j]·b[j]` accumulated sequentially in f32 over `j` (the Markov bias order).
fn dot_seq(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        acc += x * y;
    }
    acc
}

/// The Markov candidate table of [`sparkling_core::Backend::markov_table`]: direct per-row
/// evaluation (bias by sequential f32 dots, log-sum-exp in f64, exact top-k), parallel over
/// rows. `base` is `[ld, vocab]`; `markov` is `(W1, W2, rank)` with `[vocab, rank]` matrices.
/// Preconditions (checked by the caller): ids `< vocab`, `1 ≤ k ≤ cand.len()`.
pub fn markov_table(base: &[f32], ld: usize, vocab: usize, markov: Option<(&[f32], &[f32], usize)>, cand: &[u32], k: usize) -> MarkovTable {
    let n = cand.len();
    // Dense bias [n, n] (row = parent slot), or none.
    let bias: Option<Vec<f32>> = markov.map(|(w1, w2, r)| {
        let mut b = vec![0.0f32; n * n];
        b.par_chunks_mut(n.max(1)).enumerate().for_each(|(p, out)| {
            let e = &w1[cand[p] as usize * r..][..r];
            for (o, &c) in out.iter_mut().zip(cand) {
                *o = dot_seq(e, &w2[c as usize * r..][..r]);
            }
        });
        b
    });
    let ub: Vec<f32> = (0..ld).flat_map(|d| cand.iter().map(move |&c| base[d * vocab + c as usize])).collect();
    let mut vals = vec![0.0f32; ld * n * k];
    let mut slots = vec![0u32; ld * n * k];
    vals.par_chunks_mut(k).zip(slots.par_chunks_mut(k)).enumerate().for_each(|(row, (v, s))| {
        let (d, p) = (row / n, row % n);
        let u = &ub[d * n..(d + 1) * n];
        let z: Vec<f32> = match &bias {
            Some(b) => u.iter().zip(&b[p * n..(p + 1) * n]).map(|(x, y)| x + y).collect(),
            None => u.to_vec(),
        };
        let lse = log_sum_exp(&z);
        for (j, &c) in topk_indices(&z, k).iter().enumerate() {
            v[j] = (z[c as usize] as f64 - lse) as f32;
            s[j] = c;
        }
    });
    MarkovTable { k, vals, slots }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topk_orders_by_value_then_lower_index() {
        let row = [1.0, 5.0, 3.0, 5.0, -2.0, 3.0];
        assert_eq!(topk_indices(&row, 4), vec![1, 3, 2, 5]);
        assert_eq!(topk_indices(&row, 10), vec![1, 3, 2, 5, 0, 4]);
        assert!(topk_indices(&row, 0).is_empty());
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
}
