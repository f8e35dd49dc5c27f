// SparklingTree browser demo: loads a target (from this server, a local .gguf file or a local
// model folder), its drafters and a tokenizer into a Session (web/src/lib.rs), streams the
// answer coloured by decoding round, draws the draft tree each round verified (the accepted
// path and the model's bonus token on it; rejected branches grey), and keeps a table of runs
// to compare with plain `ar`.
// State: one job at a time (load or generate); Stop cancels a generation, Load cancels a
// running generation first; a superseded run's callbacks stop it and its result is ignored.

// The files the page loads by default; scripts/web-demo links them and refuses to start when
// one is missing (keep the two in step).
const DEFAULTS = {
  target: "assets/smollm2-135m-instruct-q4_1.gguf",
  drafters: "models/smollm2-135m-dspark-b8,models/smollm2-135m-dflash-b8",
  tokenizer: "",
};
const FETCH_HINT = "run `scripts/fetch-assets smollm2`, then restart `scripts/web-demo`";
// The demo models this server may offer (the "server…" choices under Model): their addresses
// and what to run when one is missing. scripts/web-demo links the Qwen file when it was fetched.
const SERVER_MODELS = {
  server: { ...DEFAULTS, hint: FETCH_HINT },
  "server-qwen": {
    target: "assets/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    drafters: "",
    tokenizer: "",
    hint: "run `scripts/fetch-assets qwen2.5-coder-0.5b` (about 478 MB), then restart `scripts/web-demo`",
  },
};
const isServer = (src) => src in SERVER_MODELS;
const SERVE_HINT = "serve the page with `scripts/web-demo` (it builds the package and links models/ and the fetched assets)";
// Methods and the drafter kind each needs (src/decode: Method::drafter_kind).
const NEEDS = { ar: null, lookup: null, dflash: "DFlash", ddtree: "DFlash", dspark: "DSpark", sparkling: "DSpark", treespark: "DSpark" };

const $ = (id) => document.getElementById(id);
const ui = {};
for (const id of ["backend", "gpuinfo", "ggufFile", "dirFile", "target", "drafters", "tokenizer", "load", "loadinfo",
  "prompt", "method", "budget", "maxnew", "go", "stop", "compare", "error", "warn", "stats", "out", "accept", "runs",
  "treeprev", "treenext", "treelast", "treepos", "treesum", "treewrap"]) {
  ui[id] = $(id);
}
ui.target.value = DEFAULTS.target;
ui.drafters.value = DEFAULTS.drafters;
ui.tokenizer.value = DEFAULTS.tokenizer;

// The page's state, also read by the browser tests (web/tests/page.py) through window.demo.
const state = {
  busy: null,          // null | "load" | "gen"
  session: null,       // the loaded Session
  loaded: null,        // { backend, target, drafters: [kinds], key }
  loadedBackend: null,
  runId: 0,            // bumped by every Generate and Load: older runs are superseded
  running: null,       // the promise of the running generation
  runs: [],            // runs of this model: { key, method, budget, tokens, tau, tps, stopped }
  prefillRate: null,   // message tokens read per millisecond, measured by the last finished run
  prefillTokens: 0,    // … and that run's message length (tokens)
  softwareGpu: false,
  gpuDesc: "",
  lastResult: null,
  rounds: [],          // committed token ids per round of the current run (round 0: prefill)
  trees: [],           // the verified rounds of the last run with a drafter (Session on_round objects)
  treeRun: 0,          // the runId those trees belong to
  treeShown: null,     // index into trees of the tree on screen; null: follow the latest
};
window.demo = state;

// ---------------------------------------------------------------- small helpers
const fmtMB = (n) => (n / 1e6).toFixed(1);
const secs = (t0) => ((performance.now() - t0) / 1000).toFixed(1);
const nextPaint = () => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
function say(el, text) { el.textContent = text; }
function showError(msg, el = ui.error) { el.textContent = msg; }
function clearMessages() { for (const id of ["error", "warn", "loaderror", "loadwarn"]) $(id).textContent = ""; }

function setBusy(kind) {
  const focused = document.activeElement;
  if (kind === null && treeFrame) {
    // The last round's tree and chart were waiting for the next animation frame: draw them now,
    // so the finished run's view is complete the moment the page is idle (a hidden or busy
    // page may delay that frame for long).
    cancelAnimationFrame(treeFrame);
    treeFrame = 0;
    renderTree();
    renderAccept();
  }
  state.busy = kind;
  document.body.dataset.busy = kind ?? "";
  const loading = kind === "load", generating = kind === "gen";
  for (const el of [ui.backend, ui.ggufFile, ui.dirFile, ui.target, ui.drafters, ui.tokenizer, ...document.querySelectorAll("input[name=src]")]) {
    el.disabled = loading;
  }
  ui.load.disabled = loading;  // Load during a generation cancels the generation first
  const ready = state.session !== null && !loading && !generating;
  for (const el of [ui.go, ui.compare, ui.method, ui.budget, ui.maxnew, ui.prompt]) {
    el.disabled = !ready && el !== ui.prompt;
  }
  ui.prompt.readOnly = generating;
  ui.stop.disabled = !generating;
  ui.load.textContent = generating ? "Stop and load model" : "Load model";
  // A control disabled under the keyboard's focus would drop the focus to the page: move it to
  // Stop during a generation, to the load message while loading, else to Generate (or Load).
  if (focused && focused !== document.body && (focused.disabled || (focused === ui.loadinfo && !loading))) {
    const to = generating ? ui.stop : loading ? ui.loadinfo : !ui.go.disabled ? ui.go : ui.load;
    to.focus();
  }
}

// ---------------------------------------------------------------- the wasm package
let wasmModule = null;
async function engine() {
  if (wasmModule) return wasmModule;
  let m;
  try {
    m = await import("./pkg/sparkling_web.js");
  } catch (e) {
    throw new Error(`The engine (pkg/sparkling_web.js) did not load: ${e.message ?? e}.\n` +
      `Build and serve the page with \`scripts/web-demo\` (once per machine: \`scripts/install-web-tools\`).`);
  }
  await m.default();
  wasmModule = m;
  return m;
}

// ---------------------------------------------------------------- WebGPU adapter check
async function checkGpu(autoSwitch) {
  let desc = "", soft = false, none = "";
  if (!navigator.gpu) {
    none = "This browser offers no WebGPU (Chrome or Edge 113+ have it; Firefox and Safari in recent versions).";
  } else {
    let a = null;
    try { a = await navigator.gpu.requestAdapter(); } catch (_) { a = null; }
    if (!a) {
      none = "WebGPU is present but no graphics adapter is available to it.";
    } else {
      let info = a.info;
      if (!info && a.requestAdapterInfo) { try { info = await a.requestAdapterInfo(); } catch (_) { info = null; } }
      info = info ?? {};
      desc = [info.vendor, info.architecture, info.device, info.description].filter(Boolean).join(" ").trim();
      soft = Boolean(a.isFallbackAdapter || info.isFallbackAdapter) ||
        /swiftshader|llvmpipe|lavapipe|softpipe|software|basic render|warp/i.test(desc);
    }
  }
  state.softwareGpu = soft || Boolean(none);
  state.gpuDesc = desc;
  ui.gpuinfo.className = "msg " + (state.softwareGpu ? "warn" : "info");
  if (none) {
    if (autoSwitch) ui.backend.value = "cpu";
    say(ui.gpuinfo, `${none} The processor (CPU) is selected: it works everywhere.`);
  } else if (soft) {
    if (autoSwitch) ui.backend.value = "cpu";
    say(ui.gpuinfo, `WebGPU here is a software renderer (${desc || "fallback adapter"}): it runs on the processor and is ` +
      `far slower than the processor (minutes for a short answer). ${autoSwitch ? "The processor (CPU) is selected" : "Pick the processor (CPU)"}.`);
  } else {
    say(ui.gpuinfo, `WebGPU adapter: ${desc || "(the browser does not name it)"}.`);
  }
}

// ---------------------------------------------------------------- loading
async function readStream(stream, total, label, t0) {
  const reader = stream.getReader();
  const chunks = [];
  let got = 0, lastShown = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    got += value.length;
    const now = performance.now();
    if (now - lastShown > 100) {
      lastShown = now;
      say(ui.loadinfo, `${label}: ${fmtMB(got)}${total ? ` of ${fmtMB(total)}` : ""} MB · ${secs(t0)} s`);
    }
  }
  const out = new Uint8Array(got);
  let off = 0;
  for (const c of chunks) { out.set(c, off); off += c.length; }
  return out;
}

// Fetch a same-origin URL with progress; a failure names the URL and what to run.
async function fetchBytes(url, label, t0, hint) {
  let r;
  try { r = await fetch(url); } catch (e) {
    throw new Error(`${url}: the server did not answer (${e.message ?? e}). Is \`scripts/web-demo\` still running?`);
  }
  if (!r.ok) throw new Error(httpError(url, r.status, hint));
  return readStream(r.body, +r.headers.get("content-length") || 0, label, t0);
}
async function fetchText(url, hint, optional = false) {
  let r;
  try { r = await fetch(url); } catch (e) {
    throw new Error(`${url}: the server did not answer (${e.message ?? e}). Is \`scripts/web-demo\` still running?`);
  }
  if (!r.ok) {
    if (optional) return null;
    throw new Error(httpError(url, r.status, hint));
  }
  return r.text();
}
function httpError(url, status, hint) {
  const what = status === 404 ? "is not on this server" : "could not be read";
  return `${url} ${what} (HTTP ${status})${hint ? `. To fix: ${hint}.` : ""}`;
}
// What to do when an address fails: the demo's own files need fetching or serving; an address
// the user typed is probably mistyped.
function hintFor(url, what) {
  const where = `check the ${what} address “${url}” under “Addresses the demo model loads from” (relative to this page; `;
  if (what === "tokenizer") return where + "leave it blank to use the model file's own tokenizer)";
  const demo = what === "drafter" ? DEFAULTS.drafters.split(",") : [DEFAULTS.target];
  if (demo.includes(url)) return what === "drafter" ? SERVE_HINT : FETCH_HINT;
  const model = Object.values(SERVER_MODELS).find((m) => m.target === url);
  if (what === "model" && model) return model.hint;
  return where + `the demo's ${what === "drafter" ? "drafters are" : "model is"} ${demo.join(" and ")})`;
}
const kindOf = (configText) => {
  try {
    const arch = (JSON.parse(configText).architectures ?? []).join(" ");
    return /dspark/i.test(arch) ? "DSpark" : /dflash/i.test(arch) ? "DFlash" : "drafter";
  } catch (_) { return "drafter"; }
};

// The files of a picked folder: config.json + model.safetensors (or a .gguf), tokenizer files.
function folderFiles(list) {
  const files = [...list].sort((a, b) => a.webkitRelativePath.split("/").length - b.webkitRelativePath.split("/").length);
  const named = (n) => files.find((f) => f.name === n);
  return {
    config: named("config.json"), weights: named("model.safetensors"), index: named("model.safetensors.index.json"),
    gguf: files.find((f) => f.name.endsWith(".gguf")), tokenizer: named("tokenizer.json"), tokenizerConfig: named("tokenizer_config.json"),
    name: files[0]?.webkitRelativePath.split("/")[0] ?? "folder",
  };
}

async function load() {
  if (state.busy === "load") return;
  clearMessages();
  if (state.busy === "gen") await cancelRun();
  clearRunView();
  setBusy("load");
  const t0 = performance.now();
  const backend = ui.backend.value;
  const src = document.querySelector("input[name=src]:checked").value;
  const warnings = [];
  let s = null;
  try {
    say(ui.loadinfo, "starting the engine…");
    const W = await engine();
    // One Session per Load: release the previous one's wasm memory first.
    if (state.session) { state.session.free(); state.session = null; state.loaded = null; }
    say(ui.loadinfo, `opening the ${backend === "cpu" ? "processor (CPU)" : "WebGPU"} backend…`);
    try {
      s = await W.Session.create(backend);
    } catch (e) {
      throw new Error(`${e.message ?? e}${backend === "webgpu" ? "\nTo fix: pick “processor (CPU)” under “Run on”." : ""}`);
    }
    let targetName;
    if (isServer(src)) {
      const t = ui.target.value.trim().replace(/\/$/, "");
      targetName = t;
      if (t.endsWith(".gguf")) {
        const bytes = await fetchBytes(t, `downloading the model (${t})`, t0, hintFor(t, "model"));
        await preparing(t0);
        s.load_target_gguf(bytes, t);
      } else {
        const cfg = await fetchText(`${t}/config.json`, hintFor(t, "model"));
        const bytes = await fetchBytes(`${t}/model.safetensors`, `downloading the model (${t})`, t0, hintFor(t, "model"));
        await preparing(t0);
        s.load_target(cfg, bytes, t);
      }
    } else if (src === "file") {
      const f = ui.ggufFile.files[0];
      if (!f) throw new Error("No file chosen: pick a .gguf file next to “a .gguf file on this computer”.");
      targetName = f.name;
      const bytes = await readStream(f.stream(), f.size, `reading ${f.name}`, t0);
      await preparing(t0);
      s.load_target_gguf(bytes, f.name);
    } else {
      const d = folderFiles(ui.dirFile.files);
      targetName = d.name;
      if (d.config && d.weights) {
        const cfg = await d.config.text();
        const bytes = await readStream(d.weights.stream(), d.weights.size, `reading ${d.name}/model.safetensors`, t0);
        await preparing(t0);
        s.load_target(cfg, bytes, d.name);
      } else if (d.gguf) {
        const bytes = await readStream(d.gguf.stream(), d.gguf.size, `reading ${d.gguf.name}`, t0);
        await preparing(t0);
        s.load_target_gguf(bytes, `${d.name}/${d.gguf.name}`);
      } else if (d.index) {
        throw new Error(`${d.name} holds a sharded checkpoint (model.safetensors.index.json): the browser loads one model.safetensors file; merge the shards first.`);
      } else {
        throw new Error(ui.dirFile.files.length ? `${d.name}: no config.json + model.safetensors (nor a .gguf) in this folder.` : "No folder chosen: pick a model folder next to “a model folder on this computer”.");
      }
      if (d.tokenizer) {
        s.set_tokenizer(await d.tokenizer.text(), d.tokenizerConfig ? await d.tokenizerConfig.text() : undefined);
      }
    }
    // Drafters: a drafter that does not fit (another model) is a warning, not a failure.
    const kinds = [];
    for (const dname of ui.drafters.value.split(",").map((x) => x.trim().replace(/\/$/, "")).filter(Boolean)) {
      try {
        const cfg = await fetchText(`${dname}/config.json`, hintFor(dname, "drafter"));
        const bytes = await fetchBytes(`${dname}/model.safetensors`, `downloading the drafter ${dname}`, t0, hintFor(dname, "drafter"));
        s.add_drafter(cfg, bytes, dname);
        kinds.push(kindOf(cfg));
      } catch (e) {
        warnings.push(`drafter ${dname} not used: ${e.message ?? e}`);
      }
    }
    const k = ui.tokenizer.value.trim().replace(/\/$/, "");
    if (k && isServer(src)) {
      s.set_tokenizer(await fetchText(`${k}/tokenizer.json`, hintFor(k, "tokenizer")), (await fetchText(`${k}/tokenizer_config.json`, null, true)) ?? undefined);
    }
    state.session = s;
    s = null;
    state.loaded = { backend: state.session.backend_name(), target: targetName, drafters: kinds, key: `${targetName}|${backend}|${performance.now()}` };
    state.loadedBackend = backend;
    state.runs = [];
    renderRuns();
    for (const opt of ui.method.options) {
      const need = NEEDS[opt.value];
      opt.disabled = need !== null && !kinds.includes(need);
    }
    if (ui.method.selectedOptions[0]?.disabled) ui.method.value = "ar";
    if (kinds.length === 0) warnings.push("No drafter loaded: only the plain method (ar) and prompt lookup are available.");
    // The largest tree size the page accepts: the processor checks a tree as several plain
    // steps, so a large one stalls the page for seconds each step.
    ui.budget.max = backend === "cpu" ? 64 : 512;
    showRanges();
    const on = backend === "cpu" ? "the processor" : "the graphics card";
    say(ui.loadinfo, `Ready in ${secs(t0)} s: ${targetName}${kinds.length ? ` with the ${kinds.join(" and ")} drafter${kinds.length > 1 ? "s" : ""}` : ""}, on ${on} (${state.loaded.backend}).`);
    $("loadwarn").textContent = warnings.join("\n");
  } catch (e) {
    s?.free();
    say(ui.loadinfo, `Loading failed after ${secs(t0)} s.`);
    const msg = `${e.message ?? e}`;
    // A file that is not a model (the engine names it): say what the page can open.
    const fix = !isServer(src) && !msg.includes("To fix") && !msg.startsWith("No ")
      ? "\nTo fix: pick a .gguf model file (llama.cpp's format) or a folder with config.json + model.safetensors." : "";
    showError(`Could not load the model: ${msg}${fix}`, $("loaderror"));
  } finally {
    setBusy(null);
  }
}
// Converting the weights blocks the page for a moment: say so before it starts.
async function preparing(t0) {
  say(ui.loadinfo, `preparing the weights (${secs(t0)} s so far; the page pauses for a few seconds)…`);
  await nextPaint();
}

// ---------------------------------------------------------------- generation
const roundColour = (i) => i === 0 ? "#e4e4e8" : `hsl(${(i * 67) % 360} 75% 84%)`;

// Forget the previous model's answer, statistics, trees and chart (a new model is loading).
function clearRunView() {
  ui.out.textContent = "";
  ui.stats.textContent = "";
  $("outlabel").textContent = "Answer";
  ui.accept.textContent = "";
  $("acceptaxis").textContent = "(drawn while a method with a drafter runs)";
  state.trees = []; state.treeShown = null; state.rounds = []; state.lastResult = null;
  renderTree();
}

function resetRunView(method) {
  ui.out.textContent = "";
  ui.stats.textContent = "";
  // The plain method guesses nothing: keep the last tree method's chart for comparison.
  if (method !== "ar") {
    ui.accept.textContent = ""; $("acceptaxis").textContent = "";
    state.trees = []; state.treeRun = state.runId; state.treeShown = null;
    renderTree();
  }
  ui.out.dataset.run = state.runId;
  $("outlabel").textContent = `Answer (${method})`;
  state.rounds = [];
  state.lastResult = null;
}

function liveStats(t0, first) {
  const n = state.rounds.reduce((a, r) => a + r.length, 0);
  const steps = state.rounds.length - 1;
  const tau = steps > 0 ? (n - state.rounds[0].length) / steps : 0;
  const tps = first && steps > 0 ? (n - 1) / ((performance.now() - first) / 1000) : 0;
  return `${secs(t0)} s · ${n} tokens · ${Math.max(steps, 0)} steps · τ ${tau.toFixed(2)} · ${tps.toFixed(1)} tokens/s`;
}

// The acceptance chart's data from a run's verified rounds: rounds that checked guesses give
// how many were accepted; rounds where `auto` skipped the drafter (the root alone: a plain
// step was cheaper) checked no guess, so they are counted apart, not as misses.
// `skipped` counts what the engine counts (`drafts_skipped`: the drafter did not run), `empty`
// the drafted rounds whose best tree was the root alone (no guess worth its cost).
function acceptance(trees) {
  const checked = trees.filter((t) => t.tokens.length > 1);
  // The last step, where only the model's own token was left, is neither checked nor skipped.
  const skipped = trees.filter((t) => t.drafted === false && !t.last_token).length;
  const last = trees.filter((t) => t.last_token).length;
  return { acc: checked.map((t) => t.accepted.length - 1), skipped, empty: trees.length - checked.length - skipped - last };
}
state.acceptance = acceptance;  // for the browser tests
const skippedText = (n, empty = 0) => `${n} step${n === 1 ? "" : "s"} skipped the drafter (a plain step was cheaper there)` +
  (empty ? ` and ${empty} drafted but found no guess worth checking;` : "") + ` ${n + empty === 1 ? "it is" : "they are"} not counted`;

function renderAccept() {
  const { acc, skipped, empty } = acceptance(state.trees);
  ui.accept.textContent = "";
  ui.accept.dataset.steps = acc.length;
  ui.accept.dataset.skipped = skipped;
  if (acc.length === 0) {
    $("acceptaxis").textContent = skipped + empty ? `No guesses checked yet: ${skippedText(skipped, empty)}.` : "(drawn while a method with a drafter runs)";
    return;
  }
  const maxD = Math.max(8, ...acc);
  for (let d = 1; d <= maxD; d++) {
    const share = acc.filter((a) => a >= d).length / acc.length;
    const bar = document.createElement("div");
    bar.style.height = `${Math.max(share * 100, 1)}%`;
    bar.title = `depth ${d}: ${(share * 100).toFixed(0)}% of ${acc.length} steps`;
    const pct = document.createElement("span");
    pct.textContent = `${(share * 100).toFixed(0)}%`;
    bar.append(pct);
    ui.accept.append(bar);
  }
  $("acceptaxis").textContent = `guessed token 1 (left) to ${maxD} (right), over ${acc.length} step${acc.length === 1 ? "" : "s"} that checked guesses` +
    (skipped + empty ? `; ${skippedText(skipped, empty)}` : "");
  ui.accept.setAttribute("aria-label", `acceptance by depth: ${[...ui.accept.children].map((b) => b.title).join("; ")}`);
}

// ---------------------------------------------------------------- the draft tree of a round
// A round (Session on_round): { round, root_pos, tokens, parents, depths, accepted, bonus,
// drafted, committed, texts, bonus_text }; node 0 is the anchor (the last committed token).
const SVGNS = "http://www.w3.org/2000/svg";
const T = { w: 70, h: 20, col: 88, row: 26, pad: 8, top: 18, chars: 7 };
let treeFrame = 0;
function scheduleTree() {
  if (!treeFrame) treeFrame = requestAnimationFrame(() => { treeFrame = 0; renderTree(); renderAccept(); });
}
const visible = (t) => t.replace(/ /g, "␣").replace(/\n/g, "⏎").replace(/\t/g, "⇥");
const tokText = (r, i) => (i === "bonus" ? r.bonus_text : r.texts?.[i]) ?? null;
function label(text, id) {
  if (text === null) return `#${id}`;
  const chars = [...visible(text)];
  if (chars.length === 0) return "∅";
  return chars.length > T.chars ? chars.slice(0, T.chars - 1).join("") + "…" : chars.join("");
}
const quoted = (text, id) => text === null ? `token ${id}` : `“${text}”`;
function el(name, attrs, parent) {
  const e = document.createElementNS(SVGNS, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  parent?.append(e);
  return e;
}

// Rows: the accepted path runs along the top row (then the bonus token); every other branch
// below it, leaves on rows of their own, each parent on its first child's row.
function layout(r) {
  const n = r.tokens.length, kids = Array.from({ length: n }, () => []);
  for (let i = 1; i < n; i++) kids[r.parents[i]].push(i);
  const rank = new Map(r.accepted.map((a, k) => [a, k]));
  const last = r.accepted[r.accepted.length - 1];
  for (const [i, ks] of kids.entries()) {
    ks.sort((a, b) => (rank.has(b) - rank.has(a)) || a - b);
    if (i === last) ks.unshift("bonus");
  }
  const row = new Map();
  let rows = 0;
  const place = (i) => {  // iterative would be longer; depth is at most the drafter block
    const ks = i === "bonus" ? [] : kids[i];
    if (ks.length === 0) { row.set(i, rows++); return; }
    ks.forEach(place);
    row.set(i, row.get(ks[0]));
  };
  place(0);
  return { kids, rank, row, rows, last };
}

function summary(r, k, total) {
  const path = r.accepted.slice(1);
  const words = path.map((i) => quoted(tokText(r, i), r.tokens[i]));
  const drafted = r.tokens.length - 1;
  const kept = path.length + 1;
  let s = `Step ${r.round + 1}${k === total - 1 ? " (latest)" : ""}: `;
  s += drafted === 0 ? (r.last_token ? "only the model's own next token was left to write (length limit), so nothing was guessed; "
    : r.drafted === false ? "drafter skipped: a plain step was cheaper here (tree size auto), no guesses checked; "
    : "no guess was worth checking (tree size auto): the root alone was verified; ") :
    `${drafted} guessed token${drafted > 1 ? "s" : ""} checked, ${path.length} accepted${words.length ? ` (${words.join(" ")})` : ""}, `;
  s += `then the model's own ${quoted(r.bonus_text ?? null, r.bonus)}: ${kept} token${kept > 1 ? "s" : ""} kept`;
  if (r.committed !== undefined && r.committed < kept) s += ` (the answer ends after ${r.committed}: length limit or end of answer)`;
  return s + ".";
}

function renderTree() {
  const total = state.trees.length;
  const k = state.treeShown ?? total - 1;
  ui.treeprev.disabled = k <= 0;
  ui.treenext.disabled = k >= total - 1;
  ui.treelast.disabled = state.treeShown === null || k >= total - 1;
  ui.treewrap.textContent = "";
  if (total === 0) {
    ui.treepos.textContent = "";
    ui.treesum.textContent = "(drawn while a method with a drafter runs)";
    return;
  }
  const r = state.trees[k];
  const skipped = acceptance(state.trees).skipped;
  ui.treepos.textContent = `step ${k + 1} of ${total}${state.treeShown === null ? " · following the latest" : ""}` +
    (skipped ? ` · ${skipped} skipped the drafter` : "");
  const sum = summary(r, k, total);
  ui.treesum.textContent = sum;
  const { kids, rank, row, rows, last } = layout(r);
  const depth = (i) => i === "bonus" ? r.depths[last] + 1 : r.depths[i];
  const maxDepth = r.depths[last] + 1 > Math.max(...r.depths) ? r.depths[last] + 1 : Math.max(...r.depths);
  const W = T.pad * 2 + maxDepth * T.col + T.w, H = T.top + T.pad + rows * T.row;
  const svg = el("svg", { id: "treesvg", width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": sum, "data-round": r.round });
  const x = (i) => T.pad + depth(i) * T.col, y = (i) => T.top + row.get(i) * T.row;
  for (let d = 0; d <= maxDepth; d++) {
    el("text", { class: "depth", x: T.pad + d * T.col + 2, y: 12 }, svg).textContent = d === 0 ? "last token" : `+${d}`;
  }
  const edges = el("g", { "aria-hidden": "true" }, svg);
  const nodes = el("g", {}, svg);
  const colour = roundColour(r.round + 1);
  const draw = (i) => {
    const isBonus = i === "bonus";
    const acc = !isBonus && rank.has(i);
    const tok = isBonus ? r.bonus : r.tokens[i];
    const text = tokText(r, i);
    const g = el("g", isBonus ? { class: "bonus", "data-token": tok } : {
      class: `node${acc ? " acc" : ""}${i === 0 ? " root" : ""}`, "data-node": i, "data-token": tok,
      "data-parent": r.parents[i], "data-depth": r.depths[i], "data-accepted": acc ? "1" : "0", ...(acc ? { "data-rank": rank.get(i) } : {}),
    }, nodes);
    el("title", {}, g).textContent = `${quoted(text, tok)} (token ${tok})${isBonus ? ": the model's own next token" :
      i === 0 ? ": the last token already in the answer" : `, ${depth(i)} ahead: ${acc ? "guessed right, kept" : "rejected"}`}`;
    const rect = el("rect", { x: x(i), y: y(i), width: T.w, height: T.h, rx: 4 }, g);
    if (acc && i !== 0) rect.style.fill = colour;
    el("text", { x: x(i) + 5, y: y(i) + 14 }, g).textContent = label(text, tok);
    const children = isBonus ? [] : kids[i];
    for (const c of children) {
      const x0 = x(i) + T.w, y0 = y(i) + T.h / 2, x1 = x(c), y1 = y(c) + T.h / 2, mx = (x0 + x1) / 2;
      const cls = c === "bonus" ? "edge bonus-edge" : rank.has(c) ? "edge acc" : "edge";
      el("path", { class: cls, d: `M${x0},${y0} C${mx},${y0} ${mx},${y1} ${x1},${y1}` }, edges);
      draw(c);
    }
  };
  draw(0);
  ui.treewrap.append(svg);
}

function showTree(k) {
  const total = state.trees.length;
  if (total === 0) return;
  k = Math.max(0, Math.min(k, total - 1));
  state.treeShown = k >= total - 1 ? null : k;
  renderTree();
}

state.showTree = showTree;  // for the browser tests: show round k (an index into trees)

function runKey() { return `${ui.prompt.value}\u0000${ui.maxnew.value}`; }

// The numeric fields, checked before a run against the range shown on each: the label the
// user sees, the value (null = empty), or an Error whose message names the field.
const FIELDS = {
  budget: { label: "Tree size", empty: "auto" },
  maxnew: { label: "Answer length", empty: null },
};
function fieldValue(id) {
  const el = ui[id], f = FIELDS[id], min = +el.min, max = +el.max;
  const range = `a whole number from ${min} to ${max}${f.empty ? `, or empty for ${f.empty}` : ""}`;
  const raw = el.value.trim();
  if (el.validity.badInput) throw new Error(`“${f.label}” must be ${range}: what is typed there is not a number.`);
  if (raw === "") {
    if (f.empty) return null;
    throw new Error(`“${f.label}” is empty: type ${range}.`);
  }
  const v = Number(raw);
  if (!Number.isInteger(v) || v < min || v > max) throw new Error(`“${f.label}” must be ${range} (it is ${raw}).`);
  return v;
}
function showRanges() {
  for (const id of Object.keys(FIELDS)) {
    const f = FIELDS[id], el = ui[id];
    $(`${id}range`).textContent = `${el.min}–${el.max}${f.empty ? `, empty = ${f.empty}` : ""}`;
  }
}
state.fieldValue = fieldValue;  // for the browser tests

// The options of a run from the page's fields, and the message's length in tokens; an Error
// naming the field (or the message) when a value is out of its range or the message does not
// fit the model's context with the answer.
function runRequest(method) {
  const budget = fieldValue("budget"), maxnew = fieldValue("maxnew");
  const prompt = ui.prompt.value;
  if (prompt.trim() === "") throw new Error("“Your message” is empty: type a question first.");
  const opts = { method, max_new_tokens: maxnew };
  if (budget !== null && method !== "ar") opts.budget = budget;
  const n = state.session.count_chat_tokens(prompt);
  const ctx = state.session.context_length();
  // The engine needs room for the message, the answer and the largest tree it may check.
  const tree = method === "ar" ? 0 : budget ?? (state.loadedBackend === "cpu" ? 16 : 64);
  if (n + maxnew + tree > ctx) {
    const room = ctx - maxnew - tree;
    throw new Error(`“Your message” is ${n} tokens long: with an answer of up to ${maxnew} tokens (“Answer length”)` +
      `${tree ? ` and up to ${tree} guesses per step` : ""} it does not fit in the ${ctx} tokens this model reads at once. ` +
      (room > 0 ? `Shorten the message to under ${room} tokens or lower “Answer length”.` : "Lower “Answer length”."));
  }
  return { opts, prompt, tokens: n };
}

// Reading a long message takes a while before the answer starts (the CPU backend reads it in
// chunks of 32 tokens and gives the page a turn between them, so the page stays usable). Say so,
// with the time the last run's reading rate predicts, before it starts.
function longMessageWarning(n) {
  const rate = state.prefillRate;
  const est = rate ? n / rate / 1000 : null;
  if (n < 200 || (est !== null ? est < 3 : n < 400)) return "";
  // Reading cost grows faster than the length (every token attends to all before it): from a
  // much shorter last message the estimate is only a lower bound.
  const atLeast = state.prefillTokens && n > 2 * state.prefillTokens ? "at least " : "";
  return `Your message is ${n} tokens long: the model reads it before it answers` +
    `${est !== null ? `, ${atLeast}about ${est < 10 ? est.toFixed(1) : est.toFixed(0)} s here` : ""} (Stop works meanwhile).`;
}

async function generate(method) {
  if (!state.session || state.busy) return null;
  ui.error.textContent = "";
  ui.warn.textContent = "";
  let req;
  try {
    req = runRequest(method);
  } catch (e) {
    showError(`${e.message ?? e}`);
    return null;
  }
  const { opts, prompt } = req;
  const warns = [];
  if (state.loadedBackend === "webgpu" && state.softwareGpu && method !== "ar" && !(opts.budget <= 8)) {
    warns.push("WebGPU runs on a software renderer here: a step that checks many guesses takes seconds, a whole answer " +
      "minutes (Stop ends it). The processor (CPU) is much faster here.");
  }
  const long = longMessageWarning(req.tokens);
  if (long) warns.push(long);
  ui.warn.textContent = warns.join("\n");
  const id = ++state.runId;
  setBusy("gen");
  resetRunView(method);
  const t0 = performance.now();
  let first = null;
  const tick = setInterval(() => {
    if (id !== state.runId) return;
    // Until the first token the model is still reading the message: say so, not zero rates.
    say(ui.stats, `${method}: ${state.rounds.length === 0 ? `reading the message (${req.tokens} tokens)… ${secs(t0)} s` : liveStats(t0, first)}`);
  }, 200);
  say(ui.stats, `${method}: reading the message (${req.tokens} tokens)…`);
  const key = runKey();
  let result = null;
  // Show the messages before the model starts reading (which holds the page on the processor).
  state.stopAsked = false;
  await nextPaint();
  try {
    if (id !== state.runId) return null;
    if (state.stopAsked) {  // Stop pressed before the model started
      say(ui.stats, `${method}: stopped before it started.`);
      return null;
    }
    state.running = state.session.generate_text(prompt, opts, (ids, piece) => {
      if (id !== state.runId) return false;  // superseded: stop this run
      if (first === null) first = performance.now();
      const i = state.rounds.length;
      state.rounds.push([...ids]);
      const span = document.createElement("span");
      span.style.background = roundColour(i);
      span.title = i === 0 ? "first token (reading the message)" : `step ${i}: ${ids.length} token${ids.length > 1 ? "s" : ""}${method !== "ar" ? " (Enter or click: show its tree)" : ""}`;
      span.dataset.round = i;
      // Keyboard: each step's piece is a tab stop; Enter or Space shows its tree (below).
      if (i > 0 && method !== "ar") span.tabIndex = 0;
      span.textContent = piece ?? "";
      ui.out.append(span);
      return true;
    }, method === "ar" ? undefined : (round) => {
      if (id !== state.runId) return false;
      state.trees.push(round);
      scheduleTree();
      return true;
    });
    const r = await state.running;
    if (id !== state.runId) return null;
    result = r;
    state.lastResult = r;
    if (r.cancelled) {
      say(ui.stats, `${method}: stopped after ${r.tokens.length} tokens and ${secs(t0)} s.`);
      // A stopped run stays in the table, marked, with what it did until Stop.
      const steps = state.rounds.length - 1;
      const n = state.rounds.reduce((a, x) => a + x.length, 0);
      const tau = steps > 0 ? (n - state.rounds[0].length) / steps : null;
      const tps = first !== null && steps > 0 ? (n - 1) / ((performance.now() - first) / 1000) : null;
      state.runs.push({ key, method, budget: method === "ar" ? null : opts.budget ?? "auto", tokens: r.tokens, tau, tps, stopped: true });
    } else {
      const skipped = r.drafts_skipped ? ` · the drafter skipped in ${r.drafts_skipped} step${r.drafts_skipped === 1 ? "" : "s"} (a plain step was cheaper)` : "";
      say(ui.stats, `${method}${method !== "ar" ? ` (tree size ${r.budget})` : ""}: ${r.tokens.length} tokens in ${secs(t0)} s · ` +
        `τ ${r.tau.toFixed(2)} tokens per model step · ${r.tokens_per_s.toFixed(1)} tokens/s · ${r.rounds} steps${skipped} · ` +
        `reading the message ${r.prefill_ms.toFixed(0)} ms${r.stopped ? "" : " · stopped at the length limit"}`);
      if (r.prefill_ms > 0) {
        state.prefillRate = req.tokens / r.prefill_ms;
        state.prefillTokens = req.tokens;
      }
      state.runs.push({ key, method, budget: method === "ar" ? null : r.budget, tokens: r.tokens, tau: r.tau, tps: r.tokens_per_s, stopped: false });
    }
    renderRuns();
  } catch (e) {
    if (id === state.runId) {
      say(ui.stats, `${method}: failed after ${secs(t0)} s.`);
      showError(`Generation failed: ${e.message ?? e}`);
    }
  } finally {
    clearInterval(tick);
    if (id === state.runId) {
      state.running = null;
      setBusy(null);
    }
  }
  return result;
}

// Stop the running generation and wait until it has let go of the models.
async function cancelRun() {
  const p = state.running;
  state.runId++;
  state.session?.cancel();
  if (p) { try { await p; } catch (_) { /* reported by its own run, or superseded */ } }
  state.running = null;
  setBusy(null);
}

function renderRuns() {
  const body = ui.runs.tBodies[0];
  body.textContent = "";
  const key = runKey();
  const runs = state.runs.filter((r) => r.key === key);
  const ar = [...runs].reverse().find((r) => r.method === "ar" && !r.stopped);
  const num = (x, d) => x === null || x === undefined ? "—" : x.toFixed(d);
  for (const r of runs) {
    const tr = body.insertRow();
    if (r.stopped) tr.dataset.stopped = "1";
    // A stopped run is compared on the tokens it made before Stop.
    const fits = ar && (r.stopped ? r.tokens.length <= ar.tokens.length : r.tokens.length === ar.tokens.length);
    const same = !ar ? "?" : fits && r.tokens.every((t, i) => t === ar.tokens[i]) ? (r.stopped ? "yes, so far" : "yes") : "NO";
    const cells = [r.method + (r.budget ? ` (tree size ${r.budget})` : "") + (r.stopped ? " — stopped" : ""), r.tokens.length, num(r.tau, 2), num(r.tps, 1),
      ar && r.tps !== null ? `${(r.tps / ar.tps).toFixed(2)}×` : "—", r.method === "ar" && !r.stopped ? "—" : same];
    for (const c of cells) tr.insertCell().textContent = c;
  }
}

async function compare() {
  const m = ui.method.value;
  const key = runKey();
  // A run of the method at the tree size set now (empty: auto); ar has none.
  const size = ui.budget.value.trim() === "" ? "auto" : String(Number(ui.budget.value));
  const have = (method) => state.runs.some((r) => r.key === key && r.method === method && !r.stopped && (method === "ar" || String(r.budget) === size));
  if (m !== "ar" && !have(m)) {
    const r = await generate(m);
    if (!r || r.cancelled) return;
  }
  if (!have("ar")) await generate("ar");
}

// ---------------------------------------------------------------- wiring
ui.load.onclick = load;
ui.go.onclick = () => generate(ui.method.value);
ui.compare.onclick = compare;
ui.stop.onclick = () => { if (state.busy === "gen") { state.stopAsked = true; state.session?.cancel(); } };
ui.prompt.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey) && !ui.go.disabled) { e.preventDefault(); ui.go.click(); }
});
ui.prompt.addEventListener("input", renderRuns);
const treeIndex = () => state.treeShown ?? state.trees.length - 1;
ui.treeprev.onclick = () => { state.treeShown = Math.max(0, treeIndex() - 1); renderTree(); };
ui.treenext.onclick = () => showTree(treeIndex() + 1);
ui.treelast.onclick = () => showTree(state.trees.length - 1);
// A coloured piece of the answer shows the tree its step checked (when the trees are this answer's).
function showStepOf(e) {
  const span = e.target.closest?.("span[data-round]");
  const step = span ? +span.dataset.round : 0;
  if (step > 0 && +ui.out.dataset.run === state.treeRun && step <= state.trees.length) {
    state.treeShown = step - 1;
    renderTree();
    ui.treewrap.scrollIntoView({ block: "nearest" });
    return true;
  }
  return false;
}
ui.out.addEventListener("click", showStepOf);
ui.out.addEventListener("keydown", (e) => {
  if ((e.key === "Enter" || e.key === " ") && showStepOf(e)) e.preventDefault();
});
ui.maxnew.addEventListener("input", renderRuns);
ui.ggufFile.addEventListener("change", () => { document.querySelector("input[name=src][value=file]").checked = true; });
// Picking a demo model from this server fills in its addresses.
for (const el of document.querySelectorAll("input[name=src]")) {
  el.addEventListener("change", () => {
    const m = SERVER_MODELS[el.value];
    if (!el.checked || !m) return;
    ui.target.value = m.target;
    ui.drafters.value = m.drafters;
    ui.tokenizer.value = m.tokenizer;
  });
}
ui.dirFile.addEventListener("change", () => { document.querySelector("input[name=src][value=dir]").checked = true; });
ui.backend.addEventListener("change", async () => {
  if (ui.backend.value === "webgpu") await checkGpu(false);
  if (state.session && ui.backend.value !== state.loadedBackend) {
    say(ui.loadinfo, `The model is loaded on the ${state.loadedBackend === "cpu" ? "processor" : "graphics card"}: press “Load model” to move it.`);
  }
});
setBusy(null);
showRanges();
checkGpu(true);
