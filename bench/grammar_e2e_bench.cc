// Structured output end to end (issue 21 "Figures"): decode step time with N
// grammar-constrained sequences against N unconstrained ones, in the same run, on the
// same model (a synthetic in-memory DeepSeek V3-architecture model with the real
// DeepSeek V3 vocabulary, so masks cover all 128K tokens).
//
// Each run: a fresh Engine, N requests (distinct prompts; greedy by default, or
// --temperature T with seeds that change per repetition) decoding `--tokens` tokens each; every
// step is timed (Engine::step on this thread) and the run's figure is the median of its decode
// steps (the first steps, which prefill the prompts, left out). The constrained requests carry a
// GrammarMaskProvider each (the compile service's grammar, its table cache warmed as `dsinfer
// serve` does at start) over a schema whose outputs cannot end before max_tokens (an array with
// minItems 1,000 of small objects), so both sides run the same number of steps; the unconstrained
// side ignores EOS. One warm-up run of each side first, then --repetitions R (default 3)
// alternating the order (U C, C U, ...). Reports each side's median of the runs' medians, min, max
// and the ratio (goal <= 1.10).
//   grammar_e2e_bench [--seqs 32] [--tokens 48] [--layers 3] [--threads 2]
//                     [--repetitions 3] [--preset tiny-v3] [--temperature 0]
// (At temperature 1 the unconstrained side samples from all 128K tokens and the
// constrained one from the few the mask allows: the sampler's cost, not the
// grammar's, decides that ratio.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "grammar/compile_service.h"
#include "grammar/mask_provider.h"
#include "grammar/test_tokenizer.h"
#include "model/deepseek.h"
#include "model/synthetic.h"

using namespace dsi;
using namespace dsi::grammar;

namespace {

constexpr const char* kSchema =
    R"({"type":"array","minItems":1000,"items":{"type":"object","properties":{)"
    R"("name":{"type":"string","maxLength":24},"id":{"type":"integer","minimum":0},)"
    R"("role":{"enum":["admin","user","guest"]},"tags":{"type":"array","items":{"type":"string"}},)"
    R"("email":{"type":"string","format":"email"},"active":{"type":"boolean"}},)"
    R"("required":["name","id","role"]}})";

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

struct RunResult {
    double step_ms_median = 0;
    int num_decode_steps = 0;
    int64_t fills = 0;
    double fill_us_mean = 0;
};

RunResult run_once(DeepseekModel* model, const Tokenizer& tok,
                   const std::shared_ptr<const CompiledGrammar>& grammar, int seqs, int tokens,
                   double temperature, uint64_t seed_base) {
    engine::EngineOptions o;
    o.num_kv_blocks = 1024;
    o.scheduler.step_budget_ns = 1e12;
    auto eng = engine::Engine::create(model, o, Env::default_env());
    DSI_CHECK(eng.is_ok(), eng.status().to_string());
    std::vector<std::shared_ptr<GrammarMaskProvider>> providers;
    const std::vector<int32_t> prompt = tok.encode("Reply with the records as JSON: ");
    for (int s = 0; s < seqs; ++s) {
        engine::GenerateRequest r;
        r.prompt = prompt;
        r.prompt.push_back(static_cast<int32_t>(1000 + s * 37));  // distinct prompts
        r.sampling.temperature = temperature;
        r.sampling.seed = seed_base + static_cast<uint64_t>(s);
        r.sampling.max_tokens = tokens;
        if (grammar) {
            providers.push_back(std::make_shared<GrammarMaskProvider>(grammar));
            r.mask = providers.back();
        } else {
            r.sampling.ignore_eos = true;
        }
        auto id = (*eng)->add_request(std::move(r), [](const engine::TokenEvent&) {});
        DSI_CHECK(id.is_ok(), id.status().to_string());
    }
    std::vector<double> step_ms;
    while ((*eng)->has_work()) {
        const auto t0 = std::chrono::steady_clock::now();
        Status st = (*eng)->step();
        DSI_CHECK(st.is_ok(), st.to_string());
        step_ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
    }
    // Prefill steps first (one with a step budget this large, two to be safe); the
    // last step may finish fewer sequences' bookkeeping: leave it out too.
    RunResult out;
    std::vector<double> decode(step_ms.begin() + std::min<size_t>(2, step_ms.size()),
                               step_ms.end() - (step_ms.size() > 3 ? 1 : 0));
    out.step_ms_median = median(decode);
    out.num_decode_steps = static_cast<int>(decode.size());
    int64_t fill_ns = 0;
    for (const auto& p : providers) {
        const GrammarMaskProvider::Stats ps = p->stats();
        DSI_CHECK(ps.rejected_tokens == 0);
        out.fills += ps.fills;
        fill_ns += ps.fill_ns_total;
    }
    out.fill_us_mean = out.fills ? fill_ns / 1e3 / static_cast<double>(out.fills) : 0;
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    int seqs = 32, tokens = 48, layers = 3, threads = 2, reps = 3;
    double temperature = 0;
    std::string preset = "tiny-v3";
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        const int v = std::atoi(argv[i + 1]);
        if (a == "--seqs")
            seqs = v;
        else if (a == "--tokens")
            tokens = v;
        else if (a == "--layers")
            layers = v;
        else if (a == "--threads")
            threads = v;
        else if (a == "--repetitions")
            reps = v;
        else if (a == "--preset")
            preset = argv[i + 1];
        else {
            std::fprintf(stderr, "unknown flag %s\n", a.c_str());
            return 2;
        }
    }
    const Tokenizer& tok = test_util::real_tokenizer();
    auto vocab = Vocabulary::from_tokenizer(tok);
    auto cfg = synthetic_preset(preset);
    DSI_CHECK(cfg.is_ok(), cfg.status().to_string());
    ModelConfig c = *cfg;
    c.vocab_size = tok.vocab_size();
    c.bos_token_id = tok.bos_id();
    c.eos_token_id = tok.eos_id();
    c.num_hidden_layers = layers;
    DeepseekModel::Options mo;
    mo.num_threads = threads;
    auto model = DeepseekModel::load(synthetic_memory_model(c, 77), mo);
    DSI_CHECK(model.is_ok(), model.status().to_string());

    CompileService svc;
    const auto w0 = std::chrono::steady_clock::now();
    const WarmupStats ws = svc.warm_table_cache(vocab);
    std::printf(
        "table cache warm-up: %lld tables, %.0f ms\n", static_cast<long long>(ws.tables_added),
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count());
    auto h = svc.submit({GrammarKind::kJsonSchema, kSchema}, vocab);
    DSI_CHECK(h.is_ok(), h.status().to_string());
    CompileResult g = (*h)->wait_for(int64_t{60} * 1000000000);
    DSI_CHECK(g.is_ok(), g.status().to_string());

    std::printf(
        "model %s, %d layers, hidden %lld, vocab %d, %d threads; %d sequences x %d "
        "tokens, %d repetitions\n",
        preset.c_str(), layers, static_cast<long long>(c.hidden_size), tok.vocab_size(), threads,
        seqs, tokens, reps);
    // Warm-up: one run of each side (allocations, kernels, the grammar's first tables).
    run_once(model->get(), tok, nullptr, seqs, tokens, temperature, 1);
    run_once(model->get(), tok, *g, seqs, tokens, temperature, 1);
    std::vector<double> plain_ms, grammar_ms;
    for (int r = 0; r < reps; ++r) {
        const uint64_t seed = 1000 * static_cast<uint64_t>(r + 2);
        for (int k = 0; k < 2; ++k) {
            const bool constrained = (k == 0) == (r % 2 == 1);
            RunResult rr = run_once(model->get(), tok, constrained ? *g : nullptr, seqs, tokens,
                                    temperature, seed);
            (constrained ? grammar_ms : plain_ms).push_back(rr.step_ms_median);
            std::printf("  rep %d %-13s decode step median %8.2f ms over %d steps", r + 1,
                        constrained ? "constrained" : "unconstrained", rr.step_ms_median,
                        rr.num_decode_steps);
            if (constrained) {
                std::printf(", %lld mask fills, mean %.1f us", static_cast<long long>(rr.fills),
                            rr.fill_us_mean);
            }
            std::printf("\n");
        }
    }
    auto summary = [](const char* name, const std::vector<double>& v) {
        std::printf("%-13s median %8.2f ms  min %8.2f  max %8.2f  (runs:", name, median(v),
                    *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()));
        for (double x : v) std::printf(" %.2f", x);
        std::printf(")\n");
    };
    summary("unconstrained", plain_ms);
    summary("constrained", grammar_ms);
    std::printf("ratio constrained / unconstrained (medians): %.3f (goal <= 1.10)\n",
                median(grammar_ms) / median(plain_ms));
    return 0;
}
