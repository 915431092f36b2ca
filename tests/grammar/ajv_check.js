// Validates every line {schema, output} of the JSONL file given as argv[2] with ajv
// (draft 2020-12 + ajv-formats). Exit 1 on any invalid output or an empty file.
"use strict";
const fs = require("fs");
const Ajv2020 = require("ajv/dist/2020").default;
const addFormats = require("ajv-formats").default;

// ajv refuses to compile `enum: []` (draft 2020-12 only says it SHOULD be non-empty);
// an empty enum accepts nothing, exactly as `not: {}` does, so it is rewritten to that.
function rewriteEmptyEnums(node) {
  if (Array.isArray(node)) return node.map(rewriteEmptyEnums);
  if (node === null || typeof node !== "object") return node;
  const out = {};
  for (const [k, v] of Object.entries(node)) {
    if (k === "enum" && Array.isArray(v) && v.length === 0) out.not = {};
    else out[k] = rewriteEmptyEnums(v);
  }
  return out;
}

// ajv tests multipleOf on doubles, which cannot hold integers past 2^53; for an output
// that is a bare integer literal the divisibility is checked exactly with BigInt.
function exactIntegerMultipleOk(schema, output, errors) {
  if (!/^-?[0-9]+$/.test(output.trim())) return false;
  if (!errors.every((e) => e.keyword === "multipleOf" && e.instancePath === "")) return false;
  const m = schema.multipleOf;
  if (!Number.isInteger(m) || m <= 0) return false;
  return BigInt(output.trim()) % BigInt(m) === 0n;
}

const lines = fs.readFileSync(process.argv[2], "utf8").split("\n").filter((l) => l.length);
let bad = 0;
for (const line of lines) {
  const { schema, output } = JSON.parse(line);
  const ajv = new Ajv2020({ strict: false });
  addFormats(ajv);
  const validate = ajv.compile(rewriteEmptyEnums(schema));
  let value;
  try {
    value = JSON.parse(output);
  } catch (e) {
    console.log("NOT JSON:", output);
    bad++;
    continue;
  }
  if (!validate(value) && !exactIntegerMultipleOk(schema, output, validate.errors)) {
    console.log("INVALID:", output, JSON.stringify(validate.errors));
    bad++;
  }
}
console.log(`${lines.length - bad} of ${lines.length} outputs valid under ajv`);
process.exit(bad === 0 && lines.length > 0 ? 0 : 1);
