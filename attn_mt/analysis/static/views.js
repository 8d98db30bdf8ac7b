"use strict";
// attn-mt's views, drawn with the DOM alone from plain JSON (no libraries, nothing fetched): the five steps of
// one head for one query (drawSteps: `attn-mt serve`'s inside view and the notebook's explanation), and the
// head view of a sentence's attention maps (headView: notebooks and saved pages). Every view draws inside the
// root element it is given and looks up nothing outside it, so several views share a page without clashing.
// The page loads this file as /static/analysis/views.js; analysis/views.py inlines it into each view's HTML.

const attnMtViews = (() => {
  const KIND_NAMES = {
    encoder_self: "encoder self-attention", decoder_self: "decoder self-attention", cross: "cross-attention",
  };
  const AXES = {
    encoder_self: "Left: each source token (query). Right: the source tokens it attends to.",
    decoder_self: "Left: the target token being predicted. Right: the target tokens already there (<s> first).",
    cross: "Left: the target token being predicted. Right: the source tokens it attends to.",
  };
  const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const HEAD_COLORS = ["#2f6fb3", "#d9541e", "#2e8b57", "#8e44ad", "#c0392b", "#16a0a0", "#b8860b", "#e377c2"];
  const SVG = "http://www.w3.org/2000/svg";  // the SVG namespace: a name, never fetched

  function el(tag, props = {}, children = []) {
    const node = Object.assign(document.createElement(tag), props);
    node.append(...children);
    return node;
  }

  function svg(tag, attrs = {}, children = []) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    node.append(...children);
    return node;
  }

  function color(x) {  // viridis at x in [0, 1]
    const t = Math.min(Math.max(x, 0), 1) * (VIRIDIS.length - 1), i = Math.min(Math.floor(t), VIRIDIS.length - 2);
    const [a, b] = [VIRIDIS[i], VIRIDIS[i + 1]];
    return `rgb(${a.map((v, c) => Math.round(v + (b[c] - v) * (t - i))).join(",")})`;
  }

  function most(xs) {  // the largest of many numbers (Math.max(...xs) overflows the stack for a long sentence's map)
    let top = -Infinity;
    for (const x of xs) if (x > top) top = x;
    return top;
  }

  function norm(xs) {
    return Math.sqrt(xs.reduce((s, x) => s + x * x, 0));
  }

  function fmt(x, digits = 3) {
    return Math.abs(x) >= 1e4 || (x !== 0 && Math.abs(x) < 1e-3) ? x.toExponential(1) : x.toFixed(digits);
  }

  // ---- the five steps of one head for one query (an Explanation as JSON, as /api/explain answers) ----

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

  // A token quoted as Python's repr quotes it, so that the page names a query as `attn-mt explain` prints it.
  function quoted(t) {
    const q = t.includes("'") && !t.includes('"') ? '"' : "'";
    return q + t.replaceAll("\\", "\\\\").replaceAll(q, "\\" + q) + q;
  }

  // explanation.py's query_name: a decoder query is named by the token it predicts, then the token it reads.
  function stepsTitle(e) {
    const query = e.kind === "encoder_self" ? `query ${e.query_index} ${quoted(e.query_token)}`
      : `query ${e.query_index} predicts ${quoted(e.query_token)} (it reads ${quoted(e.query_input)})`;
    return `${KIND_NAMES[e.kind]}, layer ${e.layer}, head ${e.head} of ${e.n_heads}: ${query}`;
  }

  // The steps as <li> elements: 1 project, 2-4 score, scale, mask and softmax, 5 mix the values, W_o.
  function drawSteps(e) {
    const maskName = e.kind === "decoder_self" ? "future" : "padding";
    const context = {encoder_self: "the source positions (x itself)", decoder_self: "the target positions (x itself)",
                     cross: "the encoder's output"}[e.kind];
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
    return [
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
    ];
  }

  // A notebook's explanation: the sentence, then the steps.
  function explanationView(root, e) {
    root.replaceChildren(
      el("h2", {className: "title", textContent: stepsTitle(e)}),
      el("p", {className: "sentence"}, [el("span", {className: "side", textContent: "source"}), e.source]),
      el("p", {className: "sentence"}, [el("span", {className: "side", textContent: "translation"}), e.translation]),
      el("ol", {className: "steps"}, drawSteps(e)));
    root.dataset.shown = `${e.kind}/${e.layer}/${e.head}/${e.query_index}`;
  }

  // ---- the head view: every map of a sentence; pick kind, layer and head, point at a token ----

  const ROW = 18;  // px per token in the lines picture

  function select(label, values, names) {
    const node = el("select", {}, values.map((v, i) => el("option", {value: String(v), textContent: names[i]})));
    node.dataset.control = label;
    return el("label", {}, [`${label} `, node]);
  }

  // data: {source (or null), translation, maps: [{kind, layer, queries, keys, permille: [head][query][key]}]}
  function headView(root, data) {
    for (const m of data.maps) m.weights = m.permille.map((head) => head.map((row) => row.map((x) => x / 1000)));
    const kinds = Object.keys(KIND_NAMES).filter((k) => data.maps.some((m) => m.kind === k));
    const nHeads = Math.max(...data.maps.map((m) => m.weights.length));
    const controls = el("div", {className: "controls"}, [
      select("kind", kinds, kinds.map((k) => KIND_NAMES[k])),
      select("layer", [], []),
      select("head", [...Array.from({length: nHeads}, (_, h) => h + 1), "all"],
             [...Array.from({length: nHeads}, (_, h) => String(h + 1)), "all"]),
      el("span", {className: "hint", textContent: "hover or click a token; click it again to let go"}),
    ]);
    const axes = el("p", {className: "axes"});
    const lines = el("div", {className: "lines"});
    const maps = el("div", {className: "maps"});
    root.replaceChildren(
      el("h2", {className: "title", textContent: "Attention"}),
      ...(data.source === null ? [] : [
        el("p", {className: "sentence"}, [el("span", {className: "side", textContent: "source"}), data.source])]),
      el("p", {className: "sentence"}, [el("span", {className: "side", textContent: "translation"}), data.translation]),
      controls, axes, el("div", {className: "panes"}, [lines, maps]));
    const ctl = (name) => root.querySelector(`select[data-control="${name}"]`);
    const view = {pinned: null, hover: null};
    if (kinds.includes("cross")) ctl("kind").value = "cross";  // as the serve page: where translation looks

    function current() {
      const kind = ctl("kind").value, layer = Number(ctl("layer").value);
      const map = data.maps.find((m) => m.kind === kind && m.layer === layer);
      const head = ctl("head").value;
      return {map, heads: head === "all" ? map.weights.map((_, h) => h) : [Number(head) - 1], head};
    }

    function fillLayers() {
      const kind = ctl("kind").value, keep = ctl("layer").value;
      const layers = data.maps.filter((m) => m.kind === kind).map((m) => m.layer);
      ctl("layer").replaceChildren(...layers.map((l) => el("option", {value: String(l), textContent: String(l)})));
      ctl("layer").value = layers.map(String).includes(keep) ? keep : String(layers[0]);
    }

    // The picture: query tokens left, key tokens right, a line per (query, key) as strong as its weight; with a
    // token picked, only its lines, and the tokens on the other side shaded by their weight.
    function drawLines({map, heads}) {
      const pick = view.hover || view.pinned;
      const width = 380, left = 150, right = 230, n = Math.max(map.queries.length, map.keys.length);
      const height = n * ROW + 8;
      const shade = {q: map.queries.map(() => 0), k: map.keys.map(() => 0)};  // the mean weight over the heads
      const links = [];  // [query, key, weight, head]
      for (const h of heads) {
        map.weights[h].forEach((row, q) => row.forEach((x, k) => {
          if (pick && !(pick.side === "q" ? q === pick.index : k === pick.index)) return;
          if (pick) shade[pick.side === "q" ? "k" : "q"][pick.side === "q" ? k : q] += x / heads.length;
          links.push([q, k, x, h]);
        }));
      }
      // with a token picked, its strongest line and the most shaded token are full strength
      const top = pick ? most(links.map((l) => l[2])) || 1 : 1 / 0.7;
      const topShade = Math.max(...shade.q, ...shade.k) || 1;
      const parts = links.filter(([, , x]) => x >= 0.01).map(([q, k, x, h]) => svg("line", {
        x1: left + 4, y1: q * ROW + ROW / 2 + 4, x2: right - 4, y2: k * ROW + ROW / 2 + 4,
        stroke: heads.length > 1 ? HEAD_COLORS[h % HEAD_COLORS.length] : HEAD_COLORS[0],
        "stroke-width": pick ? 2.5 : 1.5, "stroke-opacity": ((pick ? 0.1 : 0) + 0.9 * x / top).toFixed(3)}));
      const tokens = (side, list, x, anchor) => list.map((t, i) => {
        const picked = pick && pick.side === side && pick.index === i;
        const g = svg("g", {class: `tok${picked ? " picked" : ""}`, "data-side": side, "data-index": i}, [
          svg("rect", {x: anchor === "end" ? x - 140 : x, y: i * ROW + 5, width: 140, height: ROW - 2, rx: 3,
                       fill: `rgba(47, 111, 179, ${(0.75 * shade[side][i] / topShade).toFixed(3)})`}),
          svg("text", {x: anchor === "end" ? x - 4 : x + 4, y: i * ROW + ROW / 2 + 8, "text-anchor": anchor},
              [t.length > 16 ? `${t.slice(0, 15)}…` : t])]);
        g.append(svg("title", {}, [`${side === "q" ? "query" : "key"} ${i}: ${t}`]));
        if (pick) g.dataset.shade = shade[side][i].toFixed(4);
        return g;
      });
      lines.replaceChildren(svg("svg", {width, height, viewBox: `0 0 ${width} ${height}`}, [
        ...parts, ...tokens("q", map.queries, left, "end"), ...tokens("k", map.keys, right, "start")]));
    }

    // A heat map per head shown: rows the queries, columns the keys; one colour scale for the layer's heads.
    function drawMaps({map, heads}) {
      const top = most(map.weights.flat(2)) || 1;
      maps.classList.toggle("small", heads.length > 1);
      maps.replaceChildren(...heads.map((h) => {
        const head = el("tr", {}, [el("th"), ...map.keys.map((t, k) => el("th", {className: "col", textContent: t,
                                                                                 title: `key ${k}`}))]);
        const rows = map.weights[h].map((row, q) => el("tr", {}, [
          el("th", {className: "row", textContent: map.queries[q], title: `query ${q}`}),
          ...row.map((x, k) => {
            const cell = el("td", {title: `${map.queries[q]} → ${map.keys[k]}: ${x.toFixed(3)}`});
            Object.assign(cell.dataset, {q, k});
            cell.style.backgroundColor = color(x / top);
            return cell;
          })]));
        const caption = el("caption", {textContent: `head ${h + 1}`});
        if (heads.length > 1) caption.style.color = HEAD_COLORS[h % HEAD_COLORS.length];  // as its lines
        const table = el("table", {className: "heatmap"}, [caption, el("thead", {}, [head]), el("tbody", {}, rows)]);
        table.dataset.head = h + 1;
        return table;
      }));
    }

    // The picked token's row (a query) or column (a key) in every heat map shown.
    function markMaps(pick) {
      for (const node of maps.querySelectorAll(".picked")) node.classList.remove("picked");
      if (!pick) return;
      const which = pick.side === "q" ? `tbody tr:nth-child(${pick.index + 1})` : `td[data-k="${pick.index}"]`;
      for (const node of maps.querySelectorAll(which)) node.classList.add("picked");
    }

    // Everything after a selector changed; only the lines and the marks when a token is pointed at.
    function draw(full = true) {
      const now = current();
      if (full) {
        axes.textContent = `${KIND_NAMES[now.map.kind]}, layer ${now.map.layer}. ${AXES[now.map.kind]}`;
        drawMaps(now);
        root.dataset.shown = `${now.map.kind}/${now.map.layer}/${now.head}`;
      }
      drawLines(now);
      markMaps(view.hover || view.pinned);
      root.dataset.picked = view.pinned ? `${view.pinned.side}${view.pinned.index}` : "";
    }

    function pointed(target) {  // the token a pointer is on: a token of the picture or a heat map's row or cell
      const tok = target.closest(".tok");
      if (tok) return {side: tok.dataset.side, index: Number(tok.dataset.index)};
      const cell = target.closest("td[data-q]");
      if (cell) return {side: "q", index: Number(cell.dataset.q)};
      const row = target.closest("th.row");
      if (row) return {side: "q", index: row.parentElement.rowIndex - 1};
      return null;
    }

    const same = (a, b) => a && b && a.side === b.side && a.index === b.index;
    root.addEventListener("change", (e) => {
      if (e.target.dataset.control === "kind") {
        fillLayers();
        view.pinned = null;
      }
      draw();
    });
    root.addEventListener("click", (e) => {
      const p = pointed(e.target);
      if (!p && !e.target.closest(".lines, .maps")) return;
      view.pinned = p && !same(p, view.pinned) ? p : null;  // a second click lets go
      view.hover = null;
      draw(false);
    });
    root.addEventListener("mouseover", (e) => {
      const p = pointed(e.target);
      if (same(p, view.hover) || (!p && !view.hover)) return;
      view.hover = p;
      draw(false);
    });
    root.addEventListener("mouseleave", () => {
      view.hover = null;
      draw(false);
    });
    fillLayers();
    draw();
  }

  return {KIND_NAMES, color, fmt, stepsTitle, drawSteps, explanationView, headView};
})();
