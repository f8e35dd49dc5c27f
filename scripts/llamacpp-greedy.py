#!/usr/bin/env python3
"""Record llama.cpp greedy reference outputs for SparklingTree's real-weight tests.

Writes tests/data/llamacpp_greedy_<model>.json: for a fixed set of prompts, the
prompt token ids (llama.cpp tokenizer, no BOS) and the ids of 32 greedily
generated tokens (pure argmax over the logits, no sampler chain), plus the top-1
minus top-2 logit gap at every step so near-ties can be recognised.

llama.cpp runs on an F16 copy of the quantized GGUF (made with
`llama-quantize --allow-requantize IN OUT F16`): on the quantized weights
llama.cpp rounds activations to 8 bits inside its dot products, which makes its
greedy text drift from an implementation that dequantizes the weights.

With --native it runs on the quantized file itself instead (the file our CPU
backend keeps native, `--weights native`) and writes
tests/data/llamacpp_greedy_<model>_native.json: both engines then round
activations to 8-bit blocks, so their greedy tokens agree except where the
sums' order decides a near-tie. `smollm2-q8_0` is the SmolLM2 file
requantized to Q8_0 by llama-quantize (made on first use).

Prerequisites (none of them is needed by the normal test run):
  scripts/fetch-assets smollm2 qwen2.5-coder-0.5b   # the GGUFs
  scripts/build-llamacpp                             # llama.cpp from the pinned sdist

Usage:
  scripts/llamacpp-greedy.py [--model smollm2|qwen2.5-coder-0.5b|smollm2-q8_0|all]
      [--native] [--kv f32|f16] [--threads N] [--out-dir tests/data]
Environment: SPARKLING_ASSETS (default ~/.cache/sparkling), LLAMA_DIR (default
$SPARKLING_ASSETS/llama.cpp, the layout made by scripts/build-llamacpp).
"""
import argparse
import datetime
import hashlib
import json
import os
import shlex
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
N_PREDICT = 32

RAW_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
]

MODELS = {
    "smollm2": {
        "source": "smollm2-135m-instruct-q4_1.gguf",
        "source_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "f16": "smollm2-135m-instruct-f16.gguf",
        "chat": "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                "<|im_start|>assistant\n",
    },
    "qwen2.5-coder-0.5b": {
        "source": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "source_sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "f16": "qwen2.5-coder-0.5b-instruct-f16.gguf",
        "chat": "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                "<|im_end|>\n<|im_start|>user\nWrite a Python function that reverses a string.<|im_end|>\n"
                "<|im_start|>assistant\n",
    },
}
# Files made from another model's file by llama-quantize: name -> (base model, ggml type).
DERIVED = {"smollm2-q8_0": ("smollm2", "Q8_0", "smollm2-135m-instruct-q8_0.gguf")}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def run(cmd, **kw):
    print("+ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, **kw)


def find_llama(llama_dir):
    src = os.path.join(llama_dir, f"llama_cpp_python-{SDIST_VERSION}", "vendor", "llama.cpp")
    bin_dir = os.path.join(llama_dir, "build", "bin")
    for p in (os.path.join(src, "include", "llama.h"), os.path.join(bin_dir, "llama-quantize")):
        if not os.path.exists(p):
            sys.exit(f"llama.cpp not found ({p} missing); run scripts/build-llamacpp "
                     f"(LLAMA_DIR={llama_dir})")
    return src, bin_dir


def build_driver(src, bin_dir):
    exe = os.path.join(bin_dir, "sparkling-llamacpp-greedy")
    cmd = [os.environ.get("CC", "cc"), "-O2", "-std=c11",
           os.path.join(REPO, "scripts", "llamacpp-greedy.c"),
           "-I" + os.path.join(src, "include"), "-I" + os.path.join(src, "ggml", "include"),
           "-L" + bin_dir, "-Wl,-rpath," + bin_dir, "-lllama", "-lggml", "-lggml-base", "-o", exe]
    run(cmd)
    return exe, cmd


def llama_commit(src):
    try:
        return subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def parse_driver_output(out):
    res = {"steps": []}
    for line in out.splitlines():
        parts = line.split(" ")
        tag = parts[0]
        if tag == "version":
            res["version"] = " ".join(parts[1:])
        elif tag == "sysinfo_hex":
            res["sysinfo"] = bytes.fromhex(parts[1]).decode().strip() if parts[1] != "-" else ""
        elif tag == "meta":
            res["add_bos"] = parts[2] == "1"
            res["add_bos_key"] = parts[4]
            res["n_vocab"] = int(parts[6])
        elif tag == "prompt_ids":
            res["prompt_ids"] = [int(x) for x in parts[1:]]
        elif tag == "step":
            _, i, tok, l1, tok2, l2, piece = parts
            res["steps"].append({"id": int(tok), "logit": float(l1), "id2": int(tok2),
                                 "logit2": float(l2),
                                 "piece": bytes.fromhex(piece) if piece != "-" else b""})
        elif tag == "eog":
            res["eog"] = parts[1] == "1"
        elif tag == "text_hex":
            res["text"] = bytes.fromhex(parts[1]).decode("utf-8", "replace") if parts[1] != "-" else ""
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="all", choices=list(MODELS) + list(DERIVED) + ["all"])
    ap.add_argument("--native", action="store_true",
                    help="run llama.cpp on the quantized file itself (writes *_native.json)")
    ap.add_argument("--kv", default="f32", choices=["f32", "f16"],
                    help="KV cache type inside llama.cpp (default f32, closest to an f32 reference)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flash-attn", default="off", choices=["off", "on", "auto"],
                    help="llama.cpp flash attention (default off: plain softmax attention)")
    ap.add_argument("--out-dir", default=os.path.join(REPO, "tests", "data"))
    args = ap.parse_args()

    assets = os.environ.get("SPARKLING_ASSETS", os.path.expanduser("~/.cache/sparkling"))
    llama_dir = os.environ.get("LLAMA_DIR", os.path.join(assets, "llama.cpp"))
    src, bin_dir = find_llama(llama_dir)
    exe, build_cmd = build_driver(src, bin_dir)
    commit = llama_commit(src)

    names = (list(MODELS) + (list(DERIVED) if args.native else [])) if args.model == "all" else [args.model]
    for name in names:
        base, derived_type, derived_file = DERIVED.get(name, (name, None, None))
        m = dict(MODELS[base])
        source = os.path.join(assets, m["source"])
        if not os.path.exists(source):
            sys.exit(f"{source} missing; run scripts/fetch-assets {base}")
        src_sha = sha256(source)
        if src_sha != m["source_sha256"]:
            sys.exit(f"{source}: sha256 {src_sha} != pinned {m['source_sha256']}")
        if derived_type:
            # The derived file plays the part of the F16 copy's source: quantize it first.
            out = os.path.join(assets, derived_file)
            derive_cmd = [os.path.join(bin_dir, "llama-quantize"), "--allow-requantize", source, out, derived_type]
            if not os.path.exists(out):
                run(derive_cmd, stdout=subprocess.DEVNULL)
            m["source"], source, src_sha = derived_file, out, sha256(out)
        if args.native:
            # Run on the quantized file itself.
            m["f16"], f16, f16_sha = m["source"], source, src_sha
            quant_cmd = ["true"]
        else:
            f16 = os.path.join(assets, m["f16"])
            quant_cmd = [os.path.join(bin_dir, "llama-quantize"), "--allow-requantize", source, f16, "F16"]
            if not os.path.exists(f16):
                run(quant_cmd, stdout=subprocess.DEVNULL)
            f16_sha = sha256(f16)

        cases = []
        prompt_path = os.path.join(bin_dir, "sparkling-prompt.txt")
        for prompt, special in [(p, False) for p in RAW_PROMPTS] + [(m["chat"], True)]:
            with open(prompt_path, "wb") as f:
                f.write(prompt.encode("utf-8"))
            cmd = [exe, f16, prompt_path, str(N_PREDICT), "1" if special else "0", args.kv, str(args.threads),
                   args.flash_attn]
            out = run(cmd, capture_output=True, text=True).stdout
            r = parse_driver_output(out)
            gaps = [round(s["logit"] - s["logit2"], 4) for s in r["steps"]]
            cases.append({
                "prompt": prompt,
                "special": special,
                "prompt_ids": r["prompt_ids"],
                "generated_ids": [s["id"] for s in r["steps"]],
                "text": r["text"],
                "stopped_at_eog": r["eog"],
                "top2_gap": gaps,
                "runner_up_ids": [s["id2"] for s in r["steps"]],
                "min_top2_gap": min(gaps) if gaps else None,
            })
            print(f"[{name}] special={special} prompt_ids={r['prompt_ids'][:8]}... "
                  f"gen={cases[-1]['generated_ids'][:8]}... min_gap={cases[-1]['min_top2_gap']} "
                  f"text={r['text'][:60]!r}", file=sys.stderr)

        doc = {
            "provenance": {
                "engine": "llama.cpp (vendored in the llama-cpp-python sdist)",
                "llama_cpp_python_sdist": f"llama_cpp_python-{SDIST_VERSION}.tar.gz",
                "llama_cpp_python_sdist_sha256": SDIST_SHA256,
                "llama_cpp_commit": commit,
                "llama_cpp_version": r.get("version"),
                "llama_cpp_system_info": r.get("sysinfo"),
                "build": "scripts/build-llamacpp: cmake -S vendor/llama.cpp -B build -G Ninja -DGGML_NATIVE=ON "
                         "-DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF "
                         "-DLLAMA_BUILD_SERVER=OFF; cmake --build build -j 2 --target llama llama-quantize "
                         "llama-bench llama-simple llama-tokenize; gcc 12.2, CPU backend only",
                "driver": "scripts/llamacpp-greedy.c driven by scripts/llamacpp-greedy.py",
                "commands": {
                    "f16_copy": "none: llama.cpp ran on the quantized source file (--native)" if args.native else
                                " ".join(shlex.quote(c) for c in
                                         ["llama-quantize", "--allow-requantize", m["source"], m["f16"], "F16"]),
                    "derived_source": " ".join(["llama-quantize", "--allow-requantize", MODELS[base]["source"],
                                                derived_file, derived_type]) if derived_type else None,
                    "driver_build": " ".join(shlex.quote(c) for c in build_cmd)
                                    .replace(llama_dir, "$LLAMA_DIR").replace(REPO + "/", ""),
                    "per_case": "sparkling-llamacpp-greedy MODEL_F16 PROMPT_FILE "
                                f"{N_PREDICT} SPECIAL {args.kv} {args.threads} {args.flash_attn}",
                    "regenerate": f"scripts/llamacpp-greedy.py --model {name} --kv {args.kv} "
                                  f"--threads {args.threads} --flash-attn {args.flash_attn}"
                                  + (" --native" if args.native else ""),
                },
                "source_gguf": m["source"],
                "source_gguf_sha256": src_sha,
                "f16_gguf": m["f16"],
                "llama_ran_on": m["f16"],
                "f16_gguf_sha256": f16_sha,
                "settings": {
                    "tokenize": "llama_tokenize(add_special=false, parse_special=special): no BOS",
                    "decoding": "pure argmax over llama_get_logits_ith(ctx,-1); no sampler, no repetition "
                                "penalty; whole prompt in one llama_decode batch, then one token per step",
                    "n_predict": N_PREDICT,
                    "stop": "end-of-generation token (recorded, then stop) or n_predict tokens",
                    "kv_cache_type": args.kv,
                    "flash_attn": args.flash_attn,
                    "threads": args.threads,
                    "n_seq": 1,
                },
                "model_add_bos_token": r.get("add_bos_key"),
                "n_vocab": r.get("n_vocab"),
                "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "notes": ("llama.cpp ran on the quantized file: its CPU matmul rounds activations to "
                          "8-bit blocks (Q8_0 / Q8_1 / Q8_K) as our native kernels do, in another "
                          "summation order; use top2_gap to recognise near-ties before calling a "
                          "mismatch a bug.") if args.native else
                         ("llama.cpp's CPU matmul with F16 weights converts activations to F16 before "
                          "the dot product, so tiny differences against an f32 reference are expected; "
                          "use top2_gap to recognise near-ties before calling a mismatch a bug. "
                          "The F16 copy rounds each dequantized weight to f16."),
            },
            "cases": cases,
        }
        os.makedirs(args.out_dir, exist_ok=True)
        out_path = os.path.join(args.out_dir, f"llamacpp_greedy_{name}{'_native' if args.native else ''}.json")
        with open(out_path, "w") as f:
            json.dump(doc, f, indent=1, ensure_ascii=False)
            f.write("\n")
        print(f"wrote {out_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
