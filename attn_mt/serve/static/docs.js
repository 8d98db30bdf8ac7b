"use strict";
// The API reference, rendered from /openapi.json in the page itself: no CDN, works offline.
// Each endpoint: what it does, its request and response fields, a curl line, and its errors.

function el(tag, props = {}, children = []) {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children);
  return node;
}

function inline(text) {  // a description: `code` spans as <code>, the rest as text
  return (text || "").split("`").map((part, i) => (i % 2 ? el("code", {textContent: part}) : part));
}

function resolve(schema, spec, refs = 0) {
  // replace {"$ref": "#/components/schemas/X"} by X's schema, up to 8 references deep (a cycle stops there)
  if (!schema || typeof schema !== "object" || refs > 8) return schema;
  if (schema.$ref) return resolve(spec.components.schemas[schema.$ref.split("/").pop()], spec, refs + 1);
  const out = Array.isArray(schema) ? [] : {};
  for (const [k, v] of Object.entries(schema)) out[k] = resolve(v, spec, refs);
  return out;
}

function oneLine(value) {  // {"a": [1, 2]}: JSON on one line, a space after each comma and colon
  return JSON.stringify(value, null, 1).replace(/([[{])\n\s*/g, "$1").replace(/\n\s*([\]}])/g, "$1")
    .replace(/\n\s*/g, " ");
}

function typeOf(s) {  // "integer >= 1", "string[]", "Hypothesis[]", "number[][][][]"
  if (s.anyOf) return s.anyOf.filter((x) => x.type !== "null").map(typeOf).join(" or ");
  if (s.type === "array") return `${s.items.properties ? s.items.title : typeOf(s.items)}[]`;
  const range = s.minimum !== undefined && s.maximum !== undefined ? ` ${s.minimum} to ${s.maximum}`
    : s.minimum !== undefined ? ` >= ${s.minimum}` : s.maximum !== undefined ? ` <= ${s.maximum}` : "";
  return (s.type || "any") + range;
}

// The fields of an object schema, nested ones dotted: results[].hypotheses[].text
function fields(schema, prefix = "") {
  return Object.entries(schema.properties || {}).flatMap(([name, s]) => {
    const row = {name: prefix + name, type: typeOf(s), optional: !(schema.required || []).includes(name),
                 description: s.description || ""};
    if (s.type === "array" && s.items.properties) return [row, ...fields(s.items, `${prefix}${name}[].`)];
    if (s.properties) return [row, ...fields(s, `${prefix}${name}.`)];
    return [row];
  });
}

function fieldList(rows) {
  return el("dl", {className: "fields"}, rows.flatMap((f) => [
    el("dt", {}, [el("code", {textContent: f.name}), " ", el("span", {className: "type", textContent: f.type}),
                  f.optional ? el("span", {className: "optional", textContent: " optional"}) : ""]),
    el("dd", {}, inline(f.description)),
  ]));
}

// A request body to try: the schema's examples, with the served model's example sentence where it has one.
function exampleBody(schema, sentence) {
  const body = {};
  for (const name of schema.required || []) {
    const s = schema.properties[name], value = (s.examples || [])[0];
    body[name] = !sentence ? value : s.type === "string" ? sentence : s.items?.type === "string" ? [sentence] : value;
  }
  return body;
}

function curl(path, body) {  // POST where there is a body; one option a line
  const data = body ? ` \\\n  -H 'content-type: application/json' \\\n  -d '${oneLine(body).replaceAll("'", "'\\''")}'`
    : "";
  return `curl -s ${location.origin}${path}${data}`;
}

function title(method, path) {  // POST /api/translate
  return [el("span", {className: `method ${method}`, textContent: method.toUpperCase()}), " ",
          el("code", {textContent: path})];
}

// live: what the GET endpoints answer now (a free-form object is shown by this server's answer)
function endpoint(method, path, op, spec, live) {
  const info = live["/api/info"];
  const id = `${method}-${path.replace(/\W+/g, "-")}`;
  const section = el("section", {className: "endpoint", id}, [
    el("h2", {}, title(method, path)),
    el("p", {}, inline(op.description || op.summary)),
  ]);
  const request = op.requestBody && resolve(op.requestBody.content["application/json"].schema, spec);
  if (request) section.append(el("h3", {textContent: "Request body"}), fieldList(fields(request)));
  const body = request && exampleBody(request, info && exampleSentence(info));
  section.append(el("h3", {textContent: "Example"}), el("pre", {className: "example", textContent: curl(path, body)}));
  const errors = [];
  for (const [status, r] of Object.entries(op.responses || {})) {
    const content = (r.content || {})["application/json"] || {};
    if (status.startsWith("2")) {
      const schema = resolve(content.schema, spec) || {};
      section.append(el("h3", {textContent: `Response ${status}`}));
      if (schema.properties) section.append(fieldList(fields(schema)));
      else if (live[path]) {
        section.append(el("details", {}, [el("summary", {textContent: "A JSON object; this server's answer"}),
                                          el("pre", {textContent: JSON.stringify(live[path], null, 2)})]));
      }
    } else {
      errors.push(el("li", {}, [el("b", {textContent: status}), ` ${r.description || ""}, e.g. `,
                                el("code", {textContent: oneLine(content.example || {})})]));
    }
  }
  if (errors.length) section.append(el("h3", {textContent: "Errors"}), el("ul", {className: "errors"}, errors));
  return section;
}

async function render() {
  const spec = await (await fetch("/openapi.json")).json();
  const ops = Object.entries(spec.paths).flatMap(([path, methods]) => Object.entries(methods).map(
    ([method, op]) => ({path, method, op})));
  const live = {};
  for (const {path} of ops.filter((o) => o.method === "get")) {
    live[path] = await fetch(path).then((r) => r.json()).catch(() => null);
  }
  const sections = ops.map(({path, method, op}) => endpoint(method, path, op, spec, live));
  const contents = el("ul", {className: "contents"}, ops.map(({path, method, op}, i) => el("li", {}, [
    el("a", {href: `#${sections[i].id}`}, title(method, path)), " ", op.summary || ""])));
  const intro = el("section", {className: "intro"}, [
    ...spec.info.description.split(/\n\s*\n/).map((line) => el("p", {}, inline(line))), contents]);
  document.getElementById("api").replaceChildren(intro, ...sections);
}

render().catch((e) => { document.getElementById("api").textContent = `cannot load /openapi.json: ${e}`; });
