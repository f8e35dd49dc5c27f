#!/usr/bin/env python3
"""Browser tests of the demo page itself, run by scripts/web-test after the
wasm-bindgen tests: headless Chromium (the flags of web/webdriver.json) driven through
chromedriver's WebDriver protocol with the standard library only (no Selenium/Playwright).

The page is served from a temporary root with two copies of web/www (symbolic links):
`app/` as scripts/web-demo serves it, and `fresh/` without the fetched assets (a fresh
machine). Checks: the default addresses, the software-WebGPU warning, a load error that says
what to run, Load disabled while loading, Load + Generate with the defaults on the CPU backend
(and on WebGPU unless SPARKLING_WEB_PAGE_WEBGPU=0), Stop mid-run, Load during a run, the
comparison with `ar` (same tokens), no sideways scroll at 390 px; the tree view: after a
generation with the default message, every round's drawn tree (the SVG's node ids, tokens,
parents, depths, accepted path and bonus token, read from its data attributes) equals the
engine's per-round tree of the same generation run again through Session's on_round, stepping
back through the rounds with the page's buttons (on the CPU backend and on WebGPU); a 64-node
tree stays inside a phone-width page. Screenshots go to
$SPARKLING_WEB_SHOTS (default target/web-screenshots), not to the repository.

Usage: web/tests/page.py   (after `scripts/web-demo --build-only`)
"""
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WWW = os.path.join(ROOT, "web", "www")
SHOTS = os.environ.get("SPARKLING_WEB_SHOTS", os.path.join(ROOT, "target", "web-screenshots"))
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
WEBGPU = os.environ.get("SPARKLING_WEB_PAGE_WEBGPU", "1") != "0"

failures = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, what, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"page test: {what} did not start on port {port}")


class Driver:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"
        with open(os.path.join(ROOT, "web", "webdriver.json")) as f:
            caps = json.load(f)
        caps["goog:chromeOptions"]["args"] += ["--window-size=1100,1400", "--hide-scrollbars"]
        r = self.call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})
        self.sid = r["sessionId"]
        self.call("POST", f"/session/{self.sid}/timeouts", {"script": 600000})

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=900) as r:
                return json.load(r)["value"]
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"webdriver {method} {path}: {e.read().decode(errors='replace')[:600]}") from None

    def go(self, url):
        self.call("POST", f"/session/{self.sid}/url", {"url": url})

    def js(self, script, *args):
        return self.call("POST", f"/session/{self.sid}/execute/sync", {"script": script, "args": list(args)})

    def js_async(self, script, *args):
        # The script calls arguments[arguments.length - 1](value) when done.
        return self.call("POST", f"/session/{self.sid}/execute/async", {"script": script, "args": list(args)})

    def size(self, w, h):
        self.call("POST", f"/session/{self.sid}/window/rect", {"width": w, "height": h})

    def shot(self, name):
        os.makedirs(SHOTS, exist_ok=True)
        png = base64.b64decode(self.call("GET", f"/session/{self.sid}/screenshot"))
        path = os.path.join(SHOTS, name + ".png")
        with open(path, "wb") as f:
            f.write(png)
        print(f"  screenshot {path}")

    def wait(self, cond_js, what, timeout=600):
        end = time.time() + timeout
        while time.time() < end:
            v = self.js(cond_js)
            if v:
                return v
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}; page: {self.status()}")

    def status(self):
        return self.js("""return {busy: demo.busy, load: document.getElementById('loadinfo').textContent,
            error: document.getElementById('error').textContent + document.getElementById('loaderror').textContent, warn: document.getElementById('warn').textContent,
            stats: document.getElementById('stats').textContent}""")

    def quit(self):
        try:
            self.call("DELETE", f"/session/{self.sid}")
        except Exception:
            pass


def check(cond, what):
    print(("  ok   " if cond else "  FAIL ") + what)
    if not cond:
        failures.append(what)


IDLE = "return demo.busy === null"
READY = "return demo.busy === null && demo.session !== null"


def set_value(d, id_, value):
    d.js("const e = document.getElementById(arguments[0]); e.value = arguments[1]; e.dispatchEvent(new Event('input')); e.dispatchEvent(new Event('change'));", id_, value)


def click(d, id_):
    # A real click event on the element (what the keyboard's Enter/Space on a focused button does too).
    return d.js("const e = document.getElementById(arguments[0]); if (e.disabled) return false; e.click(); return true;", id_)


def press(d, *keys):
    acts = []
    for k in keys:
        acts += [{"type": "keyDown", "value": k}, {"type": "keyUp", "value": k}]
    d.call("POST", f"/session/{d.sid}/actions", {"actions": [{"type": "key", "id": "kb", "actions": acts}]})


TAB, ENTER = "\ue004", "\ue007"


def load(d, backend, timeout=600, keyboard=False):
    set_value(d, "backend", backend)
    t = time.time()
    if keyboard:
        # Tab from the top of the page to the Load button, then Enter: no mouse needed.
        d.js("document.activeElement?.blur(); window.scrollTo(0, 0)")
        seen = []
        for _ in range(30):
            press(d, TAB)
            seen.append(d.js("return document.activeElement.id || document.activeElement.tagName"))
            if seen[-1] == "load":
                break
        check(seen[-1] == "load" and "backend" in seen, f"the keyboard reaches Run on and Load ({' → '.join(seen)})")
        press(d, ENTER)
    else:
        click(d, "load")
    check(d.js("return document.getElementById('load').disabled && document.getElementById('go').disabled"), f"{backend}: Load and Generate are disabled while loading")
    d.wait(IDLE, "the load to finish", timeout)
    st = d.status()
    check(st["error"] == "" and st["load"].startswith("Ready"), f"{backend}: Load with the defaults succeeds in {time.time() - t:.0f} s ({st['load']!r} {st['error']!r})")


def generate(d, method, maxnew, budget="", timeout=600):
    set_value(d, "method", method)
    set_value(d, "maxnew", str(maxnew))
    set_value(d, "budget", str(budget))
    t = time.time()
    click(d, "go")
    d.wait(IDLE, f"{method} to finish", timeout)
    r = d.js("return demo.lastResult")
    st = d.status()
    print(f"  {method}: {time.time() - t:.0f} s, {st['stats']}")
    return r, st


# The drawn tree: nodes (from the SVG's data attributes) in node order, the accepted path in
# order, the bonus token, and the round it says it shows.
READ_TREE = """const svg = document.getElementById('treesvg');
if (!svg) return null;
const nodes = [...svg.querySelectorAll('g.node')].map(g => ({node: +g.dataset.node, token: +g.dataset.token,
  parent: +g.dataset.parent, depth: +g.dataset.depth, accepted: g.dataset.accepted === '1', rank: g.dataset.rank === undefined ? null : +g.dataset.rank,
  title: g.querySelector('title').textContent, label: g.querySelector('text').textContent}));
nodes.sort((a, b) => a.node - b.node);
const path = nodes.filter(n => n.rank !== null).sort((a, b) => a.rank - b.rank).map(n => n.node);
const bonus = svg.querySelector('g.bonus');
return {round: +svg.dataset.round, nodes, path, bonus: bonus ? +bonus.dataset.token : null,
  label: svg.getAttribute('aria-label'), pos: document.getElementById('treepos').textContent};"""

# The engine's per-round trees for the page's message and options, run again through the
# Session's on_round (the page's session; greedy, so the same generation).
ENGINE_ROUNDS = """const done = arguments[arguments.length - 1];
const rounds = [];
demo.session.generate_text(document.getElementById('prompt').value, arguments[0], null, r => { rounds.push(r); })
  .then(res => done({tokens: res.tokens, rounds}), e => done({error: String(e.message ?? e)}));"""


def tree_matches(t, r):
    """Whether the drawn tree t is the engine's round r (ids, parents, depths, accepted path, bonus)."""
    return (t is not None and t["round"] == r["round"] and [n["node"] for n in t["nodes"]] == list(range(len(r["tokens"])))
            and [n["token"] for n in t["nodes"]] == r["tokens"] and [n["parent"] for n in t["nodes"]] == r["parents"]
            and [n["depth"] for n in t["nodes"]] == r["depths"] and t["path"] == r["accepted"]
            and [n["node"] for n in t["nodes"] if n["accepted"]] == sorted(r["accepted"]) and t["bonus"] == r["bonus"])


def check_tree_view(d, opts, result):
    """Every round's drawn tree equals the engine's, from the latest back to the first."""
    e = d.js_async(ENGINE_ROUNDS, opts)
    check("error" not in e and e["tokens"] == result["tokens"], f"the engine's rerun gives the page's tokens ({e.get('error', '')})")
    rounds = e.get("rounds", [])
    check(len(rounds) == result["rounds"] and d.js("return demo.trees.length") == len(rounds),
          f"the page received one tree per round ({d.js('return demo.trees.length')} trees, {result['rounds']} rounds)")
    t = d.js(READ_TREE)
    check(tree_matches(t, rounds[-1]) and "following the latest" in t["pos"], f"the tree view shows the latest round, equal to the engine's ({t and t['pos']})")
    r = rounds[-1]
    check(all(f"(token {n['token']})" in n["title"] and n["label"] for n in t["nodes"]) and t["label"].startswith(f"Step {len(rounds)}"),
          "each node has a label and a tooltip naming its token; the SVG has an accessible summary")
    print(f"  latest tree: {t['label']}")
    same = 1
    for k in range(len(rounds) - 2, -1, -1):
        click(d, "treeprev")
        t = d.js(READ_TREE)
        same += tree_matches(t, rounds[k])
    check(same == len(rounds), f"stepping back with “earlier”, each round's drawn tree equals the engine's ({same} of {len(rounds)})")
    check(d.js("return document.getElementById('treeprev').disabled && !document.getElementById('treelast').disabled"),
          "at the first round “earlier” is disabled and “latest” enabled")
    click(d, "treelast")
    check(tree_matches(d.js(READ_TREE), rounds[-1]), "“latest” shows the last round again")
    # A coloured piece of the answer shows its step's tree.
    k = min(2, len(rounds))
    d.js("document.querySelector(`#out span[data-round='${arguments[0]}']`).click()", k)
    check(tree_matches(d.js(READ_TREE), rounds[k - 1]), f"clicking step {k} in the answer shows its tree")
    click(d, "treelast")
    return rounds


def main():
    tmp = tempfile.mkdtemp(prefix="sparkling-page-")
    procs = []
    d = None
    try:
        # Serve `app/` (as scripts/web-demo links it) and `fresh/` (no fetched assets).
        for name in ("app", "fresh"):
            os.makedirs(os.path.join(tmp, name))
            for f in ("index.html", "main.js", "pkg", "models"):
                os.symlink(os.path.realpath(os.path.join(WWW, f)), os.path.join(tmp, name, f))
        os.symlink(os.path.realpath(os.path.join(WWW, "assets")), os.path.join(tmp, "app", "assets"))
        hp, dp = free_port(), free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "http.server", str(hp), "--bind", "127.0.0.1", "--directory", tmp],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen([CHROMEDRIVER, f"--port={dp}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_port(hp, "the page server")
        wait_port(dp, "chromedriver")
        d = Driver(dp)
        page = f"http://127.0.0.1:{hp}"

        print("page test: a fresh machine (no fetched assets)")
        d.go(f"{page}/fresh/")
        d.wait("return document.getElementById('gpuinfo').textContent !== ''", "the WebGPU check")
        check(d.js("return document.getElementById('target').value") == "assets/smollm2-135m-instruct-q4_1.gguf",
              "the default target is the GGUF `scripts/fetch-assets smollm2` fetches")
        soft = d.js("return demo.softwareGpu")
        info = d.js("return document.getElementById('gpuinfo').textContent")
        print(f"  WebGPU: {info}")
        check(not soft or (d.js("return document.getElementById('backend').value") == "cpu" and "processor" in info),
              "a software WebGPU adapter is detected and the CPU backend suggested and selected")
        check("8 or less" not in info and "auto" in d.js("return document.getElementById('budgetrange').textContent"),
              "the help text is true with tree size auto the default (no stale “tree size of 8 or less”)")
        click(d, "load")
        d.wait(IDLE, "the load to fail", 120)
        err = d.js("return document.getElementById('loaderror').textContent")
        role = d.js("return document.getElementById('loaderror').getAttribute('role')")
        colour = d.js("return getComputedStyle(document.getElementById('loaderror')).color")
        check("404" in err and "scripts/fetch-assets smollm2" in err and role == "alert",
              f"a missing default model is an alert that says what to run ({err!r})")
        check(colour != d.js("return getComputedStyle(document.getElementById('loadinfo')).color"), "errors are coloured unlike info")
        check(d.js("return document.getElementById('go').disabled"), "Generate stays disabled without a model")
        d.shot("1-fresh-machine-load-error")

        print("page test: the defaults on the CPU backend")
        d.go(f"{page}/app/")
        d.wait("return document.getElementById('gpuinfo').textContent !== ''", "the WebGPU check")
        default_prompt = d.js("return document.getElementById('prompt').value")
        load(d, "cpu", keyboard=True)
        info = d.status()["load"]
        check("1 threads" not in info and "processor" in info, f"the ready message names the processor in plain words ({info!r})")

        print("page test: every numeric field is checked against its range before a run")
        runs_before = d.js("return demo.runId")
        for field, value, want in [("budget", "100000", ["“Tree size”", "1 to 64", "empty for auto", "100000"]),
                                   ("budget", "-5", ["“Tree size”", "1 to 64", "-5"]),
                                   ("budget", "2.5", ["“Tree size”", "whole number"]),
                                   ("maxnew", "0", ["“Answer length”", "1 to 2048", "(it is 0)"]),
                                   ("maxnew", "-5", ["“Answer length”", "from 1"]),
                                   ("maxnew", "", ["“Answer length”", "empty"])]:
            set_value(d, "budget", "")
            set_value(d, "maxnew", "24")
            set_value(d, field, value)
            click(d, "go")
            time.sleep(0.3)
            err = d.js("return document.getElementById('error').textContent")
            started = d.js("return demo.runId") != runs_before or d.js("return demo.busy") is not None
            check(all(w in err for w in want) and not started and "non-negative" not in err and "budget" not in err and "max_new_tokens" not in err,
                  f"{field} = {value!r} is refused before starting, naming the field as labelled: {err!r}")
        set_value(d, "budget", "")
        set_value(d, "maxnew", "24")
        # A message longer than the model's context is refused with its length and what to do.
        ctx = d.js("return demo.session.context_length()")
        set_value(d, "prompt", "word " * ctx)
        click(d, "go")
        time.sleep(0.5)
        err = d.js("return document.getElementById('error').textContent")
        check("“Your message” is" in err and f"{ctx} tokens" in err and "Shorten" in err and d.js("return demo.runId") == runs_before,
              f"a message beyond the context is refused before starting: {err[:160]!r}")
        # A long message is read in chunks with a turn for the page between them: the page's
        # timers keep firing while the model reads it (before, one forward froze the page).
        set_value(d, "prompt", "word " * 600)
        d.js("window.__ticks = 0; window.__tick = setInterval(() => { window.__ticks++; }, 20);")
        r, st = generate(d, "ar", 2)
        ticks = d.js("clearInterval(window.__tick); return window.__ticks")
        check(r is not None and 1 <= len(r["tokens"]) <= 2 and ticks >= 10,
              f"the page keeps running while a 600-word message is read ({ticks} timer turns during the run)")
        set_value(d, "prompt", default_prompt)
        # A fixed tree size: `auto` chooses from measured timings, so a second run (the tree-view
        # check below) could draft in other rounds.
        r, st = generate(d, "sparkling", 24, budget=8)
        check(r is not None and not r["cancelled"] and len(r["tokens"]) > 0 and r["text"], "sparkling generates text on the CPU backend")
        n_spans = d.js("return document.querySelectorAll('#out span').length")
        check(n_spans == r["rounds"] + 1, f"the answer is shown coloured by round ({n_spans} spans, {r['rounds']} rounds + the first token)")
        check(d.js("return document.getElementById('out').textContent") == r["text"], "the streamed text equals the result's text")
        check(d.js("return document.querySelectorAll('#accept div').length") >= 8, "the acceptance-by-depth chart is drawn")
        sparkling_cpu = r["tokens"]
        d.shot("2-cpu-sparkling")

        print("page test: the tree view equals the engine's per-round trees")
        check_tree_view(d, {"method": "sparkling", "budget": 8, "max_new_tokens": 24}, r)
        d.js("document.getElementById('h-drafts').scrollIntoView()")
        d.shot("2b-cpu-sparkling-tree")

        print("page test: compare with ar")
        t = time.time()
        click(d, "compare")
        d.wait("return demo.busy === null && document.querySelectorAll('#runs tbody tr').length >= 2", "the ar run", 600)
        rows = d.js("return [...document.querySelectorAll('#runs tbody tr')].map(r => [...r.cells].map(c => c.textContent))")
        print(f"  {time.time() - t:.0f} s; runs: {rows}")
        check(len(rows) == 2 and rows[1][0] == "ar" and rows[0][5] == "yes", "the comparison lists ar and sparkling gives ar's tokens")
        d.shot("3-compare-with-ar")
        # Another tree size is another run to compare (the trial saw the old run compared).
        set_value(d, "budget", "2")
        click(d, "compare")
        d.wait("return demo.busy === null && document.querySelectorAll('#runs tbody tr').length >= 3", "the tree size 2 run", 600)
        rows = d.js("return [...document.querySelectorAll('#runs tbody tr')].map(r => [...r.cells].map(c => c.textContent))")
        check(len(rows) == 3 and rows[2][0] == "sparkling (tree size 2)" and rows[2][5] == "yes",
              f"Compare after changing the tree size runs that size, and ar is not rerun ({rows})")

        print("page test: Stop mid-run")
        set_value(d, "method", "sparkling")
        set_value(d, "maxnew", "400")
        set_value(d, "prompt", "Tell a long story about a forest, with many details.")
        # From the keyboard: Enter on the focused Generate; the focus moves to Stop (not lost).
        d.js("document.getElementById('go').focus()")
        press(d, ENTER)
        d.wait("return demo.rounds.length >= 3", "three rounds", 300)
        check(d.js("return document.activeElement.id") == "stop", f"the keyboard focus moves to Stop during the run ({d.js('return document.activeElement.id')})")
        check(d.js("return document.getElementById('go').disabled && !document.getElementById('stop').disabled && document.getElementById('compare').disabled"),
              "during a generation Generate and Compare are disabled, Stop enabled")
        d.shot("4-during-generation")
        click(d, "stop")
        d.wait(IDLE, "the stop", 120)
        r = d.js("return demo.lastResult")
        st = d.status()
        check(r is not None and r["cancelled"] and 0 < len(r["tokens"]) < 400 and "stopped" in st["stats"] and st["error"] == "",
              f"Stop ends the run early ({len(r['tokens']) if r else None} tokens; {st['stats']!r})")
        check(d.js("return document.activeElement.id") == "go", f"after the run the focus is on Generate ({d.js('return document.activeElement.id')})")
        rows = d.js("return [...document.querySelectorAll('#runs tbody tr')].map(r => [...r.cells].map(c => c.textContent))")
        check(len(rows) == 1 and "stopped" in rows[0][0] and rows[0][1] == str(len(r["tokens"])), f"the stopped run stays in the runs table, marked stopped ({rows})")
        # Keyboard: the answer's pieces are tab stops; Enter on one shows its step's tree.
        d.js("document.querySelector(\"#out span[data-round='2']\").focus()")
        check(d.js("return document.activeElement.dataset.round") == "2", "a coloured piece of the answer takes the keyboard focus")
        press(d, ENTER)
        t = d.js(READ_TREE)
        check(t is not None and t["round"] == 1, f"Enter on step 2's piece shows its tree ({t and t['pos']})")

        print("page test: Load during a run")
        click(d, "go")
        d.wait("return demo.rounds.length >= 3", "three rounds", 300)
        check(d.js("return document.getElementById('load').textContent").startswith("Stop and load"), "Load during a run says it stops the run")
        click(d, "load")
        d.wait(READY, "the reload", 600)
        check(d.js("return document.getElementById('stats').textContent") == "" and d.js("return demo.trees.length") == 0,
              "loading clears the old run's statistics and trees")
        spans = d.js("return document.querySelectorAll('#out span').length")
        time.sleep(2)
        check(d.js("return document.querySelectorAll('#out span').length") == spans and d.status()["error"] == "",
              "the old run stops: no more tokens reach the page, no error")
        set_value(d, "prompt", default_prompt)
        r, st = generate(d, "sparkling", 24)
        check(r is not None and r["tokens"] == sparkling_cpu and d.js("return document.getElementById('out').textContent") == r["text"],
              "a new Generate after the reload shows only its own run, with the same tokens as before")
        check(d.js("return document.querySelectorAll('#runs tbody tr').length") == 1, "the comparison table was cleared for the new model")

        print("page test: rounds that skipped the drafter are not counted as misses")
        fake = [{"tokens": [5], "accepted": [0], "drafted": False}, {"tokens": [5, 6, 7], "accepted": [0, 1, 2], "drafted": True},
                {"tokens": [5], "accepted": [0], "drafted": True}, {"tokens": [5, 6], "accepted": [0], "drafted": True}]
        a = d.js("return demo.acceptance(arguments[0])", fake)
        check(a == {"acc": [2, 0], "skipped": 1, "empty": 1},
              f"a skipped round and a drafted root-only round apart, two checked rounds with 2 and 0 accepted ({a})")
        r, st = generate(d, "sparkling", 24)  # tree size auto
        trees = d.js("return demo.trees.map(t => [t.tokens.length, t.drafted && !t.last_token, !!t.last_token])")
        # The last step (only its bonus token left) is neither checked nor skipped.
        skipped = sum(1 for n, dr, last in trees if not dr and not last)
        checked = sum(1 for n, dr, last in trees if n > 1)
        steps = d.js("return [+document.getElementById('accept').dataset.steps, +document.getElementById('accept').dataset.skipped]")
        axis = d.js("return document.getElementById('acceptaxis').textContent")
        # The page's count of skipped steps is the engine's (the trial saw 56 against 57 when
        # root-only drafted rounds were counted as skipped).
        check(r is not None and steps == [checked, skipped] and skipped == r["drafts_skipped"] and (skipped == 0 or "skipped the drafter" in axis),
              f"with tree size auto the chart counts {steps[0]} steps with guesses, {steps[1]} skipped apart = the engine's {r and r.get('drafts_skipped')} ({axis!r})")
        if skipped:
            k = next(i for i, (n, dr, last) in enumerate(trees) if not dr and not last)
            d.js("demo.showTree(arguments[0])", k)
            check("drafter skipped" in d.js("return document.getElementById('treesum').textContent"), "a skipped step's tree view says the drafter was skipped")

        print("page test: a 64-node tree (CPU backend, tree size 64)")
        r, st = generate(d, "sparkling", 12, budget=64)
        # The latest step wrote only the model's own last token: nothing was guessed there.
        d.js("demo.showTree(demo.trees.length - 1)")
        last = d.js("return demo.trees[demo.trees.length - 1]")
        check(last is not None and last.get("last_token") is True and len(last["tokens"]) == 1
              and "left to write" in d.js("return document.getElementById('treesum').textContent"),
              "the last step drafts nothing (only its bonus token was left) and says so")
        # The biggest tree of the run (the last steps' trees shrink to the tokens left).
        k = d.js("const n = demo.trees.map(t => t.tokens.length); return n.indexOf(Math.max(...n))")
        d.js("demo.showTree(arguments[0])", k)
        t = d.js(READ_TREE)
        check(r is not None and r["tokens"] == sparkling_cpu[:12] and t is not None and 8 < len(t["nodes"]) <= 65,
              f"a tree of up to 64 guesses is drawn ({t and len(t['nodes'])} nodes) and the tokens are unchanged")
        d.js("document.getElementById('h-drafts').scrollIntoView()")
        d.shot("5a-tree-64-nodes")

        print("page test: 390 px wide (a phone)")
        d.size(390, 1400)
        time.sleep(0.5)
        sw = d.js("return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        check(sw[0] <= sw[1], f"no sideways scroll at 390 px (scrollWidth {sw[0]}, clientWidth {sw[1]})")
        d.shot("5-phone-390px")
        d.js("document.getElementById('h-drafts').scrollIntoView()")
        sw = d.js("return [document.documentElement.scrollWidth, document.documentElement.clientWidth, document.getElementById('treewrap').scrollWidth, document.getElementById('treewrap').clientWidth]")
        check(sw[0] <= sw[1] and sw[3] <= sw[1], f"the 64-node tree scrolls inside its box, not the page ({sw})")
        d.shot("5c-phone-390px-tree")
        d.js("document.getElementById('h-tree').scrollIntoView()")
        d.shot("5b-phone-390px-lower")
        d.size(1100, 1400)

        print("page test: a file that is not a model, through the file picker")
        el = d.call("POST", f"/session/{d.sid}/element", {"using": "css selector", "value": "#ggufFile"})
        el = next(iter(el.values()))
        junk = os.path.join(tmp, "my-notes.gguf")
        with open(junk, "w") as f:
            f.write("these are notes, not a model\n")
        d.call("POST", f"/session/{d.sid}/element/{el}/value", {"text": junk})
        set_value(d, "backend", "cpu")
        click(d, "load")
        d.wait(IDLE, "the failed load", 120)
        err = d.js("return document.getElementById('loaderror').textContent")
        check("my-notes.gguf" in err and "target.gguf" not in err and "To fix" in err, f"a bad file's error names the user's file and what to do ({err!r})")

        print("page test: a local .gguf file through the file picker, with a mistyped drafter address")
        set_value(d, "drafters", "models/smollm2-135m-dspark-b1,models/smollm2-135m-dflash-b8")
        gguf = os.path.realpath(os.path.join(WWW, "assets", "smollm2-135m-instruct-q4_1.gguf"))
        d.call("POST", f"/session/{d.sid}/element/{el}/value", {"text": gguf})
        check(d.js("return document.querySelector('input[name=src]:checked').value") == "file", "picking a file selects “a .gguf file on this computer”")
        load(d, "cpu")
        check("smollm2-135m-instruct-q4_1.gguf" in d.status()["load"] and "assets/" not in d.status()["load"], "the picked file is the loaded model")
        warn = d.js("return document.getElementById('loadwarn').textContent")
        check("models/smollm2-135m-dspark-b1/config.json is not on this server" in warn and "drafter address" in warn and "web-demo" not in warn,
              f"a mistyped drafter address is named with what to check ({warn!r})")
        set_value(d, "drafters", "models/smollm2-135m-dspark-b8,models/smollm2-135m-dflash-b8")
        r, st = generate(d, "ar", 8)
        check(r is not None and r["tokens"] == sparkling_cpu[:8], "the picked file gives the served file's tokens")

        print("page test: a local model folder through the folder picker (here: a folder holding the .gguf)")
        folder = os.path.join(tmp, "picked-model")
        os.makedirs(folder)
        shutil.copy(gguf, folder)
        el = d.call("POST", f"/session/{d.sid}/element", {"using": "css selector", "value": "#dirFile"})
        el = next(iter(el.values()))
        d.call("POST", f"/session/{d.sid}/element/{el}/value", {"text": folder})
        check(d.js("return document.querySelector('input[name=src]:checked').value") == "dir" and d.js("return document.getElementById('dirFile').files.length") == 1,
              "picking a folder selects “a model folder on this computer”")
        load(d, "cpu")
        check("picked-model" in d.status()["load"], "the picked folder is the loaded model")
        r, st = generate(d, "ar", 8)
        check(r is not None and r["tokens"] == sparkling_cpu[:8], "the picked folder gives the served file's tokens")
        d.js("document.querySelector('input[name=src][value=server]').checked = true")

        if WEBGPU:
            print("page test: the defaults on WebGPU (software adapter: a short run)")
            load(d, "webgpu")
            warn = d.js("return document.getElementById('gpuinfo').textContent")
            check(not soft or "software" in warn, "choosing WebGPU on a software adapter warns")
            r, st = generate(d, "sparkling", 8, budget=4, timeout=600)
            check(r is not None and not r["cancelled"] and r["tokens"] == sparkling_cpu[:8], "sparkling on WebGPU gives the CPU backend's tokens")
            check_tree_view(d, {"method": "sparkling", "budget": 4, "max_new_tokens": 8}, r)
            d.shot("6-webgpu")
    finally:
        if d:
            d.quit()
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"page test: {len(failures)} failed:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("page test: all passed")


if __name__ == "__main__":
    main()
