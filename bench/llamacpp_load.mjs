// Shared by the llama.cpp bench drivers (llamacpp_bench.mjs, llamacpp_offline_bench.mjs):
// loads the llama.cpp bundled in node-llama-cpp 3.21.1 (tests/llamacpp/node_modules),
// CPU only, prebuilt binaries. amx "off": a private copy of the prebuilt package without
// the AMX variant (as ref_logits.mjs; with AMX, llama.cpp aborts on deepseek2's Q8_0
// attn_k_b, docs/gguf_deepseek2.md).
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import {register} from "node:module";
import {fileURLToPath, pathToFileURL} from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const nm = path.join(here, "..", "tests", "llamacpp", "node_modules");
const PREBUILT = "@node-llama-cpp/linux-x64";

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
