//! Batches on wgpu: one target forward per step over every sequence (matmuls, norms and RoPE
//! once over all rows, attention ragged), each sequence bit-identical to itself decoded alone
//! on wgpu, and every method equal to wgpu's own `ar` — at T = 0 and with the same seed at
//! T > 0, with staggered joins and chunked prefill. Random tiny Llama target and drafters.
use crate::common::*;
use crate::gpu;
use sparkling::decode::batch::{Batch, BatchOptions, SeqId};
use sparkling::decode::{Engine, GenParams, LookupGraft, Method};
use sparkling::model::config::{Arch, DrafterKind, TargetConfig};
use sparkling::model::drafter::Drafter;
use sparkling::model::synth::{tiny_target_config, write_random_target, StoreDtype};
use std::collections::HashMap;

#[test]
fn batched_sequences_equal_themselves_alone_and_ar_on_wgpu() {
    let Some(g) = gpu("wgpu batch") else { return };
    let (td, dd, fd) = (tmpdir("target"), tmpdir("dspark"), tmpdir("dflash"));
    let cfg: TargetConfig = tiny_target_config(Arch::Llama, 48);
    write_random_target(td.path(), &cfg, 71, StoreDtype::F32).expect("write target");
    let t = load_target(g, td.path());
    write_drafter_with_rank(dd.path(), &t.cfg, DrafterKind::DSpark, 8, 4, 5);
    write_drafter_with_rank(fd.path(), &t.cfg, DrafterKind::DFlash, 8, 0, 6);
    let dspark = load_drafter(g, dd.path(), &t.cfg);
    let dflash = load_drafter(g, fd.path(), &t.cfg);
    let drafter_of = |m: Method| -> Option<&Drafter<_>> {
        match m.drafter_kind() {
            Some(DrafterKind::DSpark) => Some(&dspark),
            Some(DrafterKind::DFlash) => Some(&dflash),
            None => None,
        }
    };
    let prompts: [&[u32]; 4] = [&[3, 17, 5, 9, 22, 1], &[40, 2, 2, 7], &[9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 12, 13], &[5, 5]];
    let reqs: Vec<(Vec<u32>, GenParams)> = vec![
        (prompts[0].to_vec(), params(Method::Ar, 1, 0.0, 0, 12, vec![])),
        (prompts[1].to_vec(), params(Method::Sparkling, 8, 0.0, 0, 14, vec![])),
        (prompts[2].to_vec(), params(Method::DSpark, 4, 1.0, 7, 12, vec![])),
        (prompts[3].to_vec(), params(Method::DFlash, 6, 0.0, 0, 12, vec![])),
        (prompts[2].to_vec(), params(Method::Lookup, 4, 0.0, 0, 14, vec![])),
        (prompts[0].to_vec(), GenParams { lookup: LookupGraft { len: 3, skip_drafter: false }, ..params(Method::Sparkling, 4, 0.8, 5, 12, vec![]) }),
    ];
    let ar = Engine { backend: g, target: &t, drafter: None };
    let alone: Vec<Vec<u32>> = reqs
        .iter()
        .map(|(p, gp)| {
            let e = Engine { backend: g, target: &t, drafter: drafter_of(gp.method) };
            let got = e.generate(p, gp, &mut |_| {}).unwrap();
            let as_ar = ar.generate(p, &GenParams { method: Method::Ar, lookup: LookupGraft::OFF, ..gp.clone() }, &mut |_| {}).unwrap();
            assert_eq!(got.tokens, as_ar.tokens, "{:?} alone vs ar on wgpu", gp.method);
            got.tokens
        })
        .collect();
    for (stagger, chunk) in [(false, 0usize), (true, 3)] {
        let opts = BatchOptions { taps: vec![], max_prefill_rows: chunk };
        let mut batch = Batch::new(g, &t, opts).unwrap().with_drafter(&dspark).unwrap().with_drafter(&dflash).unwrap();
        let mut owner: HashMap<SeqId, usize> = HashMap::new();
        let mut got: Vec<Option<Vec<u32>>> = vec![None; reqs.len()];
        let (mut next, mut step, mut widest) = (0, 0, 0);
        while next < reqs.len() || !batch.is_empty() {
            while next < reqs.len() && (!stagger || 2 * next <= step) {
                owner.insert(batch.add(&reqs[next].0, &reqs[next].1).unwrap(), next);
                next += 1;
            }
            let out = batch.step().unwrap();
            widest = widest.max(out.seqs.len());
            for f in out.finished {
                got[owner[&f.id]] = Some(f.tokens);
            }
            step += 1;
            assert!(step < 2_000, "batch never drained");
        }
        assert!(widest >= 3, "stagger {stagger}: sequences shared a step ({widest} at most)");
        for (i, (gt, want)) in got.into_iter().zip(&alone).enumerate() {
            assert_eq!(gt.as_ref(), Some(want), "request {i} ({:?}) batched on wgpu, stagger {stagger}, chunk {chunk}", reqs[i].1.method);
        }
    }
}
