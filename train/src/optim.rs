//! AdamW (Loshchilov & Hutter: decoupled weight decay) with bias correction and global-norm
//! gradient clipping, over the named parameters of [`crate::model::Params`]. Its moments are
//! plain named tensors so a training checkpoint stores them and `--resume` continues exactly.

use crate::error::{Error, Result};
use crate::model::Params;
use candle_core::backprop::GradStore;
use candle_core::Tensor;
use std::collections::BTreeMap;

/// AdamW hyper-parameters.
#[derive(Debug, Clone, Copy)]
pub struct AdamWConfig {
    /// β₁.
    pub beta1: f64,
    /// β₂.
    pub beta2: f64,
    /// ε.
    pub eps: f64,
    /// Decoupled weight decay (applied to matrices only, never to norm weights or biases).
    pub weight_decay: f64,
    /// Clip the global gradient norm to this value (0 = off).
    pub clip: f64,
}

/// Optimizer state.
pub struct AdamW {
    /// Hyper-parameters.
    pub cfg: AdamWConfig,
    /// Steps taken.
    pub t: u64,
    /// First moments by parameter name.
    pub m: BTreeMap<String, Tensor>,
    /// Second moments by parameter name.
    pub v: BTreeMap<String, Tensor>,
}

impl AdamW {
    /// Zero state for `params`.
    pub fn new(cfg: AdamWConfig, params: &Params) -> Result<Self> {
        let mut m = BTreeMap::new();
        let mut v = BTreeMap::new();
        for (n, p) in &params.vars {
            m.insert(n.clone(), p.as_tensor().zeros_like()?);
            v.insert(n.clone(), p.as_tensor().zeros_like()?);
        }
        Ok(AdamW { cfg, t: 0, m, v })
    }

    /// One update at learning rate `lr`. Parameters without a gradient are left alone.
    /// Returns the global gradient norm before clipping.
    pub fn step(&mut self, params: &Params, grads: &GradStore, lr: f64) -> Result<f64> {
        let mut sq = 0f64;
        for p in params.vars.values() {
            if let Some(g) = grads.get(p.as_tensor()) {
                sq += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
            }
        }
        let norm = sq.sqrt();
        if !norm.is_finite() {
            return Err(Error(format!("gradient norm is {norm}; stopping (lower --lr?)")));
        }
        let clip = if self.cfg.clip > 0.0 && norm > self.cfg.clip { self.cfg.clip / norm } else { 1.0 };
        self.t += 1;
        let c = self.cfg;
        let bc1 = 1.0 - c.beta1.powi(self.t as i32);
        let bc2 = 1.0 - c.beta2.powi(self.t as i32);
        for (name, p) in &params.vars {
            let Some(g) = grads.get(p.as_tensor()) else { continue };
            let g = (g * clip)?;
            let m = self.m.get_mut(name).ok_or_else(|| Error(format!("optimizer has no state for `{name}`")))?;
            *m = ((&*m * c.beta1)? + (&g * (1.0 - c.beta1))?)?;
            let v = self.v.get_mut(name).ok_or_else(|| Error(format!("optimizer has no state for `{name}`")))?;
            *v = ((&*v * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
            let upd = ((&*m / bc1)? / ((&*v / bc2)?.sqrt()? + c.eps)?)?;
            let decay = if p.as_tensor().rank() >= 2 && !name.contains("markov") { c.weight_decay } else { 0.0 };
            let w = p.as_tensor();
            let new = ((w * (1.0 - lr * decay))? - (upd * lr)?)?;
            p.set(&new)?;
        }
        Ok(norm)
    }
}

/// Learning rate at `step` (0-based): linear warm-up over `warmup` steps to `peak`, then cosine
/// decay to `peak * min_ratio` at `total`.
pub fn lr_at(step: usize, total: usize, warmup: usize, peak: f64, min_ratio: f64) -> f64 {
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup).max(1) as f64;
    let t = ((step - warmup) as f64 / span).min(1.0);
    peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn schedule_shape() {
        assert!((lr_at(0, 100, 10, 1.0, 0.1) - 0.1).abs() < 1e-12);
        assert!((lr_at(9, 100, 10, 1.0, 0.1) - 1.0).abs() < 1e-12);
        assert!((lr_at(100, 100, 10, 1.0, 0.1) - 0.1).abs() < 1e-12);
        assert!(lr_at(50, 100, 10, 1.0, 0.1) < 1.0);
    }

    #[test]
    fn minimises_a_quadratic() {
        let w = Var::from_vec(vec![3.0f32, -2.0], (1, 2), &Device::Cpu).unwrap();
        let mut vars = BTreeMap::new();
        vars.insert("w".to_string(), w.clone());
        let params = Params { vars };
        let mut opt = AdamW::new(AdamWConfig { beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.0, clip: 10.0 }, &params).unwrap();
        for _ in 0..300 {
            let loss = w.as_tensor().sqr().unwrap().sum_all().unwrap();
            let g = loss.backward().unwrap();
            opt.step(&params, &g, 0.05).unwrap();
        }
        let v: Vec<f32> = w.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        assert!(v.iter().all(|x| x.abs() < 0.05), "{v:?}");
    }
}
