// SparklingTree browser demo: loads a target, its drafters and a tokenizer from same-origin
// URLs into a Session (web/src/lib.rs) and streams the generated text.
import init, { Session } from "./pkg/sparkling_web.js";

const $ = (id) => document.getElementById(id);
const log = (m) => { $("log").textContent += m + "\n"; };
let session = null;

async function bytes(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return new Uint8Array(await r.arrayBuffer());
}
async function text(url, optional = false) {
  const r = await fetch(url);
  if (!r.ok) { if (optional) return null; throw new Error(`${url}: HTTP ${r.status}`); }
  return r.text();
}

$("load").onclick = async () => {
  $("go").disabled = true;
  try {
    await init();
    session?.free();  // a new Session per Load: release the previous one's wasm memory
    session = null;
    session = await Session.create($("backend").value);
    log(`backend: ${session.backend_name()}`);
    const t = $("target").value.replace(/\/$/, "");
    if (t.endsWith(".gguf")) {
      session.load_target_gguf(await bytes(t));
    } else {
      session.load_target(await text(`${t}/config.json`), await bytes(`${t}/model.safetensors`));
    }
    log(`target: ${t}`);
    for (const d of $("drafters").value.split(",").map((s) => s.trim().replace(/\/$/, "")).filter(Boolean)) {
      session.add_drafter(await text(`${d}/config.json`), await bytes(`${d}/model.safetensors`));
      log(`drafter: ${d}`);
    }
    const k = $("tokenizer").value.trim().replace(/\/$/, "");
    if (k) {
      session.set_tokenizer(await text(`${k}/tokenizer.json`), await text(`${k}/tokenizer_config.json`, true));
      log(`tokenizer: ${k}`);
    }
    $("go").disabled = false;
    log("ready");
  } catch (e) {
    log(`error: ${e.message ?? e}`);
  }
};

$("go").onclick = async () => {
  $("out").textContent = "";
  $("go").disabled = true;
  // Empty fields are left out so the engine's defaults apply (budget: 64 on WebGPU, 8 on the CPU).
  const opts = { method: $("method").value };
  if ($("budget").value !== "") opts.budget = +$("budget").value;
  if ($("maxnew").value !== "") opts.max_new_tokens = +$("maxnew").value;
  try {
    const r = await session.generate_text($("prompt").value, opts, (_ids, piece) => {
      if (piece !== null) $("out").textContent += piece;
    });
    $("out").textContent = r.text;
    $("stats").textContent =
      `${r.method} (budget ${r.budget}) on ${r.backend}: ${r.tokens.length} tokens, ` +
      `τ = ${r.tau.toFixed(2)} tokens per target forward, ${r.tokens_per_s.toFixed(1)} tok/s decode, ` +
      `prefill ${r.prefill_ms.toFixed(0)} ms, ${r.rounds} rounds`;
  } catch (e) {
    log(`error: ${e.message ?? e}`);
  }
  $("go").disabled = false;
};
