#!/usr/bin/env node
// Independent llama.cpp reference for dsinfer: next-token logits + greedy continuation
// computed by the llama.cpp build bundled in node-llama-cpp 3.21.1 (CPU prebuilt binary).
//
//   node ref_logits.mjs --model X.gguf --tokens-file in.json --out out.json [--threads N]
//
// in.json : {"sequences": [[id, ...], ...], "greedy_tokens": 32}
// out.json: {"llama_cpp_version": {...}, "settings": {...}, "n_vocab": V,
//            "results": [{"n_prompt": n, "logits": [V numbers|null], "top": [[id, prob], ...],
//                         "greedy": [ids], "greedy_top": [[[id, logit], ...], ...]}]}
//
// "logits" semantics: node-llama-cpp 3.21.1 does not expose the raw float logits buffer, but with
// temperature 0 (greedy sampler only) its sampleToken(..., probabilities=true) returns the softmax
// of the FULL raw logit vector (every vocab id, no top-k/top-p/min-p, no penalties).  We invert it:
//     logits[i] = ln(p_i) - ln(p_max) == raw_logit_i - max_j raw_logit_j      (max entry is exactly 0)
// i.e. the raw logits up to one additive constant per position (softmax-invariant).  Compare with
// `x - max(x)` or log_softmax on the engine side.  Entries whose f32 probability underflowed to 0
// (logit more than ~103 below the max) are written as null.  Precision: ~1e-7 absolute for logits
// within ~87 of the max (f32 expf/normalisation in the addon), degrading in the f32-denormal range.
//
// Each sequence starts from an empty KV cache (clearHistory() on a single-sequence context).
// Token ids are fed directly: no tokenizer, no BOS insertion, no chat template.
// Greedy continuation: argmax (lowest id wins ties, llama_sampler_greedy), no repeat penalty,
// continues through EOG tokens (it never stops early).

import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import {register} from "node:module";
import {fileURLToPath, pathToFileURL} from "node:url";

const PREBUILT_PKG = "@node-llama-cpp/linux-x64";

// root folder of an installed package (both packages are ESM with a dist/index.js entry and restrictive "exports")
function packageDir(name) {
    let dir = path.dirname(fileURLToPath(import.meta.resolve(name)));
    while (!fs.existsSync(path.join(dir, "package.json"))) {
        const up = path.dirname(dir);
        if (up === dir) throw new Error(`cannot find package.json of ${name}`);
        dir = up;
    }
    return dir;
}

function usage(msg) {
    if (msg) process.stderr.write(`error: ${msg}\n`);
    process.stderr.write(`usage: node ref_logits.mjs --model X.gguf --tokens-file in.json --out out.json
         [--threads N]        CPU threads (default: all math cores)
         [--ctx N]            context size (default: max(prompt+greedy)+8, rounded up to 256)
         [--batch N]          llama.cpp batch size (default: min(ctx, 512))
         [--kv-type f32|f16]  KV-cache element type (default f32: keeps the attention path in f32 on CPU)
         [--flash-attn]       enable flash attention (default off; CPU FA converts Q/K/V to f16)
         [--top K]            also emit the top-K [id, prob] list per sequence (default 20)
         [--greedy-top K]     emit top-K [id, shifted logit] at every greedy step (default 5, 0 = off)
         [--all-positions]    also emit "positions": full shifted logits after EVERY prompt token
         [--positions-top K]  also emit "positions_top": after EVERY prompt token, its top-K
                              [id, shifted logit] pairs (teacher-forced comparison at every position)
         [--amx off|on]       off (default): hide ggml's AMX CPU variant (libggml-cpu-sapphirerapids.so) so
                              every x86 host runs the same AVX2/AVX512 kernels; on: use the stock variant choice
         [--verbose]          forward llama.cpp info logs to stderr
`);
    process.exit(2);
}

function parseArgs(argv) {
    const a = {threads: 0, ctx: 0, batch: 0, kvType: "f32", flashAttn: false, top: 20, greedyTop: 5,
        allPositions: false, positionsTop: 0, verbose: false, amx: "off"};
    for (let i = 2; i < argv.length; i++) {
        const k = argv[i];
        const next = () => {
            if (i + 1 >= argv.length) usage(`missing value for ${k}`);
            return argv[++i];
        };
        const int = () => {
            const v = Number(next());
            if (!Number.isInteger(v) || v < 0) usage(`${k} needs a non-negative integer`);
            return v;
        };
        switch (k) {
            case "--model": a.model = next(); break;
            case "--tokens-file": a.tokensFile = next(); break;
            case "--out": a.out = next(); break;
            case "--threads": a.threads = int(); break;
            case "--ctx": a.ctx = int(); break;
            case "--batch": a.batch = int(); break;
            case "--kv-type": a.kvType = next().toLowerCase(); break;
            case "--flash-attn": a.flashAttn = true; break;
            case "--top": a.top = int(); break;
            case "--greedy-top": a.greedyTop = int(); break;
            case "--all-positions": a.allPositions = true; break;
            case "--positions-top": a.positionsTop = int(); break;
            case "--verbose": a.verbose = true; break;
            case "--amx": a.amx = next().toLowerCase(); break;
            case "-h": case "--help": usage(); break;
            default: usage(`unknown argument ${k}`);
        }
    }
    if (!a.model || !a.tokensFile || !a.out) usage("--model, --tokens-file and --out are required");
    if (!["f32", "f16"].includes(a.kvType)) usage("--kv-type must be f32 or f16");
    if (!["on", "off"].includes(a.amx)) usage("--amx must be on or off");
    return a;
}

// Map<token, prob> (full vocab) -> {shifted: Float64Array (NaN = underflow), order: [[id, prob]...]}
function invertProbabilities(probs, nVocab) {
    const shifted = new Float64Array(nVocab).fill(NaN);
    let pMax = 0;
    for (const p of probs.values()) if (p > pMax) pMax = p;
    if (!(pMax > 0)) throw new Error("probability vector has no positive entry");
    const lnMax = Math.log(pMax);
    let seen = 0;
    for (const [id, p] of probs) {
        if (id < 0 || id >= nVocab) throw new Error(`probability for out-of-range token ${id}`);
        shifted[id] = p > 0 ? Math.log(p) - lnMax : NaN;
        seen++;
    }
    if (seen !== nVocab)
        throw new Error(`expected a probability for all ${nVocab} tokens, got ${seen} ` +
            `(a truncating sampler is active?)`);
    return shifted;
}

function topK(probs, k) {
    // partial selection (O(V*k)); order: probability desc, then token id asc
    const best = [];
    for (const [id, p] of probs) {
        if (best.length === k && !(p > best[k - 1][1] || (p === best[k - 1][1] && id < best[k - 1][0]))) continue;
        let i = best.length < k ? best.length : k - 1;
        best[i] = [id, p];
        while (i > 0 && (best[i][1] > best[i - 1][1] || (best[i][1] === best[i - 1][1] && best[i][0] < best[i - 1][0]))) {
            [best[i], best[i - 1]] = [best[i - 1], best[i]];
            i--;
        }
    }
    return best;
}

function toJsonArray(shifted) {
    return Array.from(shifted, (v) => (Number.isNaN(v) ? null : v));
}

// --amx off: ggml picks the best-scoring libggml-cpu-<variant>.so next to the addon; on AMX hosts that is the
// sapphirerapids variant, whose AMX "extra buffer type" (a) takes F16/Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K/IQ4_XS
// weights of eligible 2-D matmuls and computes them with different numerics (F16: f32 activations instead of
// f16-rounded ones) and (b) aborts with GGML_ASSERT(*cur_backend_id != -1) on deepseek2's attn_k_b when it is
// F16/Q8_0 (batched matmul with a non-contiguous src1 that the AMX backend rejects).  We build a private copy of
// the prebuilt package without that one variant (in the OS temp dir, once per version) and redirect the package
// import to it with a module-resolution hook; node_modules is never modified.
function prepareNoAmxPrebuilt() {
    const pkgDir = packageDir(PREBUILT_PKG);
    const version = JSON.parse(fs.readFileSync(path.join(pkgDir, "package.json"), "utf8")).version;
    const shadow = path.join(os.tmpdir(), `dsinfer-nlc-${PREBUILT_PKG.replace(/[@/]/g, "_")}-${version}-noamx`);
    const marker = path.join(shadow, ".complete");
    if (!fs.existsSync(marker)) {
        const tmp = `${shadow}.tmp-${process.pid}`;
        fs.rmSync(tmp, {recursive: true, force: true});
        fs.cpSync(pkgDir, tmp, {
            recursive: true,
            filter: (src) => !/libggml-cpu-sapphirerapids\.so$/.test(src)
        });
        fs.writeFileSync(path.join(tmp, ".complete"), "");
        try {
            fs.renameSync(tmp, shadow);
        } catch {
            fs.rmSync(tmp, {recursive: true, force: true}); // another process won the race
        }
    }
    const entry = pathToFileURL(path.join(shadow, "dist", "index.js")).href;
    const hook = `export async function resolve(specifier, context, next) {
        if (specifier === ${JSON.stringify(PREBUILT_PKG)}) return {url: ${JSON.stringify(entry)}, shortCircuit: true};
        return next(specifier, context);
    }`;
    register("data:text/javascript," + encodeURIComponent(hook), import.meta.url);
    return shadow;
}

async function main() {
    const args = parseArgs(process.argv);
    let noAmxDir = null;
    if (args.amx === "off") {
        try {
            noAmxDir = prepareNoAmxPrebuilt();
        } catch (err) {
            process.stderr.write(`warning: --amx off unavailable (${err?.message ?? err}); using the stock prebuilt\n`);
        }
    }
    const {getLlama, LlamaLogLevel} = await import("node-llama-cpp");
    const input = JSON.parse(fs.readFileSync(args.tokensFile, "utf8"));
    const sequences = input.sequences;
    const greedyTokens = input.greedy_tokens ?? 0;
    if (!Array.isArray(sequences) || sequences.length === 0) usage("in.json: 'sequences' must be a non-empty array");
    if (!Number.isInteger(greedyTokens) || greedyTokens < 0) usage("in.json: 'greedy_tokens' must be an integer >= 0");
    for (const s of sequences) {
        if (!Array.isArray(s) || s.length === 0 || !s.every((t) => Number.isInteger(t) && t >= 0))
            usage("in.json: every sequence must be a non-empty array of non-negative integer token ids");
    }

    const llama = await getLlama({
        gpu: false,                 // CPU prebuilt (@node-llama-cpp/linux-x64)
        build: "never",             // never compile llama.cpp
        skipDownload: true,         // never fetch llama.cpp sources/binaries
        usePrebuiltBinaries: true,
        progressLogs: false,
        maxThreads: args.threads || undefined,
        logLevel: args.verbose ? LlamaLogLevel.debug : LlamaLogLevel.warn,
        logger: (level, message) => {
            const line = `[llama.cpp ${level}] ${String(message).replace(/\n$/, "")}`;
            if (args.verbose || level === "error" || level === "fatal" || level === "warn") process.stderr.write(line + "\n");
        }
    });

    const model = await llama.loadModel({
        modelPath: path.resolve(args.model),
        gpuLayers: 0,
        useMmap: true,
        checkTensors: false,
        defaultContextFlashAttention: args.flashAttn
    });
    // n_vocab = rows of token_embd.weight (llama.cpp requires it to equal the tokenizer token count);
    // re-checked below against the size of the returned probability vector.
    const embd = model.fileInfo.tensorInfo?.find((t) => t.name === "token_embd.weight");
    const V = embd != null ? Number(embd.dimensions[1]) : undefined;

    const maxLen = Math.max(...sequences.map((s) => s.length)) + greedyTokens;
    const ctxSize = args.ctx || Math.max(256, Math.ceil((maxLen + 8) / 256) * 256);
    if (maxLen > ctxSize) usage(`--ctx ${ctxSize} is smaller than the longest prompt+greedy (${maxLen})`);
    const batchSize = args.batch || Math.min(ctxSize, 512);

    const kvType = args.kvType.toUpperCase();
    const context = await model.createContext({
        contextSize: ctxSize,
        batchSize,
        sequences: 1,
        flashAttention: args.flashAttn,
        threads: args.threads ? {ideal: args.threads, min: args.threads} : undefined,
        experimentalKvCacheKeyType: kvType,
        experimentalKvCacheValueType: kvType,
        ignoreMemorySafetyChecks: true,
        failedCreationRemedy: false
    });
    const seq = context.getSequence();

    const greedyOpts = {temperature: 0};  // -> llama_sampler_init_greedy only; topK/topP/minP not in the chain
    const results = [];
    for (let si = 0; si < sequences.length; si++) {
        const prompt = sequences[si];
        if (V != null) {
            const bad = prompt.find((t) => t >= V);
            if (bad != null) throw new Error(`sequence ${si}: token id ${bad} >= n_vocab ${V}`);
        }
        await seq.clearHistory();                       // empty KV state for every sequence
        if (seq.nextTokenIndex !== 0) throw new Error("KV state not empty after clearHistory()");

        const input = prompt.map((t, i) => {
            const last = i === prompt.length - 1;
            if (!last && !args.allPositions && args.positionsTop === 0) return t;
            return [t, {generateNext: {token: last, probabilities: true, options: greedyOpts}}];
        });
        const out = await seq.controlledEvaluate(input);
        const lastOut = out[prompt.length - 1];
        if (lastOut?.next?.probabilities == null) throw new Error(`sequence ${si}: no probabilities returned`);
        const probs = lastOut.next.probabilities;
        const nV = V ?? probs.size;
        if (probs.size !== nV) throw new Error(`probability vector has ${probs.size} entries, expected n_vocab ${nV}`);
        const shifted = invertProbabilities(probs, nV);
        const res = {n_prompt: prompt.length, logits: toJsonArray(shifted)};
        if (args.top > 0) res.top = topK(probs, args.top);
        if (args.allPositions) {
            res.positions = prompt.map((_, i) => toJsonArray(invertProbabilities(out[i].next.probabilities, nV)));
        }
        if (args.positionsTop > 0) {
            res.positions_top = prompt.map((_, i) => {
                const p = out[i].next.probabilities;
                const sh = invertProbabilities(p, nV);
                return topK(p, args.positionsTop).map(([id]) => [id, sh[id]]);
            });
        }

        const greedy = [];
        const greedyTop = [];
        let tok = lastOut.next.token;
        if (greedyTokens > 0) {
            if (tok == null) throw new Error(`sequence ${si}: greedy sampling returned no token`);
            greedy.push(tok);
            if (args.greedyTop > 0) greedyTop.push(topK(probs, args.greedyTop).map(([id]) => [id, shifted[id]]));
        }
        while (greedy.length < greedyTokens) {
            const wantTop = args.greedyTop > 0;
            const o = await seq.controlledEvaluate([[tok, {generateNext: {token: true, probabilities: wantTop, options: greedyOpts}}]]);
            const n = o[0]?.next;
            if (n?.token == null) throw new Error(`sequence ${si}: greedy step ${greedy.length} returned no token`);
            tok = n.token;
            greedy.push(tok);
            if (wantTop) {
                const sh = invertProbabilities(n.probabilities, nV);
                greedyTop.push(topK(n.probabilities, args.greedyTop).map(([id]) => [id, sh[id]]));
            }
        }
        res.greedy = greedy;
        if (args.greedyTop > 0) res.greedy_top = greedyTop;
        results.push(res);
        process.stderr.write(`sequence ${si}: ${prompt.length} prompt tokens, top1=${res.top?.[0]?.[0] ?? "?"}, greedy=${greedy.length}\n`);
    }

    const nlcVersion = JSON.parse(fs.readFileSync(path.join(packageDir("node-llama-cpp"), "package.json"), "utf8")).version;
    const prebuiltDir = noAmxDir ?? packageDir(PREBUILT_PKG);
    let buildMetadata = null;
    try {
        buildMetadata = JSON.parse(fs.readFileSync(path.join(prebuiltDir, "bins", "linux-x64", "_nlcBuildMetadata.json"), "utf8"));
    } catch { /* informational only */ }
    const output = {
        llama_cpp_version: {
            node_llama_cpp: nlcVersion,
            repo: llama.llamaCppRelease.repo,
            release: llama.llamaCppRelease.release,
            build_type: llama.buildType,
            prebuilt_dir: prebuiltDir,
            build_metadata: buildMetadata,
            amx: noAmxDir != null ? "off" : "on",
            gpu: llama.gpu,
            system_info: llama.systemInfo
        },
        settings: {
            model: path.resolve(args.model),
            context_size: context.contextSize,
            batch_size: batchSize,
            threads: context.currentThreads ?? args.threads,
            kv_cache_type: kvType,
            flash_attention: context.flashAttention,
            sampler: "greedy (temperature 0), no penalties, no token bias",
            logits_kind: "raw logits minus their max (ln p_i - ln p_max); null = f32 underflow"
        },
        n_vocab: V ?? null,
        results
    };
    fs.writeFileSync(args.out, JSON.stringify(output));
    await context.dispose();
    await model.dispose();
    await llama.dispose();
}

main().catch((err) => {
    process.stderr.write(`ref_logits: ${err?.stack ?? err}\n`);
    process.exit(1);
});
