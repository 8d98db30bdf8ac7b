"use strict";
// The attn-mt serve page: translate a sentence, then draw its attention maps. Plain DOM, no libraries.
// A token is named by (side, index): side "src" (source subwords) or "tgt" (predicted subwords, </s> last).
// Every chip and heatmap label carries data-side and data-index, so hovering any of them finds the others.

const $ = (id) => document.getElementById(id);
const KIND_NAMES = {
  encoder_self: "encoder self-attention", decoder_self: "decoder self-attention", cross: "cross-attention",
};
const EXPLAIN = {
  encoder_self: "Rows: each source token (query). Columns: the source tokens it attends to.",
  decoder_self: "Rows: the target token being predicted. Columns: the target tokens already there (<s> first).",
  cross: "Rows: the target token being predicted. Columns: the source tokens it attends to.",
};
const SHAPE_KEYS = ["n_layers", "d_model", "n_heads", "d_ff", "cell", "d_embed", "d_hidden", "d_attn"];
const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
// shown: the sentence, beam and n-best of the translation on the page (the share link names them)
const state = {info: null, att: null, shown: null, hover: null, request: 0, translations: 0, pinned: null};

function el(tag, props = {}, children = []) {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children);
  return node;
}

function range(from, to) {
  return Array.from({length: to - from + 1}, (_, i) => from + i);
}

function fillSelect(select, values, selected, label = String, fallback = values[0]) {
  const keep = values.map(String).includes(String(selected)) ? String(selected) : String(fallback);
  select.replaceChildren(...values.map((v) => el("option", {value: v, textContent: label(v)})));
  select.value = keep;
}

function setStatus(message, error = false) {
  $("status").textContent = message;
  $("status").classList.toggle("error", error);
}

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
  };
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.error || `HTTP ${response.status}`);
  return data;
}

// ---- model facts and controls ----

function count(n) {
  return n >= 1e6 ? `${(n / 1e6).toFixed(1)}M` : n >= 1e3 ? `${(n / 1e3).toFixed(1)}k` : String(n);
}

// The facts of /api/info; an export may not know its languages or parameter count (null: shown as –).
function showFacts(info) {
  const {architecture: arch, languages: lang, vocabulary: vocab} = info;
  const shape = Object.entries(arch).filter(([k]) => SHAPE_KEYS.includes(k)).map(([k, v]) => `${k} ${v}`).join(", ");
  const languages = lang.source && `${lang.source} → ${lang.target}`;
  const params = info.parameters && count(info.parameters);
  const rows = [
    ["checkpoint", info.checkpoint],
    ["languages", languages],
    ["architecture", shape ? `${arch.kind}: ${shape}` : arch.kind],
    ["parameters", params && `${params} (${info.parameters.toLocaleString("en")})`],
    ["vocabulary", vocab.joint ? `${vocab.source} subwords, joint` : `${vocab.source} source, ${vocab.target} target`],
    ["training step", info.step === null ? null : info.step + (info.epoch === null ? "" : ` (epoch ${info.epoch})`)],
    ["validation BLEU", info.valid_bleu === null ? null : info.valid_bleu.toFixed(2)],
    ["decoding", `beam ${info.decode.beam}, length penalty alpha ${info.decode.alpha}`],
    ["attention", info.attention.map((k) => KIND_NAMES[k]).join(", ") || "none (an export has no maps)"],
    ["device", info.device],
  ];
  const items = rows.flatMap(([k, v]) => [el("dt", {textContent: k}), el("dd", {textContent: v ?? "–"})]);
  $("facts-list").replaceChildren(...items);
  $("model-line").textContent = [arch.kind, languages, params && `${params} parameters`].filter(Boolean).join(", ");
}

function fillNbest(nbest = $("nbest").value) {
  fillSelect($("nbest"), range(1, Number($("beam").value)), nbest);
}

// Before the first translation: a sentence (the example, or a share link's) ready to translate, and what to do.
function showEmptyState(text) {
  const {source, target} = state.info.languages;
  const [from, to] = source ? [languageName(source), languageName(target)]
    : ["the source language", "the target language"];  // an export that does not name them
  $("text").placeholder = `Type or paste a sentence in ${from}, then Enter`;
  $("text").value = text;
  $("text").select();  // typing replaces it
  $("hint").textContent = text
    ? `Press Translate (or Enter) to translate the sentence above into ${to}, or type your own in ${from}.`
    : `Type a sentence in ${from} above, then press Translate (or Enter) to translate it into ${to}.`;
}

async function init() {
  try {
    state.info = await api("/api/info");
  } catch (e) {
    setStatus(`cannot reach the server: ${e.message}`, true);
    return;
  }
  showFacts(state.info);
  $("history-link").hidden = !state.info.history;  // the run's attention over training, where it recorded it
  document.body.classList.toggle("no-maps", !state.info.attention.length);  // an export: translations only
  const params = new URLSearchParams(location.search);  // a share link: every setting of the page
  const {limits, decode} = state.info;
  fillSelect($("beam"), range(1, Math.min(limits.max_beam, Math.max(12, decode.beam))), params.get("beam"), String,
             decode.beam);
  fillNbest(params.get("nbest"));
  fillView({kind: params.get("kind"), layer: params.get("layer"), head: params.get("head")});
  drawMaps();
  $("text").maxLength = Math.min(state.info.limits.max_chars, state.info.limits.max_attention_chars);
  $("beam").addEventListener("change", () => fillNbest());
  $("form").addEventListener("submit", (e) => { e.preventDefault(); translate(); });
  $("text").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); translate(); }
  });
  $("kind").addEventListener("change", () => { fillView(); drawMaps(); });
  for (const id of ["layer", "head"]) $(id).addEventListener("change", drawMaps);
  document.addEventListener("mouseover", onHover);
  for (const type of ["mouseover", "mouseout", "click"]) $("nbest-list").addEventListener(type, onWord);
  showEmptyState(params.get("text") || exampleSentence(state.info));
  document.body.dataset.ready = "";  // for tests: the controls are filled
  if (params.get("text")) translate();
}

// ---- translation ----

async function translate() {
  const text = $("text").value.replace(/\s+/g, " ").trim();
  if (!text) { setStatus("Type a sentence first."); return; }
  const beam = Number($("beam").value), nbest = Number($("nbest").value);
  const id = ++state.request;
  setStatus("translating…");
  $("go").disabled = true;
  try {
    const maps = state.info.attention.length > 0;
    const growing = (event) => { if (id === state.request) showProgress(event); };
    // with weights, the answer's word links too (`align`: they come with the stream's last event)
    const [tr, att] = await Promise.all([
      streamed({texts: [text], beam, nbest}, growing, {align: maps}), maps ? api("/api/attention", {text, beam}) : null]);
    if (id !== state.request) return;  // a newer request is on its way
    showNbest(tr.results[0]);
    state.shown = {text, beam, nbest};
    if (maps) {
      state.att = att;
      state.hover = null;
      insideReset();  // inside.js: an explanation of the last sentence no longer matches
      showTokens();
      fillView();
    }
    drawMaps();
    setStatus("");
    document.body.dataset.translations = String(++state.translations);  // for tests: a render finished
  } catch (e) {
    if (id === state.request) setStatus(e.message, true);
  } finally {
    if (id === state.request) $("go").disabled = false;
  }
}

// /api/translate with "stream": true: each server-sent event goes to `onEvent` as it arrives (the translation
// growing token by token, or beam hypotheses as they finish); resolves to the answer of the final `done` event.
async function streamed(body, onEvent, extra = {}) {
  const response = await fetch("/api/translate", {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({...body, ...extra, stream: true}),
  });
  if (!response.ok) {
    const data = await response.json().catch(() => ({}));
    throw new Error(data.error || `HTTP ${response.status}`);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) throw new Error("the server closed the stream early");
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const name = block.match(/^event: (.*)$/m)[1], data = JSON.parse(block.match(/^data: (.*)$/m)[1]);
      if (name === "done") return data;
      if (name === "error") throw new Error(data.error);
      onEvent({name, ...data});
    }
  }
}

// While decoding: greedy shows the translation so far, beam search the hypotheses finished so far.
function showProgress(event) {
  if (event.index !== 0 || event.name === "result") return;
  const list = $("nbest-list");
  if (list.dataset.growing !== String(state.request)) {
    list.replaceChildren();
    list.dataset.growing = String(state.request);
  }
  list.dataset.events = String(Number(list.dataset.events || 0) + 1);  // for tests: the stream was shown
  const text = event.name === "token" ? event.text : event.hypothesis.text;
  const item = el("li", {className: "growing"}, [el("span", {className: "hyp", textContent: text}),
    el("span", {className: "score", textContent: event.name === "token" ? "decoding…" : "finished hypothesis"})]);
  if (event.name === "token") list.replaceChildren(item); else list.append(item);
}

// The hypotheses; with word links (`alignment`, Pharaoh i-j), the source's words above them, and each output
// word lights up the source words it links to when hovered, or until clicked again when clicked.
function showNbest({source, hypotheses}) {
  const linked = hypotheses.some((h) => h.alignment != null);
  $("source-words").replaceChildren(...(linked ? spaced(words(source).map((w) => el("span", {className: "word",
    textContent: w}))) : []));
  $("source-words").hidden = !linked;
  state.pinned = null;
  $("nbest-list").replaceChildren(...hypotheses.map((h) => el("li", {}, [
    h.alignment == null ? el("span", {className: "hyp", textContent: h.text || "(empty)"})
      : el("span", {className: "hyp"}, spaced(linkedWords(h))),
    el("span", {className: "score", textContent: `score ${h.score.toFixed(3)} · log P ${h.log_prob.toFixed(3)}`}),
  ])));
}

function words(text) {
  return text.split(/\s+/).filter(Boolean);
}

function spaced(nodes) {
  return nodes.flatMap((node, i) => (i ? [" ", node] : [node]));
}

// A hypothesis's words, each with the source words it links to (data-links: their indexes).
function linkedWords(h) {
  const links = h.alignment.split(" ").filter(Boolean).map((link) => link.split("-").map(Number));
  return words(h.text).map((w, j) => {
    const node = el("span", {className: "word", textContent: w});
    node.dataset.links = links.filter(([, t]) => t === j).map(([s]) => s).join(" ");
    return node;
  });
}

// The source words `word` (an output word, or null: none) links to, lit, and the word itself.
function lightLinks(word) {
  const on = new Set(word ? words(word.dataset.links).map(Number) : []);
  $("source-words").querySelectorAll(".word").forEach((n, i) => n.classList.toggle("linked", on.has(i)));
  $("nbest-list").querySelectorAll(".word").forEach((n) => n.classList.toggle("linked", n === word));
}

function onWord(e) {
  const word = e.target.closest ? e.target.closest("#nbest-list .word[data-links]") : null;
  if (e.type === "click" && word) state.pinned = state.pinned === word ? null : word;
  lightLinks(e.type === "mouseover" && word ? word : state.pinned);
}

function tokenNode(tag, token, side, index, className) {
  const node = el(tag, {className, textContent: token});
  if (index >= 0) Object.assign(node.dataset, {side, index});
  return node;
}

function showTokens() {
  $("src-tokens").replaceChildren(...state.att.source_tokens.map((t, i) => tokenNode("span", t, "src", i, "tok")));
  $("tgt-tokens").replaceChildren(...state.att.target_tokens.map((t, i) => tokenNode("span", t, "tgt", i, "tok")));
}

// ---- attention maps ----

// The layers and heads of a kind: from the maps once there are some, before that from the model's shape.
function shapeOf(kind) {
  if (state.att) return {layers: state.att[kind].length, heads: state.att[kind][0].length};
  const arch = state.info.architecture;
  return arch.kind === "transformer" ? {layers: arch.n_layers, heads: arch.n_heads} : {layers: 1, heads: 1};
}

// The kind, layer and head menus; `view` (from a share link) picks values, else the current ones stay.
function fillView(view = {}) {
  const kinds = state.att ? Object.keys(KIND_NAMES).filter((k) => state.att[k].length) : state.info.attention;
  fillSelect($("kind"), kinds, view.kind || $("kind").value, (k) => KIND_NAMES[k], "cross");
  const {layers, heads} = shapeOf($("kind").value);
  fillSelect($("layer"), range(1, layers), view.layer || $("layer").value);
  fillSelect($("head"), [...range(1, heads), "all"], view.head || $("head").value,
             (h) => (h === "all" ? "all (grid)" : h));
}

// A link that opens the page as it is: the sentence and search translated, the map chosen.
function updateLink() {
  if (!state.shown) return;
  const {text, beam, nbest} = state.shown;
  const view = state.info.attention.length ? {kind: $("kind").value, layer: $("layer").value, head: $("head").value}
    : {};
  const link = "?" + new URLSearchParams({text, beam, nbest, ...view});
  history.replaceState(null, "", link);
  $("share").href = link;
  $("share").hidden = false;
}

// The tokens on each axis of a kind, and how a position maps to a token: decoder self-attention's
// keys are <s> and the prediction, so key j is target token j - 1 (key 0, <s>, has no chip).
function axesOf(kind) {
  const att = state.att;
  const src = {tokens: att.source_tokens, side: "src", shift: 0};
  const tgt = {tokens: att.target_tokens, side: "tgt", shift: 0};
  if (kind === "encoder_self") return {queries: src, keys: src};
  if (kind === "cross") return {queries: tgt, keys: src};
  return {queries: tgt, keys: {tokens: att.target_input_tokens, side: "tgt", shift: -1}};
}

function selection() {
  const kind = $("kind").value, layer = Number($("layer").value), head = $("head").value;
  const weights = state.att[kind][layer - 1];  // [head][query][key]
  const heads = head === "all" ? weights.map((_, h) => h) : [Number(head) - 1];
  return {kind, layer, head, weights, heads, axes: axesOf(kind)};
}

function color(x) {
  const t = Math.min(Math.max(x, 0), 1) * (VIRIDIS.length - 1), i = Math.min(Math.floor(t), VIRIDIS.length - 2);
  const [a, b] = [VIRIDIS[i], VIRIDIS[i + 1]];
  return `rgb(${a.map((v, c) => Math.round(v + (b[c] - v) * (t - i))).join(",")})`;
}

function drawMaps() {
  $("explain").textContent = EXPLAIN[$("kind").value] || "";
  updateLink();
  if (!state.att) return;
  const sel = selection();
  let max = 1e-9;
  for (const h of sel.heads) for (const row of sel.weights[h]) for (const x of row) max = Math.max(max, x);
  const grid = sel.head === "all";
  const tables = sel.heads.map((h) => heatmap(sel.weights[h], sel.axes, max, grid ? h : null));
  tables.forEach((table, i) => { table.dataset.head = sel.heads[i] + 1; });  // for a click: which head
  $("heatmaps").replaceChildren(...tables);
  $("heatmaps").classList.toggle("grid", grid);
  $("heatmaps").dataset.map = `${sel.kind}/${sel.layer}/${sel.head}`;
  $("legend").replaceChildren(el("span", {textContent: "0"}), el("span", {className: "ramp"}),
                              el("span", {textContent: max.toFixed(2)}));
  applyHover();
  markPicked();  // inside.js: the query whose steps are shown
}

function heatmap(w, axes, max, head) {
  const table = el("table", {className: "heatmap"});
  if (head !== null) table.append(el("caption", {textContent: `head ${head + 1}`}));
  const top = el("tr", {}, [el("th")]);
  axes.keys.tokens.forEach((t, j) => top.append(tokenNode("th", t, axes.keys.side, j + axes.keys.shift, "col")));
  const body = el("tbody");
  w.forEach((row, i) => {
    const q = axes.queries.tokens[i];
    const tr = el("tr", {}, [tokenNode("th", q, axes.queries.side, i + axes.queries.shift, "row")]);
    row.forEach((x, j) => {
      const td = el("td", {title: `${q} → ${axes.keys.tokens[j]}: ${x.toFixed(3)}`});
      td.style.backgroundColor = color(x / max);
      Object.assign(td.dataset, {q: i, k: j});
      tr.append(td);
    });
    body.append(tr);
  });
  table.append(el("thead", {}, [top]), body);
  return table;
}

// ---- hover: what a token attends to (row, blue) and what attends to it (column, orange) ----

function onHover(e) {
  const target = e.target.closest("[data-side], td[data-q]");
  const hover = !target ? null : target.dataset.side
    ? {side: target.dataset.side, index: Number(target.dataset.index)}
    : {q: Number(target.dataset.q), k: Number(target.dataset.k)};
  if (JSON.stringify(hover) === JSON.stringify(state.hover)) return;
  state.hover = hover;
  applyHover();
}

function meanOverHeads(sel, i, j) {
  return sel.heads.reduce((s, h) => s + sel.weights[h][i][j], 0) / sel.heads.length;
}

function tint(side, index, prop, value) {
  for (const node of document.querySelectorAll(`[data-side="${side}"][data-index="${index}"]`)) {
    node.style.setProperty(prop, value);
  }
}

function applyHover() {
  for (const node of document.querySelectorAll(".hl-row, .hl-col, .focus, .hovered")) {
    node.classList.remove("hl-row", "hl-col", "focus", "hovered");
  }
  for (const node of document.querySelectorAll("[data-side]")) {
    node.style.removeProperty("--to");
    node.style.removeProperty("--from");
  }
  const hover = state.hover;
  if (!hover || !state.att) return;
  const sel = selection(), {queries, keys} = sel.axes;
  let row = hover.q, col = hover.k;  // a cell: its query and key
  if (hover.side !== undefined) {
    for (const n of document.querySelectorAll(`[data-side="${hover.side}"][data-index="${hover.index}"]`)) {
      n.classList.add("hovered");
    }
    row = hover.side === queries.side ? hover.index - queries.shift : undefined;
    col = hover.side === keys.side ? hover.index - keys.shift : undefined;
    if (row !== undefined && !(row >= 0 && row < queries.tokens.length)) row = undefined;
    if (col !== undefined && !(col >= 0 && col < keys.tokens.length)) col = undefined;
  }
  for (const table of document.querySelectorAll("#heatmaps table")) {
    table.classList.add("focus");
    if (row !== undefined) table.tBodies[0].rows[row].classList.add("hl-row");
    if (col !== undefined) for (const tr of table.tBodies[0].rows) tr.cells[col + 1].classList.add("hl-col");
  }
  if (row !== undefined) {  // what it attends to: the keys, by its row's weights
    const w = keys.tokens.map((_, j) => meanOverHeads(sel, row, j)), top = Math.max(...w) || 1;
    w.forEach((x, j) => tint(keys.side, j + keys.shift, "--to", (x / top).toFixed(3)));
  }
  if (col !== undefined) {  // what attends to it: the queries, by its column's weights
    const w = queries.tokens.map((_, i) => meanOverHeads(sel, i, col)), top = Math.max(...w) || 1;
    w.forEach((x, i) => tint(queries.side, i + queries.shift, "--from", (x / top).toFixed(3)));
  }
}

init();
