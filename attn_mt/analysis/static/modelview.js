// attn-mt's model view (analysis/modelview.py): every chosen layer and head of one sentence's attention, one small
// map each on one colour scale (viridis, 0 to 1, its legend below), drawn on canvases. Tick boxes choose the kinds
// and heads shown; pointing at a map says which query, key and weight are under the pointer; clicking a map opens
// it large with its tokens, and "numbers" writes each weight in its cell. Nothing is fetched; the data comes in
// the view's JSON (weights as integers per mille). Without scripts the PNG of the same maps stays in its place.
const attnMtViews = (() => {
  "use strict";
  const VIRIDIS = [[68, 1, 84], [72, 40, 120], [62, 74, 137], [49, 104, 142], [38, 130, 142], [31, 158, 137],
                   [53, 183, 121], [109, 205, 89], [180, 222, 44], [253, 231, 37]];

  function color(x) {  // viridis at x in [0, 1]
    const t = Math.min(Math.max(x, 0), 1) * (VIRIDIS.length - 1);
    const i = Math.min(Math.floor(t), VIRIDIS.length - 2), f = t - i;
    const c = VIRIDIS[i].map((a, j) => Math.round(a + (VIRIDIS[i + 1][j] - a) * f));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }

  function el(tag, props = {}, children = []) {
    const node = Object.assign(document.createElement(tag), props);
    for (const child of children) node.append(child);
    return node;
  }

  function check(label, on, change) {
    const box = el("input", {type: "checkbox", checked: on});
    box.addEventListener("change", change);
    return [el("label", {}, [box, " " + label]), box];
  }

  function legend(ticks) {  // a colour bar with the scale's numbers under it
    const width = 240, bar = el("canvas", {width, height: 12, className: "mv-bar"});
    const ctx = bar.getContext("2d");
    for (let x = 0; x < width; x++) {
      ctx.fillStyle = color(x / (width - 1));
      ctx.fillRect(x, 0, 1, 12);
    }
    const marks = el("div", {className: "mv-ticks"}, ticks.map((t) => {
      const s = el("span", {textContent: String(t)});
      s.style.left = `${(t * 100).toFixed(1)}%`;
      return s;
    }));
    return el("div", {className: "mv-legend"}, [el("span", {textContent: "attention weight "}),
                                                el("div", {className: "mv-scale"}, [bar, marks])]);
  }

  function drawMap(canvas, w, px) {  // w: (Tq, Tk) per mille
    const ctx = canvas.getContext("2d");
    w.forEach((row, q) => row.forEach((x, k) => {
      ctx.fillStyle = color(x / 1000);
      ctx.fillRect(k * px, q * px, px, px);
    }));
  }

  function large(map, h, numbers) {  // one head's map as a table: tokens on both axes, weights on demand
    const w = map.permille[h - 1];
    const head = el("tr", {}, [el("th"), ...map.keys.map((k) => el("th", {className: "mv-key", textContent: k}))]);
    const rows = w.map((row, q) => el("tr", {}, [el("th", {textContent: map.queries[q]}), ...row.map((x, k) => {
      const cell = el("td", {title: `${map.queries[q]} → ${map.keys[k]}: ${(x / 1000).toFixed(3)}`,
                             textContent: numbers ? (x / 1000).toFixed(2).replace(/^0/, "") : ""});
      cell.style.background = color(x / 1000);
      cell.style.color = x > 600 ? "#1d2330" : "#fff";
      return cell;
    })]));
    return el("div", {className: "mv-large"}, [
      el("p", {className: "mv-title", textContent: `${map.kind} ${map.layer}.${h} (rows: queries, columns: keys)`}),
      el("table", {className: "mv-table"}, [el("thead", {}, [head]), el("tbody", {}, rows)])]);
  }

  function modelView(root, data) {
    const picture = root.querySelector(".mv-static");
    if (picture) picture.style.display = "none";  // scripts run: the canvases replace the picture
    const kinds = [...new Set(data.maps.map((m) => m.kind))];
    const heads = [...new Set(data.maps.flatMap((m) => m.heads))].sort((a, b) => a - b);
    const shown = {kinds: new Set(kinds), heads: new Set(heads)};
    let focus = null, numbers = false;
    const grid = el("div", {className: "mv-grid"});
    const tip = el("div", {className: "mv-tip", textContent: "point at a map for its numbers; click it to open it"});
    const detail = el("div", {className: "mv-detail"});

    function redraw() {
      grid.replaceChildren();
      const longest = Math.max(...data.maps.map((m) => Math.max(m.queries.length, m.keys.length)));
      const px = Math.max(2, Math.min(8, Math.floor(120 / longest)));
      for (const map of data.maps.filter((m) => shown.kinds.has(m.kind))) {
        const row = el("div", {className: "mv-row"}, [el("div", {className: "mv-label",
                                                              textContent: `${map.kind} ${map.layer}`})]);
        for (const h of map.heads.filter((x) => shown.heads.has(x))) {
          const canvas = el("canvas", {width: map.keys.length * px, height: map.queries.length * px});
          canvas.dataset.kind = map.kind;
          canvas.dataset.layer = map.layer;
          canvas.dataset.head = h;
          drawMap(canvas, map.permille[h - 1], px);
          canvas.addEventListener("mousemove", (ev) => {
            const box = canvas.getBoundingClientRect();
            const k = Math.floor((ev.clientX - box.left) / (box.width / map.keys.length));
            const q = Math.floor((ev.clientY - box.top) / (box.height / map.queries.length));
            const x = (map.permille[h - 1][q] || [])[k];
            if (x === undefined) return;
            tip.textContent = `${map.kind} ${map.layer}.${h}: query ${q} ${map.queries[q]} → key ${k} ` +
                              `${map.keys[k]}: ${(x / 1000).toFixed(3)}`;
          });
          canvas.addEventListener("click", () => {
            focus = {map, h};
            showDetail();
          });
          row.append(el("figure", {className: "mv-cell"}, [canvas, el("figcaption", {textContent: `head ${h}`})]));
        }
        if (row.children.length > 1) grid.append(row);
      }
    }

    function showDetail() {
      detail.replaceChildren(...(focus ? [large(focus.map, focus.h, numbers)] : []));
    }

    const controls = el("div", {className: "mv-controls"});
    for (const kind of kinds) {
      const [label, box] = check(kind, true, () => {
        box.checked ? shown.kinds.add(kind) : shown.kinds.delete(kind);
        redraw();
      });
      box.dataset.kind = kind;
      controls.append(label);
    }
    controls.append(el("span", {className: "mv-sep", textContent: "|"}));
    for (const h of heads) {
      const [label, box] = check(`head ${h}`, true, () => {
        box.checked ? shown.heads.add(h) : shown.heads.delete(h);
        redraw();
      });
      box.dataset.head = h;
      controls.append(label);
    }
    controls.append(el("span", {className: "mv-sep", textContent: "|"}));
    const [numberLabel, numberBox] = check("numbers", false, () => {
      numbers = numberBox.checked;
      if (!focus) focus = {map: data.maps[data.maps.length - 1], h: data.maps[data.maps.length - 1].heads[0]};
      showDetail();
    });
    numberBox.dataset.numbers = "1";
    controls.append(numberLabel);
    root.append(controls, legend(data.ticks), grid, tip, detail);
    redraw();
  }

  return {modelView, color};
})();
