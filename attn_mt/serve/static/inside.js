"use strict";
// The inside view: one head's attention for one query token, step by step, as /api/explain recomputes it
// from the model's weights; above it, every layer x head's weights for that query (from the maps already on
// the page), each a button that opens it. Opened by clicking a heat map cell or row, or a query's token chip.
// Loaded before app.js, whose globals ($, el, api, state, color, axesOf, KIND_NAMES) it uses once the page runs;
// the steps are drawn by analysis/static/views.js (attnMtViews.drawSteps), as in a notebook's explanation.

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
    $("inside-title").textContent = attnMtViews.stepsTitle(e);
    $("inside-steps").replaceChildren(...attnMtViews.drawSteps(e));
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

document.addEventListener("click", onInsideClick);
