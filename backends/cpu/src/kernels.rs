//! Scalar kernels of the CPU backend: the dot product (AVX2+FMA when the CPU has it, chosen at
//! run time, else portable), row argmax and row sampling.

use sparkling_core::SampleParams;

/// Lanes of the blocked dot product: 4 × 8-wide accumulators.
const LANES: usize = 32;

/// `Σ a[i]·b[i]` over equal-length slices, accumulated in f32 in a fixed blocked order
/// (the same order for every call on one machine, whatever the caller's batch size).
#[inline]
#[cfg_attr(not(test), allow(dead_code))] // the attention kernels inline its paths; tests use it as the reference
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    {
        if crate::isa::active() >= crate::isa::Isa::Avx2 {
            // SAFETY: `isa::active` only reports Avx2 when avx2 and fma were detected.
            return unsafe { dot_avx2(a, b) };
        }
    }
    dot_portable(a, b)
}

/// Name of the dot-product path in use, for the backend's `name()`.
pub fn simd_name() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::isa::active() >= crate::isa::Isa::Avx2 {
            return "avx2+fma";
        }
    }
    "portable"
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let blocks = n / LANES;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    for i in 0..blocks {
        let base = i * LANES;
        for (l, acc_l) in acc.iter_mut().enumerate() {
            let va = _mm256_loadu_ps(pa.add(base + 8 * l));
            let vb = _mm256_loadu_ps(pb.add(base + 8 * l));
            *acc_l = _mm256_fmadd_ps(va, vb, *acc_l);
        }
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut lanes = [0.0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), s);
    let mut total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    for i in blocks * LANES..n {
        total = a[i].mul_add(b[i], total);
    }
    total
}

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let blocks = n / LANES;
    let mut acc = [0.0f32; LANES];
    for i in 0..blocks {
        let (ca, cb) = (&a[i * LANES..(i + 1) * LANES], &b[i * LANES..(i + 1) * LANES]);
        for l in 0..LANES {
            acc[l] += ca[l] * cb[l];
        }
    }
    let mut total: f32 = acc.iter().sum();
    for i in blocks * LANES..n {
        total += a[i] * b[i];
    }
    total
}

/// Softmax attention of the `group` query heads of one KV head (`q`: `group·hd` values, head
/// after head) over `n` cache rows: key/value row `t` is row `rows[t]` (or `t` when `rows` is
/// `None`) of `k`/`v`, whose rows are `stride` apart, the head's values at `off..off + hd`.
/// Writes `out` (`group·hd`). Per head, exactly: `s_t = dot(q, k_t)·scale`, `m = max s_t`, then
/// for `t` in order `p = exp(s_t − m)`, `sum += p`, `o += p·v_t` (multiply, then add), and finally
/// `o *= 1/sum`, so the result does not depend on how many rows, heads or sequences share a
/// call. `scores` is scratch.
#[allow(clippy::too_many_arguments)]
pub fn attend_heads(
    q: &[f32],
    group: usize,
    hd: usize,
    k: &[f32],
    v: &[f32],
    stride: usize,
    off: usize,
    rows: Option<&[usize]>,
    n: usize,
    scale: f32,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let a = Attend { q, group, hd, k, v, stride, off, rows, n, scale };
    #[cfg(target_arch = "x86_64")]
    {
        if crate::isa::active() >= crate::isa::Isa::Avx2 {
            // SAFETY: `isa::active` only reports Avx2 when avx2 and fma were detected.
            unsafe { attend_heads_avx2(&a, out, scores) };
            return;
        }
    }
    a.run(out, scores, dot_portable, |o, p, vr| {
        for (x, y) in o.iter_mut().zip(vr) {
            *x += p * y;
        }
    })
}

/// The inputs of [`attend_heads`] (see there).
struct Attend<'a> {
    q: &'a [f32],
    group: usize,
    hd: usize,
    k: &'a [f32],
    v: &'a [f32],
    stride: usize,
    off: usize,
    rows: Option<&'a [usize]>,
    n: usize,
    scale: f32,
}

impl Attend<'_> {
    /// The values (`v`) or keys (`k`) of visible row `t`: cache row `rows[t]` (or `t`).
    #[inline(always)]
    fn row<'b>(&self, m: &'b [f32], t: usize) -> &'b [f32] {
        let r = self.rows.map_or(t, |l| l[t]);
        &m[r * self.stride + self.off..r * self.stride + self.off + self.hd]
    }

    /// [`attend_heads`] with the ISA's `dot` (scores) and `add_scaled` (`o += p·v_t`, a
    /// multiply then an add per value, never fused): the one body both ISAs share, inlined
    /// into each so the AVX2 helpers inline too.
    #[inline(always)]
    fn run(&self, out: &mut [f32], scores: &mut Vec<f32>, dot: impl Fn(&[f32], &[f32]) -> f32, add_scaled: impl Fn(&mut [f32], f32, &[f32])) {
        let (group, hd, n) = (self.group, self.hd, self.n);
        // Scores of every (head, key).
        scores.clear();
        scores.resize(group * n, 0.0);
        for t in 0..n {
            let kr = self.row(self.k, t);
            for g in 0..group {
                scores[g * n + t] = dot(&self.q[g * hd..(g + 1) * hd], kr) * self.scale;
            }
        }
        for g in 0..group {
            let sc = &scores[g * n..(g + 1) * n];
            let max = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let o = &mut out[g * hd..(g + 1) * hd];
            o.iter_mut().for_each(|a| *a = 0.0);
            let mut sum = 0.0f32;
            for (t, &s) in sc.iter().enumerate() {
                let p = (s - max).exp();
                sum += p;
                add_scaled(o, p, self.row(self.v, t));
            }
            let inv = 1.0 / sum;
            o.iter_mut().for_each(|a| *a *= inv);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_heads_avx2(a: &Attend<'_>, out: &mut [f32], scores: &mut Vec<f32>) {
    a.run(out, scores, |x, y| unsafe { dot_avx2(x, y) }, |o, p, vr| unsafe { add_scaled_avx2(o, p, vr) })
}

/// `o += p·v` (equal lengths), 8 lanes at a time as a multiply then an add (never fused), like
/// the portable loop; the tail element by element.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn add_scaled_avx2(o: &mut [f32], p: f32, v: &[f32]) {
    use std::arch::x86_64::*;
    let wide = o.len().min(v.len()) / 8 * 8;
    let (op, vp) = (o.as_mut_ptr(), v.as_ptr());
    let pv = _mm256_set1_ps(p);
    let mut d = 0;
    while d < wide {
        let acc = _mm256_loadu_ps(op.add(d));
        _mm256_storeu_ps(op.add(d), _mm256_add_ps(acc, _mm256_mul_ps(pv, _mm256_loadu_ps(vp.add(d)))));
        d += 8;
    }
    for (x, y) in o[wide..].iter_mut().zip(&v[wide..]) {
        *x += p * y;
    }
}

/// Index of the largest value (lowest index on ties; NaN never wins).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in row.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best as u32
}

/// Draw one token from `softmax(row / T)` restricted by top-k / top-p, with the uniform `u`:
/// inverse CDF over the kept tokens in ascending id order (so every backend given the same
/// logits and `u` draws the same token). `T < 1e-5` → argmax.
pub fn sample_row(row: &[f32], p: SampleParams, u: f32) -> u32 {
    if p.temperature < 1e-5 || row.is_empty() {
        return argmax(row);
    }
    let inv_t = 1.0 / p.temperature as f64;
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut probs: Vec<f64> = row.iter().map(|&v| ((v as f64 - max) * inv_t).exp()).collect();
    let needs_filter = (p.top_k > 0 && p.top_k < row.len()) || p.top_p < 1.0;
    if needs_filter {
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let total: f64 = probs.iter().sum();
        let mut keep = if p.top_k > 0 { p.top_k.min(row.len()) } else { row.len() };
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            for (n, &i) in order.iter().enumerate().take(keep) {
                acc += probs[i] / total;
                if acc >= p.top_p as f64 {
                    keep = n + 1;
                    break;
                }
            }
        }
        for &i in &order[keep..] {
            probs[i] = 0.0;
        }
    }
    let total: f64 = probs.iter().sum();
    let target = u as f64 * total;
    let mut acc = 0.0;
    let mut last = 0u32;
    for (i, &q) in probs.iter().enumerate() {
        if q > 0.0 {
            acc += q;
            last = i as u32;
            if acc > target {
                return i as u32;
            }
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_f64_reference() {
        let a: Vec<f32> = (0..77).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..77).map(|i| (i as f32 * 0.11).cos()).collect();
        let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot(&a, &b) as f64 - want).abs() < 1e-4, "{} vs {want}", dot(&a, &b));
        assert!((dot_portable(&a, &b) as f64 - want).abs() < 1e-4);
    }

    #[test]
    fn argmax_lowest_index_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn sample_inverse_cdf_in_id_order() {
        // softmax at T=1 of ln([1,2,1]) = [0.25, 0.5, 0.25]
        let row = [0.0f32, 2f32.ln(), 0.0];
        let p = SampleParams { temperature: 1.0, top_k: 0, top_p: 1.0 };
        assert_eq!(sample_row(&row, p, 0.10), 0);
        assert_eq!(sample_row(&row, p, 0.30), 1);
        assert_eq!(sample_row(&row, p, 0.74), 1);
        assert_eq!(sample_row(&row, p, 0.80), 2);
        // top-k 1 keeps only the max
        let k1 = SampleParams { top_k: 1, ..p };
        assert_eq!(sample_row(&row, k1, 0.99), 1);
        // top-p 0.6 keeps {1, 0} (0.5 + 0.25 ≥ 0.6; tie broken by lower id)
        let tp = SampleParams { top_p: 0.6, ..p };
        assert_eq!(sample_row(&row, tp, 0.99), 1);
        assert_eq!(sample_row(&row, tp, 0.2), 0);
    }
}

#[cfg(test)]
mod attention_tests {
    use super::*;

    /// The attention of one head exactly as the backend computed it before `attend_heads`
    /// (per-head task, `dot` per key, scalar `o += p·v`): the grouped kernel must equal it
    /// bit for bit, so tokens do not move.
    #[allow(clippy::too_many_arguments)]
    fn reference_head(q: &[f32], k: &[f32], v: &[f32], stride: usize, off: usize, vis: &[usize], scale: f32, o: &mut [f32]) {
        let hd = q.len();
        let scores: Vec<f32> = vis.iter().map(|&j| dot(q, &k[j * stride + off..j * stride + off + hd]) * scale).collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for (&j, &s) in vis.iter().zip(&scores) {
            let p = (s - max).exp();
            sum += p;
            for (a, b) in o.iter_mut().zip(&v[j * stride + off..j * stride + off + hd]) {
                *a += p * b;
            }
        }
        let inv = 1.0 / sum;
        o.iter_mut().for_each(|a| *a *= inv);
    }

    #[test]
    fn grouped_attention_equals_the_per_head_reference() {
        let mut seed = 5u64;
        let mut rnd = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((seed >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
                })
                .collect()
        };
        for &(hd, group, kvh, n) in &[(64usize, 3usize, 3usize, 37usize), (20, 2, 2, 5), (8, 1, 1, 1), (64, 4, 2, 130)] {
            let stride = hd * kvh;
            let (k, v) = (rnd(n * stride), rnd(n * stride));
            let q = rnd(group * hd);
            let scale = 1.0 / (hd as f32).sqrt();
            let picks: Vec<usize> = (0..n).filter(|j| j % 3 != 1).collect();
            for rows in [None, Some(picks.as_slice())] {
                let vis: Vec<usize> = rows.map_or((0..n).collect(), |r| r.to_vec());
                for kh in 0..kvh {
                    let mut want = vec![0.0f32; group * hd];
                    for g in 0..group {
                        reference_head(&q[g * hd..(g + 1) * hd], &k, &v, stride, kh * hd, &vis, scale, &mut want[g * hd..(g + 1) * hd]);
                    }
                    let mut got = vec![1.0f32; group * hd];
                    attend_heads(&q, group, hd, &k, &v, stride, kh * hd, rows, vis.len(), scale, &mut got, &mut Vec::new());
                    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "hd {hd} group {group} kh {kh} rows {:?}", rows.is_some());
                }
            }
        }
    }
}
