// Shared by the llama.cpp bench drivers (llamacpp_bench.mjs, llamacpp_offline_bench.mjs):
// loads the llama.cpp bundled in node-llama-cpp 3.21.1 (tests/llamacpp/node_modules),
// CPU only, prebuilt binaries. amx "on": ggml's own choice of CPU variant (the AMX one,
// libggml-cpu-sapphirerapids.so, only where the CPU has AMX-INT8); "off": a private copy
// of the prebuilt package without the AMX variant (as ref_logits.mjs). AMX used to abort
// on deepseek2's Q8_0 attn_k_b; our GGUF writer now stores it as bf16
// (docs/gguf_deepseek2.md section 8).
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import {register} from "node:module";
import {fileURLToPath, pathToFileURL} from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const nm = path.join(here, "..", "tests", "llamacpp", "node_modules");
const PREBUILT = "@node-llama-cpp/linux-x64";

// A context's KV cache type (node-llama-cpp reports ggml's type number) as a name.
export function ggmlTypeName(t) {
    const names = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 30: "bf16"};
    if (t == null) return "f16 (default)";
    return names[t] ?? `ggml type ${t}`;
}

// Whether this CPU reports AMX-INT8 (/proc/cpuinfo flag amx_int8).
export function cpuHasAmx() {
    try {
        return /\bamx_int8\b/.test(fs.readFileSync("/proc/cpuinfo", "utf8"));
    } catch {
        return false;
    }
}

export async function loadLlama({threads, amx}) {
    if (amx === "off") {
        const pkgDir = path.join(nm, PREBUILT);
        const shadow = path.join(os.tmpdir(), "dsinfer-bench-nlc-noamx");
        if (!fs.existsSync(path.join(shadow, ".complete"))) {
            fs.cpSync(pkgDir, shadow, {recursive: true, filter: (s) => !/sapphirerapids\.so$/.test(s)});
            fs.writeFileSync(path.join(shadow, ".complete"), "");
        }
        const entry = pathToFileURL(path.join(shadow, "dist", "index.js")).href;
        register("data:text/javascript," + encodeURIComponent(`export async function resolve(s, c, n) {
            if (s === ${JSON.stringify(PREBUILT)}) return {url: ${JSON.stringify(entry)}, shortCircuit: true};
            return n(s, c); }`), import.meta.url);
    }
    const lib = await import(pathToFileURL(path.join(nm, "node-llama-cpp", "dist", "index.js")).href);
    const llama = await lib.getLlama({gpu: false, build: "never", skipDownload: true,
        usePrebuiltBinaries: true, progressLogs: false, maxThreads: threads,
        logLevel: lib.LlamaLogLevel.error});
    return llama;
}
