#!/usr/bin/env node
// llama.cpp side of `dsinfer bench offline`: output tokens/s of N sequences decoded
// together in one context by the llama.cpp bundled in node-llama-cpp 3.21.1
// (tests/llamacpp/node_modules), on the same GGUF and workload as the dsinfer side.
//
//   node bench/llamacpp_offline_bench.mjs --model X.gguf --threads 2 --concurrency 1,4,16,64 \
//        --prompt-tokens 32 --gen-tokens 32 [--amx on|off] --out out.json
//
// Per concurrency N: one LlamaContext with `sequences: N`; every sequence evaluates its
// prompt (the ids bench_prompt() below, the same as apps/dsinfer/cmd_bench_offline.cc
// feeds dsinfer) and then generates greedily, one token per call. All N sequences are
// driven at the same time, so node-llama-cpp's batching ("maximumParallelism") puts the
// pending tokens of every sequence into one llama_decode batch. Time runs from the first
// prompt submitted to the last token generated (prefill included, as for dsinfer).
// Output: {"results": {"N": {"output_tokens_per_s", "seconds", "output_tokens"}}, settings}.
import fs from "node:fs";
import path from "node:path";

import {loadLlama} from "./llamacpp_load.mjs";

const a = {threads: 2, concurrency: [1, 4, 16, 64], promptTokens: 32, genTokens: 32, amx: "off"};
for (let i = 2; i < process.argv.length; i++) {
    const k = process.argv[i], v = process.argv[++i];
    if (k === "--model") a.model = v;
    else if (k === "--threads") a.threads = Number(v);
    else if (k === "--concurrency") a.concurrency = v.split(",").map(Number);
    else if (k === "--prompt-tokens") a.promptTokens = Number(v);
    else if (k === "--gen-tokens") a.genTokens = Number(v);
    else if (k === "--amx") a.amx = v;
    else if (k === "--out") a.out = v;
    else throw new Error(`unknown argument ${k}`);
}
if (!a.model || !a.out) throw new Error("--model and --out are required");

const llama = await loadLlama({threads: a.threads, amx: a.amx});
const model = await llama.loadModel({modelPath: path.resolve(a.model), gpuLayers: 0, useMmap: true});

// Sequence s's prompt: must match bench_prompt() in apps/dsinfer/cmd_bench_offline.cc.
const benchPrompt = (s, n) => Array.from({length: n}, (_, i) => 1000 + ((s * 7919 + i * 31) % 50000));

const greedy = {temperature: 0};
const results = {};
for (const n of a.concurrency) {
    const perSeq = a.promptTokens + a.genTokens + 8;
    const context = await model.createContext({contextSize: Math.ceil((n * perSeq) / 256) * 256,
        batchSize: Math.min(n * a.promptTokens, 4096), sequences: n,
        threads: {ideal: a.threads, min: a.threads}, ignoreMemorySafetyChecks: true,
        failedCreationRemedy: false, batching: {itemPrioritizationStrategy: "maximumParallelism"}});
    const seqs = Array.from({length: n}, () => context.getSequence());
    const t0 = performance.now();
    let firstDoneMs = 0;
    await Promise.all(seqs.map(async (seq, s) => {
        const prompt = benchPrompt(s, a.promptTokens);
        const input = prompt.map((t, i) =>
            i === prompt.length - 1 ? [t, {generateNext: {token: true, options: greedy}}] : t);
        const out = await seq.controlledEvaluate(input);
        firstDoneMs = Math.max(firstDoneMs, performance.now() - t0);
        let tok = out[prompt.length - 1].next.token;
        for (let i = 1; i < a.genTokens; i++) {
            const o = await seq.controlledEvaluate([[tok, {generateNext: {token: true, options: greedy}}]]);
            tok = o[0].next.token;
        }
    }));
    const secs = (performance.now() - t0) / 1000;
    results[String(n)] = {output_tokens: n * a.genTokens, seconds: secs,
        output_tokens_per_s: (n * a.genTokens) / secs, last_first_token_s: firstDoneMs / 1000};
    process.stderr.write(`llama.cpp ${n} sequences: ${JSON.stringify(results[String(n)])}\n`);
    await context.dispose();
}
fs.writeFileSync(a.out, JSON.stringify({results, settings: {threads: a.threads, amx: a.amx,
    prompt_tokens: a.promptTokens, gen_tokens: a.genTokens, kv_cache: "f16 (default)",
    batching: "one context, sequences: N, maximumParallelism", release: llama.llamaCppRelease.release}}));
await model.dispose();
await llama.dispose();
