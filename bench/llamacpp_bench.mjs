#!/usr/bin/env node
// llama.cpp side of `dsinfer bench model`: prompt processing and generation speed of
// the llama.cpp bundled in node-llama-cpp 3.21.1 (tests/llamacpp/node_modules) on a GGUF.
//
//   node bench/llamacpp_bench.mjs --model X.gguf --threads N --prompt-tokens 512 \
//        --gen-tokens 128 [--amx on|off] --out out.json
//
// The prompt is token ids 1000..1000+n (fed directly, one llama.cpp batch of n); generation
// is greedy, one token per call. Output: {"pp_tokens_per_s", "tg_tokens_per_s", settings}.
import fs from "node:fs";
import path from "node:path";

import {loadLlama} from "./llamacpp_load.mjs";

const a = {threads: 2, promptTokens: 512, genTokens: 128, amx: "on"};
for (let i = 2; i < process.argv.length; i++) {
    const k = process.argv[i], v = process.argv[++i];
    if (k === "--model") a.model = v;
    else if (k === "--threads") a.threads = Number(v);
    else if (k === "--prompt-tokens") a.promptTokens = Number(v);
    else if (k === "--gen-tokens") a.genTokens = Number(v);
    else if (k === "--amx") a.amx = v;
    else if (k === "--out") a.out = v;
    else throw new Error(`unknown argument ${k}`);
}

const llama = await loadLlama({threads: a.threads, amx: a.amx});
const model = await llama.loadModel({modelPath: path.resolve(a.model), gpuLayers: 0, useMmap: true});
const ctxSize = Math.ceil((a.promptTokens + a.genTokens + 8) / 256) * 256;
const context = await model.createContext({contextSize: ctxSize, batchSize: a.promptTokens, sequences: 1,
    threads: {ideal: a.threads, min: a.threads}, ignoreMemorySafetyChecks: true, failedCreationRemedy: false});
const seq = context.getSequence();
const greedy = {temperature: 0};
const prompt = Array.from({length: a.promptTokens}, (_, i) => 1000 + i);
const input = prompt.map((t, i) => i === prompt.length - 1 ? [t, {generateNext: {token: true, options: greedy}}] : t);
let t0 = performance.now();
const out = await seq.controlledEvaluate(input);
const ppMs = performance.now() - t0;
let tok = out[prompt.length - 1].next.token;
t0 = performance.now();
for (let i = 0; i < a.genTokens; i++) {
    const o = await seq.controlledEvaluate([[tok, {generateNext: {token: true, options: greedy}}]]);
    tok = o[0].next.token;
}
const tgMs = performance.now() - t0;
const res = {pp_tokens_per_s: a.promptTokens / (ppMs / 1000), tg_tokens_per_s: a.genTokens / (tgMs / 1000),
    settings: {threads: a.threads, amx: a.amx, batch: a.promptTokens, kv_cache: "f16 (default)",
        release: llama.llamaCppRelease.release}};
fs.writeFileSync(a.out, JSON.stringify(res));
await context.dispose();
await model.dispose();
await llama.dispose();
