//! `sparkling profile`: time the parts of one SparklingTree round on the chosen backend, each
//! between device syncs, over N repetitions (median and min, ms): the AR step (1 row after a
//! prefill of P tokens), the verify forward of 1+B real tree nodes, the acceptance argmax, the
//! drafter forward, the candidate table (device top-k over the draft logits + Markov table +
//! their read-back), the host heap (`tree::build_sparkling_precompute`) and the KV compaction.
//! Prints a table; `--json PATH` writes the numbers.
//!
//! A sync is the read-back of a 1-value tensor: a device→host copy returns only after every
//! op enqueued before it has finished, on every backend.

use super::load::{load, select, AnyBackend, Loaded, ModelArgs};
use clap::Args;
use sparkling::core::{AttnMask, Backend};
use sparkling::decode::{Engine, GenParams, Method};
use sparkling::model::config::DrafterKind;
use sparkling::model::target::LogitRows;
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
    /// Candidates C per depth in the SparklingTree union table.
    #[arg(long, allow_negative_numbers = true, default_value_t = 128)]
    pub candidates: usize,
    /// Maximum children per parent in the table (k = min(max_fanout, budget, n)).
    #[arg(long, allow_negative_numbers = true, default_value_t = 64)]
    pub max_fanout: usize,
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
    if a.budget == 0 {
        // Worded as generate's and bench's (`BudgetChoice::parse`); profile times fixed trees.
        return Err(Error::Input("--budget `0`: expected a positive tree budget (non-root nodes, ≥ 1); profile times fixed trees, not `auto`".into()));
    }
    for (v, arg) in [(a.reps, "--reps"), (a.prefill, "--prefill"), (a.candidates, "--candidates"), (a.max_fanout, "--max-fanout"), (a.ctx_rows, "--ctx-rows")] {
        if v == 0 {
            return Err(Error::Input(format!("{arg} 0: must be ≥ 1")));
        }
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
    if let Some(path) = &a.json {
        // Fail before minutes of timing, not after: the JSON file must be creatable (checked
        // without creating it: an interrupted run leaves no empty file).
        sparkling::fsio::check_writable(path, "--json")?;
    }
    let s = select(&a.model)?;
    let kinds = [DrafterKind::DSpark];
    match s.backend {
        AnyBackend::Cpu(b) => profile(load(b, &s.target, &a.model, &kinds)?, &a),
        #[cfg(feature = "wgpu")]
        AnyBackend::Wgpu(b) => profile(load(b, &s.target, &a.model, &kinds)?, &a),
        #[cfg(feature = "cuda")]
        AnyBackend::Cuda(b) => profile(load(b, &s.target, &a.model, &kinds)?, &a),
    }
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

fn profile<B: Backend>(m: Loaded<B>, a: &ProfileArgs) -> Result<()> {
    let b = &m.backend;
    let t = &m.models.target;
    let d = m.models.drafter(DrafterKind::DSpark).ok_or_else(|| Error::Input("profile needs a DSpark drafter (--drafter DIR)".into()))?;
    let tc = &t.cfg;
    let mut bounded = a.clone();
    super::clamp("--candidates", &mut bounded.candidates, tc.vocab, "the vocabulary size");
    super::clamp("--max-fanout", &mut bounded.max_fanout, bounded.candidates, "--candidates");
    let a = &bounded;
    let p = a.prefill;
    let bk = d.cfg.block_size;
    let depth = d.cfg.draft_depth().min(a.budget.max(1));
    if p.saturating_add(a.budget).saturating_add(bk + 4) > tc.max_positions {
        return Err(Error::Input(format!("--prefill {p} + --budget {} exceeds the target context of {}", a.budget, tc.max_positions)));
    }
    // The exactness check runs after the timing: refuse what it cannot run before timing, with
    // the engine's own check of the two generations it will run (prompt, new tokens, the rows
    // a round writes: tree, drafter block, lookup chain).
    let check_params = |method: Method| GenParams {
        method,
        tree: sparkling::decode::propose::TreeParams {
            budget: a.budget,
            candidates: a.candidates,
            max_fanout: a.max_fanout,
            treespark_k: 4,
            // As `generate --tree-prep auto`: the engine picks host or device selection.
            prep: sparkling::decode::propose::TreePrep::Auto,
        },
        sampling: sparkling::core::SampleParams { temperature: 0.0, top_k: 0, top_p: 1.0 },
        seed: 0,
        max_new_tokens: a.check_tokens,
        stop: vec![],
        auto_budget: None,
        // As `generate`: sparkling with its default lookup graft.
        lookup: sparkling::decode::Platform::of(b).lookup_graft(method),
    };
    if a.check_tokens > 0 {
        let zeros = vec![0u32; p];
        for (method, drafter) in [(Method::Ar, None), (Method::Sparkling, Some(d))] {
            if let Err(e) = (Engine { backend: b, target: t, drafter }).check(&zeros, &check_params(method)) {
                return Err(Error::Input(format!(
                    "--check-tokens {} after the {p}-token prompt (--prefill) cannot run, so nothing was timed: {e}",
                    a.check_tokens
                )));
            }
        }
    }
    let taps = d.cfg.target_layer_ids.clone();
    let tiny = b.upload(&[0.0], 1, 1)?;
    let sync = || -> Result<()> {
        b.download(&tiny)?;
        Ok(())
    };
    let vocab = tc.vocab as u64;
    let prompt: Vec<u32> = (0..p as u64).map(|i| ((i * 7919 + 13) % vocab) as u32).collect();
    let positions: Vec<u32> = (0..p as u32).collect();
    let mut cache = t.new_cache(b, p + a.budget.max(bk) + 8)?;
    let t0 = Instant::now();
    let pre = t.forward(b, &mut cache, &prompt, &positions, AttnMask::Causal, LogitRows::Last, &taps)?;
    let root = b.argmax(&pre.logits)?[0];
    let prefill_ms = ms_since(t0);
    let ctx_all = pre.taps.ok_or_else(|| Error::Input("the drafter taps no target layer".into()))?;
    eprintln!("prefilled {p} tokens in {prefill_ms:.1} ms on {}", b.name());

    let mut rows: Vec<(&str, String, (f64, f64))> = Vec::new();
    let (w, r) = (a.warmup, a.reps);

    // Empty sync (the floor every other number includes once).
    rows.push((
        "sync",
        "1-value read-back".into(),
        time_ms(w, r, || {
            let t0 = Instant::now();
            sync()?;
            Ok(ms_since(t0))
        })?,
    ));

    // AR step: 1 row at position P, argmax (a read-back), cache cropped back.
    rows.push((
        "ar_step",
        format!("1 row at position {p}, + argmax"),
        time_ms(w, r, || {
            let t0 = Instant::now();
            let o = t.forward(b, &mut cache, &[root], &[p as u32], AttnMask::Causal, LogitRows::Last, &[])?;
            b.argmax(&o.logits)?;
            let ms = ms_since(t0);
            cache.crop(p);
            Ok(ms)
        })?,
    ));

    // Drafter forward over the last ctx_rows context rows.
    let lc = a.ctx_rows;
    let ctx_rows: Vec<usize> = (p - lc..p).collect();
    let ctx = b.gather_rows(&ctx_all, &ctx_rows)?;
    let mut dcache = d.new_cache(b, p + bk + 8)?;
    // First call consumes the whole prompt's context (the steady state sees only a few rows).
    let first_ctx = b.gather_rows(&ctx_all, &(0..p - lc).collect::<Vec<_>>())?;
    if p > lc {
        d.draft(b, t, &mut dcache, &first_ctx, root, p - lc, a.budget)?;
    }
    let mut logits = None;
    rows.push((
        "draft",
        format!("drafter forward, {lc} context rows + {} of {bk} block rows (depth {})", d.block_rows(a.budget), a.budget.min(d.cfg.draft_depth())),
        time_ms(w, r, || {
            dcache.crop(p - lc);
            let t0 = Instant::now();
            let l = d.draft(b, t, &mut dcache, &ctx, root, p, a.budget)?;
            sync()?;
            let ms = ms_since(t0);
            logits = Some(l);
            Ok(ms)
        })?,
    ));
    let logits = logits.expect("at least one repetition");

    // Candidate table: top-C per depth, union (+ anchor) and Markov table in one backend call
    // (one read-back on device backends), as the decode loop's device tree prep does.
    let markov = d.markov_device(b)?;
    // The device ops work in draft ids (a reduced draft vocabulary: the anchor's draft id, or
    // draft id 0 when it has none; the tree's tokens are then mapped back below).
    let droot = d.vocab_map.as_ref().map_or(root, |m| m.draft_id(root).unwrap_or(0));
    let mut table = CandidateTable::default();
    rows.push((
        "candidate_table",
        format!("topk C={} over [{depth}, {}] + union + markov_table + read-back", a.candidates, d.draft_vocab()),
        time_ms(w, r, || {
            let t0 = Instant::now();
            let k = a.max_fanout.min(a.budget);
            table = b.candidate_table(&logits, markov, a.candidates, droot, k)?;
            Ok(ms_since(t0))
        })?,
    ));

    // Host heap over the table.
    let mut tree = DraftTree::root(root);
    rows.push((
        "heap",
        format!("build_sparkling_precompute, budget {}, {} candidates", a.budget, table.n()),
        time_ms(w, r, || {
            let t0 = Instant::now();
            tree = build_sparkling_precompute(&table, droot, a.budget);
            Ok(ms_since(t0))
        })?,
    ));
    // What the decode loop runs on a host-memory backend (the CPU: `TreePrep::Host`): download
    // the draft logits and build the tree with the lazy-row builder. The two rows above are the
    // device-style path, which decode uses only on device backends.
    if sparkling::decode::Platform::of(b).host_memory {
        rows.push((
            "host_prep",
            format!("decode's CPU path: download [{depth}, {}] + build_sparkling_lazy, budget {}", d.draft_vocab(), a.budget),
            time_ms(w, r, || {
                let t0 = Instant::now();
                let host = b.download(&logits)?;
                let lc = sparkling::tree::LazyCandidates::new(&host, depth, d.draft_vocab(), d.markov.as_ref(), droot, a.candidates);
                let built = sparkling::tree::build_sparkling_lazy(&lc, d.markov.as_ref(), droot, a.max_fanout, a.budget);
                std::hint::black_box(built);
                Ok(ms_since(t0))
            })?,
        ));
    }
    if let Some(m) = &d.vocab_map {
        tree = m.map_tree(&tree, root);
    }
    let n_nodes = tree.len();

    // The same tree built on the device, where the backend offers it (one read-back of the
    // nodes instead of the table; replaces candidate_table + heap in the decode loop).
    if b.sparkling_tree(&logits, markov, a.candidates, droot, a.max_fanout.min(a.budget), a.budget)?.is_some() {
        rows.push((
            "device_tree",
            format!("sparkling_tree: candidate_table + heap on the device, {} nodes read back", a.budget),
            time_ms(w, r, || {
                let t0 = Instant::now();
                b.sparkling_tree(&logits, markov, a.candidates, droot, a.max_fanout.min(a.budget), a.budget)?;
                Ok(ms_since(t0))
            })?,
        ));
    }

    // Verify forward of the real tree (taps as the engine requests them), cache cropped back.
    let tpos: Vec<u32> = tree.depths.iter().map(|&dp| p as u32 + dp).collect();
    let mut last_verify = None;
    rows.push((
        "verify",
        format!("{n_nodes} tree rows (1+{}), tree attention, taps", n_nodes - 1),
        time_ms(w, r, || {
            let t0 = Instant::now();
            let o = t.forward(b, &mut cache, &tree.tokens, &tpos, AttnMask::Tree { parents: &tree.parents }, LogitRows::All, &taps)?;
            sync()?;
            let ms = ms_since(t0);
            cache.crop(p);
            last_verify = Some(o);
            Ok(ms)
        })?,
    ));
    let ver = last_verify.expect("at least one repetition");
    rows.push((
        "accept",
        format!("argmax of {n_nodes} rows + read-back"),
        time_ms(w, r, || {
            let t0 = Instant::now();
            b.argmax(&ver.logits)?;
            Ok(ms_since(t0))
        })?,
    ));

    // KV compaction to a real root-to-leaf path (+ the taps gather of the accepted rows).
    let mut keep = vec![0usize];
    let mut cur = 0usize;
    let cm = tree.child_map();
    while let Some(&c) = cm.children(cur).first() {
        keep.push(c as usize);
        cur = c as usize;
        if keep.len() >= 8 {
            break;
        }
    }
    let ver_taps = ver.taps.as_ref().ok_or_else(|| Error::Input("verify produced no taps".into()))?;
    rows.push((
        "compaction",
        format!("KV compaction of {} layers to a {}-row path + taps gather", tc.layers, keep.len()),
        time_ms(w, r, || {
            // Re-create the verify rows' cache state (untimed), then compact.
            cache.crop(p);
            cache.len = p + n_nodes;
            sync()?;
            let t0 = Instant::now();
            cache.compact(b, p, &keep)?;
            let g = b.gather_rows(ver_taps, &keep)?;
            sync()?;
            let ms = ms_since(t0);
            drop(g);
            cache.crop(p);
            Ok(ms)
        })?,
    ));

    // The `--budget auto` cost curve on this cache (context P): the verify forward + argmax of
    // r rows at the points the engine measures, N_max = B, and one drafter forward.
    let ctx4 = b.gather_rows(&ctx_all, &(p.saturating_sub(4)..p).collect::<Vec<_>>())?;
    let curve = pollster::block_on(sparkling::decode::budget::CostModel::measure(b, t, &mut cache, root, a.budget, &taps, Some((d, &ctx4))))?;
    let cost_path = super::costs::cache_path(&a.model, &m.target_path, &b.name());

    // Greedy exactness on these shapes (optional).
    // The check's line goes under the timing report (it runs last).
    let mut check_line = String::new();
    let check = if a.check_tokens > 0 {
        let ar = Engine { backend: b, target: t, drafter: None }.generate(&prompt, &check_params(Method::Ar), &mut |_| {})?;
        let sp = Engine { backend: b, target: t, drafter: Some(d) }.generate(&prompt, &check_params(Method::Sparkling), &mut |_| {})?;
        let equal = ar.tokens == sp.tokens;
        let _ = writeln!(
            check_line,
            "check: {} greedy tokens after the {p}-token prompt, sparkling {} ar (τ = {:.2}; ar {:.1} tok/s, sparkling {:.1} tok/s)",
            a.check_tokens,
            if equal { "EQUAL to" } else { "DIFFER from" },
            sp.stats.tau(),
            ar.stats.tokens_per_s(),
            sp.stats.tokens_per_s()
        );
        Some(
            serde_json::json!({"tokens": a.check_tokens, "prompt_tokens": p, "equal": equal, "tau": sp.stats.tau(), "ar_tokens_per_s": ar.stats.tokens_per_s(), "sparkling_tokens_per_s": sp.stats.tokens_per_s()}),
        )
    } else {
        None
    };

    let mut report = String::new();
    // Report.
    let get = |name: &str| rows.iter().find(|r| r.0 == name).map(|r| r.2 .0).unwrap_or(f64::NAN);
    // Tree prep as decode runs it: the host lazy builder on the CPU, else the device-style path.
    let (prep, prep_parts) = if sparkling::decode::Platform::of(b).host_memory {
        (get("host_prep"), "host_prep")
    } else if rows.iter().any(|r| r.0 == "device_tree") {
        (get("device_tree"), "device_tree")
    } else {
        (get("candidate_table") + get("heap"), "candidate_table + heap")
    };
    let outside = get("accept") + prep + get("compaction");
    // The weights as stored (Q4_1 blocks stay Q4_1 on the cpu: ≈ 0.6 B per weight).
    let weight_bytes = t.decode_weight_bytes(b);
    let gb = weight_bytes as f64 / 1e9;
    let _ = writeln!(
        report,
        "backend {}; target {} layers, hidden {}, vocab {}; drafter block {bk}, markov rank {}, draft vocabulary {}",
        b.name(),
        tc.layers,
        tc.hidden,
        tc.vocab,
        d.cfg.markov_rank,
        d.draft_vocab()
    );
    let _ = writeln!(report, "target matmul kernels: {}", t.kernel_paths(b));
    let _ = writeln!(report, "prefill P = {p}, budget B = {}, candidates C = {}, {} reps (median, min)", a.budget, a.candidates, r);
    let _ = writeln!(report, "| part | what | median ms | min ms |");
    let _ = writeln!(report, "|---|---|---|---|");
    for (name, what, (med, min)) in &rows {
        let _ = writeln!(report, "| {name} | {what} | {med:.3} | {min:.3} |");
    }
    let _ = writeln!(report, "| outside forwards | accept + {prep_parts} + compaction (the tree prep decode runs here) | {outside:.3} | |");
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
    {
        let parts: serde_json::Map<String, serde_json::Value> =
            rows.iter().map(|(n, what, (med, min))| (n.to_string(), serde_json::json!({"what": what, "median_ms": med, "min_ms": min}))).collect();
        let v = serde_json::json!({
            "backend": b.name(),
            "kernels": t.kernel_paths(b),
            "target": {"layers": tc.layers, "hidden": tc.hidden, "vocab": tc.vocab, "heads": tc.n_heads, "kv_heads": tc.n_kv_heads, "head_dim": tc.head_dim, "intermediate": tc.intermediate},
            "drafter": {"block_size": bk, "markov_rank": d.cfg.markov_rank, "layers": d.cfg.layers},
            "prefill": p, "budget": a.budget, "candidates": a.candidates, "max_fanout": a.max_fanout, "ctx_rows": lc,
            "reps": r, "warmup": w, "prefill_ms": prefill_ms, "tree_nodes": n_nodes, "table_candidates": table.n(), "table_k": table.k,
            "parts": parts,
            "outside_forwards_ms": outside,
            "verify_over_ar_step": get("verify") / get("ar_step"),
            "decode_weight_bytes": weight_bytes,
            "ar_step_effective_gb_per_s": gb / (get("ar_step") / 1e3),
            "check": check,
            "budget_auto_cost_curve": curve,
        });
        report.push_str(&check_line);
        super::save_json_then_print(a.json.as_deref(), &v, &report)?;
    }
    if check.as_ref().is_some_and(|c| c["equal"] == false) {
        return Err(Error::Input("profile --check-tokens: sparkling's greedy tokens differ from ar's (the engine invariant is broken on this backend)".into()));
    }
    Ok(())
}
