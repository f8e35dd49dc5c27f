//! `--budget auto` for the prompt-lookup chain (`sparkling`'s `--lookup` beside its drafter on a
//! host-memory backend, where a round with a match verifies the chain alone): whether a round
//! verifies its chain, or goes on as a round without a match (the drafter's policy then decides
//! between a drafted tree and a plain AR step).
//!
//! A fixed rule verified every chain. On an answer that repeats little, short matches propose
//! tokens that are rarely kept (README's own command: τ 1.05 over 19 lookup rounds of 64), and
//! each verified row costs compute on a CPU (a 1 + 2-row verify ≈ 1.1 AR steps, 1 + 4 ≈ 1.2;
//! far more at long contexts), so those rounds ran slower than plain AR steps. Adaptive draft
//! length (`spec/cpu-anchors.md`) applied to the chain: the acceptance of each kind of match
//! ([`chain_class`]) at each chain position ([`chain_slot`]) is learnt online, and a chain is
//! verified when its expected tokens per millisecond under the measured cost curve beat a
//! plain AR step's ([`chain_worth`]).
//!
//! The acceptance is learnt from every chain, verified or not: each chain is scored against
//! the text the generation went on to commit, whichever proposer committed it (at T > 0 too: a
//! proposed token is kept exactly when the target's draw at its position, which depends only
//! on the prefix and the position, equals it). So a skipped chain is scored over its whole
//! length once enough tokens follow, and chains come back when the text starts repeating.
//! (Scoring only what the round itself committed saw nothing past a plain AR step's one
//! token, so deep positions stayed at their prior.)

use super::AutoState;
use crate::decode::lookup::{Match, MAX_NGRAM};

/// Kinds of match, whose chains are kept at different rates: a 1-, 2- or `MAX_NGRAM`-token
/// suffix match, and a long match (the context agrees with the earlier copy over at least
/// `2 · MAX_NGRAM` tokens: a repeated run).
pub const CHAIN_CLASSES: usize = MAX_NGRAM + 1;

/// Acceptance assumed before any observation, per class and chain slot ([`chain_slot`]):
/// optimistic enough that a generation starts by verifying chains as the fixed rule did (the
/// rule's lengths were tuned on the six evaluation sets, BENCHMARKS.md §34–35), and soon
/// outweighed by observations ([`PRIOR_WEIGHT`]).
pub const PRIOR_RATE: [[f64; CHAIN_SLOTS]; CHAIN_CLASSES] =
    [[0.35, 0.6, 0.6, 0.6, 0.6], [0.5, 0.7, 0.7, 0.7, 0.7], [0.6, 0.75, 0.8, 0.8, 0.8], [0.8, 0.9, 0.9, 0.9, 0.9]];

/// Chain positions learnt apart ([`chain_slot`]): the first token, the second, the 3rd–4th,
/// the 5th–8th and the rest, each given its predecessors were kept. A copy that has gone on
/// for a while tends to go on (the conditional acceptance rises along a chain), so one rate
/// for every later token undervalued long copies (BENCHMARKS.md §38).
pub const CHAIN_SLOTS: usize = 5;

/// The slot of chain position `i` (0-based): 0, 1, 2 for 2–3, 3 for 4–7, 4 beyond.
pub fn chain_slot(i: usize) -> usize {
    match i {
        0 | 1 => i,
        2..=3 => 2,
        4..=7 => 3,
        _ => 4,
    }
}

/// Pseudo-observations behind [`PRIOR_RATE`].
pub const PRIOR_WEIGHT: f64 = 2.0;

/// Decay of the counts per observation of a (class, position) slot: 0.97 weighs the last ≈ 30
/// observations.
pub const CHAIN_DECAY: f64 = 0.97;

/// Online acceptance of lookup chains per match class ([`chain_class`]) and chain position
/// ([`chain_slot`]; each given the ones before it were kept): exponentially decayed counts with
/// [`PRIOR_RATE`] as prior, and the chains still waiting for the text that scores them.
#[derive(Debug, Clone, Default)]
pub struct ChainCalibration {
    /// Chains proposed and not yet scored: class, tokens, and the index in the generated text
    /// of the token their first one predicts.
    pending: std::collections::VecDeque<(usize, Vec<u32>, usize)>,
    /// Decayed tries per class and chain slot.
    tries: [[f64; CHAIN_SLOTS]; CHAIN_CLASSES],
    /// Decayed kept tokens.
    kept: [[f64; CHAIN_SLOTS]; CHAIN_CLASSES],
}

/// The class of a lookup match: `ngram − 1` for a 1..=`MAX_NGRAM`-token suffix match, the last
/// class for a match of at least `2 · MAX_NGRAM` tokens. `None` without a match.
pub fn chain_class(m: &Match) -> Option<usize> {
    match m.ngram {
        0 => None,
        _ if m.matched >= 2 * MAX_NGRAM => Some(CHAIN_CLASSES - 1),
        n => Some(n.min(MAX_NGRAM) - 1),
    }
}

impl ChainCalibration {
    /// The estimated acceptance of class `class` at chain position `position` (0: the first
    /// token; later ones given their predecessors were kept; [`chain_slot`]), in (0, 1).
    pub fn rate(&self, class: usize, position: usize) -> f64 {
        let p = chain_slot(position);
        (self.kept[class][p] + PRIOR_WEIGHT * PRIOR_RATE[class][p]) / (self.tries[class][p] + PRIOR_WEIGHT)
    }

    /// Drop the chains still waiting to be scored (their positions index one generation's text).
    pub fn clear_pending(&mut self) {
        self.pending.clear();
    }

    /// Queue a chain of class `class` whose first token predicts the generated text's token
    /// `start`, to be scored by [`ChainCalibration::resolve`].
    pub fn push(&mut self, class: usize, chain: Vec<u32>, start: usize) {
        self.pending.push_back((class, chain, start));
    }

    /// Score the queued chains that the generated text `text` (every token committed so far)
    /// decides: those it covers whole, and those it contradicts somewhere
    /// ([`ChainCalibration::observe`] against the text from their start).
    pub fn resolve(&mut self, text: &[u32]) {
        let pending = std::mem::take(&mut self.pending);
        for (class, chain, start) in pending {
            let seen = &text[start.min(text.len())..];
            if seen.len() >= chain.len() || chain.iter().zip(seen).any(|(a, b)| a != b) {
                self.observe(class, &chain, seen);
            } else {
                self.pending.push_back((class, chain, start));
            }
        }
    }

    /// Score a chain of class `class` against the tokens that were generated in its place
    /// (`text`): position by position while they agree, the first disagreement counted as a
    /// miss; positions past `text` are unknown and not counted.
    pub fn observe(&mut self, class: usize, chain: &[u32], text: &[u32]) {
        for (i, (a, b)) in chain.iter().zip(text).enumerate() {
            let p = chain_slot(i);
            self.tries[class][p] = self.tries[class][p] * CHAIN_DECAY + 1.0;
            self.kept[class][p] = self.kept[class][p] * CHAIN_DECAY + f64::from(u8::from(a == b));
            if a != b {
                break;
            }
        }
    }
}

/// Whether a chain of `len` tokens is worth verifying: `E / (c(1 + len) + t_round)` above
/// `1 / (c(1) + t_round)` (a plain AR step), with `E = 1 + Σ_{i ≤ len} Π_{j ≤ i} q_j` the
/// expected tokens committed (accepted chain tokens + the bonus; `q_j = q[j − 1]` the rate of
/// chain position `j` given the ones before it were kept, the last entry standing for
/// positions past the slice), `c` the verify-cost curve and `t_round` the round's overhead,
/// both in ms. Returns `(len, E)` when it is, `(0, 1)` when not.
///
/// All or nothing: cutting a chain to the prefix that maximises the same ratio was tried and
/// ran slower where it mattered — a summary that copies its 1 500-token prompt, 200 tokens:
/// 253–286 tok/s (78 rounds) against 280–313 for the fixed rule (50 rounds) and 284–340 whole
/// or nothing (52 rounds); equal on the six evaluation sets (BENCHMARKS.md §38). A copy that
/// runs on is worth more than the per-position rates predict.
pub fn chain_worth(q: &[f64], len: usize, verify_ms: &dyn Fn(usize) -> f64, round_ms: f64) -> (usize, f64) {
    let mut e = 1.0;
    let mut reach = 1.0;
    for i in 0..len {
        reach *= q.get(i).or(q.last()).copied().unwrap_or(0.0);
        e += reach;
    }
    let ar = 1.0 / (verify_ms(1) + round_ms).max(1e-9);
    if len > 0 && e / (verify_ms(1 + len) + round_ms).max(1e-9) > ar {
        (len, e)
    } else {
        (0, 1.0)
    }
}

impl AutoState {
    /// This state for the next generation ([`crate::decode::budget::AutoBudget::resume`]): all
    /// it learnt, without the previous generation's chains still waiting to be scored.
    pub fn resumed(&self) -> AutoState {
        let mut s = self.clone();
        s.chains.clear_pending();
        s
    }

    /// How many tokens of the lookup chain `m` this round verifies: all or none
    /// ([`chain_worth`] with the class's learnt rates and the cost model); 0 without a match.
    pub fn chain_len(&self, m: &Match) -> usize {
        match chain_class(m) {
            None => 0,
            Some(c) => {
                let cal = &self.chains;
                let q: Vec<f64> = (0..m.tokens.len()).map(|i| cal.rate(c, i)).collect();
                chain_worth(&q, m.tokens.len(), &|rows| self.verify_ms(rows), self.round_ms()).0
            }
        }
    }

    /// Queue the round's lookup chain `m` (whether or not it was verified), whose first token
    /// predicts token `start` of the generated text, and score every queued chain that `text`
    /// (all tokens committed so far) decides ([`ChainCalibration::resolve`]).
    pub fn observe_chain(&mut self, m: &Match, start: usize, text: &[u32]) {
        if let Some(c) = chain_class(m) {
            self.chains.push(c, m.tokens.clone(), start);
        }
        self.chains.resolve(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(tokens: &[u32], ngram: usize, matched: usize) -> Match {
        Match { tokens: tokens.to_vec(), ngram, matched }
    }

    #[test]
    fn classes_follow_the_match() {
        assert_eq!(chain_class(&Match::default()), None);
        assert_eq!(chain_class(&m(&[1, 2], 1, 1)), Some(0));
        assert_eq!(chain_class(&m(&[1, 2, 3, 4], 2, 2)), Some(1));
        assert_eq!(chain_class(&m(&[1; 6], 3, 5)), Some(2));
        assert_eq!(chain_class(&m(&[1; 6], 3, 6)), Some(3));
        assert_eq!(chain_class(&m(&[1; 16], 3, 16)), Some(3));
    }

    #[test]
    fn observation_scores_each_position_until_the_first_miss() {
        let mut c = ChainCalibration::default();
        assert!((c.rate(0, 0) - PRIOR_RATE[0][0]).abs() < 1e-12, "prior before any observation");
        // 7 9 4 against a round that committed 7 9 5: positions 0 and 1 kept, 2 missed.
        c.observe(0, &[7, 9, 4], &[7, 9, 5]);
        assert_eq!((c.tries[0], c.kept[0]), ([1.0, 1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0, 0.0]));
        // Positions 2 and 3 share a slot, 4–7 the next, 8 on the last.
        assert_eq!((0..12).map(chain_slot).collect::<Vec<_>>(), [0, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4]);
        let mut long = ChainCalibration::default();
        long.observe(3, &[1; 10], &[1; 9]);
        assert_eq!(long.kept[3], [1.0, 1.0, 1.0 + CHAIN_DECAY, 1.0 + CHAIN_DECAY * (1.0 + CHAIN_DECAY * (1.0 + CHAIN_DECAY)), 1.0]);
        assert_eq!(long.tries[3], long.kept[3], "9 committed tokens: positions 0–8 known and kept, 9 unknown");
        // A plain AR step committing one token: only the first position is known.
        c.observe(0, &[3, 3, 3], &[2]);
        assert!((c.tries[0][0] - (CHAIN_DECAY + 1.0)).abs() < 1e-12);
        assert!((c.kept[0][0] - CHAIN_DECAY).abs() < 1e-12);
        assert_eq!(c.tries[0][1..], [1.0, 1.0, 0.0, 0.0], "later positions untouched by a one-token round");
        // Rates move towards what was observed: the first position 1 of 2 kept.
        let want = (CHAIN_DECAY + PRIOR_WEIGHT * PRIOR_RATE[0][0]) / (CHAIN_DECAY + 1.0 + PRIOR_WEIGHT);
        assert!((c.rate(0, 0) - want).abs() < 1e-12);
        // Other classes are untouched.
        assert_eq!(c.rate(2, 0), PRIOR_RATE[2][0]);
        // Every miss drives the rate down towards 0.
        for _ in 0..200 {
            c.observe(1, &[1, 2], &[5]);
        }
        assert!(c.rate(1, 0) < 0.07, "rate after 200 misses: {}", c.rate(1, 0));
    }

    #[test]
    fn a_chain_is_scored_once_the_text_decides_it() {
        let mut c = ChainCalibration::default();
        // A chain of 4 predicting text tokens 10..14, one of 2 predicting 11..13 and one of 2
        // predicting 10..12.
        c.push(3, vec![5, 6, 7, 8], 10);
        c.push(1, vec![6, 9], 11);
        c.push(0, vec![5, 9], 10);
        let mut text: Vec<u32> = vec![0; 10];
        text.extend([5, 6]);
        c.resolve(&text);
        // The first agrees so far, and the second's first token too: waiting. The third missed
        // at its 2nd token (6 ≠ 9): scored.
        assert_eq!(c.pending.len(), 2);
        assert_eq!((c.tries[0], c.kept[0]), ([1.0, 1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]));
        assert_eq!(c.tries[1], [0.0; CHAIN_SLOTS], "undecided: not scored yet");
        text.extend([7]);
        c.resolve(&text);
        assert_eq!(c.pending.len(), 1, "the first: 3 of 4 tokens agree, still undecided");
        assert_eq!((c.tries[1], c.kept[1]), ([1.0, 1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]), "the second: 6 kept, 9 ≠ 7");
        text.extend([8, 1]);
        c.resolve(&text);
        assert!(c.pending.is_empty());
        let two = 1.0 + CHAIN_DECAY;
        assert_eq!((c.tries[3], c.kept[3]), ([1.0, 1.0, two, 0.0, 0.0], [1.0, 1.0, two, 0.0, 0.0]), "all 4 kept, slot 2 twice");
    }

    #[test]
    fn a_resumed_state_keeps_the_rates_and_drops_the_waiting_chains() {
        let cost = crate::decode::budget::CostModel::from_points(vec![1, 2], vec![4.0, 4.2], 1.0);
        let mut a = AutoState::new(cost, 8);
        // A 1-token match whose chain [4, 5] missed at once (the text went on with 9), and a
        // long one still agreeing with the text so far.
        a.observe_chain(&m(&[4, 5], 1, 1), 3, &[1, 2, 3, 9]);
        a.observe_chain(&m(&[7; 8], 3, 8), 4, &[1, 2, 3, 9, 7]);
        assert_eq!(a.chains.pending.len(), 1);
        let r = a.resumed();
        assert!(r.chains.pending.is_empty(), "a new generation's text would score it at the wrong positions");
        assert_eq!((r.chains.tries, r.chains.kept), (a.chains.tries, a.chains.kept));
        assert!(r.chains.rate(0, 0) < PRIOR_RATE[0][0]);
    }

    #[test]
    fn a_chain_is_verified_whole_where_it_pays_for_its_rows() {
        // A CPU-like curve: 1 row 4 ms, each further row 0.2 ms.
        let cost = |rows: usize| 4.0 + 0.2 * (rows - 1) as f64;
        // A hopeless chain: none of it (a plain AR step).
        assert_eq!(chain_worth(&[0.02, 0.5], 4, &cost, 0.0), (0, 1.0));
        // One token breaks even at q = 0.2 / 4 = 0.05: above it, verify it.
        assert_eq!(chain_worth(&[0.1], 1, &cost, 0.0).0, 1);
        assert_eq!(chain_worth(&[0.04], 1, &cost, 0.0).0, 0);
        // A reliable chain: E = 1 + 0.9 + 0.81 + … over 5 rows at 4.8 ms.
        let (l, e) = chain_worth(&[0.9, 0.9], 4, &cost, 0.0);
        assert_eq!(l, 4);
        assert!((e - (1.0 + 0.9 + 0.81 + 0.729 + 0.6561)).abs() < 1e-12);
        // Per-position rates: the same first token with a dead tail is not worth 4 rows.
        assert_eq!(chain_worth(&[0.1, 0.0], 4, &cost, 0.0).0, 0);
        // Rows that each cost a whole AR step: E(L) / (L + 1) < 1 for any q < 1.
        let steep = |rows: usize| 4.0 * rows as f64;
        assert_eq!(chain_worth(&[0.99], 4, &steep, 0.0).0, 0);
        // The round's overhead makes each round dearer and so extra rows relatively cheaper.
        assert_eq!(chain_worth(&[0.04], 1, &cost, 2.0).0, 1);
        assert_eq!(chain_worth(&[0.9], 0, &cost, 0.0), (0, 1.0), "an empty chain");
    }
}
