// dsinfer bench offline: the engine's figures of issue 5 (bench/RESULTS.md, "Engine").
//
//   - output tokens/s with 1, 4, 16, 64 sequences running together (prefill + decode,
//     distinct prompts, greedy, fixed output length), async step loop on and off, and
//     the host gap between steps as a fraction of step time (S-ASYNC);
//   - llama.cpp on the same GGUF and workload in the same run
//     (bench/llamacpp_offline_bench.mjs: one context, `sequences: N`, batched);
//   - time to first token of a request sharing a 2,000-token prefix with an earlier one
//     (prefix-cache hit) vs the earlier one (miss).
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "base/env.h"
#include "base/settings.h"
#include "engine/calibrate.h"
#include "engine/engine.h"
#include "model/deepseek.h"

namespace dsi {
namespace {

using nlohmann::json;

struct OfflineFlags {
    std::string model;
    bool json = false;
    int threads = 2;
    std::string concurrency = "1,4,16,64";
    int prompt_tokens = 32;
    int gen_tokens = 32;
    int prefix_tokens = 2000;
    int suffix_tokens = 16;
    int64_t kv_cache_mb = 2048;
    bool batch_invariant = true;
    bool async_off = true;  // also run every concurrency with the async loop off
    bool skip_llamacpp = false;
    std::string llamacpp_amx = "off";  // "on" aborts on deepseek2 Q8_0 attn_k_b
};

// Sequence s's prompt; bench/llamacpp_offline_bench.mjs builds the same ids.
std::vector<int32_t> bench_prompt(int64_t s, int64_t n) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(1000 + (s * 7919 + i * 31) % 50000);
    return p;
}

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

engine::EngineOptions engine_options(const OfflineFlags& f, bool async) {
    engine::EngineOptions eo;
    eo.async = async;
    eo.kv_cache_bytes = f.kv_cache_mb << 20;
    eo.model_id = f.model;
    eo.batch_invariant = f.batch_invariant;
    eo.cost_model_path = engine::cost_model_path_for(f.model);
    return eo;
}

// N sequences with distinct prompts, all added before the run: output tokens/s over the
// whole run (prefill included) and the step loop's host gap.
Result<json> run_batch(DeepseekModel* model, const OfflineFlags& f, int64_t n, bool async) {
    DSI_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> eng,
                         engine::Engine::create(model, engine_options(f, async), Env::default_env()));
    for (int64_t s = 0; s < n; ++s) {
        engine::GenerateRequest r;
        r.prompt = bench_prompt(s, f.prompt_tokens);
        r.sampling.max_tokens = f.gen_tokens;
        r.sampling.ignore_eos = true;
        DSI_RETURN_IF_ERROR(eng->add_request(std::move(r), nullptr).status());
    }
    const int64_t t0 = now_ns();
    DSI_RETURN_IF_ERROR(eng->run());
    const double secs = static_cast<double>(now_ns() - t0) * 1e-9;
    const engine::EngineStats st = eng->stats();
    return json{{"seconds", secs},
                {"output_tokens", st.output_tokens},
                {"output_tokens_per_s", static_cast<double>(st.output_tokens) / secs},
                {"steps", st.steps},
                {"step_ms_mean", st.steps ? st.forward_ns / 1e6 / static_cast<double>(st.steps) : 0},
                {"host_gap_fraction",
                 st.forward_ns ? static_cast<double>(st.host_gap_ns) / st.forward_ns : 0.0}};
}

// TTFT of a request whose first prefix_tokens tokens were computed by an earlier request
// (hit) vs that earlier request (miss). Each has its own suffix; one output token.
Result<json> run_ttft(DeepseekModel* model, const OfflineFlags& f) {
    DSI_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> eng,
                         engine::Engine::create(model, engine_options(f, true), Env::default_env()));
    const std::vector<int32_t> prefix = bench_prompt(1000, f.prefix_tokens);
    json out;
    for (int k = 0; k < 2; ++k) {
        engine::GenerateRequest r;
        r.prompt = prefix;
        const std::vector<int32_t> suffix = bench_prompt(2000 + k, f.suffix_tokens);
        r.prompt.insert(r.prompt.end(), suffix.begin(), suffix.end());
        r.sampling.max_tokens = 1;
        r.sampling.ignore_eos = true;
        int64_t first_ns = 0;
        const engine::EngineStats before = eng->stats();
        const int64_t t0 = now_ns();
        DSI_RETURN_IF_ERROR(eng->add_request(std::move(r), [&](const engine::TokenEvent& ev) {
                                    if (ev.token >= 0 && first_ns == 0) first_ns = now_ns();
                                }).status());
        DSI_RETURN_IF_ERROR(eng->run());
        const engine::EngineStats st = eng->stats();
        out[k == 0 ? "miss" : "hit"] = {
            {"ttft_s", static_cast<double>(first_ns - t0) * 1e-9},
            {"prompt_tokens", f.prefix_tokens + f.suffix_tokens},
            {"computed_prefill_tokens", st.computed_prefill_tokens - before.computed_prefill_tokens},
            {"cached_prompt_tokens", st.cached_prompt_tokens - before.cached_prompt_tokens}};
    }
    out["hit_over_miss"] =
        out["hit"]["ttft_s"].get<double>() / out["miss"]["ttft_s"].get<double>();
    return out;
}

std::vector<int64_t> parse_list(const std::string& s) {
    std::vector<int64_t> v;
    std::stringstream in(s);
    std::string item;
    while (std::getline(in, item, ',')) {
        if (!item.empty()) v.push_back(std::stoll(item));
    }
    return v;
}

int run_bench_offline(const OfflineFlags& f) {
    Env* env = Env::default_env();
    std::vector<int64_t> conc;
    try {
        conc = parse_list(f.concurrency);
    } catch (const std::exception&) {
        std::fprintf(stderr, "dsinfer: --concurrency must be a comma list of counts\n");
        return 1;
    }
    for (int64_t n : conc) {
        if (n < 1) {
            std::fprintf(stderr, "dsinfer: --concurrency counts must be >= 1\n");
            return 1;
        }
    }
    Result<std::unique_ptr<WeightSource>> source = open_checkpoint(env, f.model);
    if (!source.is_ok()) {
        std::fprintf(stderr, "dsinfer: %s\n", source.status().to_string().c_str());
        return 1;
    }
    DeepseekModel::Options mo;
    mo.num_threads = f.threads;
    Result<std::unique_ptr<DeepseekModel>> model = DeepseekModel::load(std::move(source).value(), mo);
    if (!model.is_ok()) {
        std::fprintf(stderr, "dsinfer: %s\n", model.status().to_string().c_str());
        return 1;
    }
    json out = {{"model", f.model},
                {"threads", f.threads},
                {"prompt_tokens", f.prompt_tokens},
                {"gen_tokens", f.gen_tokens},
                {"batch_invariant", f.batch_invariant},
                {"cost_model", engine::cost_model_path_for(f.model)}};
    auto fail = [](const Status& s) {
        std::fprintf(stderr, "dsinfer: %s\n", s.to_string().c_str());
        return 1;
    };
    // Warm-up (page-in, thread start); not reported.
    {
        OfflineFlags w = f;
        w.gen_tokens = 2;
        Result<json> r = run_batch(model->get(), w, 2, true);
        if (!r.is_ok()) return fail(r.status());
    }
    for (int64_t n : conc) {
        json row;
        for (bool async : {true, false}) {
            if (!async && !f.async_off) continue;
            Result<json> r = run_batch(model->get(), f, n, async);
            if (!r.is_ok()) return fail(r.status());
            row[async ? "async_on" : "async_off"] = *r;
        }
        out["dsinfer"][std::to_string(n)] = row;
        std::fprintf(stderr, "dsinfer %lld sequences: %s\n", static_cast<long long>(n),
                     row.dump().c_str());
    }
    if (f.prefix_tokens > 0) {
        Result<json> t = run_ttft(model->get(), f);
        if (!t.is_ok()) return fail(t.status());
        out["ttft_prefix"] = *t;
        std::fprintf(stderr, "ttft: %s\n", t->dump().c_str());
    }
    model->reset();  // free the weights before llama.cpp loads its copy
    if (!f.skip_llamacpp) {
        const std::string tmp =
            "/tmp/dsinfer_bench_offline_llamacpp_" + std::to_string(::getpid()) + ".json";
        const std::string cmd = "node " + std::string(DSINFER_SOURCE_DIR) +
                                "/bench/llamacpp_offline_bench.mjs --model " + f.model +
                                " --threads " + std::to_string(f.threads) + " --concurrency " +
                                f.concurrency + " --prompt-tokens " +
                                std::to_string(f.prompt_tokens) + " --gen-tokens " +
                                std::to_string(f.gen_tokens) + " --amx " + f.llamacpp_amx +
                                " --out " + tmp;
        if (std::system(cmd.c_str()) == 0) {
            json l = json::parse(env->read_file(tmp).value());
            out["llama_cpp"] = l;
            for (int64_t n : conc) {
                const std::string k = std::to_string(n);
                out["ratio_output_tokens_per_s"][k] =
                    out["dsinfer"][k]["async_on"]["output_tokens_per_s"].get<double>() /
                    l["results"][k]["output_tokens_per_s"].get<double>();
            }
        } else {
            out["llama_cpp"] = "failed: " + cmd;
        }
        std::remove(tmp.c_str());
    }
    std::printf("%s\n", out.dump(f.json ? 2 : -1).c_str());
    return 0;
}

}  // namespace

void register_bench_offline_command(CLI::App& bench) {
    auto f = std::make_shared<OfflineFlags>();
    CLI::App* o = bench.add_subcommand(
        "offline", "engine throughput at N sequences, async host gap, prefix-hit TTFT, vs llama.cpp");
    add_setting(*o, "--model", f->model, "GGUF (or HF directory with --skip-llamacpp)")->required();
    o->add_flag("--json", f->json, "pretty JSON");
    add_setting(*o, "--threads", f->threads, "compute threads (both engines)");
    add_setting(*o, "--concurrency", f->concurrency, "comma list of sequence counts");
    add_setting(*o, "--prompt-tokens", f->prompt_tokens, "prompt length per sequence");
    add_setting(*o, "--gen-tokens", f->gen_tokens, "output tokens per sequence");
    add_setting(*o, "--prefix-tokens", f->prefix_tokens, "shared prefix of the TTFT figure (0: skip)");
    add_setting(*o, "--suffix-tokens", f->suffix_tokens, "own suffix of each TTFT request");
    add_setting(*o, "--kv-cache-mb", f->kv_cache_mb, "KV block pool size");
    add_switch(*o, "--batch-invariant", f->batch_invariant, "S-ENG-6 (docs/engine.md)");
    add_setting(*o, "--async-off", f->async_off, "also measure with the async loop off");
    add_setting(*o, "--llamacpp-amx", f->llamacpp_amx, "on | off (llama.cpp's AMX variant)");
    o->add_flag("--skip-llamacpp", f->skip_llamacpp, "dsinfer only");
    o->callback([f] {
        if (int rc = run_bench_offline(*f); rc != 0) throw CLI::RuntimeError(rc);
    });
}

}  // namespace dsi
