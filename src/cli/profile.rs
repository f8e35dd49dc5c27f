//! `sparkling profile`: time the parts of one SparklingTree round on the chosen backend, each
//! between device syncs, over N repetitions (median and min, ms): the AR step (1 row after a
//! prefill of P tokens), the verify forward of 1+B real tree nodes, the acceptance argmax, the
//! drafter forward, the candidate table (device top-k over the draft logits + Markov table +
//! their read-back), the host heap (`tree::build_sparkling_precompute`) and the KV compaction.
//! Prints a table; `--json PATH` writes the numbers. Each part is one method of [`Parts`].
//!
//! A sync is the read-back of a 1-value tensor: a device→host copy returns only after every
//! op enqueued before it has finished, on every backend.

use super::generate::{gen_params, Decoding};
use super::load::{Loaded, ModelArgs};
use super::options::TreeArgs;
use clap::Args;
use sparkling::core::{AttnMask, Backend, CandidateArgs, OpCounts, ReadBack, SampleParams};
use sparkling::decode::budget::{BudgetChoice, CostModel};
use sparkling::decode::{Engine, GenParams, Method, Platform};
use sparkling::model::config::DrafterKind;
use sparkling::model::drafter::{DraftJob, Drafter};
use sparkling::model::layer::KvCache;
use sparkling::model::target::{LogitRows, SeqInput, Target, TargetOutput};
use sparkling::tree::{build_sparkling_precompute, CandidateTable, DraftTree};
use sparkling::{Error, Result};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `profile`.
#[derive(Args, Debug, Clone)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens prefilled before timing (P); the AR step and the verify run at position P.
    #[arg(long, allow_negative_numbers = true, default_value_t = 512)]
    pub prefill: usize,
    /// Tree budget B: the verify forward has 1+B rows (a real tree from the drafter).
    #[arg(long, allow_negative_numbers = true, default_value_t = 64)]
    pub budget: usize,
    /// The tree options: `--candidates` (C per depth in the union table; default 128) and
    /// `--max-fanout` (children per parent in the table, k = min(max_fanout, budget, n);
    /// default 64) shape the timed parts; `--tree-prep`, `--lookup` and `--lookup-drafter` the
    /// `--check-tokens` generation.
    #[command(flatten)]
    pub tree: TreeArgs,
    /// Context rows the drafter consumes per round (accepted tokens of the previous round).
    #[arg(long, allow_negative_numbers = true, default_value_t = 4)]
    pub ctx_rows: usize,
    /// Timed repetitions per part.
    #[arg(long, allow_negative_numbers = true, default_value_t = 20)]
    pub reps: usize,
    /// Untimed warm-up repetitions per part.
    #[arg(long, allow_negative_numbers = true, default_value_t = 3)]
    pub warmup: usize,
    /// After timing, generate this many greedy tokens with `ar` and with `sparkling` (budget B,
    /// candidates C) after the same P-token prompt the timing ran on, and report whether they
    /// are equal (the engine invariant on the real shapes, at this context), τ and tokens/s.
    /// 0 = skip.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub check_tokens: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Run `profile` on the backend named by `--backend`.
pub fn run(a: ProfileArgs) -> Result<()> {
    check_args(&a)?;
    if let Some(path) = &a.json {
        // Fail before minutes of timing, not after: the JSON file must be creatable (checked
        // without creating it: an interrupted run leaves no empty file).
        sparkling::fsio::check_writable(path, "--json")?;
    }
    with_loaded!(&a.model, &[DrafterKind::DSpark], |m| profile(m, &a))
}

/// Refuse what profile cannot time or does not read, before loading anything.
fn check_args(a: &ProfileArgs) -> Result<()> {
    if a.budget == 0 {
        // Worded as generate's and bench's (`BudgetChoice::parse`); profile times fixed trees.
        return Err(Error::Input("--budget `0`: expected a positive tree budget (non-root nodes, ≥ 1); profile times fixed trees, not `auto`".into()));
    }
    for (v, arg) in [(a.reps, "--reps"), (a.prefill, "--prefill"), (a.ctx_rows, "--ctx-rows")] {
        if v == 0 {
            return Err(Error::Input(format!("{arg} 0: must be ≥ 1")));
        }
    }
    a.tree.check_counts()?;
    for (option, given) in a.tree.given("--budget", false, false) {
        match option {
            "--treespark-k" | "--no-confidence" if given => {
                return Err(Error::Input(format!("{option} is not used by profile (it times sparkling rounds at a fixed --budget); leave it out")));
            }
            "--tree-prep" | "--lookup" | "--lookup-drafter" if given && a.check_tokens == 0 => {
                return Err(Error::Input(format!("{option} is read by the --check-tokens generation only: give --check-tokens N, or leave {option} out")));
            }
            _ => {}
        }
    }
    if a.check_tokens > 0 {
        super::generate::lookup_graft(Method::Sparkling, a.tree.one_lookup()?, a.tree.lookup_drafter, &Platform::HOST)?;
    }
    // A profile is a few hundred timed forwards: huge counts only hang (or abort allocating).
    if a.reps > 100_000 || a.warmup > 100_000 {
        return Err(Error::Input(format!("--reps {} / --warmup {}: at most 100000 each (a part is timed reps + warmup times)", a.reps, a.warmup)));
    }
    if a.ctx_rows > a.prefill {
        return Err(Error::Input(format!(
            "--ctx-rows {} (the drafter's context rows per round; default 4) cannot exceed --prefill {}: raise --prefill or lower --ctx-rows",
            a.ctx_rows, a.prefill
        )));
    }
    Ok(())
}

/// Median and min of `f`'s wall time in ms over `reps` runs after `warmup` runs. `f` returns
/// the ms to count (so a part can exclude its own set-up).
fn time_ms(warmup: usize, reps: usize, mut f: impl FnMut() -> Result<f64>) -> Result<(f64, f64)> {
    for _ in 0..warmup {
        f()?;
    }
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        v.push(f()?);
    }
    v.sort_by(f64::total_cmp);
    let med = if v.len() % 2 == 1 { v[v.len() / 2] } else { 0.5 * (v[v.len() / 2 - 1] + v[v.len() / 2]) };
    Ok((med, v[0]))
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// One timed part: its name, what it runs, (median, min) ms, and the work one repetition
/// issued on a backend that counts it ([`Backend::op_counts`]).
struct Part {
    name: &'static str,
    what: String,
    ms: (f64, f64),
    counts: Option<OpCounts>,
}

/// The timed parts of a round, one method each, over what they share: the backend, the models,
/// the tree shape and the repetition counts.
struct Parts<'a, B: Backend> {
    b: &'a B,
    t: &'a Target<B>,
    d: &'a Drafter<B>,
    /// Prefill length P: the AR step and the verify run at position P.
    p: usize,
    budget: usize,
    /// `--candidates` and `--max-fanout`, bounded by the vocabulary.
    candidates: usize,
    max_fanout: usize,
    ctx_rows: usize,
    /// Draft depths one drafter forward proposes at this budget.
    depth: usize,
    warmup: usize,
    reps: usize,
    /// The target layers the drafter taps.
    taps: Vec<usize>,
    /// A 1-value tensor whose read-back is the sync.
    tiny: B::Tensor,
    /// Read-backs of `tiny` so far: the timing's own syncs, left out of a part's counts.
    timing_syncs: std::cell::Cell<u64>,
}

impl<B: Backend> Parts<'_, B> {
    /// Time `f` over the warm-up and timed repetitions, then count the work of one more
    /// (every part's repetition is self-contained, so one more changes nothing), the timing's
    /// own read-backs ([`Parts::sync`]) left out of the host syncs.
    fn time(&self, mut f: impl FnMut() -> Result<f64>) -> Result<((f64, f64), Option<OpCounts>)> {
        let ms = time_ms(self.warmup, self.reps, &mut f)?;
        let (before, timing_before) = (self.b.op_counts(), self.timing_syncs.get());
        f()?;
        let timing = self.timing_syncs.get() - timing_before;
        let counts = self.b.op_counts().zip(before).map(|(after, before)| {
            let mut c = after.since(before);
            c.host_syncs = c.host_syncs.saturating_sub(timing);
            c
        });
        Ok((ms, counts))
    }

    /// Wait for every op enqueued so far.
    fn sync(&self) -> Result<()> {
        self.b.download(&self.tiny)?;
        self.timing_syncs.set(self.timing_syncs.get() + 1);
        Ok(())
    }

    /// Prefill `prompt` (untimed but reported): the root token, the tapped context of every
    /// prompt row and the ms it took.
    fn prefill(&self, cache: &mut KvCache<B>, prompt: &[u32]) -> Result<(u32, B::Tensor, f64)> {
        let positions: Vec<u32> = (0..self.p as u32).collect();
        let t0 = Instant::now();
        let pre = self.t.forward(
            self.b,
            cache,
            SeqInput { ids: prompt, positions: &positions, mask: AttnMask::Causal, logits: Some(LogitRows::Last) },
            &self.taps,
        )?;
        let root = self.b.argmax(&pre.logits)?[0];
        let ms = ms_since(t0);
        let ctx_all = pre.taps.ok_or_else(|| Error::Input("the drafter taps no target layer".into()))?;
        Ok((root, ctx_all, ms))
    }

    /// The empty sync: the floor every other number includes once.
    fn sync_part(&self) -> Result<Part> {
        let (ms, counts) = self.time(|| {
            let t0 = Instant::now();
            self.b.download(&self.tiny)?; // the read-back itself, counted as such
            Ok(ms_since(t0))
        })?;
        Ok(Part { name: "sync", what: "1-value read-back".into(), ms, counts })
    }

    /// The AR step: 1 row at position P, argmax (a read-back), cache cropped back.
    fn ar_step(&self, cache: &mut KvCache<B>, root: u32) -> Result<Part> {
        let (b, p) = (self.b, self.p);
        let (ms, counts) = self.time(|| {
            let t0 = Instant::now();
            let o = self.t.forward(b, cache, SeqInput { ids: &[root], positions: &[p as u32], mask: AttnMask::Causal, logits: Some(LogitRows::Last) }, &[])?;
            b.argmax(&o.logits)?;
            let ms = ms_since(t0);
            cache.crop(p);
            Ok(ms)
        })?;
        Ok(Part { name: "ar_step", what: format!("1 row at position {p}, + argmax"), ms, counts })
    }

    /// The drafter forward over the last `ctx_rows` context rows (after one untimed call that
    /// consumes the rest of the prompt's context, as the steady state sees only a few rows).
    /// Returns the part and the draft logits of the last repetition.
    fn draft(&self, ctx_all: &B::Tensor, root: u32) -> Result<(Part, B::Tensor)> {
        let (b, d, p, lc) = (self.b, self.d, self.p, self.ctx_rows);
        let bk = d.cfg.block_size;
        let ctx = b.gather_rows(ctx_all, &(p - lc..p).collect::<Vec<_>>())?;
        let mut dcache = d.new_cache(b, p + bk + 8)?;
        if p > lc {
            let first_ctx = b.gather_rows(ctx_all, &(0..p - lc).collect::<Vec<_>>())?;
            d.draft(b, self.t, DraftJob { cache: &mut dcache, taps: &first_ctx, anchor: root, root_pos: p - lc, depth: self.budget })?;
        }
        let mut logits = None;
        let (ms, counts) = self.time(|| {
            dcache.crop(p - lc);
            let t0 = Instant::now();
            let l = d.draft(b, self.t, DraftJob { cache: &mut dcache, taps: &ctx, anchor: root, root_pos: p, depth: self.budget })?;
            self.sync()?;
            let ms = ms_since(t0);
            logits = Some(l);
            Ok(ms)
        })?;
        let what = format!("drafter forward, {lc} context rows + {} of {bk} block rows (depth {})", d.block_rows(self.budget), self.depth);
        Ok((Part { name: "draft", what, ms, counts }, logits.expect("at least one repetition")))
    }

    /// The selection arguments over `logits` (draft ids: `droot` is the anchor's draft id).
    fn selection<'x>(&self, logits: &'x B::Tensor, markov: Option<(&'x B::Tensor, &'x B::Tensor)>, droot: u32) -> CandidateArgs<'x, B::Tensor> {
        CandidateArgs { base: logits, markov, candidates: self.candidates, anchor: droot, k: self.max_fanout.min(self.budget) }
    }

    /// The candidate table: top-C per depth, union (+ anchor) and Markov table in one backend
    /// call (one read-back on device backends), as the decode loop's device tree prep does.
    fn candidate_table(&self, logits: &B::Tensor, droot: u32) -> Result<(Part, CandidateTable)> {
        let markov = self.d.markov_device(self.b)?;
        let mut table = CandidateTable::default();
        let (ms, counts) = self.time(|| {
            let t0 = Instant::now();
            table = self.b.candidate_table(self.selection(logits, markov, droot))?;
            Ok(ms_since(t0))
        })?;
        let what = format!("topk C={} over [{}, {}] + union + markov_table + read-back", self.candidates, self.depth, self.d.draft_vocab());
        Ok((Part { name: "candidate_table", what, ms, counts }, table))
    }

    /// The host heap over the table; returns the tree it builds (in draft ids).
    fn heap(&self, table: &CandidateTable, root: u32, droot: u32) -> Result<(Part, DraftTree)> {
        let mut tree = DraftTree::root(root);
        let (ms, counts) = self.time(|| {
            let t0 = Instant::now();
            tree = build_sparkling_precompute(table, droot, self.budget);
            Ok(ms_since(t0))
        })?;
        Ok((Part { name: "heap", what: format!("build_sparkling_precompute, budget {}, {} candidates", self.budget, table.n()), ms, counts }, tree))
    }

    /// What the decode loop runs on a host-memory backend (the CPU: `TreePrep::Host`):
    /// download the draft logits and build the tree with the lazy-row builder.
    fn host_prep(&self, logits: &B::Tensor, droot: u32) -> Result<Part> {
        let d = self.d;
        let (ms, counts) = self.time(|| {
            let t0 = Instant::now();
            let host = self.b.download(logits)?;
            let lc = sparkling::tree::LazyCandidates::new(&host, self.depth, d.draft_vocab(), d.markov.as_ref(), droot, self.candidates);
            std::hint::black_box(sparkling::tree::build_sparkling_lazy(&lc, d.markov.as_ref(), droot, self.max_fanout, self.budget));
            Ok(ms_since(t0))
        })?;
        let what = format!("decode's CPU path: download [{}, {}] + build_sparkling_lazy, budget {}", self.depth, d.draft_vocab(), self.budget);
        Ok(Part { name: "host_prep", what, ms, counts })
    }

    /// The tree built on the device, where the backend offers it (one read-back of the nodes
    /// instead of the table; replaces candidate_table + heap in the decode loop).
    fn device_tree(&self, logits: &B::Tensor, droot: u32) -> Result<Option<Part>> {
        let markov = self.d.markov_device(self.b)?;
        let args = self.selection(logits, markov, droot);
        if self.b.sparkling_tree(args, self.budget)?.is_none() {
            return Ok(None);
        }
        let (ms, counts) = self.time(|| {
            let t0 = Instant::now();
            self.b.sparkling_tree(args, self.budget)?;
            Ok(ms_since(t0))
        })?;
        let what = format!("sparkling_tree: candidate_table + heap on the device, {} nodes read back", self.budget);
        Ok(Some(Part { name: "device_tree", what, ms, counts }))
    }

    /// The verify forward of `tree` (taps as the engine requests them), cache cropped back;
    /// returns the part and the last repetition's output.
    fn verify(&self, cache: &mut KvCache<B>, tree: &DraftTree) -> Result<(Part, TargetOutput<B>)> {
        let (b, p) = (self.b, self.p);
        let tpos: Vec<u32> = tree.depths.iter().map(|&dp| p as u32 + dp).collect();
        let mut last = None;
        let (ms, counts) = self.time(|| {
            let t0 = Instant::now();
            let o = self.t.forward(
                b,
                cache,
                SeqInput { ids: &tree.tokens, positions: &tpos, mask: AttnMask::Tree { parents: &tree.parents }, logits: Some(LogitRows::All) },
                &self.taps,
            )?;
            self.sync()?;
            let ms = ms_since(t0);
            cache.crop(p);
            last = Some(o);
            Ok(ms)
        })?;
        let n = tree.len();
        Ok((Part { name: "verify", what: format!("{n} tree rows (1+{}), tree attention, taps", n - 1), ms, counts }, last.expect("at least one repetition")))
    }

    /// The acceptance argmax over the verify logits (`n` rows) and its read-back.
    fn accept(&self, logits: &B::Tensor, n: usize) -> Result<Part> {
        let (ms, counts) = self.time(|| {
            let t0 = Instant::now();
            self.b.argmax(logits)?;
            Ok(ms_since(t0))
        })?;
        Ok(Part { name: "accept", what: format!("argmax of {n} rows + read-back"), ms, counts })
    }

    /// KV compaction to a real root-to-leaf path of `tree` (≤ 8 rows) + the taps gather of
    /// the accepted rows.
    fn compaction(&self, cache: &mut KvCache<B>, tree: &DraftTree, ver_taps: &B::Tensor) -> Result<Part> {
        let (b, p) = (self.b, self.p);
        let mut keep = vec![0usize];
        let cm = tree.child_map();
        while let Some(&c) = cm.children(*keep.last().expect("root")).first() {
            keep.push(c as usize);
            if keep.len() >= 8 {
                break;
            }
        }
        let (ms, counts) = self.time(|| {
            // Re-create the verify rows' cache state (untimed), then compact.
            cache.crop(p);
            cache.len = p + tree.len();
            self.sync()?;
            let t0 = Instant::now();
            cache.compact(b, p, &keep)?;
            let g = b.gather_rows(ver_taps, &keep)?;
            self.sync()?;
            let ms = ms_since(t0);
            drop(g);
            cache.crop(p);
            Ok(ms)
        })?;
        Ok(Part { name: "compaction", what: format!("KV compaction of {} layers to a {}-row path + taps gather", self.t.cfg.layers, keep.len()), ms, counts })
    }

    /// The `--budget auto` cost curve on this cache (context P): the verify forward + argmax
    /// of r rows at the points the engine measures, N_max = B, and one drafter forward.
    fn cost_curve(&self, cache: &mut KvCache<B>, root: u32, ctx_all: &B::Tensor) -> Result<CostModel> {
        let ctx4 = self.b.gather_rows(ctx_all, &(self.p.saturating_sub(4)..self.p).collect::<Vec<_>>())?;
        pollster::block_on(CostModel::measure(self.b, self.t, cache, root, self.budget, &self.taps, Some((self.d, &ctx4))))
    }
}

/// The parameters of the `--check-tokens` generation by `method`: greedy, budget B, the
/// profiled candidates and fan-out, and the tree options given (as `generate` reads them).
fn check_params(a: &ProfileArgs, parts_tree: (usize, usize), method: Method, platform: &Platform) -> Result<GenParams> {
    let (candidates, max_fanout) = parts_tree;
    let tree = TreeArgs { candidates: Some(candidates), max_fanout: Some(max_fanout), ..a.tree.clone() };
    let dec = Decoding { sampling: SampleParams { temperature: 0.0, top_k: 0, top_p: 1.0 }, seed: 0, max_new_tokens: a.check_tokens, stop: vec![] };
    gen_params(method, Some(BudgetChoice::Fixed(a.budget)), &tree, a.tree.one_lookup()?, dec, platform)
}

/// Refuse a `--check-tokens` generation that cannot run after the `p`-token prompt, with the
/// engine's own check (prompt, new tokens, the rows a round writes), before any timing.
fn precheck<B: Backend>(a: &ProfileArgs, params: &[GenParams; 2], b: &B, t: &Target<B>, d: &Drafter<B>, p: usize) -> Result<()> {
    let zeros = vec![0u32; p];
    for (params, drafter) in params.iter().zip([None, Some(d)]) {
        if let Err(e) = (Engine { backend: b, target: t, drafter }).check(&zeros, params) {
            return Err(Error::Input(format!(
                "--check-tokens {} after the {p}-token prompt (--prefill) cannot run, so nothing was timed: {e}",
                a.check_tokens
            )));
        }
    }
    Ok(())
}

/// Greedy exactness on these shapes: `ar` and `sparkling` after `prompt`. Returns the report
/// line and the JSON of the check.
fn check_exactness<B: Backend>(params: &[GenParams; 2], b: &B, t: &Target<B>, d: &Drafter<B>, prompt: &[u32]) -> Result<(String, serde_json::Value)> {
    let ar = Engine { backend: b, target: t, drafter: None }.generate(prompt, &params[0], &mut |_| {})?;
    let sp = Engine { backend: b, target: t, drafter: Some(d) }.generate(prompt, &params[1], &mut |_| {})?;
    let equal = ar.tokens == sp.tokens;
    let (n, p) = (params[0].max_new_tokens, prompt.len());
    let line = format!(
        "check: {n} greedy tokens after the {p}-token prompt, sparkling {} ar (τ = {:.2}; ar {:.1} tok/s, sparkling {:.1} tok/s)\n",
        if equal { "EQUAL to" } else { "DIFFER from" },
        sp.stats.tau(),
        ar.stats.tokens_per_s(),
        sp.stats.tokens_per_s()
    );
    let json = serde_json::json!({"tokens": n, "prompt_tokens": p, "equal": equal, "tau": sp.stats.tau(), "ar_tokens_per_s": ar.stats.tokens_per_s(), "sparkling_tokens_per_s": sp.stats.tokens_per_s()});
    Ok((line, json))
}

fn profile<B: Backend>(m: Loaded<B>, a: &ProfileArgs) -> Result<()> {
    let b = &m.backend;
    let t = &m.models.target;
    let d = m.models.drafter(DrafterKind::DSpark).ok_or_else(|| Error::Input("profile needs a DSpark drafter (--drafter DIR)".into()))?;
    let tc = &t.cfg;
    let platform = Platform::of(b);
    let defaults = GenParams::new(Method::Sparkling, &platform).tree;
    let mut candidates = a.tree.candidates.unwrap_or(defaults.candidates);
    let mut max_fanout = a.tree.max_fanout.unwrap_or(defaults.max_fanout);
    super::clamp("--candidates", &mut candidates, tc.vocab, "the vocabulary size");
    super::clamp("--max-fanout", &mut max_fanout, candidates, "--candidates");
    let p = a.prefill;
    let bk = d.cfg.block_size;
    if p.saturating_add(a.budget).saturating_add(bk + 4) > tc.max_positions {
        return Err(Error::Input(format!("--prefill {p} + --budget {} exceeds the target context of {}", a.budget, tc.max_positions)));
    }
    // The exactness check runs after the timing: refuse what it cannot run before timing.
    let check = if a.check_tokens > 0 {
        let params =
            [check_params(a, (candidates, max_fanout), Method::Ar, &platform)?, check_params(a, (candidates, max_fanout), Method::Sparkling, &platform)?];
        precheck(a, &params, b, t, d, p)?;
        Some(params)
    } else {
        None
    };
    let parts = Parts {
        b,
        t,
        d,
        p,
        budget: a.budget,
        candidates,
        max_fanout,
        ctx_rows: a.ctx_rows,
        depth: d.cfg.draft_depth().min(a.budget.max(1)),
        warmup: a.warmup,
        reps: a.reps,
        taps: d.cfg.target_layer_ids.clone(),
        tiny: b.upload(&[0.0], 1, 1)?,
        timing_syncs: std::cell::Cell::new(0),
    };
    let vocab = tc.vocab as u64;
    let prompt: Vec<u32> = (0..p as u64).map(|i| ((i * 7919 + 13) % vocab) as u32).collect();
    let mut cache = t.new_cache(b, p + a.budget.max(bk) + 8)?;
    let (root, ctx_all, prefill_ms) = parts.prefill(&mut cache, &prompt)?;
    eprintln!("prefilled {p} tokens in {prefill_ms:.1} ms on {}", b.name());

    let mut rows = vec![parts.sync_part()?, parts.ar_step(&mut cache, root)?];
    let (draft, logits) = parts.draft(&ctx_all, root)?;
    rows.push(draft);
    // The device ops work in draft ids (a reduced draft vocabulary: the anchor's draft id, or
    // draft id 0 when it has none; the tree's tokens are then mapped back below).
    let droot = d.vocab_map.as_ref().map_or(root, |m| m.draft_id(root).unwrap_or(0));
    let (table_part, table) = parts.candidate_table(&logits, droot)?;
    rows.push(table_part);
    let (heap, mut tree) = parts.heap(&table, root, droot)?;
    rows.push(heap);
    // The two rows above are the device-style path, which decode uses only on device backends.
    if platform.host_memory {
        rows.push(parts.host_prep(&logits, droot)?);
    }
    if let Some(m) = &d.vocab_map {
        tree = m.map_tree(&tree, root);
    }
    rows.extend(parts.device_tree(&logits, droot)?);
    let (verify, ver) = parts.verify(&mut cache, &tree)?;
    rows.push(verify);
    rows.push(parts.accept(&ver.logits, tree.len())?);
    let ver_taps = ver.taps.as_ref().ok_or_else(|| Error::Input("verify produced no taps".into()))?;
    rows.push(parts.compaction(&mut cache, &tree, ver_taps)?);
    let curve = parts.cost_curve(&mut cache, root, &ctx_all)?;
    let check = match &check {
        Some(params) => Some(check_exactness(params, b, t, d, &prompt)?),
        None => None,
    };
    let timing = Timing { prefill_ms, tree_nodes: tree.len(), table: &table, rows: &rows, curve: &curve };
    report(&m, &parts, a, &timing, check.as_ref())?;
    if check.as_ref().is_some_and(|c| c.1["equal"] == false) {
        return Err(Error::Input("profile --check-tokens: sparkling's greedy tokens differ from ar's (the engine invariant is broken on this backend)".into()));
    }
    Ok(())
}

/// What the timing measured, for [`report`].
struct Timing<'a> {
    prefill_ms: f64,
    tree_nodes: usize,
    table: &'a CandidateTable,
    rows: &'a [Part],
    curve: &'a CostModel,
}

/// Print the table (and the check's line, which runs last) and write `--json`.
fn report<B: Backend>(m: &Loaded<B>, parts: &Parts<'_, B>, a: &ProfileArgs, timing: &Timing<'_>, check: Option<&(String, serde_json::Value)>) -> Result<()> {
    let (b, t, d, p) = (parts.b, parts.t, parts.d, parts.p);
    let tc = &t.cfg;
    let (rows, curve) = (timing.rows, timing.curve);
    let cost_path = super::costs::cache_path(&a.model, &m.target_path, &b.name());
    let get = |name: &str| rows.iter().find(|r| r.name == name).map(|r| r.ms.0).unwrap_or(f64::NAN);
    // Tree prep as decode runs it: the host lazy builder on the CPU, else the device-style path.
    let (prep, prep_parts) = if Platform::of(b).host_memory {
        (get("host_prep"), "host_prep")
    } else if rows.iter().any(|r| r.name == "device_tree") {
        (get("device_tree"), "device_tree")
    } else {
        (get("candidate_table") + get("heap"), "candidate_table + heap")
    };
    let outside = get("accept") + prep + get("compaction");
    // The weights as stored (Q4_1 blocks stay Q4_1 on the cpu: ≈ 0.6 B per weight).
    let weight_bytes = t.decode_weight_bytes(b);
    let gb = weight_bytes as f64 / 1e9;
    let mut report = String::new();
    let _ = writeln!(
        report,
        "backend {}; target {} layers, hidden {}, vocab {}; drafter block {}, markov rank {}, draft vocabulary {}",
        b.name(),
        tc.layers,
        tc.hidden,
        tc.vocab,
        d.cfg.block_size,
        d.cfg.markov_rank,
        d.draft_vocab()
    );
    let _ = writeln!(report, "target matmul kernels: {}", t.kernel_paths(b));
    let _ = writeln!(report, "prefill P = {p}, budget B = {}, candidates C = {}, {} reps (median, min)", parts.budget, parts.candidates, parts.reps);
    // Counted work per repetition, on backends that count it (device backends).
    let counted = rows.iter().any(|r| r.counts.is_some());
    if counted {
        let _ = writeln!(report, "| part | what | median ms | min ms | kernels | host syncs | bytes uploaded | buffers created |");
        let _ = writeln!(report, "|---|---|---|---|---|---|---|---|");
    } else {
        let _ = writeln!(report, "| part | what | median ms | min ms |");
        let _ = writeln!(report, "|---|---|---|---|");
    }
    for Part { name, what, ms: (med, min), counts } in rows {
        let c = counts.map_or(String::new(), |c| format!(" {} | {} | {} | {} |", c.kernels, c.host_syncs, c.bytes_uploaded, c.buffers_created));
        let _ = writeln!(report, "| {name} | {what} | {med:.3} | {min:.3} |{c}");
    }
    let _ = writeln!(report, "| outside forwards | accept + {prep_parts} + compaction (the tree prep decode runs here) | {outside:.3} | |");
    if counted {
        // A verify round as decode runs it: draft, tree prep, verify, accept, compaction.
        let round_parts: Vec<&str> = ["draft", "verify", "accept", "compaction"].into_iter().chain(prep_parts.split(" + ")).collect();
        let round = rows.iter().filter(|r| round_parts.contains(&r.name)).filter_map(|r| r.counts).fold(OpCounts::default(), |a, c| OpCounts {
            kernels: a.kernels + c.kernels,
            host_syncs: a.host_syncs + c.host_syncs,
            bytes_uploaded: a.bytes_uploaded + c.bytes_uploaded,
            buffers_created: a.buffers_created + c.buffers_created,
        });
        let step = rows.iter().find(|r| r.name == "ar_step").and_then(|r| r.counts).unwrap_or_default();
        let _ = writeln!(
            report,
            "counted work: a decode step (ar_step) {} kernels, {} host syncs, {} B uploaded, {} buffers created; a verify round ({}) {} kernels, {} host syncs, {} B uploaded, {} buffers created",
            step.kernels,
            step.host_syncs,
            step.bytes_uploaded,
            step.buffers_created,
            round_parts.join(" + "),
            round.kernels,
            round.host_syncs,
            round.bytes_uploaded,
            round.buffers_created
        );
    }
    let _ = writeln!(
        report,
        "\n`--budget auto` cost curve at context {p} (verify forward + argmax, min of ≤ 2 runs; measured in {:.0} ms; drafter forward {:.2} ms):",
        curve.measure_ms, curve.draft_ms
    );
    let _ = writeln!(report, "| verify rows (1+n) | ms | × 1 row |");
    let _ = writeln!(report, "|---|---|---|");
    for (r, ms) in curve.rows.iter().zip(&curve.verify_ms) {
        let _ = writeln!(report, "| {r} | {ms:.2} | {:.2} |", ms / curve.verify_ms[0]);
    }
    match super::costs::load(&cost_path, 0) {
        Some(c) => {
            let pts: Vec<String> = c.rows.iter().zip(&c.verify_ms).map(|(r, ms)| format!("{r}: {ms:.1}")).collect();
            let _ = writeln!(report, "cached curve used by `generate --budget auto` (context {}; {}): {}", c.context, cost_path.display(), pts.join(", "));
        }
        None => {
            let _ = writeln!(report, "no cached curve yet ({}): the first `generate --budget auto` measures one", cost_path.display());
        }
    }
    let _ = writeln!(
        report,
        "verify / ar_step = {:.2}; decode weight bytes {gb:.3} GB (as stored: {}): AR step at {:.0} GB/s effective",
        get("verify") / get("ar_step"),
        t.kernel_paths(b),
        gb / (get("ar_step") / 1e3)
    );
    let json_parts: serde_json::Map<String, serde_json::Value> =
        rows.iter()
            .map(|r| {
                let counts = r.counts.map(|c| {
                    serde_json::json!({"kernels": c.kernels, "host_syncs": c.host_syncs, "bytes_uploaded": c.bytes_uploaded, "buffers_created": c.buffers_created})
                });
                (r.name.to_string(), serde_json::json!({"what": r.what, "median_ms": r.ms.0, "min_ms": r.ms.1, "counts": counts}))
            })
            .collect();
    let v = serde_json::json!({
        "backend": b.name(),
        "kernels": t.kernel_paths(b),
        "target": {"layers": tc.layers, "hidden": tc.hidden, "vocab": tc.vocab, "heads": tc.n_heads, "kv_heads": tc.n_kv_heads, "head_dim": tc.head_dim, "intermediate": tc.intermediate},
        "drafter": {"block_size": d.cfg.block_size, "markov_rank": d.cfg.markov_rank, "layers": d.cfg.layers},
        "prefill": p, "budget": parts.budget, "candidates": parts.candidates, "max_fanout": parts.max_fanout, "ctx_rows": parts.ctx_rows,
        "reps": parts.reps, "warmup": parts.warmup, "prefill_ms": timing.prefill_ms, "tree_nodes": timing.tree_nodes,
        "table_candidates": timing.table.n(), "table_k": timing.table.k,
        "parts": json_parts,
        "outside_forwards_ms": outside,
        "verify_over_ar_step": get("verify") / get("ar_step"),
        "decode_weight_bytes": weight_bytes,
        "ar_step_effective_gb_per_s": gb / (get("ar_step") / 1e3),
        "check": check.map(|c| &c.1),
        "budget_auto_cost_curve": curve,
    });
    if let Some((line, _)) = check {
        report.push_str(line);
    }
    super::save_json_then_print(a.json.as_deref(), &v, &report)
}
