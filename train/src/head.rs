//! The fused vocabulary head of training: logits `z = h·Eᵀ (+ Markov bias)` through the
//! target's frozen lm_head `E [V, H]`, and per row the losses of the DFlash / DeepSpec objective
//! (reference §3.6–3.8, §6.3), with hand-written gradients.
//!
//! Why fused: `V` (49 152 for SmolLM2) dominates the cost. candle's generic matmul backward
//! would also form the `[V, H]` gradient of the frozen `E`, and an op-by-op softmax/CE/KL keeps
//! several `[rows, V]` temporaries alive; here the forward keeps one softmax buffer and the
//! backward does one `[rows, V]·[V, H]` product.
//!
//! Per row `r` with label `y` (the target's greedy token) and the target's top-k ids `K` with
//! log-probabilities `ℓ` (under its full softmax), `p = softmax(z)`:
//! - `ce = −log p_y` (column 0);
//! - `kl = Σ_{i∈K} q_i (log q_i − log p_i)`, `q = softmax(ℓ)` over `K` (the target renormalised
//!   to its top-k; column 1);
//! - `l1 = Σ_{i∈K} |p_i − t_i| + |Σ_K t − Σ_K p|`, `t = exp(ℓ)`: ‖p − p_target‖₁ with the
//!   target's tail beyond `K` lumped into one bucket (exact when the target's tail is one token
//!   or empty, otherwise a lower bound; column 2);
//! - `hit = [argmax z == y]` (column 3, no gradient).
//!
//! Gradients w.r.t. `z`: `p − e_y`, `p − q`, and `p_j (a_j − Σ_i a_i p_i)` with
//! `a_i = sign(p_i − t_i) + sign(Σ_K p − Σ_K t)` on `K`, 0 elsewhere.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Device, Layout, Shape, Tensor};
use rayon::prelude::*;
use std::sync::Mutex;

/// Loss columns of [`VocabHead`]'s output.
pub const N_COLS: usize = 4;

/// Per-row targets of the head.
#[derive(Debug, Clone)]
pub struct HeadTargets {
    /// The target's greedy token per row.
    pub labels: Vec<u32>,
    /// Top-k kept per row.
    pub k: usize,
    /// `[rows, k]` top-k ids.
    pub top_ids: Vec<u32>,
    /// `[rows, k]` top-k log-probabilities (full-softmax normalised).
    pub top_logp: Vec<f32>,
}

/// The fused head as a candle custom op. Apply with [`vocab_head`].
pub struct VocabHead {
    e: Tensor,
    tg: HeadTargets,
    probs: Mutex<Option<Vec<f32>>>,
}

/// Per-row losses `[rows, 4]` = (ce, kl, l1, hit) for final hidden rows `h [rows, H]`, the
/// frozen lm_head `e [V, H]`, and an optional additive logit bias `[rows, V]` (the Markov head).
/// Gradients flow to `h` and `bias` (never to `e`). Errors on shape mismatches.
pub fn vocab_head(h: &Tensor, e: &Tensor, bias: Option<&Tensor>, tg: HeadTargets) -> candle_core::Result<Tensor> {
    let (rows, hd) = h.dims2()?;
    let (_, he) = e.dims2()?;
    if hd != he || tg.labels.len() != rows || tg.top_ids.len() != rows * tg.k || tg.top_logp.len() != rows * tg.k {
        candle_core::bail!("vocab_head: h {:?}, e {:?}, {} labels, k {}", h.dims(), e.dims(), tg.labels.len(), tg.k);
    }
    let op = VocabHead { e: e.clone(), tg, probs: Mutex::new(None) };
    let h = h.contiguous()?;
    match bias {
        Some(b) => h.apply_op2(&b.contiguous()?, op),
        None => h.apply_op1(op),
    }
}

fn f32_slice<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> candle_core::Result<&'a [f32]> {
    let (a, b) = l.contiguous_offsets().ok_or_else(|| candle_core::Error::Msg(format!("vocab_head: {what} not contiguous")))?;
    match s {
        CpuStorage::F32(v) => Ok(&v[a..b]),
        _ => candle_core::bail!("vocab_head: {what} must be f32"),
    }
}

impl VocabHead {
    fn forward(&self, h: &[f32], rows: usize, bias: Option<&[f32]>) -> candle_core::Result<(CpuStorage, Shape)> {
        let hidden = self.e.dims2()?.1;
        let ht = Tensor::from_slice(h, (rows, hidden), &Device::Cpu)?;
        let mut z: Vec<f32> = ht.matmul(&self.e.t()?)?.flatten_all()?.to_vec1()?;
        let v = z.len() / rows.max(1);
        if let Some(b) = bias {
            if b.len() != z.len() {
                candle_core::bail!("vocab_head: bias of {} values for [{rows}, {v}]", b.len());
            }
            z.par_iter_mut().zip(b.par_iter()).for_each(|(a, b)| *a += b);
        }
        let tg = &self.tg;
        let k = tg.k;
        let mut out = vec![0f32; rows * N_COLS];
        z.par_chunks_mut(v).zip(out.par_chunks_mut(N_COLS)).enumerate().for_each(|(r, (row, o))| {
            let y = tg.labels[r] as usize;
            let mut best = 0;
            let mut max = f32::NEG_INFINITY;
            for (i, &x) in row.iter().enumerate() {
                if x > max {
                    max = x;
                    best = i;
                }
            }
            let zy = row[y];
            let mut sum = 0f64;
            for x in row.iter_mut() {
                *x = (*x - max).exp();
                sum += *x as f64;
            }
            let inv = (1.0 / sum) as f32;
            row.iter_mut().for_each(|x| *x *= inv);
            let lse = max + sum.ln() as f32;
            let ids = &tg.top_ids[r * k..(r + 1) * k];
            let lp = &tg.top_logp[r * k..(r + 1) * k];
            let lmax = lp.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let qlse = lmax + lp.iter().map(|l| (l - lmax).exp()).sum::<f32>().ln();
            let (mut kl, mut l1, mut pk, mut tk) = (0f32, 0f32, 0f32, 0f32);
            for (&i, &l) in ids.iter().zip(lp) {
                let p = row[i as usize];
                let logq = l - qlse;
                let logp = (p.max(1e-30)).ln();
                kl += logq.exp() * (logq - logp);
                let t = l.exp();
                l1 += (p - t).abs();
                pk += p;
                tk += t;
            }
            l1 += (tk - pk).abs();
            o[0] = lse - zy;
            o[1] = kl;
            o[2] = l1;
            o[3] = if best == y { 1.0 } else { 0.0 };
        });
        if let Ok(mut g) = self.probs.lock() {
            *g = Some(z);
        }
        Ok((CpuStorage::F32(out), Shape::from((rows, N_COLS))))
    }

    /// `dL/dz [rows, V]` from the loss-column gradients `g [rows, 4]`.
    fn grad_z(&self, g: &[f32], rows: usize) -> candle_core::Result<Vec<f32>> {
        let mut p = self
            .probs
            .lock()
            .ok()
            .and_then(|mut x| x.take())
            .ok_or_else(|| candle_core::Error::Msg("vocab_head: backward called twice or before forward".into()))?;
        let v = p.len() / rows.max(1);
        let tg = &self.tg;
        let k = tg.k;
        p.par_chunks_mut(v).enumerate().for_each(|(r, row)| {
            let (gce, gkl, gl1) = (g[r * N_COLS], g[r * N_COLS + 1], g[r * N_COLS + 2]);
            let ids = &tg.top_ids[r * k..(r + 1) * k];
            let lp = &tg.top_logp[r * k..(r + 1) * k];
            // Σ of the dense part: (gce + gkl) p_j − gl1 p_j A ; then sparse corrections on K and y.
            let (mut pk, mut tk) = (0f32, 0f32);
            for (&i, &l) in ids.iter().zip(lp) {
                pk += row[i as usize];
                tk += l.exp();
            }
            let u = if pk > tk {
                1.0
            } else if pk < tk {
                -1.0
            } else {
                0.0
            };
            let mut a_sum = 0f32;
            let a: Vec<f32> = ids
                .iter()
                .zip(lp)
                .map(|(&i, &l)| {
                    let pi = row[i as usize];
                    let s = if pi > l.exp() {
                        1.0
                    } else if pi < l.exp() {
                        -1.0
                    } else {
                        0.0
                    };
                    a_sum += (s + u) * pi;
                    s + u
                })
                .collect();
            let lmax = lp.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let qlse = lmax + lp.iter().map(|l| (l - lmax).exp()).sum::<f32>().ln();
            let pa: Vec<f32> = ids.iter().map(|&i| row[i as usize]).collect();
            let dense = gce + gkl - gl1 * a_sum;
            row.iter_mut().for_each(|x| *x *= dense);
            for ((&i, &l), (&ai, &pi)) in ids.iter().zip(lp).zip(a.iter().zip(&pa)) {
                row[i as usize] += -gkl * (l - qlse).exp() + gl1 * pi * ai;
            }
            row[tg.labels[r] as usize] -= gce;
        });
        Ok(p)
    }

    fn backward(&self, grad_res: &Tensor) -> candle_core::Result<Tensor> {
        let (rows, _) = grad_res.dims2()?;
        let g: Vec<f32> = grad_res.flatten_all()?.to_vec1()?;
        let gz = self.grad_z(&g, rows)?;
        let v = gz.len() / rows.max(1);
        Tensor::from_vec(gz, (rows, v), &Device::Cpu)
    }
}

impl CustomOp1 for VocabHead {
    fn name(&self) -> &'static str {
        "vocab-head"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let rows = l.dims()[0];
        self.forward(f32_slice(s, l, "h")?, rows, None)
    }
    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let gz = self.backward(grad_res)?;
        Ok(Some(gz.matmul(&self.e)?))
    }
}

impl CustomOp2 for VocabHead {
    fn name(&self) -> &'static str {
        "vocab-head-biased"
    }
    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let rows = l1.dims()[0];
        self.forward(f32_slice(s1, l1, "h")?, rows, Some(f32_slice(s2, l2, "bias")?))
    }
    fn bwd(&self, _a1: &Tensor, _a2: &Tensor, _res: &Tensor, grad_res: &Tensor) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let gz = self.backward(grad_res)?;
        let gh = gz.matmul(&self.e)?;
        Ok((Some(gh), Some(gz)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    fn targets(rows: usize, v: usize) -> HeadTargets {
        HeadTargets {
            labels: (0..rows).map(|r| (r * 3 % v) as u32).collect(),
            k: 3,
            top_ids: (0..rows).flat_map(|r| [(r * 3 % v) as u32, ((r * 3 + 1) % v) as u32, ((r * 3 + 5) % v) as u32]).collect(),
            top_logp: (0..rows).flat_map(|_| [-0.3f32, -1.9, -3.0]).collect(),
        }
    }

    /// Analytic gradients against central finite differences, with and without the bias.
    #[test]
    fn gradients_match_finite_differences() {
        let (rows, hdim, v) = (3, 4, 7);
        let dev = Device::Cpu;
        let e = Tensor::from_vec((0..v * hdim).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.2).collect::<Vec<_>>(), (v, hdim), &dev).unwrap();
        let h0: Vec<f32> = (0..rows * hdim).map(|i| ((i * 13 % 7) as f32 - 3.0) * 0.3).collect();
        let b0: Vec<f32> = (0..rows * v).map(|i| ((i * 5 % 9) as f32 - 4.0) * 0.1).collect();
        let coef = Tensor::from_vec([0.3f32, 0.5, 0.7, 0.0].repeat(rows), (rows, N_COLS), &dev).unwrap();
        let loss = |h: &[f32], b: &[f32]| -> f64 {
            let ht = Tensor::from_slice(h, (rows, hdim), &dev).unwrap();
            let bt = Tensor::from_slice(b, (rows, v), &dev).unwrap();
            let o = vocab_head(&ht, &e, Some(&bt), targets(rows, v)).unwrap();
            o.mul(&coef).unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap() as f64
        };
        let hv = Var::from_vec(h0.clone(), (rows, hdim), &dev).unwrap();
        let bv = Var::from_vec(b0.clone(), (rows, v), &dev).unwrap();
        let o = vocab_head(hv.as_tensor(), &e, Some(bv.as_tensor()), targets(rows, v)).unwrap();
        let grads = o.mul(&coef).unwrap().sum_all().unwrap().backward().unwrap();
        let gh: Vec<f32> = grads.get(hv.as_tensor()).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let gb: Vec<f32> = grads.get(bv.as_tensor()).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let eps = 1e-2f32;
        for i in 0..h0.len() {
            let (mut a, mut b) = (h0.clone(), h0.clone());
            a[i] += eps;
            b[i] -= eps;
            let fd = (loss(&a, &b0) - loss(&b, &b0)) / (2.0 * eps as f64);
            assert!((fd - gh[i] as f64).abs() < 2e-2, "h[{i}]: fd {fd} vs {}", gh[i]);
        }
        for i in 0..b0.len() {
            let (mut a, mut b) = (b0.clone(), b0.clone());
            a[i] += eps;
            b[i] -= eps;
            let fd = (loss(&h0, &a) - loss(&h0, &b)) / (2.0 * eps as f64);
            assert!((fd - gb[i] as f64).abs() < 2e-2, "bias[{i}]: fd {fd} vs {}", gb[i]);
        }
        // Unbiased variant: same values as a zero bias.
        let ht = Tensor::from_slice(&h0, (rows, hdim), &dev).unwrap();
        let zero = Tensor::zeros((rows, v), candle_core::DType::F32, &dev).unwrap();
        let a: Vec<f32> = vocab_head(&ht, &e, None, targets(rows, v)).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let b: Vec<f32> = vocab_head(&ht, &e, Some(&zero), targets(rows, v)).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn losses_are_zero_when_the_draft_equals_the_target() {
        // One row, V=2, logits (0, ln 3) → p = (0.25, 0.75); target top-2 = the same.
        let dev = Device::Cpu;
        let e = Tensor::from_vec(vec![0.0f32, 1.0], (2, 1), &dev).unwrap();
        let h = Tensor::from_vec(vec![3f32.ln()], (1, 1), &dev).unwrap();
        let tg = HeadTargets { labels: vec![1], k: 2, top_ids: vec![1, 0], top_logp: vec![0.75f32.ln(), 0.25f32.ln()] };
        let o: Vec<f32> = vocab_head(&h, &e, None, tg).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert!((o[0] - (-(0.75f32.ln()))).abs() < 1e-5);
        assert!(o[1].abs() < 1e-5 && o[2].abs() < 1e-5 && o[3] == 1.0, "{o:?}");
    }
}
