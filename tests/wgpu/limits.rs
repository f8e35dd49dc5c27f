//! Adapter limits respected, not assumed: weights split across storage bindings, dispatches
//! folded into 2-D grids, clear errors beyond the limits, and adapter selection. The limits are
//! lowered through `WgpuOptions` so the split paths run at small, fast sizes; results must not
//! change at all (exact equality with the unsplit backend).
use crate::common::*;
use crate::open;
use sparkling_core::{AttnMask, AttnShape, Backend, Error, ReadBack, NO_PARENT};
use sparkling_wgpu::{list_adapters, Subgroups, WeightDtype, WgpuBackend, WgpuOptions};

/// A backend with 4 KiB bindings and at most 3 workgroups per grid dimension.
fn tight(dtype: WeightDtype) -> Option<WgpuBackend> {
    open(&WgpuOptions { weight_dtype: dtype, max_binding_bytes: Some(4096), max_workgroups_per_dim: Some(3), ..Default::default() }, "tight limits")
}

#[test]
fn split_weights_and_folded_grids_give_identical_results() {
    for dt in [WeightDtype::F32, WeightDtype::F16, WeightDtype::Bf16] {
        let Some(t) = tight(dt) else { return };
        let Some(g) = open(&WgpuOptions { weight_dtype: dt, ..Default::default() }, "default limits") else { return };
        let mut r = Rng(9);
        let (m, k, n) = (3, 33, 250); // 250 rows of 33: f32 chunks of 28 rows, packed of 60
        let x = r.vec(m * k);
        let w = r.vec(n * k);
        let bias = r.vec(n);
        let wt = t.upload_weight(w.clone(), n, k).unwrap();
        assert!(wt.n_chunks() > 1, "{dt:?}: a [{n}, {k}] weight should be split under a 4 KiB binding limit");
        let got = t.download(&t.matmul(&t.upload(&x, m, k).unwrap(), &wt, Some(&t.upload(&bias, 1, n).unwrap())).unwrap()).unwrap();
        let wg = g.upload_weight(w, n, k).unwrap();
        assert_eq!(wg.n_chunks(), 1);
        let want = g.download(&g.matmul(&g.upload(&x, m, k).unwrap(), &wg, Some(&g.upload(&bias, 1, n).unwrap())).unwrap()).unwrap();
        assert_bits(&format!("split matmul {dt:?}"), &got, &want);
        // Embedding rows from several chunks, and a 1-row matmul (small tile kernel).
        let ids = [0u32, 249, 31, 30, 62, 61, 120];
        assert_bits(
            &format!("split embedding {dt:?}"),
            &t.download(&t.embedding(&wt, &ids).unwrap()).unwrap(),
            &g.download(&g.embedding(&wg, &ids).unwrap()).unwrap(),
        );
        let x1 = &x[..k];
        assert_bits(
            &format!("split 1-row matmul {dt:?}"),
            &t.download(&t.matmul(&t.upload(x1, 1, k).unwrap(), &wt, None).unwrap()).unwrap(),
            &g.download(&g.matmul(&g.upload(x1, 1, k).unwrap(), &wg, None).unwrap()).unwrap(),
        );
    }
}

#[test]
fn folded_grids_cover_every_elementwise_and_attention_workgroup() {
    let opts = WgpuOptions { max_workgroups_per_dim: Some(7), ..Default::default() };
    let Some(t) = open(&opts, "7 workgroups per dimension") else { return };
    let Some(g) = open(&WgpuOptions::default(), "default limits") else { return };
    let mut r = Rng(10);
    // 10 x 300 = 3000 values → 12 elementwise workgroups (> 7 per dimension → a 6 x 2 grid).
    let (rows, cols) = (10, 300);
    let a = r.vec(rows * cols);
    let b = r.vec(rows * cols);
    let silu = |be: &WgpuBackend| be.download(&be.silu_mul(&be.upload(&a, rows, cols).unwrap(), &be.upload(&b, rows, cols).unwrap()).unwrap()).unwrap();
    assert_bits("folded silu_mul", &silu(&t), &silu(&g));
    let w: Vec<f32> = (0..100).map(|i| 1.0 + i as f32 * 0.01).collect();
    let norm = |be: &WgpuBackend| be.download(&be.rms_norm(&be.upload(&a, rows, cols).unwrap(), &be.upload(&w, 1, 100).unwrap(), 100, 1e-6).unwrap()).unwrap();
    assert_bits("folded rms_norm (30 groups)", &norm(&t), &norm(&g));
    // Matmul [10, 300] x [200, 300]ᵀ: 4 x 1 tiles; [1, 300] x [700, 300]ᵀ: 11 tiles.
    let wm = r.vec(700 * 300);
    let mm = |be: &WgpuBackend, m: usize| {
        let w = be.upload_weight(wm.clone(), 700, 300).unwrap();
        be.download(&be.matmul(&be.upload(&a[..m * cols], m, cols).unwrap(), &w, None).unwrap()).unwrap()
    };
    assert_bits("folded matmul 10 rows", &mm(&t, 10), &mm(&g, 10));
    assert_bits("folded matmul 1 row", &mm(&t, 1), &mm(&g, 1));
    let am = |be: &WgpuBackend| be.argmax(&be.upload(&a, rows, cols).unwrap()).unwrap();
    assert_eq!(am(&t), am(&g), "folded argmax");
    // Attention over 5 x 4 = 20 (query, head) workgroups; an embedding of 9 x 300 values.
    let table = t.upload_weight(a.clone(), rows, cols).unwrap();
    let tg = g.upload_weight(a.clone(), rows, cols).unwrap();
    let ids = [9u32, 0, 3, 3, 8, 1, 2, 7, 6];
    assert_bits("folded embedding", &t.download(&t.embedding(&table, &ids).unwrap()).unwrap(), &g.download(&g.embedding(&tg, &ids).unwrap()).unwrap());
    let shape = AttnShape { n_heads: 4, n_kv_heads: 2, head_dim: 8 };
    let (tq, kv_len) = (5usize, 12usize);
    let q = r.vec(tq * 32);
    let kv = r.vec(kv_len * 16);
    let parents = [NO_PARENT, 0, 0, 1, 3];
    let att = |be: &WgpuBackend| {
        let kvt = be.upload(&kv, kv_len, 16).unwrap();
        be.download(&be.attention(&be.upload(&q, tq, 32).unwrap(), &kvt, &kvt, kv_len, shape, AttnMask::Tree { parents: &parents }).unwrap()).unwrap()
    };
    assert_bits("folded tree attention", &att(&t), &att(&g));
}

#[test]
fn beyond_the_binding_limit_is_a_clear_error() {
    let Some(t) = tight(WeightDtype::F32) else { return };
    // A tensor of 8 KiB cannot be one 4 KiB binding.
    let err = t.upload(&vec![0.0; 2048], 2, 1024).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Device(_)) && msg.contains("8192") && msg.contains("4096"), "{msg}");
    assert!(matches!(t.zeros(64, 64), Err(Error::Device(_))));
    // A weight whose rows (split 4 at a time) exceed the binding cannot be split further.
    let err = t.upload_weight(vec![0.0; 2 * 2000], 2, 2000).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Device(_)) && msg.contains("[2, 2000]") && msg.contains("4096"), "{msg}");
    // A matmul whose output would exceed the binding.
    let w = t.upload_weight(vec![0.0; 1000 * 2], 1000, 2).unwrap();
    let x = t.upload(&[0.0; 4 * 2], 4, 2).unwrap();
    assert!(matches!(t.matmul(&x, &w, None), Err(Error::Device(_))));
}

#[test]
fn adapters_are_listed_and_selected_by_index_or_name() {
    let g = gpu_or_skip!();
    let list = list_adapters();
    assert!(!list.is_empty());
    eprintln!("adapters: {list:#?}");
    let by_index = WgpuBackend::new(Some("0")).expect("adapter 0");
    assert!(list[0].contains(&by_index.adapter_info().name));
    let name = g.adapter_info().name.clone();
    let by_name = WgpuBackend::new(Some(&name[..name.len().min(6)])).expect("adapter by name");
    assert!(by_name.adapter_info().name.to_lowercase().contains(&name[..name.len().min(6)].to_lowercase()));
    for bad in ["no-such-adapter-xyz", "999"] {
        match WgpuBackend::new(Some(bad)) {
            Err(Error::Unavailable(m)) => assert!(m.contains("available adapters") && m.contains("0: "), "{m}"),
            Err(e) => panic!("{bad}: wrong error {e}"),
            Ok(_) => panic!("{bad}: should not match an adapter"),
        }
    }
}

#[test]
fn a_lost_device_gives_clear_errors_not_panics() {
    let Some(b) = open(&WgpuOptions::default(), "device lost") else { return };
    let x = b.upload(&[1.0, 2.0, 3.0], 1, 3).unwrap();
    let w = b.upload_weight(vec![1.0; 6], 2, 3).unwrap();
    let _pending = b.matmul(&x, &w, None).unwrap();
    b.destroy_device();
    for r in [b.download(&x).map(|_| ()), b.matmul(&x, &w, None).map(|_| ()), b.upload(&[0.0; 3], 1, 3).map(|_| ()), b.argmax(&x).map(|_| ()), b.synchronize()]
    {
        match r {
            Err(Error::Device(m)) => assert!(m.contains("destroyed") || m.contains("lost"), "{m}"),
            other => panic!("expected a device error, got {other:?}"),
        }
    }
}

#[test]
fn every_kernel_variant_compiles_on_this_adapter() {
    // All weight storages (3 float, 6 block formats) and matmul tiles and both reduction
    // libraries (where the adapter has subgroups), not only what a given model exercises;
    // web/tests runs the same in Chrome.
    for sg in [Subgroups::Auto, Subgroups::Off] {
        let Some(g) = open(&WgpuOptions { subgroups: sg, ..Default::default() }, "every kernel") else { return };
        let n = g.compile_kernels().unwrap();
        let want = if g.uses_subgroups() { 46 } else { 42 };
        assert_eq!(n, want, "kernel variants listed with subgroups={}", g.uses_subgroups());
    }
}
