// dsinfer bench offline: the engine's figures of issue 5 (bench/RESULTS.md, "Engine").
//
//   - output tokens/s with 1, 4, 16, 64 sequences running together (prefill + decode,
//     distinct prompts, greedy, fixed output length), async step loop on and off, and
//     the host gap between steps as a fraction of step time (S-ASYNC);
//   - llama.cpp on the same GGUF and workload in the same run
//     (bench/llamacpp_offline_bench.mjs: one context, `sequences: N`; it counts its
//     llama_decode calls and the tokens in each, so its batching is shown, not assumed);
//   - time to first token of a request sharing a 2,000-token prefix with an earlier one
//     (prefix-cache hit) vs the earlier one (miss).
// --repetitions R (default 3) alternates the two sides R times (dsinfer, llama.cpp,
// dsinfer, ...; each side warmed up in every repetition, the weights of one freed before
// the other loads) and reports each figure's median, min, max and runs; the ratio is
// the ratio of the medians.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/settings.h"
#include "bench_stats.h"
#include "engine/dp_front.h"
#include "engine/engine.h"
#include "ep_launch.h"
#include "kernels/cpu_features.h"
#include "replica_flags.h"
#include "serving/replica.h"
#include "support/build_paths.h"

namespace dsi {
namespace {

using nlohmann::json;

struct OfflineFlags {
    ReplicaFlags replica;  // --model, --threads (default 2 here), engine settings
    bool json = false;
    std::string concurrency = "1,4,16,64";
    int prompt_tokens = 32;
    int gen_tokens = 32;
    int prefix_tokens = 2000;
    int suffix_tokens = 16;
    bool async_off = true;  // also run every concurrency with the async loop off
    bool skip_llamacpp = false;
    // llama.cpp's AMX variant: "on" (ggml's own choice; used only where the CPU has
    // AMX-INT8) or "off" (hidden). The GGUF writer keeps attn_k_b out of AMX (bf16).
    std::string llamacpp_amx = "on";
    std::string llamacpp_flash_attn = "off";
    int repetitions = 3;
    // --ep N: rank 0 measures; with --ep-attention dp (the default) the requests are
    // spread over the ranks (a fresh engine on every rank per measurement), with rank0 the
    // ranks it starts only lend their experts.
    EpFlags ep;
};

// Expert parallelism (issue 19): the group's per-rank expert rows, moe_lb of its
// measured windows, placement changes and failovers so far.
json expert_parallel_json(const ExpertParallelStats& ep) {
    json windows = json::array();
    for (const ExpertParallelStats::Window& w : ep.windows) {
        windows.push_back({{"end_step", w.end_step},
                           {"placement", w.placement},
                           {"moe_lb", w.moe_lb},
                           {"placed_moe_lb", w.placed_moe_lb}});
    }
    return {{"ranks", ep.num_ranks},
            {"steps", ep.steps},
            {"rank_expert_rows", ep.rank_rows},
            {"moe_lb_last_window", ep.windows.empty() ? 0.0 : ep.windows.back().moe_lb},
            {"placement_changes", ep.placement_changes},
            {"placed_moe_lb", ep.placed_moe_lb},
            {"failovers", ep.failovers},
            {"windows", windows}};
}

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

// N sequences with distinct prompts, all added before the run: output tokens/s over the
// whole run (prefill included) and the step loop's host gap.
// A fresh engine (empty prefix cache) on the replica's model.
Result<engine::Engine*> fresh_engine(serving::Replica* replica, bool async) {
    engine::EngineOptions eo = replica->engine_options();
    eo.async = async;
    DSI_RETURN_IF_ERROR(replica->reset_engine(std::move(eo)));
    return replica->engine();
}

// `dp` (--ep N --ep-attention dp): the requests go through an engine::DpFront over rank 0's
// fresh engine, spread over the ranks, each of which starts a fresh engine too.
Result<json> run_batch(serving::Replica* replica, const OfflineFlags& f, int64_t n, bool async,
                       engine::DpRankLink* dp, Env* env) {
    DSI_ASSIGN_OR_RETURN(engine::Engine * local, fresh_engine(replica, async));
    std::unique_ptr<engine::DpFront> front;
    engine::StepEngine* eng = local;
    if (dp != nullptr) {
        front = std::make_unique<engine::DpFront>(
            local, replica->model(), dp, env,
            dp_routing(f.ep, replica->cache_identity(), f.replica.prefix_cache));
        DSI_RETURN_IF_ERROR(front->reset_ranks(async));
        eng = front.get();
    }
    for (int64_t s = 0; s < n; ++s) {
        engine::GenerateRequest r;
        r.prompt = bench_prompt(s, f.prompt_tokens);
        r.sampling.max_tokens = f.gen_tokens;
        r.sampling.ignore_eos = true;
        DSI_RETURN_IF_ERROR(eng->add_request(std::move(r), nullptr).status());
    }
    const int64_t t0 = now_ns();
    while (eng->has_work()) DSI_RETURN_IF_ERROR(eng->step());
    const double secs = static_cast<double>(now_ns() - t0) * 1e-9;
    const engine::EngineStats st = eng->stats();
    json out{{"seconds", secs},
             {"output_tokens", st.output_tokens},
             {"output_tokens_per_s", static_cast<double>(st.output_tokens) / secs},
             {"steps", st.steps},
             {"step_ms_mean", st.steps ? st.forward_ns / 1e6 / static_cast<double>(st.steps) : 0},
             {"host_gap_fraction",
              st.forward_ns ? static_cast<double>(st.host_gap_ns) / st.forward_ns : 0.0}};
    if (st.expert_parallel) out["expert_parallel"] = expert_parallel_json(*st.expert_parallel);
    if (dp != nullptr) {
        json per_rank = json::array();
        for (const engine::EngineStats::DpRank& r : st.dp_ranks) per_rank.push_back(r.requests);
        out["dp_rank_requests"] = per_rank;
        out["dp_prefix_routed"] = st.dp_prefix_routed;
        out["cached_prompt_tokens"] = st.cached_prompt_tokens;
    }
    if (st.spec_verify_steps > 0) {  // --speculative (issue 24)
        json per = json::array();
        for (size_t j = 0; j < st.spec_drafted_at.size() && st.spec_drafted_at[j] > 0; ++j) {
            per.push_back(static_cast<double>(st.spec_accepted_at[j]) / st.spec_drafted_at[j]);
        }
        out["speculative"] = {
            {"verify_steps", st.spec_verify_steps},
            {"draft_tokens", st.spec_draft_tokens},
            {"accepted_tokens", st.spec_accepted_tokens},
            {"accepted_length",
             1.0 + static_cast<double>(st.spec_accepted_tokens) / st.spec_verify_steps},
            {"acceptance_by_position", per},
            {"steps", st.spec_steps},
            {"drafts_verified_per_step",
             st.spec_steps ? static_cast<double>(st.spec_draft_tokens) / st.spec_steps : 0.0},
            {"varlen_cut_tokens", st.spec_varlen_cut_tokens}};
    }
    return out;
}

// TTFT of a request whose first prefix_tokens tokens were computed by an earlier request
// (hit) vs that earlier request (miss). Each has its own suffix; one output token.
Result<json> run_ttft(serving::Replica* replica, const OfflineFlags& f) {
    DSI_ASSIGN_OR_RETURN(engine::Engine * eng, fresh_engine(replica, true));
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
        DSI_RETURN_IF_ERROR(eng->add_request(std::move(r),
                                             [&](const engine::TokenEvent& ev) {
                                                 if (ev.token >= 0 && first_ns == 0)
                                                     first_ns = now_ns();
                                             })
                                .status());
        DSI_RETURN_IF_ERROR(eng->run());
        const engine::EngineStats st = eng->stats();
        out[k == 0 ? "miss" : "hit"] = {
            {"ttft_s", static_cast<double>(first_ns - t0) * 1e-9},
            {"prompt_tokens", f.prefix_tokens + f.suffix_tokens},
            {"computed_prefill_tokens",
             st.computed_prefill_tokens - before.computed_prefill_tokens},
            {"cached_prompt_tokens", st.cached_prompt_tokens - before.cached_prompt_tokens}};
    }
    out["hit_over_miss"] = out["hit"]["ttft_s"].get<double>() / out["miss"]["ttft_s"].get<double>();
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

// One repetition of dsinfer's side: open the replica, warm up, every concurrency (async
// on, and off with --async-off), the prefix TTFT; the weights are freed on return.
Result<json> run_dsinfer_once(const OfflineFlags& f, const std::vector<int64_t>& conc, Env* env) {
    DSI_ASSIGN_OR_RETURN(serving::ReplicaOptions options, to_replica_options(f.replica));
    options.load_tokenizer = false;  // token ids only
    options.create_engine = false;   // one fresh engine per measurement
    // --ep N: a fresh group each repetition (its ranks end with it).
    DSI_ASSIGN_OR_RETURN(EpLaunch ep, EpLaunch::start(f.ep, env, options, /*long_idle=*/false));
    DSI_ASSIGN_OR_RETURN(std::unique_ptr<serving::Replica> replica,
                         serving::open_replica(std::move(options), env));
    serving::Replica* rep = replica.get();
    json out = {{"cost_model", rep->engine_options().cost_model_path}};
    // Warm-up (page-in, thread start); not reported.
    {
        OfflineFlags w = f;
        w.gen_tokens = 2;
        DSI_RETURN_IF_ERROR(run_batch(rep, w, 2, true, ep.dp_link(), env).status());
    }
    for (int64_t n : conc) {
        json row;
        for (bool async : {true, false}) {
            if (!async && !f.async_off) continue;
            DSI_ASSIGN_OR_RETURN(json r, run_batch(rep, f, n, async, ep.dp_link(), env));
            row[async ? "async_on" : "async_off"] = r;
        }
        out[std::to_string(n)] = row;
        std::fprintf(stderr, "dsinfer %lld sequences: %s\n", static_cast<long long>(n),
                     row.dump().c_str());
    }
    const KvLayout layout = rep->model()->kv_layout();
    if (f.prefix_tokens > 0 && !layout.prefix_reusable) {
        // Nothing to measure: the engine offers no prefix hit for this model.
        out["ttft_prefix"] = "skipped: " + layout.not_reusable_reason;
    } else if (f.prefix_tokens > 0) {
        DSI_ASSIGN_OR_RETURN(json t, run_ttft(rep, f));
        out["ttft_prefix"] = t;
        std::fprintf(stderr, "ttft: %s\n", t.dump().c_str());
    }
    if (auto st = rep->model()->expert_parallel_stats(SIZE_MAX)) {
        out["expert_parallel"] = expert_parallel_json(*st);  // the whole repetition
    }
    DSI_RETURN_IF_ERROR(ep.finish(*rep));
    return out;
}

// One repetition of llama.cpp's side (a fresh node process, warmed up inside).
Result<json> run_llamacpp_once(const OfflineFlags& f) {
    const std::string tmp =
        "/tmp/dsinfer_bench_offline_llamacpp_" + std::to_string(::getpid()) + ".json";
    const std::string cmd =
        "node " + std::string(DSINFER_SOURCE_DIR) + "/bench/llamacpp_offline_bench.mjs --model " +
        f.replica.model + " --threads " + std::to_string(f.replica.threads) + " --concurrency " +
        f.concurrency + " --prompt-tokens " + std::to_string(f.prompt_tokens) + " --gen-tokens " +
        std::to_string(f.gen_tokens) + " --amx " + f.llamacpp_amx + " --flash-attn " +
        f.llamacpp_flash_attn + " --out " + tmp;
    if (std::system(cmd.c_str()) != 0) return internal_error("llama.cpp side failed: " + cmd);
    DSI_ASSIGN_OR_RETURN(std::string text, Env::default_env()->read_file(tmp));
    std::remove(tmp.c_str());
    return json::parse(text);
}

// A rank `bench offline --ep N` started: lends its experts until rank 0 ends the group.
int run_started_rank(const OfflineFlags& f, Env* env) {
    Result<serving::ReplicaOptions> options = to_replica_options(f.replica);
    Status s = options.status();
    if (s.is_ok()) {
        options->load_tokenizer = false;
        Result<EpLaunch> ep = EpLaunch::start(f.ep, env, *options, /*long_idle=*/false);
        s = ep.status();
        if (s.is_ok()) {
            Result<std::unique_ptr<serving::Replica>> replica =
                serving::open_replica(std::move(options).value(), env);
            s = replica.is_ok() ? ep->run_started_rank(**replica, env) : replica.status();
        }
    }
    if (!s.is_ok()) std::fprintf(stderr, "dsinfer: %s\n", s.to_string().c_str());
    return EpLaunch::started_rank_exit_code(s);
}

int run_bench_offline(const OfflineFlags& f) {
    Env* env = Env::default_env();
    if (f.ep.rank > 0) return run_started_rank(f, env);
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
    if (f.repetitions < 1) {
        std::fprintf(stderr, "dsinfer: --repetitions must be >= 1\n");
        return 1;
    }
    json out = {{"model", f.replica.model},
                {"threads", f.replica.threads},
                {"prompt_tokens", f.prompt_tokens},
                {"gen_tokens", f.gen_tokens},
                {"batch_invariant", f.replica.batch_invariant},
                {"repetitions", f.repetitions},
                {"ep", f.ep.ep},
                {"eplb", f.ep.eplb},
                {"ep_attention", f.ep.ep > 1 ? f.ep.attention : "-"},
                {"dsinfer_settings",
                 {{"attention", "MLA, absorbed (latent KV), no flash-attention variant"},
                  {"kv_cache_type", "f32"},
                  {"amx", kernels::amx_active() ? "on" : "off (CPU without AMX-INT8)"}}}};
    auto fail = [](const Status& s) {
        std::fprintf(stderr, "dsinfer: %s\n", s.to_string().c_str());
        return 1;
    };
    // runs[series][n]: one value per repetition.
    std::map<std::string, std::map<int64_t, std::vector<double>>> runs;
    std::vector<double> ttft_hit_over_miss;
    bool llamacpp_ok = !f.skip_llamacpp;
    for (int r = 0; r < f.repetitions; ++r) {
        Result<json> d = run_dsinfer_once(f, conc, env);
        if (!d.is_ok()) return fail(d.status());
        out["cost_model"] = (*d)["cost_model"];
        out["dsinfer_runs"].push_back(*d);
        for (int64_t n : conc) {
            for (const char* mode : {"async_on", "async_off"}) {
                const json& row = (*d)[std::to_string(n)];
                if (row.contains(mode)) {
                    runs[mode][n].push_back(row[mode]["output_tokens_per_s"].get<double>());
                }
            }
        }
        if (d->contains("ttft_prefix") && (*d)["ttft_prefix"].is_object()) {
            ttft_hit_over_miss.push_back((*d)["ttft_prefix"]["hit_over_miss"].get<double>());
        }
        if (!llamacpp_ok) continue;
        Result<json> l = run_llamacpp_once(f);
        if (!l.is_ok()) {
            out["llama_cpp"] = l.status().to_string();
            llamacpp_ok = false;
            continue;
        }
        out["llama_cpp_runs"].push_back((*l)["results"]);
        out["llama_cpp_settings"] = (*l)["settings"];
        for (int64_t n : conc) {
            const json& lr = (*l)["results"][std::to_string(n)];
            runs["llama_cpp"][n].push_back(lr["output_tokens_per_s"].get<double>());
            runs["llama_cpp_decode_calls"][n].push_back(lr["decode_calls"].get<double>());
            runs["llama_cpp_min_tokens_per_call"][n].push_back(
                lr["min_generation_tokens_per_call"].get<double>());
        }
    }
    std::string table =
        "| N | dsinfer tok/s median (min-max) | llama.cpp tok/s median (min-max) | ratio of "
        "medians | llama.cpp decode calls | llama.cpp fewest tokens in a decode call |\n"
        "|---:|---:|---:|---:|---:|---:|\n";
    for (int64_t n : conc) {
        json row;
        for (auto& [series, by_n] : runs) row[series] = bench::summarize_runs(by_n[n]);
        char line[256];
        const json& on = row["async_on"];
        if (llamacpp_ok) {
            const json& l = row["llama_cpp"];
            row["ratio_of_medians"] = on["median"].get<double>() / l["median"].get<double>();
            std::snprintf(line, sizeof line,
                          "| %lld | %.1f (%.1f-%.1f) | %.1f (%.1f-%.1f) | %.2f | %.0f | %.0f |\n",
                          static_cast<long long>(n), on["median"].get<double>(),
                          on["min"].get<double>(), on["max"].get<double>(),
                          l["median"].get<double>(), l["min"].get<double>(), l["max"].get<double>(),
                          row["ratio_of_medians"].get<double>(),
                          row["llama_cpp_decode_calls"]["median"].get<double>(),
                          row["llama_cpp_min_tokens_per_call"]["min"].get<double>());
        } else {
            std::snprintf(line, sizeof line, "| %lld | %.1f (%.1f-%.1f) | - | - | - | - |\n",
                          static_cast<long long>(n), on["median"].get<double>(),
                          on["min"].get<double>(), on["max"].get<double>());
        }
        table += line;
        out["summary"][std::to_string(n)] = row;
    }
    if (!ttft_hit_over_miss.empty()) {
        out["summary"]["ttft_hit_over_miss"] = bench::summarize_runs(ttft_hit_over_miss);
    }
    out["table"] = table;
    std::fprintf(stderr, "%s", table.c_str());
    std::printf("%s\n", out.dump(f.json ? 2 : -1).c_str());
    return 0;
}

}  // namespace

void register_bench_offline_command(CLI::App& bench) {
    auto f = std::make_shared<OfflineFlags>();
    CLI::App* o = bench.add_subcommand(
        "offline",
        "engine throughput at N sequences, async host gap, prefix-hit TTFT, vs llama.cpp");
    f->replica.threads = 2;  // both engines; the machine's cores (bench/RESULTS.md)
    add_replica_flags(*o, &f->replica, {.engine = true, .async = false});
    o->get_option("--model")->required()->description(
        "GGUF (or HF directory with --skip-llamacpp)");
    o->add_flag("--json", f->json, "pretty JSON");
    add_setting(*o, "--concurrency", f->concurrency, "comma list of sequence counts");
    add_setting(*o, "--prompt-tokens", f->prompt_tokens, "prompt length per sequence");
    add_setting(*o, "--gen-tokens", f->gen_tokens, "output tokens per sequence");
    add_setting(*o, "--prefix-tokens", f->prefix_tokens,
                "shared prefix of the TTFT figure (0: skip)");
    add_setting(*o, "--suffix-tokens", f->suffix_tokens, "own suffix of each TTFT request");
    add_setting(*o, "--async-off", f->async_off, "also measure with the async loop off");
    add_setting(*o, "--llamacpp-amx", f->llamacpp_amx, "on | off (llama.cpp's AMX variant)");
    add_setting(*o, "--llamacpp-flash-attn", f->llamacpp_flash_attn, "on | off");
    add_setting(*o, "--repetitions", f->repetitions, "alternating repetitions (median, spread)");
    o->add_flag("--skip-llamacpp", f->skip_llamacpp, "dsinfer only");
    add_ep_flags(*o, &f->ep);
    o->callback([f] {
        if (int rc = run_bench_offline(*f); rc != 0) throw CLI::RuntimeError(rc);
    });
}

}  // namespace dsi
