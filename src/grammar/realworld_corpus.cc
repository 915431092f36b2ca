#include "grammar/realworld_corpus.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>

#include "base/check.h"

namespace dsi::grammar::realworld {
namespace {

double elapsed_us(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
        .count();
}

// CPU time of the calling thread: on a shared machine a step's wall time includes the
// time other processes held the core.
double thread_cpu_us() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

// Token by token: each token of `text`'s encoding must be in the full mask at its step,
// EOS at the end. Returns "" or what failed; appends each fill_mask() time.
std::string replay_tokens(const std::shared_ptr<CompiledGrammar>& cg, const Tokenizer& tok,
                          const std::string& text, MaskStep where, bool measure_cpu,
                          CorpusRun* run) {
    GrammarMatcher m(cg);
    TokenBitmask mask(cg->vocab().size());
    // Cheap bookkeeping only: a CPU-clock read (a system call here) or a string per
    // step made the fills after it measurably slower (p50 1.2 -> 2.5 us).
    auto timed_fill = [&] {
        const double cpu0 = measure_cpu ? thread_cpu_us() : 0;
        auto t0 = std::chrono::steady_clock::now();
        m.fill_mask(&mask);
        run->mask_us.push_back(elapsed_us(t0));
        if (measure_cpu) run->mask_cpu_us.push_back(thread_cpu_us() - cpu0);
        run->mask_steps.push_back(where);
    };
    const std::vector<int32_t> ids = tok.encode(text);
    for (size_t k = 0; k < ids.size(); ++k) {
        timed_fill();
        if (!mask.test(ids[k])) {
            return "token " + std::to_string(k) + " (id " + std::to_string(ids[k]) +
                   ") not in the mask";
        }
        if (!m.advance(ids[k])) return "token " + std::to_string(k) + " refused by advance()";
        where.offset += static_cast<uint32_t>(cg->vocab().token_bytes(ids[k]).size());
    }
    timed_fill();
    if (!m.is_accepted() || !mask.test(tok.eos_id())) return "EOS not allowed at the end";
    return "";
}

// Where a rejected text fails: "…before|after" around the first byte the grammar
// refuses ("<end>" when every byte is taken but the text is incomplete).
std::string failure_point(const std::shared_ptr<CompiledGrammar>& cg, const std::string& text) {
    GrammarMatcher m(cg);
    size_t k = 0;
    while (k < text.size() && m.advance_bytes(std::string_view(text).substr(k, 1))) ++k;
    const size_t from = k > 40 ? k - 40 : 0;
    return "@" + std::to_string(k) + " `" + text.substr(from, k - from) + "` | `" +
           (k < text.size() ? text.substr(k, 20) : std::string("<end>")) + "`";
}

}  // namespace

std::vector<Schema> load_corpus(const std::string& source_dir) {
    const std::string path = source_dir + "/tests/data/realworld-schemas/corpus.jsonl";
    std::ifstream in(path);
    DSI_CHECK(in.good(), "real-world corpus missing at " + path);
    std::vector<Schema> out;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        auto j = nlohmann::ordered_json::parse(line);
        Schema s{j["id"].get<std::string>(), std::move(j["schema"]), {}};
        for (const auto& i : j["instances"]) {
            s.instances.push_back({i["text"].get<std::string>(), i["valid"].get<bool>()});
        }
        out.push_back(std::move(s));
    }
    return out;
}

std::string error_kind(const Status& status) {
    std::string m = status.to_string();
    size_t at = m.find("JSON schema at '");
    if (at != std::string::npos) {
        size_t end = m.find("': ", at);
        if (end != std::string::npos) m = m.substr(0, at) + m.substr(end + 3);
    }
    std::string out;
    for (char c : m) {
        if (c >= '0' && c <= '9') {
            if (out.empty() || out.back() != '#') out += '#';
        } else {
            out += c;
        }
    }
    return out.size() > 100 ? out.substr(0, 100) : out;
}

CorpusRun run_corpus(const std::vector<Schema>& corpus, const Tokenizer& tok,
                     const MatcherOptions& matcher_options,
                     const JsonSchemaOptions& schema_options, bool measure_cpu) {
    CorpusRun run;
    auto vocab = Vocabulary::from_tokenizer(tok);
    for (const auto& s : corpus) {
        ++run.num_schemas;
        auto t0 = std::chrono::steady_clock::now();
        auto g = compile_json_schema(s.schema, schema_options);
        if (!g.is_ok()) {
            ++run.compile_errors[error_kind(g.status())];
            run.compile_failures.push_back(s.id + ": " + g.status().to_string());
            continue;
        }
        run.front_end_us.push_back(elapsed_us(t0));
        auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), vocab, matcher_options);
        run.compile_us.push_back(elapsed_us(t0));
        run.compiled_ids.push_back(s.id);
        ++run.num_compiled;
        for (const auto& inst : s.instances) {
            run.num_valid += inst.valid;
            GrammarMatcher bytes(cg);
            const bool accepted = bytes.advance_bytes(inst.text) && bytes.is_accepted();
            if (accepted && !inst.valid) {
                ++run.false_accepts;
                run.false_accepted.push_back(s.id + ": " + inst.text);
            } else if (!accepted && inst.valid) {
                ++run.false_rejects;
                run.false_rejected.push_back(s.id + " " + failure_point(cg, inst.text));
            } else if (accepted) {
                ++run.valid_accepted;
            } else {
                ++run.invalid_rejected;
            }
            if (!accepted) continue;
            const MaskStep where{static_cast<uint32_t>(&s - corpus.data()),
                                 static_cast<uint32_t>(&inst - s.instances.data()), 0};
            std::string error = replay_tokens(cg, tok, inst.text, where, measure_cpu, &run);
            if (!error.empty()) run.token_failures.push_back(s.id + ": " + error);
        }
    }
    return run;
}

std::string CorpusRun::markdown(size_t max_examples) const {
    const int num_instances = valid_accepted + false_rejects + invalid_rejected + false_accepts;
    std::string md =
        "| schemas | compiled | instances (valid) | valid accepted | false rejects | "
        "invalid rejected | false accepts |\n|---|---|---|---|---|---|---|\n";
    md += "| " + std::to_string(num_schemas) + " | " + std::to_string(num_compiled) + " | " +
          std::to_string(num_instances) + " (" + std::to_string(num_valid) + ") | " +
          std::to_string(valid_accepted) + " | " + std::to_string(false_rejects) + " | " +
          std::to_string(invalid_rejected) + " | " + std::to_string(false_accepts) + " |\n\n";
    md += "Compile errors by kind (instances of schemas that do not compile are not "
          "counted above):\n\n| schemas | error |\n|---|---|\n";
    std::vector<std::pair<int, std::string>> sorted;
    for (const auto& [kind, n] : compile_errors) sorted.push_back({n, kind});
    std::sort(sorted.rbegin(), sorted.rend());
    for (const auto& [n, kind] : sorted) md += "| " + std::to_string(n) + " | " + kind + " |\n";
    md += "\nFalse rejects (first " + std::to_string(max_examples) + "):\n\n";
    for (size_t i = 0; i < false_rejected.size() && i < max_examples; ++i) {
        md += "- " + false_rejected[i] + "\n";
    }
    md += "\nCompile failures (first " + std::to_string(max_examples) + "):\n\n";
    for (size_t i = 0; i < compile_failures.size() && i < max_examples; ++i) {
        md += "- " + compile_failures[i] + "\n";
    }
    return md;
}

}  // namespace dsi::grammar::realworld
