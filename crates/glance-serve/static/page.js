// glance's chat page (docs/serve.md#the-page). It speaks the server's public API only:
// POST /v1/chat/completions with stream: true and glance's options under "glance", exactly as
// an API client sends them, and reads what each accelerator did from usage.glance.
"use strict";
const $ = (id) => document.getElementById(id);
const conversation = []; // OpenAI messages of the conversation so far
let pending = []; // data: URLs of the images of the next question
let busy = false;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function scrollDown() { $("log").scrollTop = $("log").scrollHeight; }

// The "glance" options of a request, from the settings (or plain AR with every visual token).
function options(plain) {
  if (plain) return { decode: "ar", prune: { policy: "none" } };
  const o = { decode: $("decode").value };
  if ($("prune").value !== "none") {
    o.prune = { policy: $("prune").value, keep: Number($("keep").value) / 100 };
  }
  return o;
}

function showPending() {
  const box = $("pending");
  box.replaceChildren();
  pending.forEach((url, i) => {
    const img = el("img");
    img.src = url;
    img.title = "click to remove";
    img.onclick = () => { pending.splice(i, 1); showPending(); };
    box.append(img);
  });
}

function readFiles(files) {
  for (const f of files) {
    if (!/^image\//.test(f.type)) continue;
    const r = new FileReader();
    r.onload = () => { pending.push(r.result); showPending(); };
    r.readAsDataURL(f);
  }
}

async function worldImage() {
  const index = Math.floor(Math.random() * 1000);
  try {
    const res = await fetch(`/glance/world/sample?split=test&index=${index}`);
    const v = await res.json();
    if (!res.ok) throw new Error(v.error ? v.error.message : res.statusText);
    pending.push(v.image);
    showPending();
    const box = $("questions");
    box.replaceChildren();
    for (const q of v.questions.concat(v.dialogue.filter((q) => !q.follow_up))) {
      const b = el("button", "", q.question);
      b.type = "button";
      b.title = `${q.family}; ground truth: ${q.answer}`;
      b.onclick = () => { $("question").value = q.question; $("question").focus(); };
      box.append(b);
    }
  } catch (e) {
    showError(`world image: ${e.message}`);
  }
}

function showError(message) {
  const t = el("div", "turn assistant");
  t.dataset.state = "error";
  t.append(el("div", "bubble error", message));
  $("log").append(t);
  scrollDown();
}

// One streamed completion of `messages`: calls onText with the text so far, resolves with the
// text, the usage (with usage.glance), the client's time to first token and the total time.
async function complete(messages, glance, onText) {
  const body = {
    messages, stream: true, stream_options: { include_usage: true },
    temperature: Number($("temperature").value), max_tokens: Number($("max-tokens").value),
    glance,
  };
  const start = performance.now();
  const res = await fetch("/v1/chat/completions", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  if (!res.ok) {
    let message = `${res.status} ${res.statusText}`;
    try { const v = await res.json(); if (v.error) message = `${res.status}: ${v.error.message}`; } catch (_) {}
    throw new Error(message);
  }
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "", text = "", usage = null, ttft = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") continue;
        const v = JSON.parse(data);
        if (v.error) throw new Error(v.error.message);
        if (v.usage) usage = v.usage;
        const delta = v.choices && v.choices[0] && v.choices[0].delta.content;
        if (delta) {
          if (ttft === null) ttft = performance.now() - start;
          text += delta;
          onText(text);
        }
      }
    }
  }
  return { text, usage, ttft, total: performance.now() - start };
}

// The answer's text with the tokens of each step (one target pass, one speculative round, one
// diffusion block) shaded together; a step of one token is left plain.
function colourSteps(box, text, g) {
  const chars = Array.from(text);
  box.replaceChildren();
  let token = 0, from = 0;
  g.tokens_per_step.forEach((n, s) => {
    token += n;
    const to = token > 0 ? Math.min(g.token_ends[token - 1] ?? chars.length, chars.length) : 0;
    if (to <= from) return;
    const piece = chars.slice(from, to).join("");
    from = to;
    if (n === 1) { box.append(piece); return; }
    const span = el("span", `step ${s % 2 ? "a" : "b"}`, piece);
    span.style.setProperty("--w", Math.min(0.15 + 0.08 * n, 0.7).toFixed(2));
    span.title = `step ${s}: ${n} tokens from one target pass`;
    box.append(span);
  });
  if (from < chars.length) box.append(chars.slice(from).join(""));
}

// Each image with the patches pruning dropped dimmed.
function drawPatches(box, images, kept) {
  kept.forEach((k, i) => {
    const fig = el("div", "patches");
    const canvas = el("canvas");
    canvas.width = canvas.height = 288;
    const keep = new Set(k.kept);
    const dimmed = k.rows * k.cols - keep.size;
    canvas.dataset.dimmed = String(dimmed);
    canvas.dataset.kept = String(keep.size);
    fig.append(canvas, el("span", "", `image ${i + 1}: ${keep.size} of ${k.rows * k.cols} patches kept`));
    box.append(fig);
    const img = new Image();
    img.onload = () => {
      const c = canvas.getContext("2d");
      // The model sees the centre square (shortest side resized, centre crop).
      const side = Math.min(img.width, img.height);
      c.drawImage(img, (img.width - side) / 2, (img.height - side) / 2, side, side, 0, 0, 288, 288);
      c.fillStyle = "rgba(10, 12, 16, 0.62)";
      const w = 288 / k.cols, h = 288 / k.rows;
      for (let p = 0; p < k.rows * k.cols; p++) {
        if (!keep.has(p)) c.fillRect((p % k.cols) * w, Math.floor(p / k.cols) * h, w, h);
      }
      canvas.dataset.drawn = "1";
    };
    img.src = images[i];
  });
}

function stats(r) {
  const u = r.usage, g = u.glance;
  const perPass = u.completion_tokens / Math.max(1, g.forward_passes + 1);
  const parts = [
    `<b>${g.strategy}</b>`,
    `TTFT <b>${r.ttft === null ? "–" : r.ttft.toFixed(0)} ms</b>`,
    `<b>${g.decode_tokens_per_s.toFixed(0)}</b> tokens/s`,
    `<b>${perPass.toFixed(2)}</b> tokens per pass`,
    `visual tokens <b>${u.kept_visual_tokens}</b> / ${u.visual_tokens}`,
  ];
  const s = el("div", "stats");
  s.innerHTML = parts.join(" · ");
  s.dataset.ttftMs = r.ttft === null ? "" : r.ttft.toFixed(1);
  return s;
}

// One run of `messages` drawn into `run`; resolves with the result (throws on an error).
async function answerInto(run, messages, glance) {
  const text = el("div", "answer-text");
  run.append(text);
  const r = await complete(messages, glance, (t) => { text.textContent = t; scrollDown(); });
  if (!r.usage || !r.usage.glance) throw new Error("the answer came without its usage block");
  colourSteps(text, r.text, r.usage.glance);
  run.append(stats(r));
  const images = messages.flatMap((m) => Array.isArray(m.content) ? m.content : [])
    .filter((p) => p.type === "image_url").map((p) => p.image_url.url);
  const overlays = el("div");
  drawPatches(overlays, images, r.usage.glance.kept_patches);
  run.append(overlays);
  return r;
}

async function send(ev) {
  ev.preventDefault();
  const question = $("question").value.trim();
  if (busy || (!question && pending.length === 0)) return;
  const content = pending.map((url) => ({ type: "image_url", image_url: { url } }));
  content.push({ type: "text", text: question });
  const hint = document.querySelector(".hint");
  if (hint) hint.remove();
  const user = el("div", "turn user");
  const bubble = el("div", "bubble");
  pending.forEach((url) => { const i = el("img"); i.src = url; bubble.append(i); });
  bubble.append(question);
  user.append(bubble);
  $("log").append(user);
  conversation.push({ role: "user", content });
  const messages = conversation.slice();
  const glance = options(false);
  pending = [];
  showPending();
  $("question").value = "";
  const turn = el("div", "turn assistant");
  turn.dataset.state = "streaming";
  const runs = el("div", "bubble runs");
  const run = el("div", "run");
  run.append(el("h3", "", `${glance.decode}, ${glance.prune ? `${glance.prune.policy} ${$("keep").value}%` : "every visual token"}`));
  runs.append(run);
  turn.append(runs);
  $("log").append(turn);
  setBusy(true);
  try {
    const r = await answerInto(run, messages, glance);
    conversation.push({ role: "assistant", content: r.text });
    turn.dataset.state = "done";
    runs.append(compareButton(runs, messages));
    runs.append(el("div", "legend", "shaded: tokens one target pass produced together; dimmed: pruned patches"));
  } catch (e) {
    conversation.pop(); // the failed question leaves the conversation as it was
    turn.dataset.state = "error";
    runs.classList.add("error");
    run.append(el("div", "", e.message));
  } finally {
    setBusy(false);
    scrollDown();
  }
}

function compareButton(runs, messages) {
  const b = el("button", "compare", "compare");
  b.type = "button";
  b.title = "the same request with plain autoregressive decoding and every visual token";
  b.onclick = async () => {
    if (busy) return;
    b.remove();
    const run = el("div", "run");
    run.append(el("h3", "", "ar, every visual token"));
    runs.insertBefore(run, runs.querySelector(".legend"));
    setBusy(true);
    try { await answerInto(run, messages, options(true)); run.dataset.state = "done"; }
    catch (e) { run.append(el("div", "error", e.message)); }
    finally { setBusy(false); }
  };
  return b;
}

function setBusy(b) {
  busy = b;
  $("send").disabled = b;
}

async function loadInfo() {
  try {
    const v = await (await fetch("/glance/info")).json();
    $("model").textContent = v.model;
    for (const o of $("decode").options) o.disabled = !v.strategies.includes(o.value);
    if ($("decode").selectedOptions[0].disabled) $("decode").value = v.default_decode;
  } catch (_) { /* the page works without it */ }
}

$("composer").addEventListener("submit", send);
$("question").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) send(e);
});
$("files").addEventListener("change", (e) => { readFiles(e.target.files); e.target.value = ""; });
$("world").addEventListener("click", worldImage);
$("new-chat").addEventListener("click", () => {
  conversation.length = 0;
  $("log").replaceChildren();
});
const footer = $("composer").parentElement;
document.body.addEventListener("dragover", (e) => { e.preventDefault(); footer.classList.add("drop"); });
document.body.addEventListener("dragleave", () => footer.classList.remove("drop"));
document.body.addEventListener("drop", (e) => {
  e.preventDefault();
  footer.classList.remove("drop");
  readFiles(e.dataTransfer.files);
});
loadInfo();
