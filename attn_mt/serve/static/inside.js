"use strict";
// The inside view: one head's attention for one query token, step by step, as /api/explain recomputes it
// from the model's weights; above it, every layer x head's weights for that query (from the maps already on
// the page), each a button that opens it. Opened by clicking a heat map cell or row, or a query's token chip.
// Loaded before app.js, whose globals ($, el, api, state, color, axesOf, KIND_NAMES) it uses once the page runs.

const inside = {open: null, request: 0};  // open: {kind, layer, head, query} shown or on its way

function insideReset() {  // a new translation: the old explanation no longer matches
  inside.open = null;
  inside.request++;
  $("inside").hidden = true;
  delete $("inside").dataset.shown;
}

function onInsideClick(e) {
  if (!state.att || !state.shown) return;
  const target = e.target.closest("#heatmaps td[data-q], #heatmaps th.row, .chips [data-side], #inside-grid button");
  if (!target) return;
  const kind = $("kind").value;
  if (target.matches("#inside-grid button")) {
    const {layer, head} = target.dataset;
    openInside({...inside.open, layer: Number(layer), head: Number(head)});
    return;
  }
  let query, head = $("head").value === "all" ? 1 : Number($("head").value);
  if (target.closest("#heatmaps")) {
    const table = target.closest("table");
    head = Number(table.dataset.head);
    query = Number(target.closest("tr").querySelector("td").dataset.q);
  } else {  // a chip: only a query of this kind opens
    const {queries} = axesOf(kind);
    if (target.dataset.side !== queries.side) return;
    query = Number(target.dataset.index) - queries.shift;
  }
  openInside({kind, layer: Number($("layer").value), head, query});
}

// The open query's row in the heat map of its head, when the map shown is of its kind and layer.
function markPicked() {
  for (const row of document.querySelectorAll("#heatmaps tr.picked")) row.classList.remove("picked");
  const view = inside.open;
  if (!view || view.kind !== $("kind").value || view.layer !== Number($("layer").value)) return;
  const table = document.querySelector(`#heatmaps table[data-head="${view.head}"]`);
  if (table) table.tBodies[0].rows[view.query]?.classList.add("picked");
}

async function openInside(view) {
  inside.open = view;
  markPicked();
  const id = ++inside.request;
  const panel = $("inside");
  panel.hidden = false;
  $("inside-title").textContent = `${KIND_NAMES[view.kind]}, layer ${view.layer}, head ${view.head}`;
  $("inside-status").textContent = "recomputing…";
  drawGrid(view);
  try {
    const {text, beam} = state.shown;
    const e = await api("/api/explain", {text, beam, kind: view.kind, layer: view.layer, head: view.head,
                                         token: view.query});
    if (id !== inside.request) return;
    $("inside-status").textContent = "";
    drawSteps(e);
    panel.dataset.shown = `${view.kind}/${view.layer}/${view.head}/${view.query}`;  // for tests
  } catch (err) {
    if (id === inside.request) $("inside-status").textContent = err.message;
  }
}

// Every layer x head of the kind: this query's weights over the keys, a strip each; the open one framed.
function drawGrid(view) {
  const layers = state.att[view.kind], keys = axesOf(view.kind).keys.tokens;
  const head = el("tr", {}, [el("th"), ...layers[0].map((_, h) => el("th", {textContent: `head ${h + 1}`}))]);
  const rows = layers.map((heads, l) => el("tr", {}, [el("th", {textContent: `layer ${l + 1}`}), ...heads.map((w, h) => {
    const row = w[view.query], top = Math.max(...row) || 1;
    const strip = el("span", {className: "strip-mini"}, row.map((x, j) => {
      const cell = el("span", {title: `${keys[j]}: ${x.toFixed(3)}`});
      cell.style.backgroundColor = color(x / top);
      return cell;
    }));
    const open = l + 1 === view.layer && h + 1 === view.head;
    const button = el("button", {type: "button", className: open ? "open" : "",
                                 title: `open layer ${l + 1}, head ${h + 1}`}, [strip]);
    Object.assign(button.dataset, {layer: l + 1, head: h + 1});
    return el("td", {}, [button]);
  })]));
  $("inside-grid").replaceChildren(el("table", {}, [el("thead", {}, [head]), el("tbody", {}, rows)]));
}

function norm(xs) {
  return Math.sqrt(xs.reduce((s, x) => s + x * x, 0));
}

function fmt(x, digits = 3) {
  return Math.abs(x) >= 1e4 || (x !== 0 && Math.abs(x) < 1e-3) ? x.toExponential(1) : x.toFixed(digits);
}

// A vector as a row of cells: blue positive, red negative, by |x| / the largest |x|.
function vector(xs, label) {
  const top = Math.max(...xs.map(Math.abs)) || 1;
  const strip = el("span", {className: "vector", title: `${label}: ${xs.length} numbers`});
  strip.style.gridTemplateColumns = `repeat(${xs.length}, 1fr)`;
  strip.append(...xs.map((x) => {
    const cell = el("span", {title: fmt(x)});
    const a = Math.abs(x) / top;
    cell.style.backgroundColor = x >= 0 ? `rgba(47, 111, 179, ${a})` : `rgba(200, 60, 40, ${a})`;
    return cell;
  }));
  return el("div", {className: "vec"}, [el("span", {className: "vec-label", textContent: label}), strip,
                                       el("span", {className: "vec-norm", textContent: `|·| ${fmt(norm(xs))}`})]);
}

// A number with a bar: from the middle for signed values (scores), from the left for weights.
function bar(x, top, signed, masked = false) {
  const fill = el("span", {className: `fill ${x < 0 ? "neg" : ""}`});
  const share = Math.min(Math.abs(x) / (top || 1), 1) * (signed ? 50 : 100);
  fill.style.width = `${share}%`;
  if (signed) fill.style[x < 0 ? "right" : "left"] = "50%";
  return el("td", {className: masked ? "masked" : ""}, [
    el("span", {className: "num", textContent: fmt(x)}), el("span", {className: `bar ${signed ? "signed" : ""}`}, [fill])]);
}

function step(n, title, children) {
  return el("li", {className: "step"}, [el("h3", {}, [el("span", {className: "n", textContent: n}), title]),
                                         ...children]);
}

function drawSteps(e) {
  const maskName = e.kind === "decoder_self" ? "future" : "padding";
  const context = {encoder_self: "the source positions (x itself)", decoder_self: "the target positions (x itself)",
                   cross: "the encoder's output"}[e.kind];
  const reads = e.query_input === e.query_token ? "" : `, reading ${e.query_input}`;
  $("inside-title").textContent = `${KIND_NAMES[e.kind]}, layer ${e.layer}, head ${e.head}: query ${e.query_index} `
    + `${e.query_token}${reads}`;
  const top = (f) => Math.max(...e.keys.map((k) => Math.abs(k[f])));
  const [topScore, topScaled, topWeight] = [top("score"), top("scaled"), top("weight")];
  const rows = e.keys.map((k) => el("tr", {className: k.masked ? "masked" : ""}, [
    el("th", {textContent: k.token, title: `key ${k.index}`}),
    bar(k.score, topScore, true), bar(k.scaled, topScaled, true),
    k.masked ? el("td", {className: "mask-note", textContent: `masked (${maskName})`}) : bar(k.weight, topWeight, false),
  ]));
  const keyTable = el("table", {className: "keys"}, [
    el("thead", {}, [el("tr", {}, [el("th", {textContent: "key"}), el("th", {textContent: "2. q · k"}),
                                   el("th", {textContent: `3. ÷ √${e.d_k}`}), el("th", {textContent: "4. weight"})])]),
    el("tbody", {}, rows)]);
  const mix = e.keys.filter((k) => !k.masked).sort((a, b) => b.contribution - a.contribution).slice(0, 5);
  const topMix = mix.length ? mix[0].contribution : 1;
  const mixTable = el("table", {className: "keys mix"}, [
    el("thead", {}, [el("tr", {}, [el("th", {textContent: "key"}), el("th", {textContent: "weight"}),
                                   el("th", {textContent: "|v|"}), el("th", {textContent: "|weight · v|"})])]),
    el("tbody", {}, mix.map((k) => el("tr", {}, [
      el("th", {textContent: k.token}), el("td", {textContent: fmt(k.weight)}), el("td", {textContent: fmt(norm(e.v[k.index]))}),
      bar(k.contribution, topMix, false)])))]);
  const heads = e.head_outputs.map((o, h) => {
    const row = vector(o, `head ${h + 1}`);
    if (h + 1 === e.head) row.classList.add("this-head");
    return row;
  });
  const ok = e.max_abs_diff < 1e-4;
  $("inside-steps").replaceChildren(
    step("1", `Project: q = x W_q, k = c W_k, v = c W_v`, [
      el("p", {textContent: `d_model ${e.d_model} = ${e.n_heads} heads × d_k ${e.d_k}. x is the query's input; `
        + `c is ${context}. This head uses ${e.d_k} columns of each W.`}),
      vector(e.x, "x"), vector(e.q, "q")]),
    step("2–4", "Score every key, scale, mask, softmax", [
      el("p", {textContent: `q · k for every key, divided by √${e.d_k} = ${fmt(1 / e.scale, 2)}; masked keys `
        + `(${maskName}) get weight 0, and softmax makes the rest sum to 1.`}),
      el("div", {className: "scroll"}, [keyTable])]),
    step("5", "Mix the values: output = Σ weight · v", [
      el("p", {textContent: "The largest contributions to this head's output:"}),
      el("div", {className: "scroll"}, [mixTable]), vector(e.head_output, `head ${e.head}`)]),
    step("W_o", "Recombine the heads", [
      el("p", {textContent: `Every head's output for this query, concatenated (${e.n_heads} × ${e.d_k} = `
        + `${e.d_model}) and multiplied by W_o (+ b_o):`}),
      ...heads, vector(e.output, "recomputed"), vector(e.model_output, "the model's"),
      el("p", {className: `diff ${ok ? "ok" : "bad"}`,
               textContent: `max |recomputed − model| = ${e.max_abs_diff.toExponential(1)}`
                 + (ok ? ": the same numbers" : ": they differ")})]),
  );
}

document.addEventListener("click", onInsideClick);
