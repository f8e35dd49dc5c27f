use super::*;
use crate::decode::{Method, Platform};

fn staircase() -> CostModel {
    // Steps every 4 rows: 10 ms for 1–4 rows, 14 for 5–8, 18 for 9–12, 22 for 13–16, 26 for 17.
    CostModel::from_points(vec![1, 4, 5, 8, 9, 12, 13, 16, 17], vec![10.0, 10.0, 14.0, 14.0, 18.0, 18.0, 22.0, 22.0, 26.0], 5.0)
}

#[test]
fn interpolation_keeps_the_staircase() {
    let c = staircase();
    assert!(c.is_valid());
    assert_eq!(c.verify(1), 10.0);
    assert_eq!(c.verify(3), 10.0); // flat step, not a smoothed slope
    assert_eq!(c.verify(4), 10.0);
    assert_eq!(c.verify(5), 14.0);
    assert_eq!(c.verify(7), 14.0);
    assert_eq!(c.verify(17), 26.0);
    assert_eq!(c.verify(19), 34.0); // last segment's slope continues (4 ms/row)
    let lin = CostModel::from_points(vec![1, 9], vec![10.0, 26.0], 0.0);
    assert_eq!(lin.verify(5), 18.0);
    assert_eq!(lin.verify(0), 10.0);
}

#[test]
fn sample_rows_cover_tile_edges() {
    assert_eq!(CostModel::sample_rows(0), vec![1]);
    assert_eq!(CostModel::sample_rows(8), vec![1, 2, 3, 4, 5, 6, 8, 9]);
    assert_eq!(CostModel::sample_rows(16), vec![1, 2, 3, 4, 5, 6, 8, 9, 12, 13, 16, 17]);
    assert_eq!(CostModel::sample_rows(20).last(), Some(&21));
    assert_eq!(CostModel::sample_rows(64).len(), 20);
}

/// The policy is the arithmetic argmax, table-driven.
#[test]
fn choose_is_the_arithmetic_argmax() {
    let stair = staircase();
    let flat = CostModel::from_points(vec![1, 65], vec![10.0, 10.0], 0.0);
    let linear = CostModel::from_points(vec![1, 65], vec![10.0, 10.0 + 64.0 * 2.5], 0.0);
    struct Case {
        name: &'static str,
        q: Vec<f64>,
        cost: CostModel,
        draft: f64,
        round: f64,
        want: usize,
    }
    let cases = vec![
        // Random drafter: nothing is worth verifying; n = 0.
        Case { name: "hopeless", q: vec![1e-4; 16], cost: linear.clone(), draft: 5.0, round: 0.5, want: 0 },
        // Staircase: 4 rows cost what 1 does, so the first 3 nodes are free: take them even
        // when small; the 4th node (5 rows) costs a step of 4 ms and needs q ≳ 0.26 to pay.
        Case { name: "free step", q: vec![0.05, 0.04, 0.03, 0.02, 0.01], cost: stair.clone(), draft: 5.0, round: 0.0, want: 3 },
        // A confident chain on the staircase: the second step (5–8 rows) pays.
        Case { name: "next step pays", q: vec![0.99, 0.98, 0.97, 0.96, 0.95, 0.94, 0.93, 0.02], cost: stair.clone(), draft: 5.0, round: 0.0, want: 7 },
        // Free verify (a GPU): every node with q > 0 adds tokens at no cost.
        Case { name: "flat", q: vec![0.5, 0.2, 0.01, 0.001], cost: flat, draft: 2.0, round: 1.0, want: 4 },
        // Linear cost 2.5 ms/row after 10 ms: node i pays while q_i > 2.5 ms × the rate.
        // Rates 0.1, 0.144, 0.1533, 0.1486, 0.135 per ms: n = 2.
        Case { name: "linear", q: vec![0.8, 0.5, 0.3, 0.1], cost: linear.clone(), draft: 0.0, round: 0.0, want: 2 },
        // The drafter's 20 ms lower the rate, so a smaller q still pays: n = 3.
        Case { name: "linear with draft", q: vec![0.8, 0.5, 0.3, 0.1], cost: linear, draft: 20.0, round: 0.0, want: 3 },
        Case { name: "empty", q: vec![], cost: stair, draft: 5.0, round: 0.0, want: 0 },
    ];
    for c in cases {
        // A chain (depths 1, 2, …): `q` are path probabilities (non-increasing), except
        // for "next step pays", given as conditional acceptances (running products here).
        let depths: Vec<u32> = (1..=c.q.len() as u32).collect();
        let q = if c.name == "next step pays" {
            let mut p = 1.0;
            c.q.iter()
                .map(|&x| {
                    p *= x;
                    p
                })
                .collect::<Vec<_>>()
        } else {
            c.q.clone()
        };
        let e = expected_tokens(&depths, &q);
        let got = choose(&e, &|r| c.cost.verify(r), c.draft, c.round);
        // Brute force.
        let rate = |n: usize| e[n] / (c.draft + c.cost.verify(1 + n) + c.round);
        let brute = (0..e.len()).fold(0, |b, n| if rate(n) > rate(b) { n } else { b });
        assert_eq!(got.n, brute, "{}: policy vs brute force", c.name);
        assert_eq!(got.n, c.want, "{}: expected n = {}", c.name, c.want);
        assert!((got.expected - e[got.n]).abs() < 1e-12);
    }
}

#[test]
fn chain_case_with_numbers() {
    // A chain with conditional acceptance 0.9, 0.8, ... on the staircase.
    let cond = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.02];
    let mut p = 1.0;
    let q: Vec<f64> = cond
        .iter()
        .map(|&x| {
            p *= x;
            p
        })
        .collect();
    let depths: Vec<u32> = (1..=8).collect();
    let e = expected_tokens(&depths, &q);
    let got = choose(&e, &|r| staircase().verify(r), 5.0, 0.0);
    // E(3) = 1 + .9 + .72 + .504 = 3.124 at 15 ms (0.208/ms); E(7) = 3.124 + .3024 + .1512
    // + .0605 + .0181 = 3.656 at 19 ms (0.192/ms): the free step wins.
    assert_eq!(got.n, 3);
    assert!((got.expected - 3.124).abs() < 1e-9);
    assert_eq!(got.ms, 15.0);
}

#[test]
fn expected_tokens_sums_and_clamps() {
    // Sum of path probabilities when nothing exceeds a depth's reach.
    let e = expected_tokens(&[1, 1, 2], &[0.5, 0.2, 0.3]);
    assert_eq!(e.len(), 4);
    assert!((e[3] - 2.0).abs() < 1e-12);
    // Over-calibrated masses are clamped: depth 1 ≤ 1, depth 2 ≤ depth 1.
    let e = expected_tokens(&[1, 1, 2], &[0.9, 0.6, 1.4]);
    assert!((e[2] - 2.0).abs() < 1e-12);
    assert!((e[3] - 3.0).abs() < 1e-12);
    let e = expected_tokens(&[1, 2], &[0.3, 0.9]);
    assert!((e[2] - 1.6).abs() < 1e-12);
}

#[test]
fn pop_order_and_truncate() {
    // TreeSpark-like depth-major order: scores not monotone in index.
    let t = DraftTree {
        tokens: vec![9, 1, 2, 3, 4],
        parents: vec![crate::tree::NO_PARENT, 0, 0, 1, 2],
        depths: vec![0, 1, 1, 2, 2],
        scores: vec![0.0, -0.1, -2.0, -0.5, -2.5],
    };
    let o = pop_order(&t);
    assert_eq!(o, vec![1, 3, 2, 4]);
    let k = truncate(&t, &o, 2);
    assert!(k.is_well_formed());
    assert_eq!(k.tokens, vec![9, 1, 3]);
    assert_eq!(k.parents, vec![crate::tree::NO_PARENT, 0, 1]);
    assert_eq!(truncate(&t, &o, 0), DraftTree::root(9));
    assert_eq!(truncate(&t, &o, 10), t);
    // A chain's pop order is its order.
    let mut c = DraftTree::chain(5, &[6, 7, 8]);
    c.scores = vec![0.0, -0.2, -0.9, -0.9];
    assert_eq!(pop_order(&c), vec![1, 2, 3]);
    assert_eq!(truncate(&c, &pop_order(&c), 2).tokens, vec![5, 6, 7]);
}

/// Calibration converges on a synthetic stream whose true acceptance is known: the drafter
/// claims q per node but the truth is 0.4·q at depth 1 and 1.5·q (capped) at depth 2.
#[test]
fn calibration_converges_on_a_synthetic_stream() {
    let mut rng = 0x1234_5678u64;
    let mut unit = || (crate::decode::rng::splitmix64_next(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
    // A long window (decay 0.999) to check the estimate itself; the default window (0.98,
    // ~50 rounds) trades precision for tracking and is checked more loosely below.
    let mut cal = Calibration { decay: 0.999, ..Calibration::default() };
    let mut short = Calibration::default();
    for _ in 0..20000 {
        let q1 = 0.3 + 0.5 * unit(); // claimed depth-1 probability
        let q2 = q1 * (0.2 + 0.3 * unit()); // claimed depth-2 path probability
        let p1 = 0.4 * q1; // true
        let p2_given_1 = (1.5 * q2 / q1).min(1.0);
        let reached = if unit() < p1 {
            if unit() < p2_given_1 {
                2
            } else {
                1
            }
        } else {
            0
        };
        cal.observe(&[None, Some(q1), Some(q2)], reached);
        short.observe(&[None, Some(q1), Some(q2)], reached);
    }
    assert!((short.factor(1) - 0.4).abs() < 0.25, "depth 1 factor (short window) {}", short.factor(1));
    assert!((cal.factor(1) - 0.4).abs() < 0.08, "depth 1 factor {}", cal.factor(1));
    // Depth 2: true P(reach 2) = 0.4·q1·min(1, 1.5·q2/q1) = 0.6·q2 ⇒ factor 0.6.
    assert!((cal.factor(2) - 0.6).abs() < 0.15, "depth 2 factor {}", cal.factor(2));
    // Unobserved depths inherit the deepest observed factor.
    assert_eq!(cal.factor(5), cal.factor(2));
    assert_eq!(cal.factors(3), vec![1.0, cal.factor(1), cal.factor(2), cal.factor(2)]);
    assert_eq!(Calibration::default().factor(3), 1.0);
}

/// An over-confident chain (claims ≈ 1 at every depth, never accepted) loses the trust of
/// its deep nodes after one round, not only of its first.
#[test]
fn calibration_distrusts_deeper_depths_first() {
    let mut cal = Calibration::default();
    cal.observe(&[None, Some(1.0), Some(1.0), Some(1.0), Some(1.0)], 0);
    let f = cal.factors(4);
    assert!((f[1] - 0.2).abs() < 1e-12);
    assert!(f[2] < 0.05 && f[3] < 0.01 && f[4] < f[3], "{f:?}");
}

#[test]
fn random_drafter_is_skipped_and_probed_with_backoff() {
    let cost = CostModel::from_points(vec![1, 17], vec![10.0, 40.0], 8.0);
    let mut s = AutoState::new(cost, 16);
    let mut tree = DraftTree::chain(1, &[2, 3, 4]);
    tree.scores = vec![0.0, -9.0, -18.0, -27.0];
    let mut drafted = Vec::new();
    for round in 0..300 {
        if s.should_draft() {
            drafted.push(round);
            let d = s.choose(&tree, 8.0);
            assert_eq!(d.choice.n, 0);
            s.observe(1, 10.0, 0.1, Some((&d.raw_mass, 0)));
        } else {
            s.observe(1, 10.0, 0.1, None);
        }
    }
    // First round, then probes after 4, 8, ... 64 skips.
    assert_eq!(&drafted[..4], &[0, 4, 12, 28]);
    assert!(drafted.len() <= 8, "{drafted:?}");
    let gaps: Vec<usize> = drafted.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.iter().all(|&g| g <= MAX_PROBE_INTERVAL), "{gaps:?}");
}

/// A drafter whose rounds alternate one hit with two slight misses gains on average; its
/// EMA of the predicted gain still turns negative after two misses. A probe of
/// [`PROBE_BURST`] rounds sees the hits and drafting resumes; a single-round probe that lands
/// on a miss only backs off further.
#[test]
fn a_skewed_drafter_that_pays_on_average_keeps_drafting() {
    let cost = CostModel::from_points(vec![1, 2, 17], vec![10.0, 11.0, 40.0], 2.0);
    let mut s = AutoState::new(cost, 16);
    let mut hit = DraftTree::chain(1, &[2, 3]);
    hit.scores = vec![0.0, -0.01, -0.02];
    let mut miss = DraftTree::chain(1, &[2]);
    miss.scores = vec![0.0, -1.5];
    let mut drafted = 0;
    for round in 0..300 {
        let tree = if round % 3 == 0 { &hit } else { &miss };
        if s.should_draft() {
            drafted += 1;
            let d = s.choose(tree, 2.0);
            assert!(d.choice.n >= 1, "both trees are worth verifying: {:?}", d.choice);
            let reached = if round % 3 == 0 { 2 } else { 0 };
            s.observe(1 + d.choice.n, 11.0, 0.1, Some((&d.raw_mass, reached)));
        } else {
            s.observe(1, 10.0, 0.1, None);
        }
    }
    assert!(drafted > 200, "drafted in only {drafted} of 300 rounds");
}

#[test]
fn a_good_drafter_keeps_drafting() {
    let cost = CostModel::from_points(vec![1, 5, 17], vec![10.0, 12.0, 40.0], 3.0);
    let mut s = AutoState::new(cost, 16);
    let mut tree = DraftTree::chain(1, &[2, 3, 4, 5]);
    tree.scores = vec![0.0, -0.05, -0.1, -0.15, -0.2];
    for _ in 0..50 {
        assert!(s.should_draft());
        let d = s.choose(&tree, 3.0);
        assert_eq!(d.choice.n, 4);
        s.observe(5, 12.0, 0.1, Some((&d.raw_mass, 4)));
    }
}

/// The drafting depth follows the kept trees: the full depth before any round, then the
/// deepest kept tree of the window + 2 (at least 2), growing back as deeper trees pay.
#[test]
fn draft_depth_follows_the_kept_trees() {
    let cost = CostModel::from_points(vec![1, 5, 17], vec![10.0, 12.0, 40.0], 3.0);
    let mut s = AutoState::new(cost, 16);
    assert_eq!(s.draft_depth(16), 16);
    let mut bad = DraftTree::chain(1, &[2, 3, 4]);
    bad.scores = vec![0.0, -9.0, -18.0, -27.0];
    assert_eq!(s.choose(&bad, 3.0).choice.n, 0);
    assert_eq!((s.draft_depth(16), s.draft_depth(1)), (2, 1), "nothing kept: the smallest block");
    let mut good = DraftTree::chain(1, &[2, 3, 4, 5]);
    good.scores = vec![0.0, -0.05, -0.1, -0.15, -0.2];
    assert_eq!(s.choose(&good, 3.0).choice.n, 4);
    assert_eq!(s.draft_depth(16), 6);
    for _ in 0..DEPTH_WINDOW {
        s.choose(&bad, 3.0);
    }
    assert_eq!(s.draft_depth(16), 2, "the window forgets the deep tree");
}

#[test]
fn a_zero_tree_budget_is_refused_by_the_library() {
    use crate::decode::GenParams;
    for m in [Method::DFlash, Method::DDTree, Method::DSpark, Method::Sparkling, Method::TreeSpark] {
        let e = GenParams::new(m, &Platform::HOST).with_budget(BudgetChoice::Fixed(0)).validate().unwrap_err().to_string();
        assert!(e.contains("tree budget 0") && e.contains(m.name()), "{e}");
        assert!(GenParams::new(m, &Platform::HOST).with_budget(BudgetChoice::Fixed(1)).validate().is_ok());
        assert!(GenParams::new(m, &Platform::DEVICE).validate().is_ok(), "auto");
    }
    // `ar` reads no budget.
    assert!(GenParams::new(Method::Ar, &Platform::HOST).with_budget(BudgetChoice::Fixed(0)).validate().is_ok());
}

#[test]
fn budget_choice_parses() {
    assert_eq!(BudgetChoice::parse("auto", "--budget").unwrap(), BudgetChoice::Auto);
    assert_eq!(BudgetChoice::parse(" 8", "--budget").unwrap(), BudgetChoice::Fixed(8));
    for bad in ["x", "0", "-1", ""] {
        let e = BudgetChoice::parse(bad, "--budget").unwrap_err().to_string();
        assert!(e.contains("--budget") && e.contains("positive tree budget") && e.contains("`auto`"), "{bad}: {e}");
    }
    assert_eq!(BudgetChoice::Fixed(3).name(), "3");
}
