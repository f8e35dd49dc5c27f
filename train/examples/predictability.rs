//! What is predictable at all — how much a drafter could agree with the target — per prompt set of a `gen-data` cache:
//! how confident the target is in its own greedy token at each answer position (the top-1
//! probability of its full softmax, from the cached top-k), and what a context-free bigram
//! model (`x_S → x_{S+1}`, counted on the even-indexed sequences, scored on the odd ones)
//! agrees with at depth 1 — the floor any drafter with the anchor token must beat.
//!
//! `cargo run --release --example predictability -- <cache dir> <prompt dir or files...>`
//! (the prompt files `gen-data` read, in the same order, to name each sequence's set: ids are
//! `file index · 2^20 + line`).

use sparkling_train::cache::{list, load_files, CacheMeta};
use sparkling_train::gen::prompt_files;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

#[derive(Default)]
struct Acc {
    seqs: usize,
    tokens: usize,
    p1_sum: f64,
    ge50: usize,
    ge80: usize,
    bigram_hit: usize,
    bigram_n: usize,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = Path::new(args.first().ok_or("usage: predictability <cache dir> <prompt files or dirs...>")?);
    let files = prompt_files(&args[1..].iter().map(PathBuf::from).collect::<Vec<_>>())?;
    let meta = CacheMeta::read(dir)?.ok_or("no meta.json in the cache directory")?;
    let seqs = load_files(dir, &meta, &list(dir)?)?;
    let name = |id: u32| -> String {
        let f = (id >> 20) as usize;
        if files.len() <= 1 {
            return files.first().map(|p| p.file_stem().unwrap_or_default().to_string_lossy().to_string()).unwrap_or_default();
        }
        files.get(f).map(|p| p.file_stem().unwrap_or_default().to_string_lossy().to_string()).unwrap_or_else(|| format!("file {f}"))
    };
    // Bigram table from the even-indexed sequences' answers: most frequent successor.
    let mut counts: HashMap<u32, HashMap<u32, u32>> = HashMap::new();
    for s in seqs.iter().step_by(2) {
        for q in s.prompt_len.max(1)..s.len() {
            *counts.entry(s.tokens[q - 1]).or_default().entry(s.tokens[q]).or_default() += 1;
        }
    }
    let best: HashMap<u32, u32> =
        counts.into_iter().map(|(k, m)| (k, m.into_iter().max_by_key(|&(t, c)| (c, std::cmp::Reverse(t))).map(|x| x.0).unwrap_or(0))).collect();
    let mut by: BTreeMap<String, Acc> = BTreeMap::new();
    for (i, s) in seqs.iter().enumerate() {
        for key in [name(s.id), "all".to_string()] {
            let a = by.entry(key).or_default();
            a.seqs += 1;
            for q in s.prompt_len..s.len() {
                let Some((_, lp)) = s.topk_at(q) else { continue };
                let p1 = (lp[0] as f64).exp();
                a.tokens += 1;
                a.p1_sum += p1;
                a.ge50 += (p1 >= 0.5) as usize;
                a.ge80 += (p1 >= 0.8) as usize;
                // Depth 1 of an anchor at S = q - 1 predicts q from x_S alone.
                if i % 2 == 1 && q >= 1 {
                    a.bigram_n += 1;
                    a.bigram_hit += (best.get(&s.tokens[q - 1]) == Some(&s.tokens[q])) as usize;
                }
            }
        }
    }
    println!("| prompt set | sequences | answer tokens | mean top-1 prob | top-1 prob ≥ 0.5 | ≥ 0.8 | bigram depth-1 agreement |");
    println!("|---|---|---|---|---|---|---|");
    for (k, a) in &by {
        let t = a.tokens.max(1) as f64;
        println!(
            "| {k} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} |",
            a.seqs,
            a.tokens,
            a.p1_sum / t,
            a.ge50 as f64 / t,
            a.ge80 as f64 / t,
            a.bigram_hit as f64 / a.bigram_n.max(1) as f64
        );
    }
    Ok(())
}
