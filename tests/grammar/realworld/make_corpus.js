// Regenerates tests/data/realworld-schemas/corpus.jsonl (issue 21): real-world JSON
// schemas with valid and invalid instances whose labels are ajv's verdict.
//
//   cd tests/grammar/realworld && npm ci --ignore-scripts && node make_corpus.js
//
// Sources (pinned in package.json, MIT): every component schema of GitHub's REST API
// OpenAPI 3.0 description (@octokit/openapi, api.github.com.json) and every definition
// (events and their per-event oneOf groups) of GitHub's webhook payload schemas (@octokit/webhooks-schemas).
// Each becomes a standalone schema: the definitions it reaches are copied into `$defs`
// and its `$ref`s rewritten to point there; OpenAPI 3.0's `nullable: true` next to a
// `type` becomes the type list with "null" (as OpenAPI 3.1 writes it), without a type
// an `anyOf` with a null branch; `$schema` (draft-07 in the webhook schemas) is dropped:
// every schema is read as draft 2020-12. Every other
// keyword is kept as published (`x-github`, `example`, `readOnly`, ... included).
//
// Instances: json-schema-faker (seeded) gives candidates (required properties only,
// then with optional ones); mutations of them (a property removed, a leaf of another
// type or value, an extra property, the root replaced) give more. Each instance is
// serialised compactly with object keys in the schema's declaration order (the
// order our grammar generates) and labelled by ajv 8 (draft 2020-12 + ajv-formats,
// the versions of tests/grammar). Deterministic: same packages, same file.
"use strict";
const fs = require("fs");
const path = require("path");
const Ajv2020 = require("ajv/dist/2020").default;
const addFormats = require("ajv-formats").default;
const { JSONSchemaFaker: jsf } = require("json-schema-faker");

const OUT = path.join(__dirname, "..", "..", "data", "realworld-schemas", "corpus.jsonl");
const MAX_SCHEMA_BYTES = 32 * 1024;  // standalone schema (with its $defs), compact
const MAX_INSTANCE_BYTES = 4096;     // compact instance text
const VALID_PER_SCHEMA = 2;
const INVALID_PER_SCHEMA = 3;

function mulberry32(seed) {
  return function () {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Copies `node`, rewriting `$ref`s with `prefix` to `#/$defs/NAME` and collecting the
// names reached; OpenAPI `nullable` folded into `type` (and `enum`).
function rewrite(node, prefix, reached) {
  if (Array.isArray(node)) return node.map((x) => rewrite(x, prefix, reached));
  if (node === null || typeof node !== "object") return node;
  const out = {};
  for (const [k, v] of Object.entries(node)) {
    if (k === "$ref" && typeof v === "string" && v.startsWith(prefix)) {
      const name = v.slice(prefix.length);
      reached.add(name);
      out[k] = "#/$defs/" + name.replace(/~/g, "~0").replace(/\//g, "~1");
    } else if (k === "properties" || k === "patternProperties" || k === "$defs" || k === "definitions") {
      out[k] = {};
      for (const [pk, pv] of Object.entries(v)) out[k][pk] = rewrite(pv, prefix, reached);
    } else {
      out[k] = rewrite(v, prefix, reached);
    }
  }
  if (out.nullable === true && typeof out.type === "string") {
    out.type = [out.type, "null"];
    if (Array.isArray(out.enum) && !out.enum.includes(null)) out.enum = [...out.enum, null];
    delete out.nullable;
  } else if ("nullable" in out) {
    // ajv refuses `nullable` without `type`; OpenAPI 3.1 writes it as a null branch.
    const nullable = out.nullable === true;
    delete out.nullable;
    if (nullable) return { anyOf: [out, { type: "null" }] };
  }
  if (typeof out.$schema === "string") delete out.$schema;  // every schema is read as 2020-12
  return out;
}

function standalone(rootName, defs, prefix) {
  const reached = new Set();
  const root = rewrite(defs[rootName], prefix, reached);
  const $defs = {};
  const todo = [...reached];
  while (todo.length) {
    const name = todo.pop();
    if (name in $defs || !(name in defs)) continue;
    const before = new Set(reached);
    $defs[name] = rewrite(defs[name], prefix, reached);
    for (const r of reached) if (!before.has(r)) todo.push(r);
  }
  if (typeof root !== "object" || Array.isArray(root)) return root;
  if (Object.keys($defs).length) {
    const sorted = {};
    for (const k of Object.keys($defs).sort()) sorted[k] = $defs[k];
    root.$defs = { ...(root.$defs || {}), ...sorted };
  }
  return root;
}

// Declared property names of `schema` in declaration order ($ref, allOf, anyOf, oneOf
// followed), for serialising an instance in the order the grammar generates.
function declaredOrder(schema, root, seen = new Set()) {
  if (!schema || typeof schema !== "object" || seen.has(schema)) return [];
  seen.add(schema);
  let names = [];
  if (typeof schema.$ref === "string" && schema.$ref.startsWith("#/$defs/")) {
    const name = schema.$ref.slice(8).replace(/~1/g, "/").replace(/~0/g, "~");
    names = names.concat(declaredOrder(root.$defs && root.$defs[name], root, seen));
  }
  for (const k of ["allOf", "anyOf", "oneOf"]) {
    if (Array.isArray(schema[k])) for (const s of schema[k]) names = names.concat(declaredOrder(s, root, seen));
  }
  if (schema.properties) names = names.concat(Object.keys(schema.properties));
  return [...new Set(names)];
}

function subschemas(schema, root, key, seen = new Set()) {
  // Schemas that may apply to property `key` (or items when key === null).
  if (!schema || typeof schema !== "object" || seen.has(schema)) return [];
  seen.add(schema);
  let out = [];
  if (typeof schema.$ref === "string" && schema.$ref.startsWith("#/$defs/")) {
    const name = schema.$ref.slice(8).replace(/~1/g, "/").replace(/~0/g, "~");
    out = out.concat(subschemas(root.$defs && root.$defs[name], root, key, seen));
  }
  for (const k of ["allOf", "anyOf", "oneOf"]) {
    if (Array.isArray(schema[k])) for (const s of schema[k]) out = out.concat(subschemas(s, root, key, seen));
  }
  if (key === null) {
    if (schema.items && typeof schema.items === "object") out.push(schema.items);
  } else {
    if (schema.properties && schema.properties[key]) out.push(schema.properties[key]);
    if (schema.additionalProperties && typeof schema.additionalProperties === "object") {
      out.push(schema.additionalProperties);
    }
  }
  return out;
}

function ordered(value, schemas, root) {
  if (Array.isArray(value)) {
    const sub = schemas.flatMap((s) => subschemas(s, root, null));
    return value.map((v) => ordered(v, sub, root));
  }
  if (value === null || typeof value !== "object") return value;
  let order = [];
  for (const s of schemas) order = order.concat(declaredOrder(s, root));
  order = [...new Set(order)];
  const keys = Object.keys(value);
  const rank = (k) => (order.indexOf(k) < 0 ? order.length : order.indexOf(k));
  keys.sort((a, b) => rank(a) - rank(b));
  const out = {};
  for (const k of keys) {
    out[k] = ordered(value[k], schemas.flatMap((s) => subschemas(s, root, k)), root);
  }
  return out;
}

// All paths to nodes of a JSON value.
function paths(value, prefix = [], out = []) {
  out.push(prefix);
  if (Array.isArray(value)) value.forEach((v, i) => paths(v, prefix.concat([i]), out));
  else if (value !== null && typeof value === "object") {
    for (const k of Object.keys(value)) paths(value[k], prefix.concat([k]), out);
  }
  return out;
}
function getAt(v, p) {
  for (const k of p) v = v[k];
  return v;
}
function setAt(v, p, x) {
  if (p.length === 0) return x;
  const copy = structuredClone(v);
  let node = copy;
  for (const k of p.slice(0, -1)) node = node[k];
  node[p[p.length - 1]] = x;
  return copy;
}
function deleteAt(v, p) {
  const copy = structuredClone(v);
  let node = copy;
  for (const k of p.slice(0, -1)) node = node[k];
  if (Array.isArray(node)) node.splice(p[p.length - 1], 1);
  else delete node[p[p.length - 1]];
  return copy;
}

function otherValue(x, rng) {
  const options = [0, 1.5, -7, "x", "", "not valid!", true, null, [], {}, "2020-13-45", 99999999999];
  for (;;) {
    const o = options[Math.floor(rng() * options.length)];
    if (JSON.stringify(o) !== JSON.stringify(x)) return o;
  }
}

function mutations(value, rng) {
  const out = [];
  const all = paths(value);
  for (let i = 0; i < 24; ++i) {
    const p = all[Math.floor(rng() * all.length)];
    const kind = Math.floor(rng() * 4);
    if (kind === 0 && p.length > 0) {
      out.push(deleteAt(value, p));
    } else if (kind === 1) {
      out.push(setAt(value, p, otherValue(getAt(value, p), rng)));
    } else if (kind === 2) {
      const node = getAt(value, p);
      if (node !== null && typeof node === "object" && !Array.isArray(node)) {
        out.push(setAt(value, p, { ...node, zz_extra: 1 }));
      }
    } else {
      out.push(otherValue(value, rng));
    }
  }
  return out;
}

// json-schema-faker 0.5.9 throws "Invalid time value" on date-time fields (it cuts them
// at maxLength first) and has no uri-template; these stand in (seeded through its random option).
function registerFormats(rng) {
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  const int = (lo, hi) => lo + Math.floor(rng() * (hi - lo + 1));
  const date = () => `${int(1990, 2030)}-${pad(int(1, 12))}-${pad(int(1, 28))}`;
  const time = () => `${pad(int(0, 23))}:${pad(int(0, 59))}:${pad(int(0, 59))}Z`;
  jsf.format("date", date);
  jsf.format("time", time);
  jsf.format("date-time", () => `${date()}T${time()}`);
  jsf.format("uri-template", () => `https://api.example.com/${int(1, 99)}{/id}`);
}

function main() {
  const rest = require("@octokit/openapi/generated/api.github.com.json");
  const hooks = require("@octokit/webhooks-schemas/schema.json");
  const items = [];
  const restDefs = rest.components.schemas;
  for (const name of Object.keys(restDefs)) {
    items.push({ id: "github-rest/" + name, schema: standalone(name, restDefs, "#/components/schemas/") });
  }
  const hookDefs = hooks.definitions;
  for (const name of Object.keys(hookDefs)) {
    items.push({ id: "github-webhooks/" + name, schema: standalone(name, hookDefs, "#/definitions/") });
  }
  let stats = { considered: items.length, too_big: 0, ajv_error: 0, no_instance: 0, kept: 0 };
  const lines = [];
  for (const item of items) {
    const text = JSON.stringify(item.schema);
    if (text.length > MAX_SCHEMA_BYTES) {
      stats.too_big++;
      continue;
    }
    const ajv = new Ajv2020({ strict: false, allErrors: false });
    addFormats(ajv);
    let validate;
    try {
      validate = ajv.compile(item.schema);
    } catch (e) {
      if (process.env.DEBUG) console.error(item.id, e.message.slice(0, 200));
      stats.ajv_error++;
      continue;
    }
    const rng = mulberry32(lines.length * 7919 + 17);
    const seen = new Set();
    const valid = [];
    const invalid = [];
    const add = (v) => {
      if (v === undefined) return;
      const t = JSON.stringify(ordered(v, [item.schema], item.schema));
      if (t === undefined || t.length > MAX_INSTANCE_BYTES || seen.has(t)) return;
      seen.add(t);
      const ok = validate(JSON.parse(t));
      if (ok && valid.length < VALID_PER_SCHEMA) valid.push(t);
      if (!ok && invalid.length < INVALID_PER_SCHEMA) invalid.push(t);
    };
    const candidates = [];
    registerFormats(rng);
    for (const [requiredOnly, probability] of [[true, 0], [false, 0.5], [false, 0.2]]) {
      jsf.option({
        random: rng, requiredOnly, optionalsProbability: probability, alwaysFakeOptionals: false,
        fixedProbabilities: true, maxItems: 2, maxLength: 32, useDefaultValue: false,
        useExamplesValue: false, failOnInvalidTypes: false, failOnInvalidFormat: false,
        refDepthMax: 10, ignoreMissingRefs: true, pruneProperties: [],
      });
      try {
        candidates.push(jsf.generate(structuredClone(item.schema)));
      } catch (e) {
        // json-schema-faker gives up on some schemas; mutations need a base value.
      }
    }
    for (const c of candidates) add(c);
    const bases = candidates.length ? candidates : [{}];
    for (const b of bases) for (const m of mutations(b, rng)) add(m);
    if (valid.length + invalid.length === 0) {
      stats.no_instance++;
      continue;
    }
    stats.kept++;
    const instances = valid.map((t) => ({ text: t, valid: true }))
      .concat(invalid.map((t) => ({ text: t, valid: false })));
    lines.push(JSON.stringify({ id: item.id, schema: item.schema, instances }));
  }
  fs.mkdirSync(path.dirname(OUT), { recursive: true });
  fs.writeFileSync(OUT, lines.join("\n") + "\n");
  let nv = 0, ni = 0;
  for (const l of lines) for (const i of JSON.parse(l).instances) (i.valid ? nv++ : ni++);
  console.log(JSON.stringify({ ...stats, valid_instances: nv, invalid_instances: ni,
                               bytes: fs.statSync(OUT).size }));
}

main();
