#!/usr/bin/env python3
"""Acceptance length τ of prompt-lookup drafting, simulated on the target's own answers.

A drafter-free proposer (prompt lookup decoding, "PLD"; `sparkling --method lookup`, and the
chain `sparkling --lookup` grafts): at each round, find the most recent earlier occurrence of
the context's last n tokens (n = --ngram down to 1, prompt and answer so far both searched),
propose the tokens that followed it as a chain (past the context's end the copy reads its own
proposal, as the engine does), and count how many the recorded answer confirms; the round
commits those plus the bonus token. At T = 0 every method emits the `ar` tokens, and at T > 0
(same seed) a proposed token is kept exactly when it equals the answer's token at its
position, so replaying the rule over recorded answers is what decoding would see.

Rules (--rule):
  engine  (default) src/decode/lookup.rs: with k = min(N, base), ⌈k·n/3⌉ tokens after an
          n-token match (n = 1, 2), and after a 3-token match max(k, m) up to N, m being the
          whole length of the match; base = 6 when greedy, 3 when sampling (--base overrides)
  fixed   the first rule (BENCHMARKS §33 d): N tokens after any match

Inputs (one of):
  --bench FILE  `sparkling bench --save-tokens FILE` (prompt and answer ids per prompt; the
                prompt is searched; sets named by prompt file; its temperature picks the base)
  --cache DIR   a `sparkling-train gen-data` cache (`seq-*.bin`, layout in train/src/cache.rs:
                magic SPKD, version, id, prompt_len, n_tokens, width, topk, then the tokens)
  --ids FILE    JSON {"set name": [[answer ids], ...], ...}, e.g. from
                `sparkling generate --chat "…" --method ar --ids`; the prompt is not searched
                then (answers only), so τ is a lower bound

--costs FILE (a cost curve `--budget auto` cached under $SPARKLING_ASSETS/costs/) adds a
modelled speed-up over `ar`: each round costs the verify of 1 + chain rows, interpolated on the
curve, in units of one AR step.

Output: τ per chain limit N (--chains), per set, the share of rounds with a proposal, and the
mean chain length. Numbers: BENCHMARKS.md §33 (d), §35.
"""
import argparse
import json
import os
import random
import struct
import sys


def find_match(ctx, nmax):
    """(start s, matched suffix n) of the most recent earlier occurrence of ctx's last n tokens,
    n = nmax..1 (the longest with a match), or None."""
    size = len(ctx)
    for n in range(nmax, 0, -1):
        if size < n + 1:
            continue
        suffix = ctx[size - n:]
        for s in range(size - n - 1, -1, -1):
            if ctx[s:s + n] == suffix:
                return s, n
    return None


def copy_after(ctx, start, k):
    """The k tokens from ctx[start]; as the engine (src/decode/lookup.rs), past the context's
    end the copy reads the tokens it has proposed."""
    cont = []
    for i in range(start, start + k):
        cont.append(ctx[i] if i < len(ctx) else cont[i - len(ctx)])
    return cont


def propose(ctx, k, nmax):
    """The first rule: the k tokens after the match, whatever its length."""
    found = find_match(ctx, nmax)
    return copy_after(ctx, found[0] + found[1], k) if found and k > 0 else []


def propose_engine(ctx, max_len, base, nmax):
    """src/decode/lookup.rs `propose`: the chain's length follows the match's."""
    k = min(max_len, base)
    found = find_match(ctx, nmax)
    if k == 0 or not found:
        return []
    s, n = found
    if n < nmax:
        want = -(-k * n // nmax)
    else:
        # The match's whole length m: the tokens before both copies that agree.
        m, size = n, len(ctx)
        while m < max_len and m - n < s and ctx[s - (m - n) - 1] == ctx[size - m - 1]:
            m += 1
        want = min(max(k, m), max_len)
    return copy_after(ctx, s + n, want)


def cost_curve(path):
    """Verify cost of r rows in AR steps, from a cached cost model (rows, verify_ms)."""
    try:
        with open(path) as fh:
            c = json.load(fh)
        rows, ms = c["rows"], c["verify_ms"]
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"--costs {path}: {e} (expected a cost model JSON with `rows` and `verify_ms`)")
    ok = isinstance(rows, list) and isinstance(ms, list) and len(rows) == len(ms) and len(rows) > 0
    ok = ok and all(isinstance(x, int) for x in rows) and all(isinstance(x, (int, float)) and x > 0 for x in ms)
    if not ok or rows[0] != 1 or any(b <= a for a, b in zip(rows, rows[1:])):
        raise SystemExit(f"--costs {path}: expected `rows` rising from 1 and as many positive `verify_ms`")

    def cost(r):
        if r >= rows[-1]:
            slope = (ms[-1] - ms[-2]) / (rows[-1] - rows[-2]) if len(rows) > 1 else 0.0
            return (ms[-1] + (r - rows[-1]) * slope) / ms[0]
        for j in range(len(rows) - 1):
            if rows[j] <= r <= rows[j + 1]:
                return (ms[j] + (ms[j + 1] - ms[j]) * (r - rows[j]) / (rows[j + 1] - rows[j])) / ms[0]
        return 1.0
    return cost


def replay(tokens, start, proposer, cost=None):
    """(rounds, committed tokens, rounds with a proposal, proposed rows, cost in AR steps)
    decoding tokens[start:]."""
    rounds = committed = proposed = rows = 0
    steps = 0.0
    i = start
    while i < len(tokens):
        draft = proposer(tokens[:i])
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
        rows += len(draft)
        steps += cost(1 + len(draft)) if cost else 0.0
        i += step
    return rounds, committed, proposed, rows, steps


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
    src.add_argument("--bench", help="`sparkling bench --save-tokens` output")
    src.add_argument("--cache", help="gen-data cache directory")
    src.add_argument("--ids", help="JSON of answer ids per set")
    ap.add_argument("--sample", type=int, default=600, help="sequences drawn from --cache (default 600)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chains", default="1,2,4,8,16", help="chain limits N (default 1,2,4,8,16)")
    ap.add_argument("--ngram", type=int, default=3, help="longest suffix matched (default 3)")
    ap.add_argument("--rule", choices=["engine", "fixed"], default="engine", help="the chain-length rule (default engine)")
    ap.add_argument("--base", type=int, help="the engine rule's base chain (default 6, or 3 for a --bench file sampled at T > 0)")
    ap.add_argument("--costs", help="a cached `--budget auto` cost model: adds the modelled speed-up over ar")
    a = ap.parse_args()
    try:
        chains = [int(x) for x in a.chains.split(",")]
    except ValueError:
        chains = []
    if not chains or min(chains) < 1:
        raise SystemExit(f"--chains {a.chains}: expected comma-separated chain lengths ≥ 1")
    if a.base is not None and a.base < 1:
        raise SystemExit(f"--base {a.base}: expected a base chain length ≥ 1")
    if a.ngram < 1:
        raise SystemExit(f"--ngram {a.ngram}: expected ≥ 1")
    base = a.base if a.base is not None else 6
    if a.bench:
        try:
            with open(a.bench) as fh:
                data = json.load(fh)
            seqs = data["sequences"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"--bench {a.bench}: {e} (expected `sparkling bench --save-tokens` JSON)")
        temperature = data.get("temperature", 0) if isinstance(data, dict) else None
        ids = lambda v: isinstance(v, list) and all(isinstance(x, int) for x in v)  # noqa: E731
        if not isinstance(temperature, (int, float)) or not isinstance(seqs, list) or not all(
            isinstance(q, dict) and ids(q.get("prompt")) and ids(q.get("answer")) for q in seqs
        ):
            raise SystemExit(f"--bench {a.bench}: expected `sparkling bench --save-tokens` JSON (a numeric temperature; sequences of prompt and answer id lists)")
        if a.base is None and temperature >= 1e-5:
            base = 3
        sets = {}
        for q in seqs:
            if len(q["answer"]) > 1:
                name = str(q.get("file", "bench"))
                # The answer's first token comes from the prefill; rounds start after it.
                sets.setdefault(name, []).append((len(q["prompt"]) + 1, q["prompt"] + q["answer"]))
        if not sets:
            raise SystemExit(f"--bench {a.bench}: no answer longer than one token to replay")
        rule = f"base {base}" if a.rule == "engine" else "fixed rule"
        print(f"{a.bench}: {sum(len(v) for v in sets.values())} answers, T = {temperature:.3g}, prompt searched, {rule}")
    elif a.cache:
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
    cost = cost_curve(a.costs) if a.costs else None
    for k in chains:
        if a.rule == "engine":
            proposer = lambda ctx, k=k: propose_engine(ctx, k, base, a.ngram)  # noqa: E731
        else:
            proposer = lambda ctx, k=k: propose(ctx, k, a.ngram)  # noqa: E731
        parts, taus, speeds = [], [], []
        for name, seqs in sets.items():
            r = c = p = rows = 0
            steps = 0.0
            for start, toks in seqs:
                rr, cc, pp, nn, ss = replay(toks, start, proposer, cost)
                r, c, p, rows, steps = r + rr, c + cc, p + pp, rows + nn, steps + ss
            if r == 0:
                continue
            taus.append(c / r)
            speed = ""
            if cost:
                speeds.append(c / steps)
                speed = f", {c / steps:.2f}× ar"
            parts.append(f"{name} τ {c / r:.2f}{speed} (proposals in {p / r:.0%} of rounds, {rows / r:.1f} rows per round)")
        mean = f" | mean τ {sum(taus) / len(taus):.2f}" if len(taus) > 1 else ""
        if len(speeds) > 1:
            mean += f", mean {sum(speeds) / len(speeds):.2f}× ar (modelled)"
        print(f"N = {k}: " + ", ".join(parts) + mean)


if __name__ == "__main__":
    sys.exit(main())
