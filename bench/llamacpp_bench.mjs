#!/usr/bin/env node
// llama.cpp side of `dsinfer bench model`: prompt processing and generation speed of
// the llama.cpp bundled in node-llama-cpp 3.21.1 (tests/llamacpp/node_modules) on a GGUF.
// One process = one repetition; `dsinfer bench model` alternates it with its own runs.
//
//   node bench/llamacpp_bench.mjs --model X.gguf --threads N --prompt-tokens 512 \
//        --gen-tokens 128 [--amx on|off] [--flash-attn on|off] --out out.json
//
// Warm-up first (a 4-token prompt and two decode steps in a throw-away context: page-in
// of the mmap'd weights, thread start), as dsinfer's side does. Then the prompt: token
// ids 1000..1000+n fed directly, one llama.cpp batch of n; generation is greedy, one token
// per call. Output: {"pp_tokens_per_s", "tg_tokens_per_s", settings (flash attention, KV
// cache types, AMX)}.
import fs from "node:fs";
import path from "node:path";

import {cpuHasAmx, ggmlTypeName, loadLlama} from "./llamacpp_load.mjs";

const a = {threads: 2, promptTokens: 512, genTokens: 128, amx: "on", flashAttn: "off"};
for (let i = 2; i < process.argv.length; i++) {
    const k = process.argv[i], v = process.argv[++i];
    if (k === "--model") a.model = v;
    else if (k === "--threads") a.threads = Number(v);
    else if (k === "--prompt-tokens") a.promptTokens = Number(v);
    else if (k === "--gen-tokens") a.genTokens = Number(v);
    else if (k === "--amx") a.amx = v;
    else if (k === "--flash-attn") a.flashAttn = v;
    else if (k === "--out") a.out = v;
    else throw new Error(`unknown argument ${k}`);
}
if (!["on", "off"].includes(a.flashAttn)) throw new Error("--flash-attn must be on or off");

const llama = await loadLlama({threads: a.threads, amx: a.amx});
const model = await llama.loadModel({modelPath: path.resolve(a.model), gpuLayers: 0, useMmap: true});
const greedy = {temperature: 0};

async function run(promptTokens, genTokens) {
    const ctxSize = Math.ceil((promptTokens + genTokens + 8) / 256) * 256;
    const context = await model.createContext({contextSize: ctxSize, batchSize: Math.max(promptTokens, 1),
        sequences: 1, threads: {ideal: a.threads, min: a.threads}, ignoreMemorySafetyChecks: true,
        failedCreationRemedy: false, flashAttention: a.flashAttn === "on"});
    const seq = context.getSequence();
    const prompt = Array.from({length: promptTokens}, (_, i) => 1000 + i);
    const input = prompt.map((t, i) => i === prompt.length - 1 ? [t, {generateNext: {token: true, options: greedy}}] : t);
    let t0 = performance.now();
    const out = await seq.controlledEvaluate(input);
    const ppMs = performance.now() - t0;
    let tok = out[prompt.length - 1].next.token;
    t0 = performance.now();
    for (let i = 0; i < genTokens; i++) {
        const o = await seq.controlledEvaluate([[tok, {generateNext: {token: true, options: greedy}}]]);
        tok = o[0].next.token;
    }
    const tgMs = performance.now() - t0;
    const settings = {flash_attention: context.flashAttention,
        kv_cache_key_type: ggmlTypeName(context.kvCacheKeyType),
        kv_cache_value_type: ggmlTypeName(context.kvCacheValueType)};
    await context.dispose();
    return {ppMs, tgMs, settings};
}

await run(4, 2);  // warm-up, not reported
const r = await run(a.promptTokens, a.genTokens);
const res = {pp_tokens_per_s: a.promptTokens / (r.ppMs / 1000), tg_tokens_per_s: a.genTokens / (r.tgMs / 1000),
    settings: {threads: a.threads, amx: a.amx, cpu_has_amx_int8: cpuHasAmx(), batch: a.promptTokens,
        ...r.settings, release: llama.llamaCppRelease.release}};
fs.writeFileSync(a.out, JSON.stringify(res));
await model.dispose();
await llama.dispose();
