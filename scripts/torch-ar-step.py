#!/usr/bin/env python3
"""PyTorch + transformers reference timing for `sparkling profile`: the same random
Qwen3 config (read from a `sparkling synth` target's config.json), bf16 weights on the GPU,
eager attention-free-of-tricks defaults (sdpa), batch 1:

- ar_step: one decode step (1 token) after a prefill of P tokens, KV cache cropped back after
  each repetition; timed between torch.cuda.synchronize() calls, median and min of N;
- verify_65: one forward of 65 new tokens on the same cache (causal; transformers has no tree
  mask, so this is the same-size block the tree verify processes);
- hbm_copy_gb_per_s: a 2 GiB device-to-device copy (read + write bytes / time), the bandwidth
  the "AR step ≤ 1.2 × HBM bound" criterion divides by.

Usage: torch-ar-step.py --config DIR/target/config.json [--prefill 512] [--reps 20] [--json OUT]
Weights are random (initialised on the GPU): timing only, no checkpoint is read.
"""
import argparse
import json
import statistics
import time

import torch


def timed(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(out), "min_ms": min(out)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()

    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

    cfg = AutoConfig.from_pretrained(a.config)
    torch.manual_seed(0)
    dev = torch.device("cuda")
    with dev:
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    res = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(0),
        "params": n_params,
        "prefill": a.prefill,
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
    }

    # HBM bandwidth: copy 2 GiB (counts read + write).
    n = 1 << 30
    src = torch.empty(n, dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), 2, 10)
    res["hbm_copy_gb_per_s"] = 2 * src.numel() * 2 / (t["min_ms"] / 1e3) / 1e9
    del src, dst

    ids = torch.randint(0, cfg.vocab_size, (1, a.prefill), device=dev)
    with torch.inference_mode():
        cache = DynamicCache()
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        one = torch.randint(0, cfg.vocab_size, (1, 1), device=dev)
        block = torch.randint(0, cfg.vocab_size, (1, 65), device=dev)

        def step(tokens):
            def f():
                out = model(input_ids=tokens, past_key_values=cache, use_cache=True)
                out.logits.argmax(-1)
                cache.crop(a.prefill)
            return f

        res["ar_step"] = timed(step(one), a.warmup, a.reps)
        res["verify_65"] = timed(step(block), a.warmup, a.reps)
    weight_bytes = 2 * (n_params - cfg.vocab_size * cfg.hidden_size * (0 if cfg.tie_word_embeddings else 1))
    res["decode_weight_bytes"] = weight_bytes
    res["hbm_bound_ms"] = weight_bytes / (res["hbm_copy_gb_per_s"] * 1e9) * 1e3
    print(json.dumps(res, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
