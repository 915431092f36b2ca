// Structured output on real-world schemas (issue 21 item 4): the vendored corpus of
// tests/data/realworld-schemas (1,178 GitHub REST API / webhook schemas, instances
// labelled by ajv). Compiles every schema as the compile service does (lazy position
// tables, one table cache shared by all grammars; "private": a cache per grammar) and
// replays every instance the grammar accepts token by token with the DeepSeek V3
// vocabulary, timing each full-vocabulary fill_mask() (first use of a position builds
// its table inside that step, as in serving). Reports compile rate, false accepts /
// rejects (labels: ajv), mask p50/p99/p99.9/max and compile p50/p99/max.
//   grammar_realworld_bench [private] [--only SUBSTRING] [--cpu] [--cold] [--errors]
//                           [--any-order] [--any-order-cap N]
// Before the run the shared table cache is warmed as `dsinfer serve` does at start
// (grammar/table_warmup.h); --cold: not. --only: the schemas whose id contains
// SUBSTRING; --cpu: also each fill's thread CPU time (a system call per step, which
// slows the fills after it: off by default); --errors: only compile, and print each
// schema that does not compile with its error; --any-order: JsonSchemaOptions::
// any_property_order (validation of what someone wrote; the server's default,
// generation, is declaration order); --any-order-cap N: the same with
// max_any_order_properties N.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "grammar/json_schema.h"
#include "grammar/realworld_corpus.h"
#include "grammar/table_warmup.h"
#include "grammar/test_tokenizer.h"
#include "support/build_paths.h"

using namespace dsi;
using namespace dsi::grammar;

static double pct(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

int main(int argc, char** argv) {
    bool shared = true;
    bool cpu = false;
    bool errors = false;
    bool warm = true;
    JsonSchemaOptions schema_options;
    std::string only;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "private") {
            shared = false;
        } else if (a == "--cpu") {
            cpu = true;
        } else if (a == "--errors") {
            errors = true;
        } else if (a == "--cold") {
            warm = false;
        } else if (a == "--any-order") {
            schema_options.any_property_order = true;
        } else if (a == "--any-order-cap" && i + 1 < argc) {
            schema_options.any_property_order = true;
            schema_options.max_any_order_properties = std::stoul(argv[++i]);
        } else if (a == "--only" && i + 1 < argc) {
            only = argv[++i];
        }
    }
    MatcherOptions options;
    if (shared) options.table_cache = std::make_shared<PositionTableCache>();
    auto corpus = realworld::load_corpus(DSINFER_SOURCE_DIR);
    if (!only.empty()) {
        std::erase_if(corpus, [&](const auto& s) { return s.id.find(only) == std::string::npos; });
    }
    if (errors) {
        int num_compiled = 0;
        for (const auto& s : corpus) {
            auto g = compile_json_schema(s.schema, schema_options);
            num_compiled += g.is_ok();
            if (!g.is_ok()) std::printf("%s: %s\n", s.id.c_str(), g.status().to_string().c_str());
        }
        std::printf("%d of %zu compiled\n", num_compiled, corpus.size());
        return 0;
    }
    if (warm && options.table_cache) {
        auto vocab = Vocabulary::from_tokenizer(test_util::real_tokenizer());
        const auto start = std::chrono::steady_clock::now();
        const WarmupStats ws = warm_table_cache(vocab, options);
        const std::chrono::duration<double, std::milli> took =
            std::chrono::steady_clock::now() - start;
        std::printf(
            "table cache warm-up (as dsinfer serve at start): %d grammars, %lld masks, "
            "%lld tables, %.1f ms\n",
            ws.num_grammars, static_cast<long long>(ws.num_masks),
            static_cast<long long>(ws.tables_added), took.count());
    }
    const auto run =
        realworld::run_corpus(corpus, test_util::real_tokenizer(), options, schema_options, cpu);
    const auto& m = run.mask_us;
    int64_t slow_1ms = std::count_if(m.begin(), m.end(), [](double us) { return us >= 1000; });
    int64_t slow_100ms =
        std::count_if(m.begin(), m.end(), [](double us) { return us >= 100000; });
    std::printf("real-world corpus: %d schemas, %d compiled (%.1f%%), %s table cache%s\n",
                run.num_schemas, run.num_compiled, 100.0 * run.num_compiled / run.num_schemas,
                shared ? "shared" : "private",
                schema_options.any_property_order ? ", any property order" : "");
    std::printf("instances of compiled schemas: %d valid accepted, %d false rejects, %d invalid "
                "rejected, %d false accepts, %zu token-replay failures\n",
                run.valid_accepted, run.false_rejects, run.invalid_rejected, run.false_accepts,
                run.token_failures.size());
    std::printf("compile  p50 %9.1f us  p99 %9.1f us  max %9.1f us  n=%zu (goal p99 <= 50000)\n",
                pct(run.compile_us, 0.5), pct(run.compile_us, 0.99), pct(run.compile_us, 1.0),
                run.compile_us.size());
    std::printf("  front end p50 %9.1f us  p99 %9.1f us  max %9.1f us (compile_json_schema)\n",
                pct(run.front_end_us, 0.5), pct(run.front_end_us, 0.99),
                pct(run.front_end_us, 1.0));
    std::printf("mask     p50 %9.1f us  p99 %9.1f us  p99.9 %9.1f us  max %9.1f us  n=%zu "
                "(goal p50 <= 10, p99 <= 200, max <= 10000)\n",
                pct(m, 0.5), pct(m, 0.99), pct(m, 0.999), pct(m, 1.0), m.size());
    const auto& mc = run.mask_cpu_us;
    if (cpu) {
        std::printf("mask CPU p50 %9.1f us  p99 %9.1f us  p99.9 %9.1f us  max %9.1f us (thread CPU time)\n",
                    pct(mc, 0.5), pct(mc, 0.99), pct(mc, 0.999), pct(mc, 1.0));
    }
    std::printf("mask steps >= 1 ms: %lld (%.2f%%), >= 100 ms: %lld\n",
                static_cast<long long>(slow_1ms), m.empty() ? 0.0 : 100.0 * slow_1ms / m.size(),
                static_cast<long long>(slow_100ms));
    auto sum_s = [](const std::vector<double>& v) {
        double t = 0;
        for (double x : v) t += x;
        return t / 1e6;
    };
    std::printf("totals: compile %.1f s (front end %.1f s), masks %.1f s\n", sum_s(run.compile_us),
                sum_s(run.front_end_us), sum_s(m));
    std::vector<size_t> order(run.compile_us.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return run.compile_us[a] > run.compile_us[b]; });
    std::printf("slowest compiles:");
    for (size_t i = 0; i < order.size() && i < 5; ++i) {
        std::printf(" %s %.0f ms;", run.compiled_ids[order[i]].c_str(),
                    run.compile_us[order[i]] / 1000);
    }
    std::printf("\n");
    std::vector<size_t> slow(m.size());
    for (size_t i = 0; i < slow.size(); ++i) slow[i] = i;
    const size_t num_slow = std::min<size_t>(10, slow.size());
    std::partial_sort(slow.begin(), slow.begin() + static_cast<ptrdiff_t>(num_slow), slow.end(),
                      [&](size_t a, size_t b) { return m[a] > m[b]; });
    if (options.table_cache) {
        const PositionTableCache::Stats cs = options.table_cache->stats();
        std::printf("shared table cache: %lld entries, %.1f MB, %lld hits, %lld misses\n",
                    static_cast<long long>(cs.entries), cs.bytes / 1e6,
                    static_cast<long long>(cs.hits), static_cast<long long>(cs.misses));
    }
    std::printf("slowest masks:\n");
    for (size_t i = 0; i < num_slow; ++i) {
        const realworld::MaskStep& w = run.mask_steps[slow[i]];
        const std::string& text = corpus[w.schema].instances[w.instance].text;
        const size_t from = w.offset > 30 ? w.offset - 30 : 0;
        std::printf("  %9.1f us", m[slow[i]]);
        if (cpu) std::printf(" (CPU %9.1f us)", mc[slow[i]]);
        std::printf("  %s @%u `%s`\n", corpus[w.schema].id.c_str(), w.offset,
                    text.substr(from, w.offset - from).c_str());
    }
    std::printf("\n%s", run.markdown(10).c_str());  // the first 10 false rejects / failures
    return run.false_accepts == 0 ? 0 : 1;
}
