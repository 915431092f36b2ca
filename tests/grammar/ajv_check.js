// Validates every line {schema, output} of the JSONL file given as argv[2] with ajv
// (draft 2020-12 + ajv-formats). Exit 1 on any invalid output or an empty file.
"use strict";
const fs = require("fs");
const Ajv2020 = require("ajv/dist/2020").default;
const addFormats = require("ajv-formats").default;

const lines = fs.readFileSync(process.argv[2], "utf8").split("\n").filter((l) => l.length);
let bad = 0;
for (const line of lines) {
  const { schema, output } = JSON.parse(line);
  const ajv = new Ajv2020({ strict: false });
  addFormats(ajv);
  const validate = ajv.compile(schema);
  let value;
  try {
    value = JSON.parse(output);
  } catch (e) {
    console.log("NOT JSON:", output);
    bad++;
    continue;
  }
  if (!validate(value)) {
    console.log("INVALID:", output, JSON.stringify(validate.errors));
    bad++;
  }
}
console.log(`${lines.length - bad} of ${lines.length} outputs valid under ajv`);
process.exit(bad === 0 && lines.length > 0 ? 0 : 1);
