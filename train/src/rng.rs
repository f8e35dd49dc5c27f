//! Seeded, counter-based randomness for the trainer: every draw is a pure function of
//! `(seed, stream, counter)`, so a run resumed from a checkpoint draws exactly what an
//! uninterrupted run would (SplitMix64, the engine's mixer `sparkling::decode::rng::splitmix64`).

use sparkling::decode::rng::splitmix64;

/// A small deterministic generator (SplitMix64 stream).
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator for `(seed, stream)`; different streams are independent in practice.
    pub fn new(seed: u64, stream: u64) -> Self {
        Rng { state: splitmix64(seed ^ splitmix64(stream.wrapping_add(0x5EED))) }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        splitmix64(self.state)
    }

    /// Uniform in `[0, 1)` with 53-bit resolution.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform integer in `0..n` (`n > 0`; returns 0 for `n == 0`).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        (self.uniform() * n as f64) as usize % n
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }

    /// Fisher–Yates shuffle in place.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }

    /// `k` distinct values from `lo..hi` (all of them, shuffled, when the range is smaller).
    pub fn sample_distinct(&mut self, lo: usize, hi: usize, k: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (lo..hi).collect();
        self.shuffle(&mut all);
        all.truncate(k);
        all.sort_unstable();
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = Rng::new(1, 2);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..4)
            .map({
                let mut r = Rng::new(1, 2);
                move |_| r.next_u64()
            })
            .collect();
        let c = Rng::new(1, 3).next_u64();
        assert_eq!(a, b);
        assert_ne!(a[0], c);
    }

    #[test]
    fn normal_has_unit_variance() {
        let mut r = Rng::new(7, 0);
        let n = 20_000;
        let xs: Vec<f32> = (0..n).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f32>() / n as f32;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n as f32;
        assert!(mean.abs() < 0.03 && (var - 1.0).abs() < 0.05, "{mean} {var}");
    }
}
