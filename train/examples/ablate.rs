//! Which inputs a trained drafter uses: held-out per-depth top-1 agreement and τchain of a run's
//! checkpoint as trained, with its Markov head zeroed, and with the target's context taps zeroed.
//! `cargo run --release --example ablate -- <run dir> [step]`

use candle_core::Tensor;
use sparkling_train::cache::load_files;
use sparkling_train::checkpoint::{frozen_file_list, latest_checkpoint, load_checkpoint, load_checkpoint_scale, read_draft_vocab, read_run_config};
use sparkling_train::eval::evaluate;
use sparkling_train::model::CandleDrafter;
use sparkling_train::train::{run_context, split};
use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run = Path::new(args.first().ok_or("usage: ablate <run dir> [step]")?);
    let rc = read_run_config(run)?;
    let (meta, head, tcfg, dcfg) = run_context(&rc)?;
    let step = match args.get(1) {
        Some(s) => s.parse()?,
        None => latest_checkpoint(run)?.ok_or("no checkpoint")?,
    };
    let params = load_checkpoint(run, step, &dcfg, meta.width(), None)?;
    let scale = load_checkpoint_scale(run, step)?;
    let draft_vocab = read_draft_vocab(run, &rc, tcfg.vocab)?;
    let lm_head = match &draft_vocab {
        Some(dv) => head.index_select(&Tensor::from_vec(dv.draft_to_target().to_vec(), dv.len(), &candle_core::Device::Cpu)?, 0)?,
        None => head.clone(),
    };
    let files = frozen_file_list(&rc, run)?;
    let seqs = load_files(Path::new(&rc.cache), &meta, &files)?;
    let (_, hold) = split(seqs, rc.holdout);
    let m = CandleDrafter { cfg: dcfg, params, embed: head, lm_head, draft_vocab, ctx_scale: scale };
    let show = |what: &str, m: &CandleDrafter, hold: &[sparkling_train::cache::Sequence]| -> Result<(), Box<dyn std::error::Error>> {
        let ev = evaluate(m, hold, &rc, meta.topk, 32)?;
        let acc: Vec<String> = ev.acc.iter().take(8).map(|x| format!("{x:.3}")).collect();
        println!("{what:28} ce {:.3}  τchain {:.3}  acc d1..8 [{}]", ev.ce, ev.tau_chain, acc.join(" "));
        Ok(())
    };
    show("as trained", &m, &hold)?;
    let zero_ctx: Vec<_> = hold.iter().map(|s| sparkling_train::cache::Sequence { taps: vec![half::f16::ZERO; s.taps.len()], ..s.clone() }).collect();
    show("context taps zeroed", &m, &zero_ctx)?;
    if let Some(w2) = m.params.vars.get("markov_head.markov_w2.weight") {
        w2.set(&w2.zeros_like()?)?;
        show("Markov head zeroed", &m, &hold)?;
        show("both zeroed", &m, &zero_ctx)?;
    }
    Ok(())
}
