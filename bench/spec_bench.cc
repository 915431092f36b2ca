// Speculative decoding figures (issue 24, bench/RESULTS.md "Speculative decoding"):
// output tokens/s with and without speculation at one sequence, mean accepted length and
// acceptance per draft position, for MTP k = 1..5 and prompt-lookup n-gram, on the
// trained default model and its held-out chat prompts (tests/data/default_model).
//
//   spec_bench --model DIR [--cases FILE] [--prompts 8] [--max-tokens 64] [--reps 3]
//              [--threads 2] [--temperature 0] [--configs off,mtp1,...,ngram5,mtp5dv]
//              [--concurrency 1,4,16]
// A configuration is off, or a method and k with optional suffixes: d = MTP drafts
// from draft_vocab.json beside the model, v = DSpark variable-length verification on
// dsinfer_verify_cost.json beside the model (profiled and written there if missing).
//
// Every configuration runs the same prompts one at a time (1 sequence), greedy by
// default; configurations alternate within each repetition (off, mtp1, ..., off, ...),
// each repetition starts with an untimed warm-up prompt per configuration. Figures:
// median tokens/s over repetitions (min, max beside), speed-up = ratio of medians to
// "off" in the same run. Each configuration's tokens are checked equal to "off"'s (the
// exact rule: the run fails otherwise). Where each configuration's time went (last
// repetition: decode-only steps per mode, probes, switches, drafter time, MTP catch-up
// rows) goes to stderr and into the JSON. Per configuration the table gives what DSpark
// is compared with fixed k on (issue 24): throughput, mean accepted length (acc.len:
// tokens per verifying sequence-step), drafts verified per sequence and verifying step
// (verif/seq), per verifying step over all sequences (verif/st), and the share of steps
// that verified any (spec%).
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/settings.h"
#include "engine/calibrate.h"
#include "engine/engine.h"
#include "model/deepseek.h"
#include "model/draft_vocab.h"
#include "model/weights.h"
#include "protocol/adapters.h"
#include "protocol/encoder.h"
#include "protocol/prompt.h"
#include "support/build_paths.h"
#include "tokenizer/tokenizer.h"

namespace dsi {
namespace {

struct Flags {
    std::string model;
    std::string cases = std::string(DSINFER_SOURCE_DIR) + "/tests/data/default_model/cases.jsonl";
    int prompts = 8;
    int max_tokens = 64;
    int reps = 3;
    int threads = 2;
    double temperature = 0.0;
    std::string configs = "off,mtp1,mtp2,mtp3,mtp4,mtp5,ngram3,ngram5";
    std::string concurrency = "1";
};

struct Config {
    std::string name;
    spec::SpecConfig spec;
};

// off | METHOD K [d] [v]: d = MTP drafts from the draft vocabulary beside the model
// (draft_vocab.json), v = variable-length verification (DSpark) on the model's
// verify-cost curve.
Result<Config> parse_config(const std::string& name, const std::string& model_dir) {
    Config c{name, {}};
    if (name == "off") return c;
    const size_t digits = name.find_first_of("0123456789");
    if (digits == std::string::npos) return invalid_argument("config " + name + ": no K");
    const std::string method = name.substr(0, digits);
    DSI_ASSIGN_OR_RETURN(c.spec.method, spec::parse_method(method));
    size_t end = digits;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    c.spec.num_tokens = std::stoi(name.substr(digits, end - digits));
    for (char x : name.substr(end)) {
        if (x == 'd') {
            c.spec.draft_vocab_path = model_dir + "/" + kDraftVocabFile;
        } else if (x == 'v') {
            c.spec.varlen = true;
        } else {
            return invalid_argument("config " + name + ": unknown suffix (d: draft vocabulary, "
                                    "v: variable-length verification)");
        }
    }
    return c;
}

struct Run {
    double tokens_per_s = 0;
    double seconds = 0;  // timed rounds
    int64_t output_tokens = 0;
    engine::EngineStats stats;
    std::vector<std::vector<int32_t>> outputs;
};

// Runs max(prompts, concurrency) requests, `concurrency` at a time (after one untimed
// warm-up request); tokens/s over the timed rounds.
Result<Run> run_config(DeepseekModel* model, const Config& c,
                       const std::vector<std::vector<int32_t>>& prompts, int concurrency,
                       const Flags& f, std::shared_ptr<const spec::VerifyCostCurve> curve) {
    engine::EngineOptions o;
    o.speculative = c.spec;
    if (c.spec.varlen) o.verify_cost = std::move(curve);
    o.num_kv_blocks = std::max(64, 4 * concurrency);  // no preemption at any concurrency
    o.prefix_cache = false;  // every prompt is computed (no cross-config reuse)
    o.scheduler.step_budget_ns = 1e12;
    DSI_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> eng,
                         engine::Engine::create(model, o, Env::default_env()));
    Run r;
    engine::EngineStats warm;  // after the warm-up: its drafts are not counted
    double secs = 0;
    const size_t total = std::max(prompts.size(), static_cast<size_t>(concurrency));
    // Round 0 is the warm-up (one request); then rounds of `concurrency` requests.
    for (size_t start = 0, round = 0; start < total; ++round) {
        const size_t n = round == 0 ? 1 : std::min<size_t>(concurrency, total - start);
        std::vector<std::vector<int32_t>> outs(n);
        for (size_t q = 0; q < n; ++q) {
            engine::GenerateRequest req;
            req.prompt = prompts[(round == 0 ? 0 : start + q) % prompts.size()];
            req.sampling.max_tokens = f.max_tokens;
            req.sampling.temperature = f.temperature;
            req.sampling.seed = 7;
            std::vector<int32_t>* out = &outs[q];
            DSI_RETURN_IF_ERROR(eng->add_request(std::move(req),
                                                 [out](const engine::TokenEvent& ev) {
                                                     if (ev.token >= 0) out->push_back(ev.token);
                                                 })
                                    .status());
        }
        const auto t0 = std::chrono::steady_clock::now();
        DSI_RETURN_IF_ERROR(eng->run());
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (round == 0) {
            warm = eng->stats();
            continue;
        }
        start += n;
        secs += s;
        for (std::vector<int32_t>& one : outs) {
            r.output_tokens += static_cast<int64_t>(one.size());
            r.outputs.push_back(std::move(one));
        }
    }
    r.stats = eng->stats();
    r.seconds = secs;
    // Everything below counts the timed rounds only (the warm-up's share taken out).
    r.stats.steps -= warm.steps;
    r.stats.forward_ns -= warm.forward_ns;
    r.stats.host_gap_ns -= warm.host_gap_ns;
    for (size_t m = 0; m < 2; ++m) {
        r.stats.spec_gate_steps[m] -= warm.spec_gate_steps[m];
        r.stats.spec_gate_ns[m] -= warm.spec_gate_ns[m];
        r.stats.spec_gate_tokens[m] -= warm.spec_gate_tokens[m];
        r.stats.spec_gate_probe_steps[m] -= warm.spec_gate_probe_steps[m];
    }
    r.stats.spec_gate_switches -= warm.spec_gate_switches;
    r.stats.spec_draft_ns -= warm.spec_draft_ns;
    r.stats.spec_catchup_rows -= warm.spec_catchup_rows;
    r.stats.spec_deferred_catchup_rows -= warm.spec_deferred_catchup_rows;
    r.stats.spec_deferred_catchup_ns -= warm.spec_deferred_catchup_ns;
    r.stats.spec_gate_priced_out -= warm.spec_gate_priced_out;
    r.stats.spec_verify_steps -= warm.spec_verify_steps;
    r.stats.spec_draft_tokens -= warm.spec_draft_tokens;
    r.stats.spec_accepted_tokens -= warm.spec_accepted_tokens;
    r.stats.spec_steps -= warm.spec_steps;
    r.stats.spec_varlen_cut_tokens -= warm.spec_varlen_cut_tokens;
    for (size_t j = 0; j < warm.spec_drafted_at.size(); ++j) {
        r.stats.spec_drafted_at[j] -= warm.spec_drafted_at[j];
        r.stats.spec_accepted_at[j] -= warm.spec_accepted_at[j];
    }
    r.tokens_per_s = static_cast<double>(r.output_tokens) / secs;
    return r;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int fail(const Status& s) {
    std::fprintf(stderr, "spec_bench: %s\n", s.to_string().c_str());
    return 1;
}

int run(const Flags& f) {
    Env* env = Env::default_env();
    auto tokenizer = Tokenizer::load(env, f.model);
    if (!tokenizer.is_ok()) return fail(tokenizer.status());
    auto source = open_checkpoint(env, f.model);
    if (!source.is_ok()) return fail(source.status());
    DeepseekModel::Options mo;
    mo.num_threads = f.threads;
    auto model = DeepseekModel::load(std::move(source).value(), mo);
    if (!model.is_ok()) return fail(model.status());
    // Held-out chat prompts, cut after the last user message (as tools/eval does).
    const protocol::SpecialTokens sp = protocol::SpecialTokens::from_tokenizer(**tokenizer);
    std::vector<std::vector<int32_t>> prompts;
    std::ifstream in(f.cases);
    if (!in) return fail(not_found("cannot read " + f.cases));
    for (std::string line;
         std::getline(in, line) && static_cast<int>(prompts.size()) < f.prompts;) {
        nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.contains("request")) continue;
        auto conv = protocol::parse_chat_completions_request(j["request"].dump());
        if (!conv.is_ok()) return fail(conv.status());
        size_t last_user = 0;
        for (size_t i = 0; i < conv->messages.size(); ++i) {
            if (conv->messages[i].role == protocol::Role::kUser) last_user = i;
        }
        conv->messages.resize(last_user + 1);
        auto prompt =
            protocol::encode_conversation(protocol::ChatEncoding::kDeepSeekV32, *conv, sp);
        if (!prompt.is_ok()) return fail(prompt.status());
        prompts.push_back(prompt->encode(**tokenizer));
    }
    std::vector<Config> configs;
    std::stringstream cs(f.configs);
    bool any_varlen = false;
    for (std::string name; std::getline(cs, name, ',');) {
        Result<Config> c = parse_config(name, f.model);
        if (!c.is_ok()) return fail(c.status());
        any_varlen |= c->spec.varlen;
        configs.push_back(*c);
    }
    // Variable-length verification's step-cost curve: the one beside the model, or
    // profiled now and kept there (as `serve --enable-mtp-varlen` does).
    std::shared_ptr<const spec::VerifyCostCurve> curve;
    if (any_varlen) {
        auto c = engine::ensure_verify_cost(env, model->get(), engine::verify_cost_path_for(f.model));
        if (!c.is_ok()) return fail(c.status());
        curve = std::make_shared<const spec::VerifyCostCurve>(std::move(c).value());
        std::fprintf(stderr, "verify cost curve (tokens: ms):");
        for (const spec::VerifyCostPoint& p : curve->points()) {
            std::fprintf(stderr, " %lld: %.2f", static_cast<long long>(p.tokens), p.ns * 1e-6);
        }
        std::fprintf(stderr, "\n");
    }
    nlohmann::json out = nlohmann::json::array();
    std::stringstream ccs(f.concurrency);
    for (std::string cstr; std::getline(ccs, cstr, ',');) {
        const int conc = std::stoi(cstr);
        std::map<std::string, std::vector<double>> tps;
        std::map<std::string, Run> last;
        for (int rep = 0; rep < f.reps; ++rep) {
            for (const Config& c : configs) {
                Result<Run> r = run_config(model->get(), c, prompts, conc, f, curve);
                if (!r.is_ok()) return fail(r.status().with_context(c.name));
                if (last.count("off") && r->outputs != last["off"].outputs) {
                    return fail(internal_error(c.name + ": output differs from off"));
                }
                tps[c.name].push_back(r->tokens_per_s);
                last[c.name] = std::move(r).value();
                std::fprintf(stderr, "concurrency %d rep %d %-8s %.1f tok/s\n", conc, rep,
                             c.name.c_str(), tps[c.name].back());
            }
        }
        const double base = tps.count("off") ? median(tps["off"]) : 0.0;
        std::printf("concurrency %d\n%-8s %10s %8s %8s %8s %10s %9s %9s %8s  %s\n", conc, "config",
                    "tok/s", "min", "max", "speedup", "acc.len", "verif/seq", "verif/st", "spec%",
                    "acceptance by draft position");
        for (const Config& c : configs) {
            const std::vector<double>& v = tps[c.name];
            const engine::EngineStats& st = last[c.name].stats;
            const double med = median(v);
            const double acc_len =
                st.spec_verify_steps
                    ? 1.0 + static_cast<double>(st.spec_accepted_tokens) / st.spec_verify_steps
                    : 1.0;
            std::string per;
            nlohmann::json per_j = nlohmann::json::array();
            for (size_t j = 0; j < st.spec_drafted_at.size() && st.spec_drafted_at[j] > 0; ++j) {
                const double a =
                    static_cast<double>(st.spec_accepted_at[j]) / st.spec_drafted_at[j];
                char b[16];
                std::snprintf(b, sizeof b, "%.2f ", a);
                per += b;
                per_j.push_back(a);
            }
            // Drafts verified per step that verified any (S-SPEC's "tokens verified per step").
            const double per_step =
                st.spec_steps ? static_cast<double>(st.spec_draft_tokens) / st.spec_steps : 0.0;
            // Drafts verified per sequence and verifying step (the SPEC's "verified
            // tokens per step": 5.00 for fixed k = 5), and the share of the steps that
            // verified any (DSpark's gate runs the others plain).
            const double per_seq =
                st.spec_verify_steps
                    ? static_cast<double>(st.spec_draft_tokens) / st.spec_verify_steps
                    : 0.0;
            const double spec_share =
                st.steps ? 100.0 * static_cast<double>(st.spec_steps) / st.steps : 0.0;
            std::printf("%-8s %10.1f %8.1f %8.1f %8.2f %10.2f %9.2f %9.2f %8.1f  %s\n",
                        c.name.c_str(), med, *std::min_element(v.begin(), v.end()),
                        *std::max_element(v.begin(), v.end()), base > 0 ? med / base : 0.0, acc_len,
                        per_seq, per_step, spec_share, per.c_str());
            // Where the time went (last repetition): decode-only steps per mode with
            // their wall time and tokens, probe steps, the drafter's time, the rest
            // (steps that ran prefill chunks, the first step after a mode switch is
            // included in its mode).
            const double ms = 1e-6;
            std::fprintf(stderr,
                         "  %-8s time %.0f ms, steps %lld, forward %.0f ms, host gap %.0f ms | "
                         "plain %lld st %.0f ms %lld tok | spec %lld st %.0f ms %lld tok | "
                         "probes plain %lld spec %lld, switches %lld, priced out %lld | "
                         "drafter %.0f ms, catch-up rows %lld (deferred %lld, %.1f ms)\n",
                         c.name.c_str(), last[c.name].seconds * 1e3,
                         static_cast<long long>(st.steps), st.forward_ns * ms, st.host_gap_ns * ms,
                         static_cast<long long>(st.spec_gate_steps[0]), st.spec_gate_ns[0] * ms,
                         static_cast<long long>(st.spec_gate_tokens[0]),
                         static_cast<long long>(st.spec_gate_steps[1]), st.spec_gate_ns[1] * ms,
                         static_cast<long long>(st.spec_gate_tokens[1]),
                         static_cast<long long>(st.spec_gate_probe_steps[0]),
                         static_cast<long long>(st.spec_gate_probe_steps[1]),
                         static_cast<long long>(st.spec_gate_switches),
                         static_cast<long long>(st.spec_gate_priced_out), st.spec_draft_ns * ms,
                         static_cast<long long>(st.spec_catchup_rows),
                         static_cast<long long>(st.spec_deferred_catchup_rows),
                         st.spec_deferred_catchup_ns * ms);
            out.push_back({{"concurrency", conc},
                           {"config", c.name},
                           {"tokens_per_s_median", med},
                           {"tokens_per_s_runs", v},
                           {"speedup", base > 0 ? med / base : 0.0},
                           {"accepted_length", acc_len},
                           {"acceptance_by_position", per_j},
                           {"verify_steps", st.spec_verify_steps},
                           {"draft_tokens", st.spec_draft_tokens},
                           {"accepted_tokens", st.spec_accepted_tokens},
                           {"spec_steps", st.spec_steps},
                           {"drafts_verified_per_step", per_step},
                           {"drafts_verified_per_seq_step", per_seq},
                           {"spec_step_share", spec_share / 100.0},
                           {"varlen_cut_tokens", st.spec_varlen_cut_tokens},
                           {"output_tokens", last[c.name].output_tokens},
                           {"seconds", last[c.name].seconds},
                           {"steps", st.steps},
                           {"gate_steps", st.spec_gate_steps},
                           {"gate_ns", st.spec_gate_ns},
                           {"gate_tokens", st.spec_gate_tokens},
                           {"gate_probe_steps", st.spec_gate_probe_steps},
                           {"gate_switches", st.spec_gate_switches},
                           {"drafter_ns", st.spec_draft_ns},
                           {"catchup_rows", st.spec_catchup_rows},
                           {"deferred_catchup_rows", st.spec_deferred_catchup_rows},
                           {"deferred_catchup_ns", st.spec_deferred_catchup_ns},
                           {"gate_priced_out", st.spec_gate_priced_out}});
        }
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
}

}  // namespace
}  // namespace dsi

int main(int argc, char** argv) {
    CLI::App app{"spec_bench: speculative decoding tokens/s and acceptance (issue 24)"};
    dsi::Flags f;
    app.add_option("--model", f.model, "HF checkpoint directory (tools/eval/expand_pack)")
        ->required();
    app.add_option("--cases", f.cases, "gen_corpus.py JSONL of chat requests");
    app.add_option("--prompts", f.prompts, "prompts per configuration");
    app.add_option("--max-tokens", f.max_tokens, "tokens generated per prompt");
    app.add_option("--reps", f.reps, "alternating repetitions");
    app.add_option("--threads", f.threads, "compute threads");
    app.add_option("--temperature", f.temperature, "0 = greedy (seeded otherwise)");
    app.add_option("--configs", f.configs,
                   "off | mtpK | ngramK, + d (draft vocabulary) / v (varlen), comma-separated");
    app.add_option("--concurrency", f.concurrency, "sequences at a time, comma-separated");
    CLI11_PARSE(app, argc, argv);
    return dsi::run(f);
}
