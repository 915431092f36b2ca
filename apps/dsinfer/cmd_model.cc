// `dsinfer make-model`, `dsinfer plan` and `dsinfer generate`.
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "base/env.h"
#include "base/logging.h"
#include "base/progress.h"
#include "base/settings.h"
#include "engine/dp_front.h"
#include "engine/engine.h"
#include "engine/ep_rank.h"
#include "ep_launch.h"
#include "kv/swa_rules.h"
#include "model/checkpoint_writer.h"
#include "model/memory_plan.h"
#include "model/synthetic.h"
#include "model/v41_config.h"
#include "model/weights.h"
#include "replica_flags.h"
#include "sampling/sampler.h"
#include "serving/data_dir.h"
#include "serving/replica.h"
#include "tokenizer/tokenizer.h"

namespace dsi {
namespace {

using engine::GenerateRequest;

struct MakeModelFlags {
    std::string preset = "tiny";
    std::string out;
    std::string format = "all";  // hf | gguf | all
    std::string gguf_dtype = "f32";
    std::string gguf_experts;   // routed experts' GGUF type; "" = gguf_dtype
    std::string tokenizer_dir;  // "" = the installed data (serving/data_dir.h)
    uint64_t seed = 1;
};

int fail(const Status& s) {
    std::fprintf(stderr, "dsinfer: %s\n", s.to_string().c_str());
    return 1;
}

Result<DType> parse_gguf_dtype(const std::string& s) {
    if (s == "f32") return DType::kF32;
    if (s == "f16") return DType::kF16;
    if (s == "bf16") return DType::kBF16;
    if (s == "q8_0") return DType::kQ8_0;
    return invalid_argument("--gguf-dtype must be f32, f16, bf16 or q8_0, got '" + s + "'");
}

int run_make_model(const MakeModelFlags& f) {
    Env* env = Env::default_env();
    Result<ModelConfig> config = synthetic_preset(f.preset);
    if (!config.is_ok()) return fail(config.status());
    Result<DType> dtype = parse_gguf_dtype(f.gguf_dtype);
    if (!dtype.is_ok()) return fail(dtype.status());
    std::optional<DType> experts;
    if (f.gguf_experts == "mxfp4") {
        experts = DType::kMXFP4;
    } else if (!f.gguf_experts.empty()) {
        Result<DType> e = parse_gguf_dtype(f.gguf_experts);
        if (!e.is_ok()) {
            return fail(invalid_argument("--gguf-experts: f32, f16, bf16, q8_0 or mxfp4"));
        }
        experts = *e;
    }
    if (f.format != "hf" && f.format != "gguf" && f.format != "all") {
        return fail(invalid_argument("--format must be hf, gguf or all"));
    }
    std::string tok_dir = f.tokenizer_dir;
    if (tok_dir.empty()) {
        Result<std::string> data = serving::find_tokenizer_data_dir(env);
        if (!data.is_ok()) return fail(data.status().with_context("--tokenizer-dir"));
        tok_dir = *data;
    }
    Result<TokenizerFiles> tok = read_tokenizer_files(env, tok_dir);
    if (!tok.is_ok()) return fail(tok.status().with_context("--tokenizer-dir"));
    // The synthetic weights, counted on a progress line as the writers ask for them.
    // FP8 codes and V4's layout come only from the seeded writers: no progress there yet.
    const bool seeded_only = config->fp8 || config->v4_layout();
    // V4.1 has no GGUF layout yet: "all" writes the HF checkpoint only.
    const bool gguf = f.format != "hf" && !(config->is_v41() && f.format == "all");
    const int64_t num_tensors =
        seeded_only ? 0 : static_cast<int64_t>(deepseek_tensor_specs(*config).size());
    const auto counted = [&](Progress* progress) -> TensorValues {
        return [&, progress](const TensorSpec& spec) -> Result<std::vector<float>> {
            progress->advance(1);
            return synthetic_tensor(*config, spec, f.seed);
        };
    };
    if (f.format != "gguf") {
        DSI_LOG(kInfo) << "writing HF checkpoint " << f.out;
        Progress progress("make-model " + f.out, num_tensors, Progress::Unit::kItems,
                          {.show = seeded_only ? std::optional<bool>(false) : std::nullopt});
        Status s = seeded_only ? write_hf_checkpoint(env, *config, f.seed, *tok, f.out)
                               : write_hf_checkpoint(env, *config, counted(&progress), *tok, f.out);
        if (!s.is_ok()) return fail(s);
    }
    if (gguf) {
        const std::string exps = f.gguf_experts.empty() ? "" : "-exps-" + f.gguf_experts;
        const std::string path = f.out + "/model-" + f.gguf_dtype + exps + ".gguf";
        DSI_LOG(kInfo) << "writing GGUF " << path;
        Progress progress(
            "make-model " + path, num_tensors, Progress::Unit::kItems,
            {.show = config->v4_layout() ? std::optional<bool>(false) : std::nullopt});
        Status s = config->v4_layout()  // V4.1: "no GGUF layout yet"
                       ? write_gguf_checkpoint(env, *config, f.seed, *tok, *dtype, path, experts)
                       : write_gguf_checkpoint(env, *config, counted(&progress), *tok, *dtype, path,
                                               experts);
        if (!s.is_ok()) return fail(s);
    }
    std::printf("wrote %s preset to %s\n", f.preset.c_str(), f.out.c_str());
    return 0;
}

struct GenerateFlags {
    ReplicaFlags replica;  // model, engine, scheduler and KV store settings
    std::string prompt;
    std::string input;   // prompts.jsonl: {"prompt": "...", optional sampling fields}
    std::string output;  // results.jsonl
    int max_tokens = 32;
    double temperature = 0.0;
    uint64_t seed = 0;
    EpFlags ep;  // expert parallelism (issue 19, ep_launch.h)
};

struct Job {
    std::string id;
    std::string prompt;
    SamplingParams sampling;
    std::string cache_salt;
    std::string text;
    int64_t num_prompt = 0;
    int64_t num_output = 0;
    std::string finish;
};

// One line of --input: {"prompt": str, "id"?, "max_tokens"?, "temperature"?, "top_p"?,
// "top_k"?, "min_p"?, "seed"?, "ignore_eos"?, "stop"?: [str], "cache_salt"?}.
Result<Job> parse_job(const std::string& line, const GenerateFlags& f, size_t lineno) {
    Job job;
    job.sampling.max_tokens = f.max_tokens;
    job.sampling.temperature = f.temperature;
    job.sampling.seed = f.seed;
    try {
        nlohmann::json j = nlohmann::json::parse(line);
        if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string()) {
            return invalid_argument("line " + std::to_string(lineno) +
                                    ": needs a string \"prompt\"");
        }
        job.prompt = j["prompt"].get<std::string>();
        job.id = !j.contains("id")     ? std::to_string(lineno)
                 : j["id"].is_string() ? j["id"].get<std::string>()
                                       : j["id"].dump();
        job.sampling.max_tokens = j.value("max_tokens", job.sampling.max_tokens);
        job.sampling.temperature = j.value("temperature", job.sampling.temperature);
        job.sampling.top_p = j.value("top_p", job.sampling.top_p);
        job.sampling.top_k = j.value("top_k", job.sampling.top_k);
        job.sampling.min_p = j.value("min_p", job.sampling.min_p);
        job.sampling.seed = j.value("seed", job.sampling.seed);
        job.sampling.ignore_eos = j.value("ignore_eos", job.sampling.ignore_eos);
        if (j.contains("stop")) job.sampling.stop = j["stop"].get<std::vector<std::string>>();
        job.cache_salt = j.value("cache_salt", std::string());
    } catch (const nlohmann::json::exception& e) {
        return invalid_argument("line " + std::to_string(lineno) + ": " + e.what());
    }
    return job;
}

int run_generate(const GenerateFlags& f) {
    Env* env = Env::default_env();
    if (f.prompt.empty() == f.input.empty())
        return fail(invalid_argument("give --prompt or --input"));
    if (f.max_tokens < 1) return fail(invalid_argument("--max-tokens must be >= 1"));
    std::vector<Job> jobs;
    if (!f.input.empty()) {
        Result<std::string> text = env->read_file(f.input);
        if (!text.is_ok()) return fail(text.status());
        std::istringstream in(*text);
        std::string line;
        for (size_t n = 1; std::getline(in, line); ++n) {
            if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
            Result<Job> job = parse_job(line, f, n);
            if (!job.is_ok()) return fail(job.status().with_context(f.input));
            jobs.push_back(std::move(job).value());
        }
    } else {
        Job job;
        job.prompt = f.prompt;
        job.sampling.max_tokens = f.max_tokens;
        job.sampling.temperature = f.temperature;
        job.sampling.seed = f.seed;
        jobs.push_back(std::move(job));
    }
    Result<serving::ReplicaOptions> options = to_replica_options(f.replica);
    if (!options.is_ok()) return fail(options.status());
    // --ep N: this process becomes a front with no model and starts the N ranks here (and
    // kills them when it fails).
    Result<EpLaunch> ep = EpLaunch::start(f.ep, env, *options, /*long_idle=*/false,
                                          /*front=*/true);
    if (!ep.is_ok()) return fail(ep.status());
    Result<std::unique_ptr<serving::Replica>> replica =
        serving::open_replica(std::move(options).value(), env);
    if (!replica.is_ok()) {
        // A started rank whose group never formed (a peer lost before it attached) is
        // healthy: its exit status says so to the failover.
        const int code = fail(replica.status());
        return ep->started_rank() ? EpLaunch::started_rank_exit_code(replica.status()) : code;
    }
    if (ep->started_rank()) {
        Status s = ep->run_started_rank(**replica, env);
        if (!s.is_ok()) (void)fail(s);
        return EpLaunch::started_rank_exit_code(s);
    }
    const Tokenizer& tk = *(*replica)->tokenizer();
    engine::StepEngine* eng = (*replica)->engine();
    // --ep: the prompts go to the ranks (spread over them with --ep-attention dp,
    // engine/dp_front.h).
    std::unique_ptr<engine::DpFront> front;
    if (ep->front()) {
        front = std::make_unique<engine::DpFront>(
            ep->dp_link(), ep->front_limits(**replica), ep->spread(), env,
            dp_routing(f.ep, (*replica)->cache_identity(), f.replica.prefix_cache));
        eng = front.get();
    } else if (engine::DpRankLink* link = ep->dp_link()) {
        // --ep-front off with --ep-attention dp: rank 0 (this process) spreads the prompts.
        front = std::make_unique<engine::DpFront>(
            (*replica)->engine(), (*replica)->model(), link, env,
            dp_routing(f.ep, (*replica)->cache_identity(), f.replica.prefix_cache));
        eng = front.get();
    }
    if (ep->front()) {
        // The ranks load the model and attach after the front started them: wait for every
        // rank's first report so the figures below time generation, not loading.
        Status ready = Status::ok();
        while (ready.is_ok() && !front->ranks_ready()) ready = front->step();
        if (!ready.is_ok()) return fail(ready);
    }
    const bool stream = !f.prompt.empty();
    if (stream) std::fputs(f.prompt.c_str(), stdout);
    size_t done = 0;
    for (Job& job : jobs) {
        GenerateRequest req;
        if (tk.add_bos_token()) req.prompt.push_back(tk.bos_id());
        tk.encode_into(job.prompt, &req.prompt);
        job.num_prompt = static_cast<int64_t>(req.prompt.size());
        req.sampling = job.sampling;
        req.cache_salt = job.cache_salt;
        Job* jp = &job;
        Result<engine::RequestId> id =
            eng->add_request(std::move(req), [&, jp](const engine::TokenEvent& ev) {
                if (ev.token >= 0) ++jp->num_output;
                jp->text += ev.text;
                if (stream) {
                    std::fputs(ev.text.c_str(), stdout);
                    std::fflush(stdout);
                }
                if (ev.finished) {
                    jp->finish = engine::finish_reason_name(ev.reason);
                    ++done;
                    if (!stream) {
                        std::fprintf(stderr, "\r[%zu/%zu] requests done", done, jobs.size());
                    }
                }
            });
        if (!id.is_ok()) return fail(id.status().with_context("request " + job.id));
    }
    const int64_t t0 = env->now_ns();
    // With --ep: every forward pass is a collective of the ranks (engine/ep_rank.h).
    Status s = Status::ok();
    if (front != nullptr) {
        while (s.is_ok() && front->has_work()) s = front->step();
    } else {
        s = engine::run_ep_rank(
            *(*replica)->engine(), *(*replica)->model(), [] { return true; }, env);
    }
    // Ending the group (the ranks' exit) is not generation time.
    const double secs = static_cast<double>(env->now_ns() - t0) * 1e-9;
    if (s.is_ok()) s = ep->finish(**replica);
    if (!s.is_ok()) return fail(s);
    if (stream) {
        std::fputc('\n', stdout);
        std::fflush(stdout);  // before the summary on stderr
    }
    if (!f.output.empty()) {
        std::string out;
        for (const Job& job : jobs) {
            nlohmann::json j = {{"id", job.id},
                                {"text", job.text},
                                {"finish_reason", job.finish},
                                {"prompt_tokens", job.num_prompt},
                                {"output_tokens", job.num_output}};
            out += j.dump() + "\n";
        }
        Status w = env->write_file(f.output, out);
        if (!w.is_ok()) return fail(w);
    }
    const engine::EngineStats st = eng->stats();
    if (!stream) std::fputc('\n', stderr);
    std::fprintf(stderr,
                 "requests %lld, prompt tokens %lld (prefix hit %.1f%%), output tokens %lld, "
                 "%.2f s, %.1f output tokens/s, %lld steps, host gap %.2f%% of step time\n",
                 static_cast<long long>(st.num_requests), static_cast<long long>(st.prompt_tokens),
                 st.prompt_tokens ? 100.0 * st.cached_prompt_tokens / st.prompt_tokens : 0.0,
                 static_cast<long long>(st.output_tokens), secs,
                 secs > 0 ? st.output_tokens / secs : 0.0, static_cast<long long>(st.steps),
                 st.forward_ns ? 100.0 * st.host_gap_ns / st.forward_ns : 0.0);
    if (st.expert_parallel) {  // --ep (issue 19)
        const ExpertParallelStats& ep_st = *st.expert_parallel;
        char lb[64];
        if (ep_st.windows.empty()) {
            std::snprintf(lb, sizeof lb, "moe_lb n/a (no window complete)");
        } else {
            std::snprintf(lb, sizeof lb, "moe_lb %.3f (last window)", ep_st.windows.back().moe_lb);
        }
        std::fprintf(stderr,
                     "expert parallelism: %d ranks, %lld group steps, %lld placement changes, "
                     "%s, %lld failovers\n",
                     ep_st.num_ranks, static_cast<long long>(ep_st.steps),
                     static_cast<long long>(ep_st.placement_changes), lb,
                     static_cast<long long>(ep_st.failovers));
    }
    if (!st.dp_ranks.empty()) {  // --ep-attention dp
        std::string per_rank;
        for (const engine::EngineStats::DpRank& r : st.dp_ranks) {
            per_rank += (per_rank.empty() ? "" : " ") + std::to_string(r.requests);
        }
        std::fprintf(stderr,
                     "attention data parallelism: requests per rank [%s], %lld re-run, %lld "
                     "routed by prefix (%lld tokens matched)\n",
                     per_rank.c_str(), static_cast<long long>(st.dp_reruns),
                     static_cast<long long>(st.dp_prefix_routed),
                     static_cast<long long>(st.dp_prefix_matched_tokens));
    }
    if (st.spec_verify_steps > 0) {
        std::string per_pos;
        for (size_t j = 0; j < st.spec_drafted_at.size() && st.spec_drafted_at[j] > 0; ++j) {
            char b[32];
            std::snprintf(b, sizeof b, "%s%.2f", j ? " " : "",
                          static_cast<double>(st.spec_accepted_at[j]) / st.spec_drafted_at[j]);
            per_pos += b;
        }
        std::fprintf(stderr,
                     "speculative: %lld verify steps, %lld drafts, %lld accepted (%.1f%%), "
                     "%.2f tokens per verify step, acceptance by position [%s], %lld drafts "
                     "not verified (varlen)\n",
                     static_cast<long long>(st.spec_verify_steps),
                     static_cast<long long>(st.spec_draft_tokens),
                     static_cast<long long>(st.spec_accepted_tokens),
                     100.0 * st.spec_accepted_tokens / st.spec_draft_tokens,
                     1.0 + static_cast<double>(st.spec_accepted_tokens) / st.spec_verify_steps,
                     per_pos.c_str(), static_cast<long long>(st.spec_varlen_cut_tokens));
    }
    if (!f.replica.kv_store.empty()) {
        std::fprintf(stderr,
                     "kv store: %lld lookups, %lld hit blocks (%lld tokens, %lld bytes), %lld "
                     "missed, %lld offered, %lld dropped, fetch mean %.2f ms, swap-in mean %.2f "
                     "ms (%lld overlapped with compute)\n",
                     static_cast<long long>(st.store_lookups),
                     static_cast<long long>(st.store_hit_blocks),
                     static_cast<long long>(st.store_hit_tokens),
                     static_cast<long long>(st.store_bytes_read),
                     static_cast<long long>(st.store_miss_blocks),
                     static_cast<long long>(st.store_blocks_offered),
                     static_cast<long long>(st.store_blocks_dropped),
                     st.fetch_count ? st.fetch_sum_ns / 1e6 / st.fetch_count : 0.0,
                     st.swap_in_count ? st.swap_in_sum_ns / 1e6 / st.swap_in_count : 0.0,
                     static_cast<long long>(st.swap_in_overlapped));
    }
    return 0;
}

struct PlanFlags {
    std::string model;
    int64_t context = 8192;
};

// The SWA state slot (S-KV-8, kv/swa_rules.h) as text.
std::string format_swa_slot(const kv::SwaSlotShape& s, const char* stored_layers,
                            const char* dropped_layers) {
    char line[512];
    std::string out;
    std::snprintf(line, sizeof line,
                  "\nSWA state slot per sequence (S-KV-8; ring %" PRId64 " = window %" PRId64
                  " + 6, %" PRId64 " B per row)\n",
                  s.ring_tokens, kv::kSwaWindowTokens, s.swa_row_bytes);
    out += line;
    std::snprintf(line, sizeof line,
                  "  stored region   %3" PRId64 " layers x %" PRId64 " x %" PRId64 " B = %" PRId64
                  " B  (%s; host SWA pool, never the KV store)\n",
                  s.stored_layers, s.ring_tokens, s.swa_row_bytes, s.stored_bytes(), stored_layers);
    out += line;
    std::snprintf(line, sizeof line,
                  "  dropped region  %3" PRId64 " layers x %" PRId64 " x %" PRId64 " B + %" PRId64
                  " B accumulators = %" PRId64 " B  (%s; rebuilt, never stored)\n",
                  s.dropped_swa_layers, s.ring_tokens, s.swa_row_bytes, s.accumulator_bytes,
                  s.dropped_bytes(), dropped_layers);
    out += line;
    std::snprintf(line, sizeof line, "  slot            %" PRId64 " B\n", s.slot_bytes());
    out += line;
    return out;
}

// V4.1 (CED) configs: only the SWA slot (weights and block KV are not planned yet).
int plan_v41(const ModelConfig& c) {
    kv::SwaSlotShape s;
    s.stored_layers = v41_first_decoder_layer(c);
    s.dropped_swa_layers = c.num_hidden_layers - s.stored_layers + c.num_nextn_predict_layers;
    s.swa_row_bytes = v41_swa_row_bytes(c);
    s.accumulator_bytes = v41_partial_state_bytes(c);
    std::printf(
        "%s: block KV %.1f B per token in the production formats (FP4 entries, MXFP4 "
        "keys); the SWA state slot (weights are not planned yet)\n",
        c.architecture.c_str(), v41_block_kv_bytes_per_token(c));
    std::fputs(format_swa_slot(s, "encoder layers",
                               "decoder + draft layers' SWA, ratio-2 "
                               "pending groups")
                   .c_str(),
               stdout);
    return 0;
}

// `dsinfer plan`: weight and KV bytes of a checkpoint or bare config.json (model/memory_plan.h).
int run_plan(const PlanFlags& f) {
    Env* env = Env::default_env();
    if (f.context < 1) return fail(invalid_argument("--context must be >= 1"));
    const std::string path = f.model.ends_with(".json") ? f.model : f.model + "/config.json";
    Result<std::string> text = env->read_file(path);
    if (!text.is_ok()) return fail(text.status());
    Result<ModelConfig> config = parse_hf_config(*text);
    if (!config.is_ok()) return fail(config.status().with_context(path));
    if (config->is_v41()) return plan_v41(*config);
    const long pages = ::sysconf(_SC_AVPHYS_PAGES);
    const long page = ::sysconf(_SC_PAGESIZE);
    const int64_t available = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
    const MemoryPlan plan = plan_memory(*config, f.context);
    std::fputs(format_memory_plan(plan, available).c_str(), stdout);
    if (config->is_v4()) {
        // V4 has no encoder/decoder split: every main layer's window is stored (compact
        // rows); the MTP layer's window and the compressors' accumulators are dropped.
        kv::SwaSlotShape s;
        s.stored_layers = config->num_hidden_layers;
        s.dropped_swa_layers = config->num_nextn_predict_layers;
        s.swa_row_bytes = plan.compact_window_row_bytes;
        s.accumulator_bytes = plan.accumulator_bytes;
        std::fputs(
            format_swa_slot(s, "main layers", "MTP layer's SWA, compressor accumulators").c_str(),
            stdout);
    }
    return 0;
}

}  // namespace

void register_model_commands(CLI::App& app) {
    auto plan_flags = std::make_shared<PlanFlags>();
    CLI::App* plan = app.add_subcommand(
        "plan", "weight bytes by format, KV bytes per token and per sequence, fit in memory");
    add_setting(*plan, "--model", plan_flags->model, "HF checkpoint directory or config.json")
        ->required();
    add_setting(*plan, "--context", plan_flags->context, "tokens of one sequence");
    plan->callback([plan_flags] { throw CLI::RuntimeError(run_plan(*plan_flags)); });

    auto make_flags = std::make_shared<MakeModelFlags>();
    CLI::App* mk = app.add_subcommand("make-model", "write a synthetic checkpoint (HF + GGUF)");
    add_setting(*mk, "--preset", make_flags->preset,
                "tiny | tiny-v3 | small | medium | tiny-v4 | small-v4 | tiny-v41");
    add_setting(*mk, "--out", make_flags->out, "output directory")->required();
    add_setting(*mk, "--format", make_flags->format, "hf | gguf | all");
    add_setting(*mk, "--gguf-dtype", make_flags->gguf_dtype, "f32 | f16 | bf16 | q8_0");
    add_setting(*mk, "--gguf-experts", make_flags->gguf_experts,
                "routed experts' GGUF type (default: --gguf-dtype): f32 | f16 | bf16 | q8_0 | "
                "mxfp4 (file model-<dtype>-exps-<type>.gguf)");
    add_setting(*mk, "--tokenizer-dir", make_flags->tokenizer_dir,
                "directory with DeepSeek V3's tokenizer.json and tokenizer_config.json "
                "(default: the installed data)");
    add_setting(*mk, "--seed", make_flags->seed, "weight seed");
    mk->callback([make_flags] { throw CLI::RuntimeError(run_make_model(*make_flags)); });

    auto gen_flags = std::make_shared<GenerateFlags>();
    CLI::App* gen = app.add_subcommand("generate", "generate text for one prompt or a JSONL batch");
    add_replica_flags(*gen, &gen_flags->replica);
    add_setting(*gen, "--prompt", gen_flags->prompt, "prompt text (streams to stdout)");
    add_setting(*gen, "--input", gen_flags->input, "prompts.jsonl: one {\"prompt\": ...} per line");
    add_setting(*gen, "--output", gen_flags->output, "results.jsonl (with --input)");
    add_setting(*gen, "--max-tokens", gen_flags->max_tokens, "tokens to generate");
    add_setting(*gen, "--temperature", gen_flags->temperature, "0 = greedy");
    add_setting(*gen, "--seed", gen_flags->seed, "sampling seed");
    add_ep_flags(*gen, &gen_flags->ep);
    gen->callback([gen_flags] { throw CLI::RuntimeError(run_generate(*gen_flags)); });
}

}  // namespace dsi
