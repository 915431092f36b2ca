#!/usr/bin/env node
// llama.cpp side of `dsinfer bench offline`: output tokens/s of N sequences decoded
// together in one context by the llama.cpp bundled in node-llama-cpp 3.21.1
// (tests/llamacpp/node_modules), on the same GGUF and workload as the dsinfer side.
// One process = one repetition; `dsinfer bench offline` alternates it with its own runs.
//
//   node bench/llamacpp_offline_bench.mjs --model X.gguf --threads 2 --concurrency 1,4,16,64 \
//        --prompt-tokens 32 --gen-tokens 32 [--amx on|off] [--flash-attn on|off] --out out.json
//
// Per concurrency N: one LlamaContext with `sequences: N` and contextSize = one sequence's
// need (node-llama-cpp gives each sequence its own contextSize cells: llama.cpp's KV is
// not unified, kv_unified = false); every sequence evaluates its prompt (the ids of
// bench_prompt() below, the same as apps/dsinfer/cmd_bench_offline.cc feeds dsinfer) and
// then generates greedily, one token per call. All N sequences are driven at the same
// time; node-llama-cpp's batching (default "nextCycle" dispatch, maximumParallelism) puts
// the pending tokens of the sequences into one llama_decode batch. That is not assumed:
// the context's batch calls (initBatch + addToBatch + decodeBatch = one llama_decode) are
// counted, with the tokens in each, and reported as `decode_calls`, `tokens_per_call` (a
// histogram), `min_generation_tokens_per_call` and `batched` (every generation-phase call
// held all N sequences' tokens). Measured 2026-12-01: N - 1 tokens per call (one sequence
// is always one call behind: 4 sequences -> 4 calls of 3 per 3 steps; 16 -> 3 calls of 15
// and one of 3), i.e. batched, not one token per call; a custom dispatch schedule that
// waited for all N queued tokens (up to 1 s) did not change that.
// Warm-up: one context of 2 sequences x 2 tokens before anything is timed (page-in of the
// mmap'd weights, thread start), as dsinfer's side does.
// Time runs from the first prompt submitted to the last token generated (prefill
// included, as for dsinfer).
// Output: {"results": {"N": {output_tokens_per_s, seconds, output_tokens, decode_calls,
// tokens_per_call, batched}}, "settings": {...flash_attention, kv_cache_type...}}.
import fs from "node:fs";
import path from "node:path";

import {cpuHasAmx, ggmlTypeName, loadLlama} from "./llamacpp_load.mjs";

const a = {threads: 2, concurrency: [1, 4, 16, 64], promptTokens: 32, genTokens: 32, amx: "on",
    flashAttn: "off"};
for (let i = 2; i < process.argv.length; i++) {
    const k = process.argv[i], v = process.argv[++i];
    if (k === "--model") a.model = v;
    else if (k === "--threads") a.threads = Number(v);
    else if (k === "--concurrency") a.concurrency = v.split(",").map(Number);
    else if (k === "--prompt-tokens") a.promptTokens = Number(v);
    else if (k === "--gen-tokens") a.genTokens = Number(v);
    else if (k === "--amx") a.amx = v;
    else if (k === "--flash-attn") a.flashAttn = v;
    else if (k === "--out") a.out = v;
    else throw new Error(`unknown argument ${k}`);
}
if (!a.model || !a.out) throw new Error("--model and --out are required");
if (!["on", "off"].includes(a.flashAttn)) throw new Error("--flash-attn must be on or off");


const llama = await loadLlama({threads: a.threads, amx: a.amx});
const model = await llama.loadModel({modelPath: path.resolve(a.model), gpuLayers: 0, useMmap: true});

// Sequence s's prompt: must match bench_prompt() in apps/dsinfer/cmd_bench_offline.cc.
const benchPrompt = (s, n) => Array.from({length: n}, (_, i) => 1000 + ((s * 7919 + i * 31) % 50000));
const greedy = {temperature: 0};

// Counts the context's llama_decode calls and the tokens of each (node-llama-cpp builds a
// batch with initBatch(tokens), fills it with addToBatch per sequence, runs decodeBatch).
function countDecodes(context) {
    const ctx = context._ctx;
    const stats = {calls: []};
    let pending = 0;
    const initBatch = ctx.initBatch.bind(ctx);
    const decodeBatch = ctx.decodeBatch.bind(ctx);
    // The addon's methods are read-only on its prototype: shadow them on the instance.
    Object.defineProperty(ctx, "initBatch", {configurable: true, value: (size) => {
        pending = size;
        return initBatch(size);
    }});
    Object.defineProperty(ctx, "decodeBatch", {configurable: true, value: (...args) => {
        stats.calls.push(pending);
        return decodeBatch(...args);
    }});
    return stats;
}

async function run(n, promptTokens, genTokens) {
    const perSeq = promptTokens + genTokens + 8;
    const context = await model.createContext({contextSize: Math.ceil(perSeq / 256) * 256,
        batchSize: Math.min(n * promptTokens, 4096), sequences: n,
        threads: {ideal: a.threads, min: a.threads}, ignoreMemorySafetyChecks: true,
        failedCreationRemedy: false, flashAttention: a.flashAttn === "on",
        batching: {itemPrioritizationStrategy: "maximumParallelism"}});
    const stats = countDecodes(context);
    const seqs = Array.from({length: n}, () => context.getSequence());
    const t0 = performance.now();
    let firstDoneMs = 0;
    let prefillCalls = 0;
    await Promise.all(seqs.map(async (seq, s) => {
        const prompt = benchPrompt(s, promptTokens);
        const input = prompt.map((t, i) =>
            i === prompt.length - 1 ? [t, {generateNext: {token: true, options: greedy}}] : t);
        const out = await seq.controlledEvaluate(input);
        firstDoneMs = Math.max(firstDoneMs, performance.now() - t0);
        prefillCalls = Math.max(prefillCalls, stats.calls.length);
        let tok = out[prompt.length - 1].next.token;
        for (let i = 1; i < genTokens; i++) {
            const o = await seq.controlledEvaluate([[tok, {generateNext: {token: true, options: greedy}}]]);
            tok = o[0].next.token;
        }
    }));
    const secs = (performance.now() - t0) / 1000;
    const hist = {};
    for (const c of stats.calls) hist[c] = (hist[c] ?? 0) + 1;
    const genCalls = stats.calls.slice(prefillCalls);
    const settings = {flash_attention: context.flashAttention,
        kv_cache_key_type: ggmlTypeName(context.kvCacheKeyType),
        kv_cache_value_type: ggmlTypeName(context.kvCacheValueType),
        context_cells_per_sequence: context.contextSize, batch_size: context.batchSize};
    await context.dispose();
    return {output_tokens: n * genTokens, seconds: secs, output_tokens_per_s: (n * genTokens) / secs,
        last_first_token_s: firstDoneMs / 1000, decode_calls: stats.calls.length,
        prefill_decode_calls: prefillCalls, tokens_per_call: hist,
        min_generation_tokens_per_call: genCalls.length ? Math.min(...genCalls) : 0,
        batched: genCalls.length === genTokens - 1 && genCalls.every((c) => c === n), settings};
}

await run(2, 2, 2);  // warm-up, not reported
const results = {};
let contextSettings = null;
for (const n of a.concurrency) {
    const r = await run(n, a.promptTokens, a.genTokens);
    contextSettings = r.settings;
    delete r.settings;
    results[String(n)] = r;
    process.stderr.write(`llama.cpp ${n} sequences: ${JSON.stringify(results[String(n)])}\n`);
}
fs.writeFileSync(a.out, JSON.stringify({results, settings: {threads: a.threads, amx: a.amx,
    cpu_has_amx_int8: cpuHasAmx(),
    prompt_tokens: a.promptTokens, gen_tokens: a.genTokens, ...contextSettings,
    kv_unified: false, batching: "one context, sequences: N, maximumParallelism, nextCycle dispatch",
    release: llama.llamaCppRelease.release}}));
await model.dispose();
await llama.dispose();
