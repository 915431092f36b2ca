// Structured-output figures (issue 7): compile time per schema and mask time per
// token at the DeepSeek V3 vocabulary, over the JSON-Schema-Test-Suite schemas we
// support and the realistic schemas of tests/cases/grammar/json_schema.json.
// Compile time includes the per-position token tables (matcher.h). Mask time is
// measured at every step of whole generations (random walks sampling only allowed
// tokens, EOS with probability 1/2 where accepted): the first request on a fresh
// compiled grammar and a second on the same one (the compile service's cache hit).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"
#include "support/build_paths.h"

using namespace dsi;
using namespace dsi::grammar;
using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

static double now_us() {
    return std::chrono::duration<double, std::micro>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

static double pct(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

int main(int argc, char** argv) {
    // Default: the compile service's configuration (tables built on first use, one
    // table cache shared by all grammars). "eager": every table at compile time;
    // "private": a table cache per compiled grammar (as for the first schema a
    // fresh server compiles).
    const std::string mode = argc > 1 ? argv[1] : "";
    const bool lazy = mode != "eager";
    MatcherOptions options;
    if (mode != "private") options.table_cache = std::make_shared<PositionTableCache>();
    auto dir = find_reference_tokenizer_dir(Env::default_env(), DSINFER_SOURCE_DIR);
    if (!dir.is_ok()) {
        std::fprintf(stderr, "%s\n", dir.status().to_string().c_str());
        return 1;
    }
    auto tok = Tokenizer::load(Env::default_env(), *dir);
    if (!tok.is_ok()) return 1;
    auto vocab = Vocabulary::from_tokenizer(**tok);
    std::vector<ojson> schemas;
    fs::path suite =
        fs::path(DSINFER_SOURCE_DIR) / "tests" / "data" / "json-schema-test-suite" / "draft2020-12";
    if (fs::exists(suite)) {
        for (const auto& e : fs::directory_iterator(suite)) {
            if (e.path().extension() != ".json") continue;
            std::ifstream f(e.path());
            for (const auto& g : ojson::parse(f)) schemas.push_back(g["schema"]);
        }
    }
    size_t num_suite = schemas.size();
    std::ifstream cf(std::string(DSINFER_SOURCE_DIR) + "/tests/cases/grammar/json_schema.json");
    const ojson cases = ojson::parse(cf);  // named: a range-for over parse(...)["cases"] dangles
    for (const auto& c : cases["cases"]) {
        if (!c.contains("error")) schemas.push_back(c["schema"]);
    }
    // Issue 21's reproducers: objects that allow additional properties (the default).
    for (const char* text :
         {R"({"type":"object","properties":{"c":{"type":"number"}}})",
          R"({"type":"object","properties":{"name":{"type":"string"},"tags":{"type":"array","items":{"type":"object","properties":{"k":{"type":"string"},"v":{"type":"integer"}}}}}})",
          R"({"type":"array","items":{"type":"object","properties":{"id":{"type":"integer"},"children":{"type":"array","items":{"type":"object","properties":{"id":{"type":"integer"},"label":{"type":"string"}}}}}}})"}) {
        schemas.push_back(ojson::parse(text));
    }
    std::vector<double> compile_us, front_us, table_us, cold_us, warm_us, all_us, walk_us;
    std::vector<double> table_kb;
    int compiled = 0;
    for (size_t i = 0; i < schemas.size(); ++i) {
        double t0 = now_us();
        auto g = compile_json_schema(schemas[i]);
        double t1 = now_us();
        if (!g.is_ok()) continue;
        ++compiled;
        auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), vocab, options);
        if (!lazy) GrammarMatcher(cg).precompute();
        double t2 = now_us();
        front_us.push_back(t1 - t0);
        table_us.push_back(t2 - t1);
        compile_us.push_back(t2 - t0);
        table_kb.push_back(cg->table_stats().bytes / 1024.0);
        if (i < num_suite && i % 2 != 0) continue;  // generations on half the suite
        for (int pass = 0; pass < 2; ++pass) {
            std::mt19937_64 walk_rng(i);
            GrammarMatcher m(cg);
            TokenBitmask mask(vocab->size());
            for (int step = 0; step < 96 && !m.is_terminated(); ++step) {
                double a = now_us();
                m.fill_mask(&mask);
                double b = now_us();
                (pass == 0 ? cold_us : warm_us).push_back(b - a);
                all_us.push_back(b - a);
                if (pass == 0 && step % 8 == 0) {
                    double c = now_us();
                    m.plain_walk_mask(&mask);
                    walk_us.push_back(now_us() - c);
                }
                std::vector<int32_t> allowed;
                for (int32_t t = 0; t < vocab->size(); ++t) {
                    if (mask.test(t)) allowed.push_back(t);
                }
                if (allowed.empty()) break;
                int32_t pick = allowed[walk_rng() % allowed.size()];
                if (m.is_accepted() && walk_rng() % 2 == 0) pick = (*tok)->eos_id();
                if (!m.advance(pick)) break;
            }
        }
    }
    std::printf("schemas: %zu (%d compiled), vocabulary %d ids, tables %s, %s cache\n",
                schemas.size(), compiled, vocab->size(), lazy ? "lazy" : "at compile time",
                options.table_cache ? "shared" : "private");
    std::printf("compile total  median %8.1f us  p99 %8.1f us  max %8.1f us (goal median <= 5000 us)\n",
                pct(compile_us, 0.5), pct(compile_us, 0.99), pct(compile_us, 1.0));
    std::printf("  front end    median %8.1f us  p99 %8.1f us\n", pct(front_us, 0.5),
                pct(front_us, 0.99));
    std::printf("  tables       median %8.1f us  p99 %8.1f us  memory median %.0f KB p99 %.0f KB\n",
                pct(table_us, 0.5), pct(table_us, 0.99), pct(table_kb, 0.5), pct(table_kb, 0.99));
    std::printf("mask all steps median %8.1f us  p99 %8.1f us  p99.9 %8.1f us  max %8.1f us  n=%zu "
                "(issue 21 goal: p50 <= 10, p99 <= 200, max <= 10000)\n",
                pct(all_us, 0.5), pct(all_us, 0.99), pct(all_us, 0.999), pct(all_us, 1.0), all_us.size());
    std::printf("  first request median %7.1f us  p99 %8.1f us  n=%zu\n", pct(cold_us, 0.5),
                pct(cold_us, 0.99), cold_us.size());
    std::printf("  second request median %6.1f us  p99 %8.1f us  n=%zu\n", pct(warm_us, 0.5),
                pct(warm_us, 0.99), warm_us.size());
    std::printf("plain trie walk median %7.1f us  p99 %8.1f us  n=%zu (reference, no tables)\n",
                pct(walk_us, 0.5), pct(walk_us, 0.99), walk_us.size());
    std::printf("ratios to goal: compile median %.2f, mask median %.2f, mask p99 %.2f\n",
                pct(compile_us, 0.5) / 5000.0, pct(all_us, 0.5) / 10.0, pct(all_us, 0.99) / 200.0);
    return 0;
}
