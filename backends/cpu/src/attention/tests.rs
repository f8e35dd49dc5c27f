//! The attention paths against scalar references of their defined arithmetic.

use super::*;

fn rnd(seed: &mut u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

/// Key row `r` of an f32 cache's head.
fn key<'a>(kv: &KvHead<'a>, r: usize) -> &'a [f32] {
    &kv.k[r * kv.stride + kv.off..][..kv.hd]
}

/// Value row `r` of an f32 cache's head.
fn value<'a>(kv: &KvHead<'a>, r: usize) -> &'a [f32] {
    &kv.v[r * kv.stride + kv.off..][..kv.hd]
}

/// A cache of rows of `stride` values in q8_0 form: (codes, scales, the dequantized values).
fn q8_cache(x: &[f32], stride: usize) -> (Vec<i8>, Vec<f32>, Vec<f32>) {
    let nb = crate::kv::q8::blocks(stride);
    let rows = x.len() / stride;
    let (mut c, mut d) = (vec![0i8; x.len()], vec![0.0f32; rows * nb]);
    for r in 0..rows {
        crate::kv::q8::quantize_row(&x[r * stride..(r + 1) * stride], &mut c[r * stride..(r + 1) * stride], &mut d[r * nb..(r + 1) * nb]);
    }
    let deq = (0..x.len()).map(|i| c[i] as f32 * d[(i / stride) * nb + (i % stride) / crate::kv::q8::KV_BLOCK]).collect();
    (c, d, deq)
}

/// `r8` of 8 lanes (module docs).
fn r8(l: [f32; 8]) -> f32 {
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

/// One head exactly as the module docs define the AVX2 path, in scalar code.
fn avx2_reference(q: &[f32], kv: KvHead<'_>, vis: &[usize], scale: f32, o: &mut [f32]) {
    let hd = q.len();
    let scores: Vec<f32> = vis
        .iter()
        .map(|&r| {
            let k = key(&kv, r);
            let mut l = [0.0f32; 8];
            for d in 0..hd {
                l[d % 8] = q[d].mul_add(k[d], l[d % 8]);
            }
            r8(l) * scale
        })
        .collect();
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let p: Vec<f32> = scores.iter().map(|s| crate::vmath::exp8_scalar(s - max)).collect();
    let mut l = [0.0f32; 8];
    for (t, &pt) in p.iter().enumerate() {
        l[t % 8] += pt;
    }
    let inv = 1.0 / r8(l);
    for (d, od) in o.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for (&r, &pt) in vis.iter().zip(&p) {
            acc = pt.mul_add(value(&kv, r)[d], acc);
        }
        *od = acc * inv;
    }
}

/// One head as the portable path defines it.
fn portable_reference(q: &[f32], kv: KvHead<'_>, vis: &[usize], scale: f32, o: &mut [f32]) {
    let scores: Vec<f32> = vis.iter().map(|&r| crate::kernels::dot(q, key(&kv, r)) * scale).collect();
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    o.iter_mut().for_each(|a| *a = 0.0);
    for (&r, &s) in vis.iter().zip(&scores) {
        let p = (s - max).exp();
        sum += p;
        for (a, b) in o.iter_mut().zip(value(&kv, r)) {
            *a += p * b;
        }
    }
    let inv = 1.0 / sum;
    o.iter_mut().for_each(|a| *a *= inv);
}

#[test]
fn attention_equals_the_reference_of_the_path_in_use_bit_for_bit() {
    let mut seed = 5u64;
    let avx2 = cfg!(target_arch = "x86_64") && crate::isa::active() >= crate::isa::Isa::Avx2;
    let wide = avx2 && crate::isa::active() >= crate::isa::Isa::Avx512Vnni;
    eprintln!(
        "attention path under test: {}",
        if wide {
            "avx2 arithmetic on 512-bit registers (head dims % 8 == 0), portable otherwise"
        } else if avx2 {
            "avx2 (head dims % 8 == 0), portable otherwise"
        } else {
            "portable"
        }
    );
    // Head dims 64 / 16 / 128 / 8 / 24 (avx2 path) and 20 (portable); key counts around the
    // 8-key tiles and across several CHUNKs; contiguous, shorter causal, tree-like and
    // sparse visibility, all rows in one call and each row alone.
    for &(hd, group, kvh, n) in
        &[(64usize, 3usize, 3usize, 37usize), (16, 2, 3, 45), (128, 2, 1, 9), (8, 1, 1, 1), (24, 2, 2, 16), (20, 2, 2, 5), (64, 4, 2, 130), (64, 3, 1, 203)]
    {
        let stride = hd * kvh;
        let (k, v) = (rnd(&mut seed, n * stride), rnd(&mut seed, n * stride));
        let scale = 1.0 / (hd as f32).sqrt();
        let sparse: Vec<usize> = (0..n).filter(|j| j % 3 != 1).collect();
        let prefix = n / 2;
        let tree: Vec<usize> = (prefix..n).filter(|j| j % 2 == 0).collect();
        let cases = [
            (Visible { prefix: n, extra: &[] }, "causal"),
            (Visible { prefix: n.div_ceil(3), extra: &[] }, "shorter causal"),
            (Visible { prefix, extra: &tree }, "tree"),
            (Visible { prefix: 0, extra: &sparse }, "sparse"),
        ];
        let qs: Vec<Vec<f32>> = cases.iter().map(|_| rnd(&mut seed, group * hd)).collect();
        let w = group * hd;
        for kh in 0..kvh {
            let kvh_ = KvHead::new(&k, &v, stride, kh * hd, hd);
            let rows: Vec<QueryRow<'_>> = cases.iter().zip(&qs).map(|(&(vis, _), q)| QueryRow { q, vis }).collect();
            let mut together = vec![1.0f32; rows.len() * w];
            attend_rows(&rows, group, kvh_, scale, &mut together, &mut vec![7.0; 3]);
            for (r, (&(vis, name), q)) in cases.iter().zip(&qs).enumerate() {
                let keys: Vec<usize> = (0..vis.len()).map(|t| vis.row(t)).collect();
                let mut want = vec![0.0f32; w];
                for g in 0..group {
                    let (qg, og) = (&q[g * hd..(g + 1) * hd], &mut want[g * hd..(g + 1) * hd]);
                    if avx2 && hd % 8 == 0 {
                        avx2_reference(qg, kvh_, &keys, scale, og);
                    } else {
                        portable_reference(qg, kvh_, &keys, scale, og);
                    }
                }
                let got = &together[r * w..(r + 1) * w];
                assert!(
                    got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "hd {hd} group {group} kh {kh} {name}, in a call of {} rows",
                    rows.len()
                );
                let mut alone = vec![1.0f32; w];
                attend_rows(&[QueryRow { q, vis }], group, kvh_, scale, &mut alone, &mut Vec::new());
                assert!(alone.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "hd {hd} group {group} kh {kh} {name}, alone");
                // An f16 cache gives exactly the f32 path over the f16-rounded values.
                let (k16, v16): (Vec<half::f16>, Vec<half::f16>) =
                    (k.iter().map(|&x| half::f16::from_f32(x)).collect(), v.iter().map(|&x| half::f16::from_f32(x)).collect());
                let (kr, vr): (Vec<f32>, Vec<f32>) = (k16.iter().map(|h| h.to_f32()).collect(), v16.iter().map(|h| h.to_f32()).collect());
                let (mut from16, mut rounded) = (vec![1.0f32; w], vec![2.0f32; w]);
                attend_rows(&[QueryRow { q, vis }], group, KvHead::new(&k16[..], &v16[..], stride, kh * hd, hd), scale, &mut from16, &mut Vec::new());
                attend_rows(&[QueryRow { q, vis }], group, KvHead::new(&kr[..], &vr[..], stride, kh * hd, hd), scale, &mut rounded, &mut Vec::new());
                assert!(from16.iter().zip(&rounded).all(|(a, b)| a.to_bits() == b.to_bits()), "hd {hd} group {group} kh {kh} {name}, f16 cache");
                // A q8_0 cache gives exactly the f32 arithmetic over its dequantized values, the
                // vector path's for every head dim that is a multiple of 8 (as f32 and f16).
                let ((kc, kd, kq), (vc, vd, vq)) = (q8_cache(&k, stride), q8_cache(&v, stride));
                let q8 = KvHead { k: &kc[..], v: &vc[..], kd: &kd[..], vd: &vd[..], stride, off: kh * hd, hd };
                let deq = KvHead::new(&kq[..], &vq[..], stride, kh * hd, hd);
                let (mut from8, mut over) = (vec![1.0f32; w], vec![2.0f32; w]);
                attend_rows(&[QueryRow { q, vis }], group, q8, scale, &mut from8, &mut Vec::new());
                for g in 0..group {
                    let (qg, og) = (&q[g * hd..(g + 1) * hd], &mut over[g * hd..(g + 1) * hd]);
                    if avx2 && hd.is_multiple_of(8) {
                        avx2_reference(qg, deq, &keys, scale, og);
                    } else {
                        portable_reference(qg, deq, &keys, scale, og);
                    }
                }
                assert!(from8.iter().zip(&over).all(|(a, b)| a.to_bits() == b.to_bits()), "hd {hd} group {group} kh {kh} {name}, q8_0 cache");
                // Close to the f64 softmax.
                for g in 0..group {
                    let qg = &q[g * hd..(g + 1) * hd];
                    let s: Vec<f64> =
                        keys.iter().map(|&r| qg.iter().zip(key(&kvh_, r)).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale as f64).collect();
                    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for d in 0..hd {
                        let exact: f64 = keys.iter().zip(&e).map(|(&r, p)| p / z * value(&kvh_, r)[d] as f64).sum();
                        assert!((got[g * hd + d] as f64 - exact).abs() < 1e-4, "hd {hd} {name} head {g} dim {d}");
                    }
                }
            }
        }
    }
}

/// The shapes the multi-query passes share loads on: a 1+8 tree verify (every row sees the same
/// prefix, then its own ancestors), a prefill block (each row one key more than the last) and
/// a mix of both with rows that see no prefix, each row against the reference of the path in
/// use, with every head count per call from 1 to 7 (query sets of 1–6 heads and a remainder).
#[test]
fn rows_that_share_a_prefix_equal_the_reference_bit_for_bit() {
    let mut seed = 11u64;
    let avx2 = cfg!(target_arch = "x86_64") && crate::isa::active() >= crate::isa::Isa::Avx2;
    let wide = avx2 && crate::isa::active() >= crate::isa::Isa::Avx512Vnni;
    eprintln!(
        "attention path under test: {}",
        if wide {
            "multi-query sets on 512-bit registers"
        } else if avx2 {
            "avx2 (no multi-query sets)"
        } else {
            "portable"
        }
    );
    for (hd, kvh, prefix) in [(64usize, 2usize, 141usize), (16, 3, 50), (128, 1, 77), (72, 2, 40)] {
        rows_sharing_a_prefix(&mut seed, avx2, hd, kvh, prefix);
    }
}

/// [`rows_that_share_a_prefix_equal_the_reference_bit_for_bit`] at one head dim, KV head count
/// and prefix length.
fn rows_sharing_a_prefix(seed: &mut u64, avx2: bool, hd: usize, kvh: usize, prefix: usize) {
    let parents = [usize::MAX, 0, 0, 1, 1, 2, 3, 6, 5];
    let n = prefix + parents.len();
    let stride = hd * kvh;
    let (k, v) = (rnd(seed, n * stride), rnd(seed, n * stride));
    let (k16, v16): (Vec<half::f16>, Vec<half::f16>) =
        (k.iter().map(|&x| half::f16::from_f32(x)).collect(), v.iter().map(|&x| half::f16::from_f32(x)).collect());
    let (kr, vr): (Vec<f32>, Vec<f32>) = (k16.iter().map(|h| h.to_f32()).collect(), v16.iter().map(|h| h.to_f32()).collect());
    let ((kc, kd, kq), (vc, vd, vq)) = (q8_cache(&k, stride), q8_cache(&v, stride));
    let scale = 1.0 / (hd as f32).sqrt();
    // Tree rows: ancestors (block offsets) of node i, itself included, ascending.
    let anc: Vec<Vec<usize>> = (0..parents.len())
        .map(|i| {
            let mut a = vec![i];
            while parents[*a.last().unwrap()] != usize::MAX {
                a.push(parents[*a.last().unwrap()]);
            }
            a.reverse();
            a.into_iter().map(|j| prefix + j).collect()
        })
        .collect();
    let sparse: Vec<usize> = (0..n).step_by(5).collect();
    let mut shapes: Vec<(&str, Vec<Visible<'_>>)> = vec![
        ("tree verify", anc.iter().map(|a| Visible { prefix, extra: a }).collect()),
        ("prefill", (0..17).map(|i| Visible { prefix: prefix - 16 + i, extra: &[] }).collect()),
    ];
    let mut mixed: Vec<Visible<'_>> = anc.iter().take(4).map(|a| Visible { prefix, extra: a }).collect();
    mixed.insert(2, Visible { prefix: 0, extra: &sparse });
    mixed.push(Visible { prefix: 7, extra: &[] });
    shapes.push(("mixed", mixed));
    for group in 1..=7usize {
        let w = group * hd;
        for (name, vis) in &shapes {
            let qs: Vec<Vec<f32>> = vis.iter().map(|_| rnd(seed, w)).collect();
            for kh in 0..kvh {
                let kv = KvHead::new(&kr[..], &vr[..], stride, kh * hd, hd);
                let rows: Vec<QueryRow<'_>> = vis.iter().zip(&qs).map(|(&vis, q)| QueryRow { q, vis }).collect();
                let mut got = vec![3.0f32; rows.len() * w];
                attend_rows(&rows, group, kv, scale, &mut got, &mut vec![5.0; 2]);
                let mut got8 = vec![6.0f32; rows.len() * w];
                let q8 = KvHead { k: &kc[..], v: &vc[..], kd: &kd[..], vd: &vd[..], stride, off: kh * hd, hd };
                let deq = KvHead::new(&kq[..], &vq[..], stride, kh * hd, hd);
                attend_rows(&rows, group, q8, scale, &mut got8, &mut Vec::new());
                let mut got16 = vec![4.0f32; rows.len() * w];
                attend_rows(&rows, group, KvHead::new(&k16[..], &v16[..], stride, kh * hd, hd), scale, &mut got16, &mut Vec::new());
                for (r, (vis, q)) in vis.iter().zip(&qs).enumerate() {
                    let keys: Vec<usize> = (0..vis.len()).map(|t| vis.row(t)).collect();
                    let mut want = vec![0.0f32; w];
                    for g in 0..group {
                        let (qg, og) = (&q[g * hd..(g + 1) * hd], &mut want[g * hd..(g + 1) * hd]);
                        if avx2 {
                            avx2_reference(qg, kv, &keys, scale, og);
                        } else {
                            portable_reference(qg, kv, &keys, scale, og);
                        }
                    }
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got[r * w..(r + 1) * w]), bits(&want), "{name}, row {r} of {}, group {group}, kv head {kh}, f32 cache", rows.len());
                    assert_eq!(bits(&got16[r * w..(r + 1) * w]), bits(&want), "{name}, row {r}, group {group}, kv head {kh}, f16 cache");
                    let mut want8 = vec![0.0f32; w];
                    for g in 0..group {
                        let (qg, og) = (&q[g * hd..(g + 1) * hd], &mut want8[g * hd..(g + 1) * hd]);
                        if avx2 && hd.is_multiple_of(8) {
                            avx2_reference(qg, deq, &keys, scale, og);
                        } else {
                            portable_reference(qg, deq, &keys, scale, og);
                        }
                    }
                    assert_eq!(bits(&got8[r * w..(r + 1) * w]), bits(&want8), "{name}, row {r}, group {group}, kv head {kh}, q8_0 cache");
                }
            }
        }
    }
}
