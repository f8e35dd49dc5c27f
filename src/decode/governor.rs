//! The batch's load governor: whether a step of several sequences under `--budget auto` lets
//! their policies speculate, or runs every one of them as a plain AR step.
//!
//! Each sequence's [`super::policy::Auto`] prices its own tree against the batch's rows
//! ([`super::budget::AutoState::set_load`]), one sequence at a time: it cannot see that every
//! neighbour also drafts (one more drafter forward, more verify rows, more tree building) in the
//! same step. Measured on the six sets' chat prompts (BENCHMARKS.md §41), that left speculation
//! 0.96× / 0.80× / 0.76× of `ar` at 4 / 8 / 16 concurrent requests. The governor decides per
//! step from what the batch itself measured: for each load level (the number of sequences
//! running rounds, in power-of-two buckets) it keeps the recent throughput (committed tokens
//! per ms of whole step) of *speculating* steps and of *forced-AR* steps, and runs the better
//! arm, trying the other one every [`Governor::EXPLORE`]-th step of that level so a change in
//! the prompts' predictability is seen. Until each arm of a level has
//! [`Governor::MIN_SAMPLES`] steps, the levels take turns.
//!
//! A sequence alone (one round in the step) is never governed: its own policy already compares
//! its trees with an AR step, so `generate` and a lone request behave as before. Sequences
//! at a fixed `--budget`, `ar` and `lookup` are never forced. Whatever a step verifies, the
//! target's tokens are committed, so the governor changes speed, never tokens.

use super::policy::{Plan, RoundCtx, RoundPolicy};

/// Load buckets: 2, 3–4, 5–8, 9–16, 17–32, more.
const BUCKETS: usize = 6;

fn bucket(rounds: usize) -> usize {
    let b = usize::BITS - (rounds.max(2) - 1).leading_zeros(); // 2 → 1, 3..4 → 2, 5..8 → 3, …
    (b as usize - 1).min(BUCKETS - 1)
}

/// One arm's recent throughput at one load level.
#[derive(Debug, Clone, Copy, Default)]
struct Arm {
    /// Exponential moving average of committed tokens per ms.
    rate: f64,
    /// Steps measured.
    n: u32,
}

impl Arm {
    fn observe(&mut self, rate: f64) {
        self.rate = if self.n == 0 { rate } else { self.rate + Governor::ALPHA * (rate - self.rate) };
        self.n = self.n.saturating_add(1);
    }
}

/// What a step does under the governor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepArm {
    /// The sequences' own policies plan their rounds.
    Speculate,
    /// Every governed sequence verifies its anchor alone.
    ForceAr,
}

/// Per-load-level throughput of speculating and forced-AR steps (module docs).
#[derive(Debug, Clone, Default)]
pub struct Governor {
    spec: [Arm; BUCKETS],
    ar: [Arm; BUCKETS],
    steps: [u32; BUCKETS],
}

impl Governor {
    /// Weight of a new step in an arm's average.
    pub const ALPHA: f64 = 0.1;
    /// Steps each arm of a level is measured before the better one is chosen.
    pub const MIN_SAMPLES: u32 = 4;
    /// Once chosen, the other arm runs every this many steps of the level.
    pub const EXPLORE: u32 = 16;

    /// The arm of a step in which `rounds` governed sequences run rounds (`None`: not
    /// governed, fewer than two).
    pub fn choose(&mut self, rounds: usize) -> Option<StepArm> {
        if rounds < 2 {
            return None;
        }
        let b = bucket(rounds);
        self.steps[b] = self.steps[b].wrapping_add(1);
        let (s, a) = (self.spec[b], self.ar[b]);
        let arm = if s.n < Self::MIN_SAMPLES || a.n < Self::MIN_SAMPLES {
            if s.n <= a.n {
                StepArm::Speculate
            } else {
                StepArm::ForceAr
            }
        } else {
            let best = if s.rate >= a.rate { StepArm::Speculate } else { StepArm::ForceAr };
            let explore = self.steps[b].is_multiple_of(Self::EXPLORE);
            match (best, explore) {
                (StepArm::Speculate, true) => StepArm::ForceAr,
                (StepArm::ForceAr, true) => StepArm::Speculate,
                (arm, false) => arm,
            }
        };
        Some(arm)
    }

    /// A governed step of `rounds` sequences ran `arm`, committed `tokens` and took `ms`
    /// (planning, drafting, the target forward and committing).
    pub fn observe(&mut self, rounds: usize, arm: StepArm, tokens: usize, ms: f64) {
        if rounds < 2 || ms <= 0.0 || !ms.is_finite() {
            return;
        }
        let b = bucket(rounds);
        let rate = tokens as f64 / ms;
        match arm {
            StepArm::Speculate => self.spec[b].observe(rate),
            StepArm::ForceAr => self.ar[b].observe(rate),
        }
    }

    /// `(speculating, forced-AR)` tokens per ms at the load of `rounds` sequences, once measured.
    pub fn rates(&self, rounds: usize) -> (Option<f64>, Option<f64>) {
        let b = bucket(rounds.max(2));
        let f = |a: Arm| (a.n > 0).then_some(a.rate);
        (f(self.spec[b]), f(self.ar[b]))
    }
}

/// The policy of a governed sequence in a forced-AR step: its anchor alone, the drafter skipped.
pub struct ForcedAr;

impl RoundPolicy for ForcedAr {
    fn plan(&mut self, _ctx: &RoundCtx<'_>) -> Plan {
        Plan::Ar { skipped: true }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two() {
        assert_eq!([2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 1000].map(bucket), [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]);
    }

    #[test]
    fn alone_is_never_governed() {
        let mut g = Governor::default();
        assert_eq!(g.choose(1), None);
        assert_eq!(g.choose(0), None);
    }

    #[test]
    fn measures_both_arms_then_runs_the_faster_and_explores() {
        let mut g = Governor::default();
        // Speculation at 8 sequences: 0.5 tokens/ms; AR: 0.7.
        let mut arms = Vec::new();
        for _ in 0..64 {
            let arm = g.choose(8).unwrap();
            arms.push(arm);
            g.observe(8, arm, if arm == StepArm::Speculate { 5 } else { 7 }, 10.0);
        }
        let first = &arms[..8];
        assert_eq!(first.iter().filter(|&&a| a == StepArm::Speculate).count(), 4, "{first:?}");
        let later = &arms[8..];
        let spec = later.iter().filter(|&&a| a == StepArm::Speculate).count();
        // AR wins; speculation only on exploration steps (every 16th).
        assert!((2..=4).contains(&spec), "{spec} speculating steps of {}", later.len());
        assert_eq!(g.rates(8), (Some(0.5), Some(0.7)));
        // Another level is measured on its own: at 2 sequences speculation wins.
        for _ in 0..40 {
            let arm = g.choose(2).unwrap();
            g.observe(2, arm, if arm == StepArm::Speculate { 9 } else { 6 }, 10.0);
        }
        assert_eq!(g.choose(2), Some(StepArm::Speculate));
        let (s, a) = g.rates(2);
        assert!(s.unwrap() > a.unwrap());
    }

    #[test]
    fn bad_timings_are_ignored() {
        let mut g = Governor::default();
        g.observe(4, StepArm::Speculate, 3, 0.0);
        g.observe(4, StepArm::Speculate, 3, f64::NAN);
        g.observe(1, StepArm::Speculate, 3, 1.0);
        assert_eq!(g.rates(4), (None, None));
    }
}
