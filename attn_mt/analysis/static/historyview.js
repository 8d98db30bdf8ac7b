// attn-mt's history view (analysis/history_view.py): how a run's attention heads learned, step by step. A slider
// picks the evaluation step and a menu the probe sentence; a grid (rows: modules, columns: heads) shows each head's
// attention map at that step (viridis, 0 to 1; tokens on the axes where they fit) above its role curves over all
// steps (the step it takes its role ringed; entropy dashed, coreference black), and a chart above the grid the
// contrastive accuracy and BLEU, with the coreference and entropy steps. Clicking a chart picks its nearest step.
// Nothing is fetched; the data comes in the view's JSON (weights as bytes, base64). Without scripts the PNG stays.
const attnMtViews = (() => {
  "use strict";
  const VIRIDIS = [[68, 1, 84], [72, 40, 120], [62, 74, 137], [49, 104, 142], [38, 130, 142], [31, 158, 137],
                   [53, 183, 121], [109, 205, 89], [180, 222, 44], [253, 231, 37]];
  const INK = "#1d2330", MUTED = "#667085", LINE = "#d9dde5", ACCENT = "#2f6fb3", BLEU = "#d95f02";

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

  function decode(text) {  // base64 -> one byte a weight
    const raw = atob(text), out = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
    return out;
  }

  function short(token, n) {
    return token.length > n ? token.slice(0, n - 1) + "…" : token;
  }

  function layout(map) {  // cell size, and room for the tokens where the cells are large enough to name
    const longest = Math.max(map.queries.length, map.keys.length, 1);
    const px = Math.max(2, Math.min(14, Math.floor(200 / longest)));
    const room = px >= 8 ? 56 : 0;
    return {px, left: room, top: room, width: room + map.keys.length * px, height: room + map.queries.length * px};
  }

  function drawMap(canvas, map, bytes, e, h, heads) {  // step e, head h of (E, H, Q, K) bytes
    const Q = map.queries.length, K = map.keys.length, {px, left, top} = layout(map);
    const ctx = canvas.getContext("2d"), base = (e * heads + h) * Q * K;
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    for (let q = 0; q < Q; q++) {
      for (let k = 0; k < K; k++) {
        ctx.fillStyle = color(bytes[base + q * K + k] / 255);
        ctx.fillRect(left + k * px, top + q * px, px, px);
      }
    }
    if (!left) return;
    ctx.fillStyle = INK;
    ctx.font = `${Math.min(px - 1, 11)}px sans-serif`;
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    map.queries.forEach((t, q) => ctx.fillText(short(t, 9), left - 3, top + q * px + px / 2));
    ctx.textAlign = "left";
    map.keys.forEach((t, k) => {
      ctx.save();
      ctx.translate(left + k * px + px / 2, top - 3);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(short(t, 9), 0, 0);
      ctx.restore();
    });
  }

  // a line chart over the steps: series [{values, colour, dash, scale}], vertical marks [{step, colour, dash}],
  // dots [{step, value, colour}], the step shown (index `at`), y from lo to hi, `right`: a second axis's top
  function chart(canvas, steps, {series, marks = [], dots = [], at, lo = 0, hi = 1, right = null}) {
    const W = canvas.width, H = canvas.height, pad = {l: 26, r: right ? 30 : 6, t: 6, b: 14};
    const first = steps[0], span = (steps[steps.length - 1] - first) || 1;
    const x = (s) => pad.l + (s - first) / span * (W - pad.l - pad.r);
    const y = (v) => pad.t + (hi - v) / ((hi - lo) || 1) * (H - pad.t - pad.b);
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, W, H);
    ctx.strokeStyle = LINE;
    ctx.lineWidth = 1;
    ctx.setLineDash([]);
    ctx.strokeRect(pad.l + 0.5, pad.t + 0.5, W - pad.l - pad.r, H - pad.t - pad.b);
    ctx.fillStyle = MUTED;
    ctx.font = "9px sans-serif";
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    ctx.fillText(String(hi), pad.l - 3, y(hi));
    ctx.fillText(String(lo), pad.l - 3, y(lo));
    if (right) {
      ctx.textAlign = "left";
      ctx.fillText(right.top, W - pad.r + 3, y(hi));
      ctx.fillText(right.label, W - pad.r + 3, y((hi + lo) / 2));
    }
    ctx.textBaseline = "top";
    ctx.textAlign = "left";
    ctx.fillText(String(first), pad.l, H - pad.b + 2);
    ctx.textAlign = "right";
    ctx.fillText(String(steps[steps.length - 1]), W - pad.r, H - pad.b + 2);
    const vertical = (s, colour, dash, width) => {
      ctx.strokeStyle = colour;
      ctx.lineWidth = width;
      ctx.setLineDash(dash);
      ctx.beginPath();
      ctx.moveTo(x(s), pad.t);
      ctx.lineTo(x(s), H - pad.b);
      ctx.stroke();
    };
    vertical(steps[at], "rgba(47,111,179,0.35)", [], 3);
    for (const m of marks) vertical(m.step, m.colour, m.dash || [3, 3], 1);
    for (const s of series) {
      ctx.strokeStyle = s.colour;
      ctx.lineWidth = s.width || 1.5;
      ctx.setLineDash(s.dash || []);
      ctx.beginPath();
      let open = false;
      s.values.forEach((v, i) => {
        if (v === null) {
          open = false;
          return;
        }
        const px = x(steps[i]), py = y(v * (s.scale || 1));
        open ? ctx.lineTo(px, py) : ctx.moveTo(px, py);
        open = true;
      });
      ctx.stroke();
    }
    ctx.setLineDash([]);
    for (const d of dots) {
      ctx.fillStyle = d.colour;
      ctx.strokeStyle = INK;
      ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.arc(x(d.step), y(d.value), 3.5, 0, 2 * Math.PI);
      ctx.fill();
      ctx.stroke();
    }
  }

  function nearest(canvas, steps, ev, pad) {  // the index of the step under the pointer
    const box = canvas.getBoundingClientRect(), first = steps[0], span = (steps[steps.length - 1] - first) || 1;
    const s = first + (ev.clientX - box.left - pad.l) / (box.width - pad.l - pad.r) * span;
    let best = 0;
    steps.forEach((t, i) => { if (Math.abs(t - s) < Math.abs(steps[best] - s)) best = i; });
    return best;
  }

  function chip(colour, text, dash) {
    const swatch = el("span", {className: "hv-chip"});
    swatch.style.borderTop = `3px ${dash ? "dashed" : "solid"} ${colour}`;
    return el("span", {className: "hv-key"}, [swatch, text]);
  }

  function historyView(root, data) {
    const picture = root.querySelector(".hv-static");
    if (picture) picture.style.display = "none";  // scripts run: the drawings replace the picture
    const controls = root.querySelector(".hv-controls");
    controls.hidden = false;
    const slider = controls.querySelector(".hv-step"), menu = controls.querySelector(".hv-probe");
    const play = controls.querySelector(".hv-play"), at = controls.querySelector(".hv-at");
    const steps = data.steps, H = data.heads, roles = Object.keys(data.roles);
    const decoded = data.probes.map(() => null);  // a probe's weights, decoded when it is first shown
    const bytes = (p) => (decoded[p] = decoded[p] || data.probes[p].maps.map((m) => decode(m.bytes)));
    const tip = el("div", {className: "hv-tip", textContent: "point at a map for its numbers; click a chart to pick "
                                                             + "its nearest step"});
    const grid = el("table", {className: "hv-grid"});
    const cells = [];  // [module][head] -> {map, curve}
    const head = el("tr", {}, [el("th"), ...Array.from({length: H}, (_, h) => el("th", {textContent: `head ${h + 1}`}))]);
    grid.append(el("thead", {}, [head]));
    const body = el("tbody");
    data.modules.forEach((name, m) => {
      const row = el("tr", {}, [el("th", {className: "hv-module", textContent: name})]);
      cells.push([]);
      for (let h = 0; h < H; h++) {
        const map = el("canvas", {className: "hv-map"}), curve = el("canvas", {className: "hv-curve", width: 210,
                                                                                height: 96});
        Object.assign(map.dataset, {module: m, head: h});
        Object.assign(curve.dataset, {module: m, head: h});
        const got = data.role_steps[m][h];
        const caption = el("figcaption", {textContent: got ? `${got.role} from step ${got.step}` : "no role yet"});
        if (got) caption.style.color = data.colours[got.role] || INK;
        map.addEventListener("mousemove", (ev) => point(ev, map, m, h));
        curve.addEventListener("click", (ev) => go(nearest(curve, steps, ev, {l: 26, r: 6})));
        cells[m].push({map, curve});
        row.append(el("td", {}, [el("figure", {className: "hv-cell"}, [map, curve, caption])]));
      }
      body.append(row);
    });
    grid.append(body);
    const overall = el("canvas", {className: "hv-overall", width: 560, height: 120});
    overall.addEventListener("click", (ev) => go(nearest(overall, steps, ev, {l: 26, r: 30})));
    const keys = el("div", {className: "hv-keys"}, [
      ...roles.map((r) => chip(data.colours[r], r)), chip(MUTED, "entropy / uniform", true),
      ...(data.coref ? [chip(INK, "coref")] : [])]);
    const totals = el("div", {className: "hv-keys"}, [chip(ACCENT, "contrastive accuracy"), chip(BLEU, "BLEU (right)")]);
    root.append(totals, overall, keys, el("div", {className: "hv-scroll"}, [grid]), tip);

    let step = Number(slider.value), probe = Number(menu.value), timer = null;  // the classic sentence first
    const bleuTop = Math.min(100, Math.max(1, ...data.bleu.filter((b) => b !== null)) * 1.1);  // BLEU: 0-100

    function point(ev, canvas, m, h) {
      const map = data.probes[probe].maps[m], {px, left, top} = layout(map);
      const box = canvas.getBoundingClientRect(), scale = canvas.width / box.width;
      const k = Math.floor(((ev.clientX - box.left) * scale - left) / px);
      const q = Math.floor(((ev.clientY - box.top) * scale - top) / px);
      const Q = map.queries.length, K = map.keys.length;
      if (q < 0 || k < 0 || q >= Q || k >= K) return;
      const w = bytes(probe)[m][((step * H + h) * Q + q) * K + k] / 255;
      tip.textContent = `${data.head_names[m][h]}, step ${steps[step]}: ${map.queries[q]} → ${map.keys[k]}: ` +
                        `${w.toFixed(2)}`;
    }

    function drawOverall() {
      const marks = [];
      if (data.coref_step) marks.push({step: data.coref_step.step, colour: ACCENT});
      if (data.uniform_step !== null) marks.push({step: data.uniform_step, colour: MUTED, dash: [1, 3]});
      chart(overall, steps, {at: step, marks, right: {top: bleuTop.toFixed(0), label: "BLEU"}, series: [
        {values: data.contrastive, colour: ACCENT, width: 2},
        {values: data.bleu.map((b) => (b === null ? null : b / bleuTop)), colour: BLEU, width: 2}]});
    }

    function drawCurves() {
      data.modules.forEach((_, m) => {
        for (let h = 0; h < H; h++) {
          const series = roles.map((r) => ({values: data.roles[r][m][h], colour: data.colours[r]}))
            .filter((s) => s.values.some((v) => v !== null));
          series.push({values: data.entropy[m][h], colour: MUTED, dash: [4, 3]});
          if (data.coref) series.push({values: data.coref[m][h], colour: INK, width: 2});
          const low = Math.min(0, ...series.flatMap((s) => s.values.filter((v) => v !== null)));
          const got = data.role_steps[m][h], dots = [];
          if (got && data.roles[got.role]) {
            const v = data.roles[got.role][m][h][steps.indexOf(got.step)];
            if (v !== null && v !== undefined) dots.push({step: got.step, value: v, colour: data.colours[got.role]});
          }
          const c = data.coref_step, marks = c && c.module === m && c.head === h ? [{step: c.step, colour: INK}] : [];
          chart(cells[m][h].curve, steps, {series, dots, marks, at: step, lo: low < 0 ? -1 : 0});
        }
      });
    }

    function drawMaps() {
      data.modules.forEach((_, m) => {
        const map = data.probes[probe].maps[m], size = layout(map);
        for (let h = 0; h < H; h++) {
          const canvas = cells[m][h].map;
          if (canvas.width !== size.width || canvas.height !== size.height) {
            canvas.width = size.width;
            canvas.height = size.height;
          }
          drawMap(canvas, map, bytes(probe)[m], step, h, H);
        }
      });
    }

    function describe() {
      const parts = [`step ${steps[step]} (${step + 1} of ${steps.length})`];
      if (data.contrastive[step] !== null) parts.push(`contrastive ${data.contrastive[step].toFixed(2)}`);
      if (data.bleu[step] !== null) parts.push(`BLEU ${data.bleu[step].toFixed(1)}`);
      at.textContent = parts.join(" · ");
      root.dataset.step = steps[step];
      root.dataset.probe = probe;
    }

    function go(i) {
      step = Math.max(0, Math.min(steps.length - 1, i));
      slider.value = String(step);
      drawMaps();
      drawCurves();
      drawOverall();
      describe();
    }

    slider.addEventListener("input", () => go(Number(slider.value)));
    menu.addEventListener("change", () => {
      probe = Number(menu.value);
      go(step);
    });
    play.addEventListener("click", () => {
      if (timer) {
        clearInterval(timer);
        timer = null;
        play.textContent = "play";
        return;
      }
      if (step === steps.length - 1) go(0);
      play.textContent = "pause";
      timer = setInterval(() => {
        if (step === steps.length - 1 || !root.isConnected) {
          clearInterval(timer);
          timer = null;
          play.textContent = "play";
          return;
        }
        go(step + 1);
      }, 700);
    });
    go(step);
  }

  return {historyView, color};
})();
