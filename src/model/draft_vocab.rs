//! The reduced draft vocabulary (the FR-Spec / EAGLE-3 idea): a drafter whose output
//! layer and Markov `W2` cover only the V_d most frequent target tokens. Its checkpoint
//! carries `draft_vocab_size` in `config.json` and the map `draft_to_target` (`[V_d]`, integer,
//! **absolute** target ids: draft id `i` is target id `draft_to_target[i]`; EAGLE-3's `d2t`
//! stores offsets `target − i` instead). Draft ids are what the draft logits' columns, the
//! tree builders and the device kernels see; [`DraftVocab::map_tree`] turns a draft-id tree into
//! the target-id tree the target verifies (over its full vocabulary, so exactness is untouched:
//! a token outside the draft vocabulary simply cannot be drafted).

use crate::error::{Error, Result};
use crate::tree::{DraftTree, NO_PARENT};
use std::path::Path;

/// Name of the map tensor in a reduced drafter's checkpoint.
pub const MAP_TENSOR: &str = "draft_to_target";

/// The draft → target id map of a reduced drafter, with its inverse.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftVocab {
    d2t: Vec<u32>,
    /// `t2d[t]` = the draft id of target id `t`, or `u32::MAX` outside the draft vocabulary.
    t2d: Vec<u32>,
}

impl DraftVocab {
    /// Check and index a map read from `path`: exactly `draft_vocab` entries (`shape` `[V_d]`),
    /// each a target id in `0..vocab`, no id twice. Errors name the file and [`MAP_TENSOR`].
    pub fn new(path: &Path, shape: &[usize], ids: &[i64], vocab: usize, draft_vocab: usize) -> Result<DraftVocab> {
        let bad = |m: String| Err(Error::tensor(path, MAP_TENSOR, m));
        if shape != [draft_vocab] || ids.len() != draft_vocab {
            return bad(format!("expected shape [{draft_vocab}] (draft_vocab_size), found {shape:?}"));
        }
        let mut t2d = vec![u32::MAX; vocab];
        let mut d2t = Vec::with_capacity(ids.len());
        for (d, &t) in ids.iter().enumerate() {
            if t < 0 || t as u64 >= vocab as u64 {
                return bad(format!("entry {d} is target id {t}, outside the target vocabulary 0..{vocab}"));
            }
            let slot = &mut t2d[t as usize];
            if *slot != u32::MAX {
                return bad(format!("target id {t} appears twice (entries {} and {d}): the map must be one-to-one", *slot));
            }
            *slot = d as u32;
            d2t.push(t as u32);
        }
        Ok(DraftVocab { d2t, t2d })
    }

    /// The map from a list of distinct in-range target ids (programmatic use; panics-free:
    /// errors as [`DraftVocab::new`]).
    pub fn from_ids(ids: &[u32], vocab: usize) -> Result<DraftVocab> {
        let v: Vec<i64> = ids.iter().map(|&x| x as i64).collect();
        DraftVocab::new(Path::new("<draft vocabulary>"), &[ids.len()], &v, vocab, ids.len())
    }

    /// V_d.
    pub fn len(&self) -> usize {
        self.d2t.len()
    }

    /// Never true for a loaded map (V_d ≥ 1).
    pub fn is_empty(&self) -> bool {
        self.d2t.is_empty()
    }

    /// The target ids of draft ids `0..V_d`, in draft-id order.
    pub fn draft_to_target(&self) -> &[u32] {
        &self.d2t
    }

    /// The draft id of target id `t`, `None` outside the draft vocabulary.
    pub fn draft_id(&self, t: u32) -> Option<u32> {
        self.t2d.get(t as usize).copied().filter(|&d| d != u32::MAX)
    }

    /// The target id of draft id `d` (`None` for an id `≥ V_d`, such as the virtual anchor slot
    /// of [`crate::decode::propose`]).
    pub fn target_id(&self, d: u32) -> Option<u32> {
        self.d2t.get(d as usize).copied()
    }

    /// A tree built over draft ids, in target ids: the root becomes `anchor`, every other node
    /// `d2t[token]`; a node whose token is not a draft id (`≥ V_d`: the virtual anchor column
    /// of an out-of-vocabulary anchor, which carries probability 0) is dropped with its subtree,
    /// and the remaining nodes keep their verify order.
    pub fn map_tree(&self, tree: &DraftTree, anchor: u32) -> DraftTree {
        let n = tree.len();
        let mut out = DraftTree::root(anchor);
        if n == 0 {
            return out;
        }
        let mut new_index = vec![u32::MAX; n];
        new_index[0] = 0;
        for i in 1..n {
            let p = tree.parents[i];
            let np = if p == NO_PARENT { u32::MAX } else { new_index[p as usize] };
            let Some(t) = self.target_id(tree.tokens[i]) else { continue };
            if np == u32::MAX {
                continue;
            }
            new_index[i] = out.tokens.len() as u32;
            out.tokens.push(t);
            out.parents.push(np);
            out.depths.push(tree.depths[i]);
            out.scores.push(tree.scores[i]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_checks_and_inverse() {
        let p = Path::new("d/model.safetensors");
        let m = DraftVocab::new(p, &[3], &[7, 2, 9], 10, 3).unwrap();
        assert_eq!((m.draft_id(2), m.draft_id(9), m.draft_id(3), m.draft_id(99)), (Some(1), Some(2), None, None));
        assert_eq!((m.target_id(0), m.target_id(3)), (Some(7), None));
        for (shape, ids, want) in [
            (vec![3usize], vec![7i64, 2, 10], "outside the target vocabulary"),
            (vec![3], vec![7, -1, 9], "outside the target vocabulary"),
            (vec![3], vec![7, 2, 7], "appears twice"),
            (vec![2], vec![7, 2], "expected shape [3]"),
            (vec![1, 3], vec![7, 2, 9], "expected shape [3]"),
        ] {
            let e = DraftVocab::new(p, &shape, &ids, 10, 3).unwrap_err().to_string();
            assert!(e.contains(MAP_TENSOR) && e.contains(want) && e.contains("d/model.safetensors"), "{e}");
        }
    }

    #[test]
    fn map_tree_maps_and_drops_virtual_subtrees() {
        let m = DraftVocab::from_ids(&[5, 6, 7], 10).unwrap();
        // root(virtual 3) → 0, 3(virtual) → 1 (dropped with its parent), 0 → 2
        let t = DraftTree {
            tokens: vec![3, 0, 3, 1, 2],
            parents: vec![NO_PARENT, 0, 0, 2, 1],
            depths: vec![0, 1, 1, 2, 2],
            scores: vec![0.0, -0.1, -50.0, -50.5, -0.3],
        };
        let g = m.map_tree(&t, 42);
        assert_eq!(g.tokens, vec![42, 5, 7]);
        assert_eq!(g.parents, vec![NO_PARENT, 0, 1]);
        assert_eq!(g.depths, vec![0, 1, 2]);
        assert_eq!(g.scores, vec![0.0, -0.1, -0.3]);
        assert!(g.is_well_formed());
    }
}
