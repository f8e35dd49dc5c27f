//! Scalar kernels of the CPU backend: the dot product (AVX2+FMA when the CPU has it, chosen at
//! run time, else portable; the portable attention path's scores), row argmax and row sampling.

use sparkling_core::SampleParams;

/// Lanes of the blocked dot product: 4 × 8-wide accumulators.
const LANES: usize = 32;

/// `Σ a[i]·b[i]` over equal-length slices, accumulated in f32 in a fixed blocked order
/// (the same order for every call on one machine, whatever the caller's batch size).
#[inline]
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
        if crate::isa::active() >= crate::isa::Isa::Avx512Vnni {
            // The f16/f32 matmuls stay on 256 bits; attention's arithmetic runs on 512.
            return "avx2+fma, avx512 attention";
        }
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

/// Index of the largest value (lowest index on ties; NaN never wins; 0 when no value is above
/// −∞). AVX2 where the CPU has it (8 lanes each keeping its first maximum, then the lowest index
/// among the lanes holding the overall maximum: the same index as the scalar scan), else
/// [`argmax_portable`].
pub fn argmax(row: &[f32]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if row.len() >= 16 && crate::isa::active() >= crate::isa::Isa::Avx2 {
            // SAFETY: `isa::active` only reports Avx2 when avx2 was detected.
            return unsafe { argmax_avx2(row) };
        }
    }
    argmax_portable(row)
}

/// [`argmax`] on 8 lanes. Caller guarantees avx2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn argmax_avx2(row: &[f32]) -> u32 {
    use std::arch::x86_64::*;
    let n8 = row.len() / 8 * 8;
    let mut best = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut best_at = _mm256_setzero_si256();
    let mut at = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let eight = _mm256_set1_epi32(8);
    let mut i = 0;
    while i < n8 {
        let v = _mm256_loadu_ps(row.as_ptr().add(i));
        // Ordered compare: false for NaN, and strict, so a lane keeps its first maximum.
        let gt = _mm256_cmp_ps::<_CMP_GT_OQ>(v, best);
        best = _mm256_blendv_ps(best, v, gt);
        best_at = _mm256_blendv_epi8(best_at, at, _mm256_castps_si256(gt));
        at = _mm256_add_epi32(at, eight);
        i += 8;
    }
    let (mut lanes, mut lanes_at) = ([0.0f32; 8], [0i32; 8]);
    _mm256_storeu_ps(lanes.as_mut_ptr(), best);
    _mm256_storeu_si256(lanes_at.as_mut_ptr() as *mut __m256i, best_at);
    let (mut best_v, mut best_i) = (f32::NEG_INFINITY, 0usize);
    for (&v, &a) in lanes.iter().zip(&lanes_at) {
        if v > best_v || (v == best_v && v > f32::NEG_INFINITY && (a as usize) < best_i) {
            best_v = v;
            best_i = a as usize;
        }
    }
    for (j, &v) in row.iter().enumerate().skip(n8) {
        if v > best_v {
            best_v = v;
            best_i = j;
        }
    }
    best_i as u32
}

/// The portable [`argmax`]: one scan, strict `>`.
pub fn argmax_portable(row: &[f32]) -> u32 {
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

    /// The dispatched argmax (AVX2 where the CPU has it) equals the portable scan on rows with
    /// ties across and within lanes, NaNs, infinities, only −∞ and lengths around the 8 lanes.
    #[test]
    fn argmax_equals_the_portable_scan() {
        let mut seed = 3u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        for len in [1usize, 7, 8, 15, 16, 17, 23, 64, 100, 1001] {
            for case in 0..40 {
                // Few distinct values, so ties are common; some NaN and ±∞.
                let row: Vec<f32> = (0..len)
                    .map(|_| match next() % 23 {
                        0 => f32::NAN,
                        1 => f32::NEG_INFINITY,
                        2 if case % 5 == 0 => f32::INFINITY,
                        r => (r % 7) as f32 - 3.0,
                    })
                    .collect();
                assert_eq!(argmax(&row), argmax_portable(&row), "len {len} case {case}: {row:?}");
                let low: Vec<f32> = row.iter().map(|&v| if v.is_nan() { v } else { f32::NEG_INFINITY }).collect();
                assert_eq!(argmax(&low), argmax_portable(&low), "len {len} case {case}: only -inf and NaN");
                let mut late = vec![0.0f32; len];
                late[len - 1] = 1.0;
                assert_eq!(argmax(&late), (len - 1) as u32);
            }
        }
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
