//! The draft-tree vocabulary shared by the engine and every backend (design §3): the tree in
//! verify order ([`DraftTree`]), the per-depth top-k ([`TopK`]) and the SparklingTree
//! candidate table ([`CandidateTable`]). Tree builders in the engine consume these types and
//! backends return them, so nothing is copied field by field across the seam.

use crate::{Error, Result};

/// Sentinel parent of the root (`parents[0]` of every [`DraftTree`]).
pub const NO_PARENT: u32 = u32::MAX;

/// A draft tree in verify order (§4.8).
///
/// All four vectors have the same length `len() = 1 + num_nodes()`. Index 0 is the root
/// (anchor/bonus token, depth 0, parent [`NO_PARENT`], score 0); nodes `1..len` are in the
/// order the builder admitted them, and `parents[i] < i` for `i >= 1`. Siblings carry
/// distinct tokens, which makes the acceptance walk (§4.9.1) unambiguous.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DraftTree {
    /// Token id of every node (`tokens[0]` = anchor).
    pub tokens: Vec<u32>,
    /// Parent index of every node (`parents[0]` = [`NO_PARENT`], else `< i`).
    pub parents: Vec<u32>,
    /// Depth of every node (root 0; `depths[i] = depths[parents[i]] + 1`). Position id = `S + depth`.
    pub depths: Vec<u32>,
    /// Path log-score of every node (natural log; 0 for the root). Its meaning depends on the
    /// builder: sum of per-depth log-marginals (DDTree) or of Markov-conditioned
    /// log-probabilities (SparklingTree, TreeSpark/PCTree); 0 for [`DraftTree::chain`].
    pub scores: Vec<f32>,
}

impl DraftTree {
    /// A tree made of the root only (`len() == 1`): token `anchor`, depth 0, score 0.
    pub fn root(anchor: u32) -> Self {
        DraftTree { tokens: vec![anchor], parents: vec![NO_PARENT], depths: vec![0], scores: vec![0.0] }
    }

    /// A chain-shaped tree: root `anchor` followed by `drafts[0], drafts[1], ...`, node `i`
    /// having parent `i - 1` and depth `i`. Scores are all 0 (a chain carries no log-scores).
    pub fn chain(anchor: u32, drafts: &[u32]) -> Self {
        let n = drafts.len() + 1;
        let mut t = DraftTree { tokens: Vec::with_capacity(n), parents: Vec::with_capacity(n), depths: Vec::with_capacity(n), scores: vec![0.0; n] };
        t.tokens.push(anchor);
        t.tokens.extend_from_slice(drafts);
        t.parents.push(NO_PARENT);
        t.parents.extend(0..drafts.len() as u32);
        t.depths.extend(0..n as u32);
        t
    }

    /// Number of nodes including the root (= number of verify positions).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Always false for a tree built by this module (the root is always present); provided
    /// for API completeness (`len() == 0` only for `DraftTree::default()`).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Graft the chain `drafts` (the tokens after the root, in order) onto this tree, as a
    /// prompt-lookup chain is grafted onto a drafter's tree: follow the root's existing path
    /// while a child carries the chain's next token, then append the rest of the chain below
    /// the last matched node. Appended nodes take that node's path score (a chain carries no
    /// probabilities; a child's score never exceeds its parent's, so pop-order prefixes stay
    /// ancestor-closed). Parents stay before children and siblings keep distinct tokens, so a
    /// well-formed tree stays well formed. Returns the number of nodes appended (0 when the
    /// tree already holds the whole chain). O(len · chain) ([`DraftTree::child_with_token`]).
    pub fn graft_chain(&mut self, drafts: &[u32]) -> usize {
        let mut cur = 0usize;
        let mut matched = 0usize;
        for &t in drafts {
            match self.child_with_token(cur, t) {
                Some(c) => cur = c,
                None => break,
            }
            matched += 1;
        }
        let score = self.scores[cur];
        for &t in &drafts[matched..] {
            let depth = self.depths[cur] + 1;
            self.tokens.push(t);
            self.parents.push(cur as u32);
            self.depths.push(depth);
            self.scores.push(score);
            cur = self.tokens.len() - 1;
        }
        drafts.len() - matched
    }

    /// Number of non-root nodes (`len() - 1`; 0 for an empty/default tree).
    pub fn num_nodes(&self) -> usize {
        self.tokens.len().saturating_sub(1)
    }

    /// Child lookup for the acceptance walk (§4.9.1): the index of the child of `node` whose
    /// token is `tok`, or `None`. Scans indices `node+1..len` (children always follow their
    /// parent), i.e. O(len) per call with no allocation — a few ns for verify-sized trees.
    /// For strict O(children) lookups build a [`ChildMap`] once with [`DraftTree::child_map`].
    /// `node >= len()` yields `None`.
    pub fn child_with_token(&self, node: usize, tok: u32) -> Option<usize> {
        let n = self.tokens.len();
        (node.saturating_add(1)..n).find(|&i| self.parents[i] as usize == node && self.tokens[i] == tok)
    }

    /// Build the CSR child map of this tree (O(len)); see [`ChildMap`].
    pub fn child_map(&self) -> ChildMap {
        ChildMap::new(self)
    }

    /// True iff the tree is structurally valid: all four vectors have the same non-zero
    /// length, the root has parent [`NO_PARENT`] and depth 0, every other node `i` has
    /// `parents[i] < i` and `depths[i] == depths[parents[i]] + 1`, and siblings carry
    /// distinct tokens.
    pub fn is_well_formed(&self) -> bool {
        let n = self.tokens.len();
        if n == 0 || self.parents.len() != n || self.depths.len() != n || self.scores.len() != n {
            return false;
        }
        if self.parents[0] != NO_PARENT || self.depths[0] != 0 {
            return false;
        }
        for i in 1..n {
            let p = self.parents[i] as usize;
            if p >= i || self.depths[i] != self.depths[p].wrapping_add(1) {
                return false;
            }
        }
        let cm = self.child_map();
        (0..n).all(|p| {
            let toks = cm.child_tokens(p);
            toks.iter().enumerate().all(|(a, t)| !toks[a + 1..].contains(t))
        })
    }
}

/// Compressed child lists of a [`DraftTree`] (children of `p` in ascending index order),
/// for O(children) lookups in the acceptance walk (§4.9.1). Snapshot: rebuild it if the tree
/// is modified.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChildMap {
    offsets: Vec<u32>,
    children: Vec<u32>,
    tokens: Vec<u32>,
}

impl ChildMap {
    /// Build from `tree` in O(len). Nodes whose parent is out of range are ignored.
    pub fn new(tree: &DraftTree) -> Self {
        let n = tree.tokens.len();
        let mut offsets = vec![0u32; n + 1];
        for i in 1..n {
            let p = tree.parents[i] as usize;
            if p < n {
                offsets[p + 1] += 1;
            }
        }
        for i in 0..n {
            offsets[i + 1] += offsets[i];
        }
        let m = offsets[n] as usize;
        let mut fill = offsets.clone();
        let mut children = vec![0u32; m];
        let mut tokens = vec![0u32; m];
        for i in 1..n {
            let p = tree.parents[i] as usize;
            if p < n {
                let at = fill[p] as usize;
                children[at] = i as u32;
                tokens[at] = tree.tokens[i];
                fill[p] += 1;
            }
        }
        ChildMap { offsets, children, tokens }
    }

    /// Child indices of `node`, ascending (empty if `node` is out of range).
    pub fn children(&self, node: usize) -> &[u32] {
        match (self.offsets.get(node), self.offsets.get(node + 1)) {
            (Some(&a), Some(&b)) => &self.children[a as usize..b as usize],
            _ => &[],
        }
    }

    /// Tokens of the children of `node`, aligned with [`ChildMap::children`].
    pub fn child_tokens(&self, node: usize) -> &[u32] {
        match (self.offsets.get(node), self.offsets.get(node + 1)) {
            (Some(&a), Some(&b)) => &self.tokens[a as usize..b as usize],
            _ => &[],
        }
    }

    /// The child of `node` with token `tok`, in O(children of `node`).
    pub fn child_with_token(&self, node: usize, tok: u32) -> Option<usize> {
        let toks = self.child_tokens(node);
        toks.iter().position(|&t| t == tok).map(|j| self.children(node)[j] as usize)
    }
}

impl DraftTree {
    /// Decode the output of the device tree kernels (`shaders/tree_heap.wgsl`,
    /// `shaders/cuda/tree_heap.cu`) into a tree rooted at `anchor`: `words[0]` = node count c
    /// (`0xffffffff` when the anchor is not in the candidate union), then 4 words per node in
    /// pop order — token, parent node index, depth, f32 bits of the path log-weight. `words`
    /// holds at least `1 + 4·c` words.
    /// Errors: [`Error::Device`] naming `op` for the anchor flag, a count above `budget`, or
    /// a buffer too short for the count (device faults: the kernels never produce them).
    pub fn from_device_words(op: &str, words: &[u32], anchor: u32, budget: usize) -> Result<DraftTree> {
        let Some(&c) = words.first() else {
            return Err(Error::Device(format!("{op}: empty tree read-back")));
        };
        if c == u32::MAX {
            return Err(Error::Device(format!("{op}: the anchor is missing from the device's candidate union")));
        }
        let count = c as usize;
        if count > budget || words.len() < 1 + 4 * count {
            return Err(Error::Device(format!("{op}: the device reported {count} nodes for a budget of {budget} ({} words read)", words.len())));
        }
        let mut t = DraftTree::root(anchor);
        t.tokens.reserve(count);
        t.parents.reserve(count);
        t.depths.reserve(count);
        t.scores.reserve(count);
        for node in words[1..1 + 4 * count].chunks_exact(4) {
            t.tokens.push(node[0]);
            t.parents.push(node[1]);
            t.depths.push(node[2]);
            t.scores.push(f32::from_bits(node[3]));
        }
        Ok(t)
    }
}

/// Per-row top-k with each row's normaliser: what [`crate::Backend::topk_async`] returns and what the
/// DDTree builder consumes (design §3; DDTree §5.1 step 2). Row `d` of draft logits describes
/// depth `d + 1`.
///
/// For `rows` rows and `k` kept entries: `ids` and `vals` are `[rows, k]` row-major, sorted by
/// value descending, ties broken by the lower id; `vals[i] - lse[i / k]` ([`TopK::logp`]) is the
/// log-probability of `ids[i]` over the **full** row. A backend returns the raw logits in `vals`
/// and `lse[r] = ln Σ_j exp(logits[r, j])` (max-shifted; f32 on a device is within ~1e-6
/// relative of the host's f64 sum); the host builder (`sparkling::tree::depth_topk`) normalises
/// in f64 and returns log-probabilities with `lse = 0` (see [`TopK::from_logp`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopK {
    /// Entries per row.
    pub k: usize,
    /// Token ids, `[rows, k]`.
    pub ids: Vec<u32>,
    /// Logit values (up to the row's `lse`), `[rows, k]`, descending per row.
    pub vals: Vec<f32>,
    /// Normaliser of each row, `[rows]`.
    pub lse: Vec<f32>,
}

impl TopK {
    /// Already-normalised log-probabilities `logp` (`[rows, k]`): `vals = logp`, `lse = 0`.
    pub fn from_logp(k: usize, ids: Vec<u32>, logp: Vec<f32>) -> TopK {
        let rows = ids.len().checked_div(k).unwrap_or(0);
        TopK { k, ids, vals: logp, lse: vec![0.0; rows] }
    }

    /// Number of rows (`ids.len() / k`; 0 when `k == 0`).
    pub fn rows(&self) -> usize {
        self.ids.len().checked_div(self.k).unwrap_or(0)
    }

    /// Log-probability of entry `i` (flat index into `ids`): `vals[i] - lse[i / k]` in f32.
    #[inline]
    pub fn logp(&self, i: usize) -> f32 {
        self.vals[i] - self.lse[i / self.k]
    }
}

/// The SparklingTree candidate union and its Markov transition table (reference §5.2 b–c):
/// what [`crate::Backend::candidate_table_async`] and [`crate::Backend::markov_table_async`] return and what
/// the precompute heap (`sparkling::tree::build_sparkling_precompute`) consumes.
///
/// `n = cand.len()`. For depth row `d in 0..ld` (feeding depth `d + 1` nodes) and parent slot
/// `p in 0..n`, entries `j in 0..k` at flat index `(d * n + p) * k + j` hold the `j`-th best
/// child: `slots[..]` is the child's slot in `cand` and `vals[..]` its log-probability
/// `T[d,p,c] - ln Σ_c' exp T[d,p,c']` with `T[d,p,c] = U[d, cand[c]] + B(cand[p])[cand[c]]`,
/// i.e. normalised over the candidate union (not the full vocabulary). Descending per row;
/// ties: lower slot first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CandidateTable {
    /// Candidate token ids, ascending and distinct: the union of the per-depth top-C of `U`
    /// plus the anchor (all of `0..V` when `C ≥ V`).
    pub cand: Vec<u32>,
    /// Number of depth rows.
    pub ld: usize,
    /// Children kept per (depth, parent), `≤ n`.
    pub k: usize,
    /// Log-probabilities, `[ld, n, k]` row-major.
    pub vals: Vec<f32>,
    /// Child slots into `cand`, `[ld, n, k]` row-major.
    pub slots: Vec<u32>,
}

impl CandidateTable {
    /// Number of candidates `n = cand.len()`.
    pub fn n(&self) -> usize {
        self.cand.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graft_chain_follows_the_existing_path_then_appends() {
        // root 10 → 11 (score -1) → 12 (-2); root → 13 (-0.5).
        let mut t =
            DraftTree { tokens: vec![10, 11, 12, 13], parents: vec![NO_PARENT, 0, 1, 0], depths: vec![0, 1, 2, 1], scores: vec![0.0, -1.0, -2.0, -0.5] };
        // 11 and 12 exist; 14 and 15 are appended under 12 with 12's score.
        assert_eq!(t.graft_chain(&[11, 12, 14, 15]), 2);
        assert_eq!(t.tokens, vec![10, 11, 12, 13, 14, 15]);
        assert_eq!(t.parents, vec![NO_PARENT, 0, 1, 0, 2, 4]);
        assert_eq!(t.depths, vec![0, 1, 2, 1, 3, 4]);
        assert_eq!(t.scores, vec![0.0, -1.0, -2.0, -0.5, -2.0, -2.0]);
        assert!(t.is_well_formed());
        // A chain the tree already holds adds nothing; a new first token branches at the root.
        assert_eq!(t.graft_chain(&[13]), 0);
        assert_eq!(t.graft_chain(&[]), 0);
        assert_eq!(t.graft_chain(&[16, 11]), 2);
        assert_eq!((t.parents[6], t.parents[7], t.depths[7], t.scores[7]), (0, 6, 2, 0.0));
        assert!(t.is_well_formed());
        // Onto a root alone it is DraftTree::chain.
        let mut r = DraftTree::root(7);
        r.graft_chain(&[1, 2, 3]);
        assert_eq!(r, DraftTree::chain(7, &[1, 2, 3]));
    }

    #[test]
    fn device_tree_words_decode_and_faults_are_errors() {
        let w = [2, 7, 0, 1, (-0.5f32).to_bits(), 9, 1, 2, (-1.25f32).to_bits(), 99];
        let t = DraftTree::from_device_words("tree", &w, 3, 4).unwrap();
        let want = DraftTree { tokens: vec![3, 7, 9], parents: vec![NO_PARENT, 0, 1], depths: vec![0, 1, 2], scores: vec![0.0, -0.5, -1.25] };
        assert_eq!(t, want);
        assert!(t.is_well_formed());
        assert!(matches!(DraftTree::from_device_words("tree", &[u32::MAX], 3, 4), Err(Error::Device(m)) if m.contains("anchor")));
        assert!(matches!(DraftTree::from_device_words("tree", &w, 3, 1), Err(Error::Device(m)) if m.contains("budget of 1")));
        assert!(matches!(DraftTree::from_device_words("tree", &w[..5], 3, 4), Err(Error::Device(_))));
        assert!(DraftTree::from_device_words("tree", &[], 3, 4).is_err());
    }

    #[test]
    fn topk_logp_and_rows() {
        let t = TopK { k: 2, ids: vec![1, 0, 3, 2], vals: vec![2.0, 1.0, 0.5, 0.0], lse: vec![3.0, 1.0] };
        assert_eq!(t.rows(), 2);
        assert_eq!((t.logp(1), t.logp(2)), (-2.0, -0.5));
        let n = TopK::from_logp(2, vec![1, 0], vec![-0.1, -2.0]);
        assert_eq!((n.rows(), n.logp(1)), (1, -2.0));
        assert_eq!(TopK::default().rows(), 0);
    }
}
