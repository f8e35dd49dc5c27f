//! Prompt lookup: a drafter-free proposer for [`super::Method::Lookup`]. The continuation of
//! the most recent earlier occurrence of the context's last tokens is proposed as a chain
//! (prompt lookup decoding, Saxena 2023; the n-gram copy idea of LLMA, Yang et al. 2023). The
//! target verifies the chain like any draft, so the output is exactly the target's.
//!
//! Replayed over SmolLM2's own greedy answers it reaches τ 1.50 at chains of 2 and 1.65 at 4 on
//! the six evaluation sets, above the trained drafter at those budgets, with no drafter forward
//! (BENCHMARKS.md §33 d, `scripts/lookup-tau.py`).

use super::GenParams;

/// Longest suffix matched: the last 3 tokens, else 2, else 1.
pub const MAX_NGRAM: usize = 3;

/// Longest lookup chain accepted (`--lookup N`, `lookup`'s `--budget`): the copy repeats the
/// matched run past the context's end, so an unbounded N verified thousands of rows of one
/// repeated phrase per round (a user trial: `--lookup 8000` ran 350× slower, exact tokens).
pub const MAX_CHAIN: usize = 64;

/// Prompt lookup beside a drafter (`--lookup`): each round, the lookup chain ([`propose`], up
/// to `len` tokens) is grafted onto the drafter's tree ([`DraftTree::graft_chain`]), so the
/// target verifies both sources in one forward and keeps whichever path it agrees with; with
/// `skip_drafter`, a round whose lookup finds a match verifies the chain alone and skips the
/// drafter (whose tree rarely adds to a matched chain what its forward and its extra verify
/// rows cost on a CPU: BENCHMARKS.md §34). Lossless either way: the target verifies every
/// node. Not read by `ar` and `lookup` (whose chain is its tree budget).
///
/// [`DraftTree::graft_chain`]: sparkling_core::tree::DraftTree::graft_chain
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupGraft {
    /// Longest chain grafted, tokens (0: off).
    pub len: usize,
    /// Skip the drafter in rounds whose lookup finds a match.
    pub skip_drafter: bool,
}

impl LookupGraft {
    /// No lookup: the drafter's tree alone.
    pub const OFF: LookupGraft = LookupGraft { len: 0, skip_drafter: false };
}

/// Chain length after a `max_ngram`-token match of no more than `BASE_CHAIN` tokens at T = 0
/// (shorter matches get ⌈BASE_CHAIN·n / max_ngram⌉; [`propose`], [`base_chain`]).
pub const BASE_CHAIN: usize = 6;

/// The base chain length `k` of [`propose`] at sampling temperature `temperature`:
/// [`BASE_CHAIN`] when greedy, half of it when sampling. At T > 0 a proposed token is kept
/// only when the target's draw equals it (probability p(token) < 1 even for its argmax), so
/// acceptance falls off faster along a chain and the rows past the first few rarely pay:
/// six sets at T = 1, 256 tokens, in the same processes, `lookup` 1.09× / 1.10× `ar` with
/// k = 3 against 1.04× / 1.09× with k = 6, `sparkling` 1.09× / 1.05× against 1.08× / 1.00×
/// (BENCHMARKS.md §35 c). Long matches still extend the chain.
pub fn base_chain(temperature: f32) -> usize {
    if temperature < 1e-5 {
        BASE_CHAIN
    } else {
        BASE_CHAIN / 2
    }
}

/// A round's lookup chain for a generation under `p` that has committed `out` after `prompt`
/// (the round's anchor last): [`propose`] with the base chain of `p`'s temperature
/// ([`base_chain`]), cut to the tokens still to generate less the bonus (a longer chain would
/// be verified for nothing: the commit is cut at `max_new_tokens`). `max_len`: `lookup`'s
/// chain length or the `--lookup` graft's. `Engine::generate` and `Batch` both propose
/// through it, so a sequence proposes the same chains batched as alone.
pub fn round_chain(prompt: &[u32], out: &[u32], max_len: usize, p: &GenParams) -> Vec<u32> {
    round_match(prompt, out, max_len, p).tokens
}

/// [`round_chain`] with the match it came from ([`propose_match`]).
pub fn round_match(prompt: &[u32], out: &[u32], max_len: usize, p: &GenParams) -> Match {
    let mut context = Vec::with_capacity(prompt.len() + out.len());
    context.extend_from_slice(prompt);
    context.extend_from_slice(out);
    let mut m = propose_match(&context, max_len, base_chain(p.sampling.temperature), MAX_NGRAM);
    m.tokens.truncate(p.max_new_tokens.saturating_sub(out.len() + 1));
    m
}

/// A lookup chain and the match it copies ([`propose_match`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Match {
    /// The proposed tokens (empty: no match).
    pub tokens: Vec<u32>,
    /// Tokens of the matched suffix (1 ..= `max_ngram`; 0 without a match).
    pub ngram: usize,
    /// The match's whole length: how far back the context agrees with the earlier copy
    /// (`ngram` for a shorter-than-`max_ngram` match; see [`propose`]).
    pub matched: usize,
}

/// Up to `max_len` draft tokens for the position after `context` (prompt and committed tokens,
/// oldest first, the round's anchor last): for `n` = `max_ngram` down to 1, the most recent
/// earlier occurrence of the last `n` tokens (its end before the context's end) gives the
/// tokens that followed it; the first `n` with a match wins.
///
/// The chain's length follows the match's, with `k = min(max_len, base)` (`base`:
/// [`base_chain`], 6 when greedy):
/// - after a 1- or 2-token match (n < `max_ngram`), `⌈k·n / max_ngram⌉` tokens (2 / 4 for
///   k = 6): a short match is a weak guess, and each verified row costs compute on a CPU
///   (BENCHMARKS.md §34 g);
/// - after a full `max_ngram`-token match, the occurrence's whole match length `m` (how far
///   back before the suffix the context agrees with it), at least `k`, at most `max_len`: a
///   long repeated run — a quoted line, a repeated code block, a loop the model fell into —
///   is likely to go on repeating (replayed over SmolLM2's greedy answers on the six sets at
///   512 tokens: τ 2.29 → 2.47 at `max_len` 16, unchanged at T = 1; in the engine τ 2.64 →
///   2.89 but only ≈ 1 % faster, as rows 7–17 cost twice what rows 2–6 do; BENCHMARKS.md §35 b).
///
/// The copy runs on past the context's end into the tokens it has proposed (as an LZ77 copy
/// does), so inside a repeating run of period `p` the chain continues the run instead of
/// stopping after `p` tokens. Empty when nothing matches, `max_len` is 0 or the context is
/// shorter than 2 tokens. A scan from the end: O(len · n) per call, microseconds at the
/// context lengths served here (an n-gram index would make it O(1) at long contexts).
pub fn propose(context: &[u32], max_len: usize, base: usize, max_ngram: usize) -> Vec<u32> {
    propose_match(context, max_len, base, max_ngram).tokens
}

/// [`propose`], with the suffix length and the whole match length it used ([`Match`]).
pub fn propose_match(context: &[u32], max_len: usize, base: usize, max_ngram: usize) -> Match {
    let len = context.len();
    let k = max_len.min(base);
    if k == 0 {
        return Match::default();
    }
    for n in (1..=max_ngram).rev() {
        if len < n + 1 {
            continue;
        }
        let suffix = &context[len - n..];
        // Start positions s of an earlier occurrence context[s..s + n], most recent first, each
        // ending before the context's last token (so at least one token follows it).
        for s in (0..len - n).rev() {
            if &context[s..s + n] == suffix {
                let mut m = n;
                let want = if n < max_ngram {
                    (k * n).div_ceil(max_ngram)
                } else {
                    // The match's whole length m: the tokens before both copies that agree.
                    while m < max_len && m - n < s && context[s - (m - n) - 1] == context[len - m - 1] {
                        m += 1;
                    }
                    k.max(m).min(max_len)
                };
                let mut follow = Vec::with_capacity(want);
                for i in s + n..s + n + want {
                    follow.push(if i < len { context[i] } else { follow[i - len] });
                }
                return Match { tokens: follow, ngram: n, matched: m };
            }
        }
    }
    Match::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_most_recent_longest_match() {
        // "1 2 3" occurred twice; the most recent occurrence (positions 5..8) was followed by 9.
        let ctx = [1, 2, 3, 4, 5, 1, 2, 3, 9, 7, 1, 2, 3];
        assert_eq!(propose(&ctx, 1, BASE_CHAIN, 3), vec![9]);
        assert_eq!(propose(&ctx, 3, BASE_CHAIN, 3), vec![9, 7, 1]);
        // With a 4-gram limit the same 3-token match gets ⌈4·3/4⌉ = 3 of k = 4 tokens.
        assert_eq!(propose(&ctx, 4, BASE_CHAIN, 4), vec![9, 7, 1]);
        // Past the context's end the copy continues into its own proposal: 9, 7, 1, 2, 3 are
        // the context's, then 9, … repeats with the match's period (5). A 3-token match gets
        // BASE_CHAIN = 6 tokens when `max_len` allows more.
        assert_eq!(propose(&ctx, 10, BASE_CHAIN, 3), vec![9, 7, 1, 2, 3, 9]);
        assert_eq!(propose(&ctx, 64, BASE_CHAIN, 3).len(), BASE_CHAIN);
    }

    #[test]
    fn a_long_match_proposes_as_many_tokens_as_it_matched() {
        // 20..=29, then 5, then 20..=27 again: the last 3 tokens match at 5..8, and the 8
        // tokens 20..=27 agree with the earlier copy (the match's whole length m = 8).
        let mut ctx: Vec<u32> = (20..30).collect();
        ctx.push(5);
        ctx.extend(20..28);
        assert_eq!(propose(&ctx, 16, BASE_CHAIN, 3), vec![28, 29, 5, 20, 21, 22, 23, 24], "m = 8 tokens, under max_len");
        assert_eq!(propose(&ctx, 7, BASE_CHAIN, 3), vec![28, 29, 5, 20, 21, 22, 23], "capped at max_len");
        assert_eq!(propose(&ctx, 6, BASE_CHAIN, 3), vec![28, 29, 5, 20, 21, 22], "max_len = BASE_CHAIN: the short-match rule");
        assert_eq!(propose(&ctx, 4, BASE_CHAIN, 3), vec![28, 29, 5, 20]);
        // A match of exactly 3 tokens gets BASE_CHAIN, whatever max_len above it.
        let ctx = [7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3];
        assert_eq!(propose(&ctx, 16, BASE_CHAIN, 3), vec![4, 5, 6, 7, 8, 9]);
        // Inside a long periodic run the match reaches back to the run's start.
        let run: Vec<u32> = [1, 2].repeat(12);
        assert_eq!(propose(&run, 16, BASE_CHAIN, 3), [1, 2].repeat(8));
    }

    #[test]
    fn sampling_halves_the_base_chain_but_not_a_long_match() {
        assert_eq!((base_chain(0.0), base_chain(0.7), base_chain(1.0)), (BASE_CHAIN, BASE_CHAIN / 2, BASE_CHAIN / 2));
        let ctx = [7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3];
        assert_eq!(propose(&ctx, 16, 3, 3), vec![4, 5, 6], "a 3-token match: k = 3");
        assert_eq!(propose(&[7, 9, 4, 5, 8, 9], 16, 3, 3), vec![4], "a 1-token match: ⌈3/3⌉");
        let mut long: Vec<u32> = (20..30).collect();
        long.push(5);
        long.extend(20..28);
        assert_eq!(propose(&long, 16, 3, 3).len(), 8, "an 8-token match keeps its length");
    }

    #[test]
    fn falls_back_to_shorter_suffixes_and_to_nothing() {
        // No earlier "8 9" nor "5 8 9"; an earlier "9" at 1 is followed by 4 — a 1-token match,
        // so ⌈k/3⌉ tokens: 1 of k = 2, 2 of k = 6.
        assert_eq!(propose(&[7, 9, 4, 5, 8, 9], 2, BASE_CHAIN, 3), vec![4]);
        assert_eq!(propose(&[7, 9, 4, 5, 8, 9], 6, BASE_CHAIN, 3), vec![4, 5]);
        // A 2-token match ("5 8" at 3..5, followed by 9 1 5 8 9): ⌈2k/3⌉ tokens.
        assert_eq!(propose(&[0, 0, 2, 5, 8, 9, 1, 5, 8], 6, BASE_CHAIN, 3), vec![9, 1, 5, 8]);
        assert_eq!(propose(&[0, 0, 2, 5, 8, 9, 1, 5, 8], 1, BASE_CHAIN, 3), vec![9]);
        // The longest suffix with a match wins over a more recent shorter one: "2 9" at 0..2
        // (followed by 6) beats the more recent "9" at 3 (followed by 1).
        assert_eq!(propose(&[2, 9, 6, 9, 1, 2, 9], 1, BASE_CHAIN, 3), vec![6]);
        assert!(propose(&[1, 2, 3, 4], 4, BASE_CHAIN, 3).is_empty(), "no repeated token");
        assert!(propose(&[5], 4, BASE_CHAIN, 3).is_empty());
        assert!(propose(&[], 4, BASE_CHAIN, 3).is_empty());
        assert!(propose(&[1, 1, 1], 0, BASE_CHAIN, 3).is_empty(), "k = 0");
        // A run proposes more of the run, as long as asked (the copy overlaps itself): "1 1"
        // is a 2-token match in a 3-token context (⌈2·4/3⌉ = 3 tokens), "2 1 2" a 3-token one.
        assert_eq!(propose(&[1, 1, 1], 4, BASE_CHAIN, 3), vec![1, 1, 1]);
        assert_eq!(propose(&[1, 1, 1, 1], 4, BASE_CHAIN, 3), vec![1, 1, 1, 1]);
        assert_eq!(propose(&[4, 1, 2, 1, 2, 1, 2], 5, BASE_CHAIN, 3), vec![1, 2, 1, 2, 1]);
    }
}
