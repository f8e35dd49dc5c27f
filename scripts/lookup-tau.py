#!/usr/bin/env python3
"""Acceptance length τ of prompt-lookup drafting, simulated on the target's own greedy answers.

A drafter-free proposer (prompt lookup decoding, "PLD"; `sparkling --method lookup`): at each
round, find the most recent earlier occurrence of the context's last n tokens (n = --ngram down
to 1, prompt and answer so far both searched), propose the k tokens that followed it as a chain
(past the context's end the copy reads its own proposal, as the engine does), and count how many the
target's greedy answer confirms; the round commits those plus the bonus token. This replays
that rule over recorded answers, so it measures τ without running the target (at T = 0 every
method emits these exact tokens, so the replay is what decoding would see).

Inputs (one of):
  --cache DIR   a `sparkling-train gen-data` cache (`seq-*.bin`, layout in train/src/cache.rs:
                magic SPKD, version, id, prompt_len, n_tokens, width, topk, then the tokens)
  --ids FILE    JSON {"set name": [[answer ids], ...], ...}, e.g. from
                `sparkling generate --chat "…" --method ar --ids`; the prompt is not searched
                then (answers only), so τ is a lower bound

Output: τ per chain length k (--chains), per set for --ids, and the share of rounds with a
proposal. Numbers of 2026-12-04 are in BENCHMARKS.md §33 (d).
"""
import argparse
import json
import os
import random
import struct
import sys


def propose(ctx, k, nmax):
    """The k tokens after the most recent earlier match of ctx's last n tokens, n = nmax..1."""
    size = len(ctx)
    for n in range(nmax, 0, -1):
        if size < n + 1:
            continue
        suffix = ctx[size - n:]
        for s in range(size - n - 1, -1, -1):
            if ctx[s:s + n] == suffix:
                # As the engine (src/decode/lookup.rs): past the context's end the copy reads
                # the tokens it has proposed.
                cont = []
                for i in range(s + n, s + n + k):
                    cont.append(ctx[i] if i < size else cont[i - size])
                return cont
    return []


def replay(tokens, start, k, nmax):
    """(rounds, committed tokens, rounds with a proposal) decoding tokens[start:]."""
    rounds = committed = proposed = 0
    i = start
    while i < len(tokens):
        draft = propose(tokens[:i], k, nmax)
        accepted = 0
        for j, t in enumerate(draft):
            if i + j < len(tokens) and tokens[i + j] == t:
                accepted += 1
            else:
                break
        step = min(accepted + 1, len(tokens) - i)
        rounds += 1
        committed += step
        proposed += 1 if draft else 0
        i += step
    return rounds, committed, proposed


def read_cache_seq(path):
    with open(path, "rb") as fh:
        head = fh.read(28)
        if len(head) < 28 or head[:4] != b"SPKD":
            raise SystemExit(f"{path}: not a gen-data sequence file (expected magic SPKD)")
        _id, prompt_len, n_tokens, _width, _topk = struct.unpack("<5I", head[8:28])
        raw = fh.read(4 * n_tokens)
        if len(raw) != 4 * n_tokens:
            raise SystemExit(f"{path}: truncated: {n_tokens} tokens announced")
        return prompt_len, list(struct.unpack(f"<{n_tokens}I", raw))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--cache", help="gen-data cache directory")
    src.add_argument("--ids", help="JSON of answer ids per set")
    ap.add_argument("--sample", type=int, default=600, help="sequences drawn from --cache (default 600)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chains", default="1,2,4,8", help="chain lengths k (default 1,2,4,8)")
    ap.add_argument("--ngram", type=int, default=3, help="longest suffix matched (default 3)")
    a = ap.parse_args()
    chains = [int(x) for x in a.chains.split(",")]
    if a.cache:
        if not os.path.isdir(a.cache):
            raise SystemExit(f"--cache {a.cache}: not a directory (a `sparkling-train gen-data` cache holds meta.json and seq-*.bin)")
        files = sorted(f for f in os.listdir(a.cache) if f.startswith("seq-") and f.endswith(".bin"))
        if not files:
            raise SystemExit(f"{a.cache}: no seq-*.bin files")
        random.seed(a.seed)
        files = random.sample(files, min(a.sample, len(files)))
        sets = {"cache": [read_cache_seq(os.path.join(a.cache, f)) for f in files]}
        print(f"{len(files)} sequences of {a.cache} (prompt searched too)")
    else:
        try:
            with open(a.ids) as fh:
                data = json.load(fh)
        except (OSError, ValueError) as e:
            raise SystemExit(f"--ids {a.ids}: {e} (expected JSON {{\"set\": [[ids], ...]}})")
        if not isinstance(data, dict) or not all(isinstance(v, list) and all(isinstance(s, list) for s in v) for v in data.values()):
            raise SystemExit(f"--ids {a.ids}: expected JSON {{\"set\": [[ids], ...]}}")
        sets = {name: [(1, seq) for seq in seqs if len(seq) > 1] for name, seqs in data.items()}
        print(f"{a.ids}: answers only (the prompt is not searched: a lower bound)")
    for k in chains:
        parts, taus = [], []
        for name, seqs in sets.items():
            r = c = p = 0
            for start, toks in seqs:
                rr, cc, pp = replay(toks, start, k, a.ngram)
                r, c, p = r + rr, c + cc, p + pp
            if r == 0:
                continue
            taus.append(c / r)
            parts.append(f"{name} τ {c / r:.2f} (proposals in {p / r:.0%} of rounds)")
        mean = f" | mean τ {sum(taus) / len(taus):.2f}" if len(taus) > 1 else ""
        print(f"k = {k}: " + ", ".join(parts) + mean)


if __name__ == "__main__":
    sys.exit(main())
