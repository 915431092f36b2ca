// Re-checks the labels of tests/data/realworld-schemas/corpus.jsonl (argv[2]): each
// instance's `valid` must be ajv's verdict (draft 2020-12 + ajv-formats, the versions
// installed here). Exit 1 on any mismatch, on a schema ajv cannot compile, or an
// empty corpus.
"use strict";
const fs = require("fs");
const Ajv2020 = require("ajv/dist/2020").default;
const addFormats = require("ajv-formats").default;

const lines = fs.readFileSync(process.argv[2], "utf8").split("\n").filter((l) => l.length);
let bad = 0, instances = 0;
for (const line of lines) {
  const { id, schema, instances: list } = JSON.parse(line);
  const ajv = new Ajv2020({ strict: false });
  addFormats(ajv);
  let validate;
  try {
    validate = ajv.compile(schema);
  } catch (e) {
    console.log("SCHEMA ajv cannot compile:", id, e.message);
    bad++;
    continue;
  }
  for (const { text, valid } of list) {
    instances++;
    if (validate(JSON.parse(text)) !== valid) {
      console.log("LABEL differs from ajv:", id, valid, text.slice(0, 200));
      bad++;
    }
  }
}
console.log(`${lines.length} schemas, ${instances} instances, ${bad} mismatches`);
process.exit(bad === 0 && lines.length > 0 ? 0 : 1);
