// The API reference, rendered from /openapi.json in the page itself: no CDN, works offline.
"use strict";

function resolve(schema, spec, depth = 0) {
  // replace {"$ref": "#/components/schemas/X"} by X's schema, a few levels deep
  if (!schema || depth > 6) return schema;
  if (schema.$ref) return resolve(spec.components.schemas[schema.$ref.split("/").pop()], spec, depth + 1);
  const out = Array.isArray(schema) ? [] : {};
  for (const [k, v] of Object.entries(schema)) out[k] = typeof v === "object" ? resolve(v, spec, depth + 1) : v;
  return out;
}

function block(title, value) {
  const details = document.createElement("details");
  const summary = document.createElement("summary");
  summary.textContent = title;
  const pre = document.createElement("pre");
  pre.textContent = JSON.stringify(value, null, 2);
  details.append(summary, pre);
  return details;
}

async function render() {
  const spec = await (await fetch("/openapi.json")).json();
  const root = document.getElementById("api");
  root.replaceChildren();
  const intro = document.createElement("p");
  intro.textContent = spec.info.description || "";
  root.append(intro);
  for (const [path, methods] of Object.entries(spec.paths)) {
    for (const [method, op] of Object.entries(methods)) {
      const section = document.createElement("section");
      const h = document.createElement("h2");
      h.textContent = `${method.toUpperCase()} ${path}`;
      const p = document.createElement("p");
      p.textContent = op.description || op.summary || "";
      section.append(h, p);
      const body = op.requestBody && op.requestBody.content["application/json"];
      if (body) section.append(block("request body", resolve(body.schema, spec)));
      for (const [status, r] of Object.entries(op.responses || {})) {
        const content = r.content && r.content["application/json"];
        section.append(block(`${status} ${r.description || ""}`, content ? resolve(content.schema, spec) : {}));
      }
      root.append(section);
    }
  }
}

render().catch((e) => { document.getElementById("api").textContent = `cannot load /openapi.json: ${e}`; });
