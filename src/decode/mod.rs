//! Decoding (docs/design.md §1): the methods, their parameters, and the engine that runs a
//! generation. The loop itself is [`batch`]: prefill, then rounds of plan ([`policy`]) →
//! draft → verify with tree attention → accept → commit path + bonus → compact KV → carry the
//! accepted rows' taps (the target's tapped-layer features) as the next drafter context; a
//! single generation is a batch of one. Methods differ only in the drafter they need and the
//! proposer they use.

pub mod batch;
pub mod budget;
pub mod governor;
pub mod lookup;
pub mod platform;
pub mod policy;
pub mod prefix;
pub mod propose;
pub mod rng;
mod round;
pub mod stats;

use crate::error::{Error, Result};
use crate::model::config::DrafterKind;
use crate::model::drafter::Drafter;
use crate::model::target::Target;
use batch::{Batch, BatchOptions};
use budget::{AutoBudget, AutoState, CostModel};
pub use lookup::LookupGraft;
pub use platform::Platform;
use propose::{TreeParams, TreePrep};
use sparkling_core::tree::DraftTree;
use sparkling_core::{Backend, SampleParams};
pub use stats::Stats;

/// A decoding method (design §1). All are lossless: at T=0 each emits the target's greedy
/// tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// Plain autoregressive decoding (one target forward per token).
    Ar,
    /// DFlash chain: in-place drafter, argmax per depth.
    DFlash,
    /// DDTree: in-place drafter, best-first tree over factorized marginals (reference §5.1).
    DDTree,
    /// DSpark chain: shifted drafter + Markov head, greedy sequential drafts (§3.7).
    DSpark,
    /// SparklingTree: shifted drafter + Markov-conditioned best-first tree (§5.2c).
    Sparkling,
    /// TreeSpark policy: per-parent top-k, frontier pruning, global top-N packing (§5.4).
    TreeSpark,
    /// Prompt lookup: no drafter; the chain is what followed the most recent earlier
    /// occurrence of the context's last tokens ([`lookup`]). Not in [`Method::ALL`] (the
    /// published methods the tables compare); single-sequence decoding only.
    Lookup,
}

impl Method {
    /// All methods, in the order tables list them.
    pub const ALL: [Method; 6] = [Method::Ar, Method::DFlash, Method::DDTree, Method::DSpark, Method::Sparkling, Method::TreeSpark];

    /// Parse a CLI name, ignoring ASCII case (`AR`, `Sparkling`).
    pub fn parse(s: &str) -> Result<Method> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "ar" => Method::Ar,
            "dflash" => Method::DFlash,
            "ddtree" => Method::DDTree,
            "dspark" => Method::DSpark,
            "sparkling" => Method::Sparkling,
            "treespark" => Method::TreeSpark,
            "lookup" => Method::Lookup,
            _ => return Err(Error::Input(format!("unknown method `{s}` (expected ar, dflash, ddtree, dspark, sparkling, treespark, lookup)"))),
        })
    }

    /// CLI name.
    pub fn name(self) -> &'static str {
        match self {
            Method::Ar => "ar",
            Method::DFlash => "dflash",
            Method::DDTree => "ddtree",
            Method::DSpark => "dspark",
            Method::Sparkling => "sparkling",
            Method::TreeSpark => "treespark",
            Method::Lookup => "lookup",
        }
    }

    /// The drafter convention this method needs (`None` for `ar`).
    pub fn drafter_kind(self) -> Option<DrafterKind> {
        match self {
            Method::Ar | Method::Lookup => None,
            Method::DFlash | Method::DDTree => Some(DrafterKind::DFlash),
            Method::DSpark | Method::Sparkling | Method::TreeSpark => Some(DrafterKind::DSpark),
        }
    }
}

/// Generation parameters.
#[derive(Debug, Clone)]
pub struct GenParams {
    /// Decoding method.
    pub method: Method,
    /// Tree knobs.
    pub tree: TreeParams,
    /// Temperature / top-k / top-p of the target's sampling.
    pub sampling: SampleParams,
    /// RNG seed (counter-based, per position).
    pub seed: u64,
    /// Maximum generated tokens.
    pub max_new_tokens: usize,
    /// Token ids that end generation (the stop token is emitted, then generation ends).
    pub stop: Vec<u32>,
    /// `--budget auto` ([`budget`]): each round verifies the prefix of the tree's pop order
    /// worth its measured cost (`tree.budget` is then N_max, the largest tree built), or skips
    /// the drafter; `None`: every round verifies `tree.budget` nodes.
    pub auto_budget: Option<AutoBudget>,
    /// Prompt lookup beside the drafter (methods with a drafter; [`LookupGraft::OFF`] for the
    /// others): the lookup chain grafted onto each round's tree, or verified alone.
    pub lookup: LookupGraft,
}

impl GenParams {
    /// The library's defaults for `method` on `platform`: `--budget auto` with N_max =
    /// [`Platform::auto_max_budget`], 128 SparklingTree candidates per depth, fan-out 64,
    /// TreeSpark k = 4, [`TreePrep::Auto`], greedy (T = 0, top-k off, top-p 1), seed 0,
    /// 256 new tokens, no stop tokens (see [`stop_tokens`]), the method's
    /// [`Platform::lookup_graft`]. The CLI, the browser and the server start here;
    /// [`GenParams::with_budget`] sets a fixed budget.
    pub fn new(method: Method, platform: &Platform) -> GenParams {
        GenParams {
            method,
            tree: TreeParams { budget: platform.auto_max_budget(method), candidates: 128, max_fanout: 64, treespark_k: 4, prep: TreePrep::Auto },
            sampling: SampleParams { temperature: 0.0, top_k: 0, top_p: 1.0 },
            seed: 0,
            max_new_tokens: 256,
            stop: Vec::new(),
            auto_budget: Some(AutoBudget::default()),
            lookup: platform.lookup_graft(method),
        }
    }

    /// These parameters with budget `b`: [`budget::BudgetChoice::Fixed`] sets `tree.budget`
    /// and turns `--budget auto` off; [`budget::BudgetChoice::Auto`] turns it on (keeping a
    /// cost model already set) with N_max = `tree.budget`.
    pub fn with_budget(mut self, b: budget::BudgetChoice) -> GenParams {
        match b {
            budget::BudgetChoice::Fixed(n) => {
                self.tree.budget = n;
                self.auto_budget = None;
            }
            budget::BudgetChoice::Auto => {
                self.auto_budget.get_or_insert_with(AutoBudget::default);
            }
        }
        self
    }

    /// Check the values no caller may pass: a temperature that is negative or not finite,
    /// top-p outside (0, 1], zero candidates, fan-out or TreeSpark k, a tree budget of 0 for a
    /// method with a drafter (`ar` reads no budget), a lookup graft for a method without one.
    /// Errors: [`Error::Input`] naming the parameter as this struct spells it (`tree.budget`,
    /// `lookup.len`); front-ends check their own options first, so that theirs name the option.
    pub fn validate(&self) -> Result<()> {
        let s = &self.sampling;
        if !(s.temperature >= 0.0 && s.temperature.is_finite()) {
            return Err(Error::Input(format!("sampling.temperature {} must be finite and ≥ 0", s.temperature)));
        }
        if !(s.top_p > 0.0 && s.top_p <= 1.0) {
            return Err(Error::Input(format!("sampling.top_p {} must be in (0, 1]", s.top_p)));
        }
        let t = &self.tree;
        for (v, arg) in [(t.candidates, "tree.candidates"), (t.max_fanout, "tree.max_fanout"), (t.treespark_k, "tree.treespark_k")] {
            if v == 0 {
                return Err(Error::Input(format!("{arg} 0: must be ≥ 1")));
            }
        }
        if self.lookup.len > lookup::MAX_CHAIN || (self.method == Method::Lookup && self.auto_budget.is_none() && t.budget > lookup::MAX_CHAIN) {
            let (what, n) =
                if self.method == Method::Lookup { ("tree.budget (method `lookup`'s chain length)", t.budget) } else { ("lookup.len", self.lookup.len) };
            return Err(Error::Input(format!(
                "{what} {n}: a lookup chain of at most {} tokens (longer chains repeat one phrase and cost a verify row per token)",
                lookup::MAX_CHAIN
            )));
        }
        if self.lookup.len > 0 && self.method.drafter_kind().is_none() {
            return Err(Error::Input(format!(
                "a lookup chain grafted onto the tree (lookup.len {}) needs a method with a drafter, not `{}`; method `lookup` takes its chain length from tree.budget",
                self.lookup.len,
                self.method.name()
            )));
        }
        if t.budget == 0 && self.method != Method::Ar {
            return Err(Error::Input(format!(
                "tree budget 0 for method `{}`: expected a positive tree budget (≥ 1 non-root node) or `auto`",
                self.method.name()
            )));
        }
        Ok(())
    }
}

/// The one stop-token rule (CLI and browser alike): the target's end-of-sequence ids, then the
/// tokenizer's stop tokens (end of turn, `<|im_end|>`, ...) not already among them.
pub fn stop_tokens(target_eos: &[u32], tokenizer_stop: &[u32]) -> Vec<u32> {
    let mut stop = target_eos.to_vec();
    for &s in tokenizer_stop {
        if !stop.contains(&s) {
            stop.push(s);
        }
    }
    stop
}

/// Result of one generation.
#[derive(Debug, Clone)]
pub struct Generation {
    /// Generated token ids (prompt excluded), trimmed at the first stop token / max-new-tokens.
    pub tokens: Vec<u32>,
    /// Whether a stop token ended generation.
    pub stopped: bool,
    /// Statistics.
    pub stats: Stats,
    /// The cost model `--budget auto` measured in this generation (when none was given), for
    /// the caller to cache and pass back in [`AutoBudget::cost`].
    pub cost_model: Option<CostModel>,
    /// The `--budget auto` policy state at the end (pass it back in [`AutoBudget::resume`] to
    /// continue learning in the next generation).
    pub auto_state: Option<AutoState>,
}

/// One verified round as the decode loop saw it, for the round observer of
/// [`Engine::generate_observed_async`] (issue 16: the live tree view).
#[derive(Debug, Clone, Copy)]
pub struct RoundView<'t> {
    /// 0-based round index (the prefill is not a round).
    pub round: usize,
    /// Sequence position of the root (the anchor token); node `i` sits at `root_pos + tree.depths[i]`.
    pub root_pos: usize,
    /// The tree the target verified in this round (node 0 = the anchor; `ar`: the root only).
    pub tree: &'t DraftTree,
    /// Accepted node indices from the root (`accepted[0] == 0`), each the child of the one before.
    pub accepted: &'t [usize],
    /// The target's own token after the accepted path (committed with it).
    pub bonus: u32,
    /// Whether anything was drafted this round: the drafter ran, or a prompt-lookup chain was
    /// proposed (`lookup`, `--lookup`). `false` for `ar` and for rounds `--budget auto` skipped
    /// (counted in `Stats::drafts_skipped`); a drafted round may still verify the root alone
    /// when no guess was worth its cost.
    pub drafted: bool,
    /// Whether this round drafted nothing because only its bonus token was left to generate
    /// (`max_new_tokens`): no drafted node could have been committed. Counted in
    /// `Stats::final_rounds`, not as a skipped drafter.
    pub last_token: bool,
}

/// Target + optional drafter on one backend.
pub struct Engine<'a, B: Backend> {
    /// Backend.
    pub backend: &'a B,
    /// Target model.
    pub target: &'a Target<B>,
    /// Drafter (needed by every method but `ar`).
    pub drafter: Option<&'a Drafter<B>>,
}

/// A target and the drafters loaded for it (at most one per [`DrafterKind`]): the models a
/// generation runs on one backend. The CLI's loaded run and the browser session hold one each,
/// so both pick a method's drafter, replace a drafter and report a missing one the same way.
pub struct Models<B: Backend> {
    /// The target model.
    pub target: Target<B>,
    /// The drafters, at most one of each kind.
    pub drafters: Vec<Drafter<B>>,
}

impl<B: Backend> Models<B> {
    /// A target without drafters (`ar` only until [`Models::add_drafter`]).
    pub fn new(target: Target<B>) -> Self {
        Models { target, drafters: Vec::new() }
    }

    /// The drafter of `kind`, if loaded.
    pub fn drafter(&self, kind: DrafterKind) -> Option<&Drafter<B>> {
        self.drafters.iter().find(|d| d.cfg.kind == kind)
    }

    /// Add `d`, replacing an earlier drafter of the same kind.
    pub fn add_drafter(&mut self, d: Drafter<B>) {
        self.drafters.retain(|x| x.cfg.kind != d.cfg.kind);
        self.drafters.push(d);
    }

    /// The engine for `method` on `backend`: the target and the method's drafter.
    /// Errors: the method needs a drafter kind that is not loaded (the message lists the
    /// loaded kinds).
    pub fn engine<'a>(&'a self, backend: &'a B, method: Method) -> Result<Engine<'a, B>> {
        let drafter = match method.drafter_kind() {
            None => None,
            Some(kind) => Some(self.drafter(kind).ok_or_else(|| {
                let have: Vec<String> = self.drafters.iter().map(|d| format!("{:?}", d.cfg.kind)).collect();
                Error::Input(format!(
                    "method `{}` needs a {kind:?} drafter; loaded: [{}] (load one with `Models::add_drafter`)",
                    method.name(),
                    have.join(", ")
                ))
            })?),
        };
        Ok(Engine { backend, target: &self.target, drafter })
    }
}

/// What [`Engine::check`] resolves for one generation request.
pub struct Checked<'a, B: Backend> {
    /// The drafter the method uses (`None` for `ar`).
    pub drafter: Option<&'a Drafter<B>>,
    /// KV rows the generation needs: prompt + max-new-tokens + the largest tree + 1.
    pub capacity: usize,
}

impl<'a, B: Backend> Engine<'a, B> {
    /// Generate from `prompt` ids. `on_tokens` receives each round's newly committed tokens.
    /// Blocks on the backend's read-backs (runs [`Engine::generate_async`] to completion; on
    /// native backends its futures are ready when polled).
    /// Errors: empty prompt, prompt + max-new-tokens beyond the context, missing or wrong-kind
    /// drafter for the method, backend failures; in a browser (wasm32) always an error, since
    /// a page cannot block: use `generate_async`.
    pub fn generate(&self, prompt: &[u32], p: &GenParams, on_tokens: &mut dyn FnMut(&[u32])) -> Result<Generation> {
        self.generate_observed(prompt, p, on_tokens, &mut |_| {})
    }

    /// [`Engine::generate`] that also shows each verified round to `on_round` (see
    /// [`Engine::generate_observed_async`]). Same tokens, statistics and errors.
    pub fn generate_observed(
        &self,
        prompt: &[u32],
        p: &GenParams,
        on_tokens: &mut dyn FnMut(&[u32]),
        on_round: &mut dyn FnMut(&RoundView<'_>),
    ) -> Result<Generation> {
        #[cfg(target_arch = "wasm32")]
        {
            let _ = (prompt, p, on_tokens, on_round);
            Err(Error::Input("Engine::generate cannot block in a browser: use Engine::generate_async".into()))
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            pollster::block_on(self.generate_observed_async(prompt, p, on_tokens, on_round))
        }
    }

    /// [`Engine::generate`] for hosts that cannot block on the device (WebGPU in a browser):
    /// the same loop, awaiting each round's read-backs (tree prep and acceptance) through the
    /// backend's `*_async` ops. Same tokens, statistics and errors as `generate`.
    pub async fn generate_async(&self, prompt: &[u32], p: &GenParams, on_tokens: &mut dyn FnMut(&[u32])) -> Result<Generation> {
        self.generate_observed_async(prompt, p, on_tokens, &mut |_| {}).await
    }

    /// [`Engine::generate_async`] that also shows each verified round to `on_round` (after
    /// acceptance, before `on_tokens` receives the round's committed tokens): the tree the
    /// target verified and the path it accepted (`generate --show-tree`, the browser's live
    /// tree view). Same tokens, statistics and errors as `generate`. Runs the decode loop as a
    /// batch of one ([`batch::Batch`]).
    pub async fn generate_observed_async(
        &self,
        prompt: &[u32],
        p: &GenParams,
        on_tokens: &mut dyn FnMut(&[u32]),
        on_round: &mut dyn FnMut(&RoundView<'_>),
    ) -> Result<Generation> {
        let mut batch = Batch::new(self.backend, self.target, BatchOptions::default())?;
        if let Some(d) = self.drafter {
            batch = batch.with_drafter(d)?;
        }
        batch.add(prompt, p)?;
        let mut rounds = 0;
        loop {
            let step = batch.step_async().await?;
            for s in &step.seqs {
                if let (Some(tree), Some(bonus)) = (&s.tree, s.bonus) {
                    on_round(&RoundView {
                        round: rounds,
                        root_pos: s.first_position,
                        tree,
                        accepted: &s.accepted,
                        bonus,
                        drafted: s.drafted,
                        last_token: s.last_token,
                    });
                    rounds += 1;
                }
                if !s.tokens.is_empty() {
                    on_tokens(&s.tokens);
                }
            }
            if let Some(f) = step.finished.into_iter().next() {
                return Ok(Generation { tokens: f.tokens, stopped: f.stopped, stats: f.stats, cost_model: f.cost_model, auto_state: f.auto_state });
            }
        }
    }

    /// The checks of one generation request, before any device work: a non-empty prompt of
    /// in-vocabulary ids, the drafter the method needs (of the right kind), and prompt +
    /// max-new-tokens + the largest tree within the target context. Returns the drafter and
    /// the KV capacity the generation needs.
    /// Errors: [`Error::Input`] naming what is wrong.
    pub fn check(&self, prompt: &[u32], p: &GenParams) -> Result<Checked<'a, B>> {
        let tcfg = &self.target.cfg;
        if prompt.is_empty() {
            return Err(Error::Input("empty prompt: nothing to condition on".into()));
        }
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= tcfg.vocab) {
            return Err(Error::Input(format!("prompt token id {bad} is outside the target vocabulary of {}", tcfg.vocab)));
        }
        let drafter = match p.method.drafter_kind() {
            None => None,
            Some(kind) => {
                let d =
                    self.drafter.ok_or_else(|| Error::Input(format!("method `{}` needs a {kind:?} drafter (`Engine::drafter` is none)", p.method.name())))?;
                if d.cfg.kind != kind {
                    return Err(Error::Input(format!("method `{}` needs a {kind:?} drafter but the drafter is {:?}", p.method.name(), d.cfg.kind)));
                }
                Some(d)
            }
        };
        let max_tree = match drafter {
            // The drafter's tree, and a grafted lookup chain beside it.
            Some(d) => p.tree.budget.max(d.cfg.block_size).saturating_add(p.lookup.len).saturating_add(1),
            // `lookup`'s chain: at most its length (the budget, or its default under auto).
            None if p.method == Method::Lookup => Platform::of(self.backend).lookup_chain_len(p).saturating_add(1),
            None => 1,
        };
        // Saturating: a huge budget or token count (e.g. from JavaScript) must fail this check,
        // not wrap around it.
        let capacity = prompt.len().saturating_add(p.max_new_tokens).saturating_add(max_tree).saturating_add(1);
        if capacity > tcfg.max_positions {
            // The rows one round writes past the answer (a tree, or one decode row) and the
            // bonus row: reserved in the cache, so they count against the context too.
            return Err(Error::Input(format!(
                "a prompt of {} + {} + {} a round writes at once exceeds the target context of {} positions: shorten the prompt or ask for fewer new tokens",
                stats::count(prompt.len(), "token"),
                stats::count(p.max_new_tokens, "new token"),
                stats::count(max_tree + 1, "row"),
                tcfg.max_positions
            )));
        }
        Ok(Checked { drafter, capacity })
    }
}

/// Give the host's event loop a turn: in a browser, resolve on a `setTimeout(0)` (a macrotask,
/// so the page repaints, streams the committed tokens and handles input between rounds);
/// natively a no-op.
#[cfg(target_arch = "wasm32")]
pub(crate) async fn yield_to_host() {
    use wasm_bindgen::{JsCast, JsValue};
    let p = js_sys::Promise::new(&mut |resolve, _| {
        let set_timeout = js_sys::Reflect::get(&js_sys::global(), &JsValue::from_str("setTimeout")).ok().and_then(|f| f.dyn_into::<js_sys::Function>().ok());
        let _ = match set_timeout {
            Some(f) => f.call2(&JsValue::NULL, &resolve, &JsValue::from(0)),
            None => resolve.call0(&JsValue::NULL),
        };
    });
    let _ = wasm_bindgen_futures::JsFuture::from(p).await;
}

/// Give the host's event loop a turn (a no-op outside the browser).
#[cfg(not(target_arch = "wasm32"))]
pub(crate) async fn yield_to_host() {}
