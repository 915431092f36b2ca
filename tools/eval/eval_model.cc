// eval_model: scores a model on held-out generated tasks (issue 17).
//
//   eval_model --model DIR --cases heldout.jsonl [--loss-set PREFIX] [--out figures.json]
//
// Figures and checks: tools/eval/eval.h.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "base/env.h"
#include "base/settings.h"
#include "eval/eval.h"
#include "model/deepseek.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace dsi {
namespace {

struct Flags {
    std::string model;
    std::string tokenizer_dir;
    std::string out;
    int threads = 2;
    tools::EvalOptions eval;
};

int fail(const Status& s) {
    std::fprintf(stderr, "eval_model: %s\n", s.to_string().c_str());
    return 1;
}

int run(const Flags& f) {
    Env* env = Env::default_env();
    auto tokenizer = Tokenizer::load(env, f.tokenizer_dir.empty() ? f.model : f.tokenizer_dir);
    if (!tokenizer.is_ok()) return fail(tokenizer.status());
    auto source = open_checkpoint(env, f.model);
    if (!source.is_ok()) return fail(source.status());
    DeepseekModel::Options mo;
    mo.num_threads = f.threads;
    auto model = DeepseekModel::load(std::move(source).value(), mo);
    if (!model.is_ok()) return fail(model.status());
    auto res = tools::evaluate_model(**model, **tokenizer, f.eval);
    if (!res.is_ok()) return fail(res.status());
    if (!f.out.empty()) {
        Status s = env->write_file(f.out, res->dump(1) + "\n");
        if (!s.is_ok()) return fail(s);
    }
    nlohmann::json brief = *res;
    brief.erase("samples");
    brief.erase("counts");
    std::printf("%s\n", brief.dump(1).c_str());
    return 0;
}

}  // namespace
}  // namespace dsi

int main(int argc, char** argv) {
    CLI::App app{"eval_model: task accuracy, MTP acceptance and held-out loss of a model"};
    dsi::Flags f;
    app.add_option("--model", f.model, "HF checkpoint directory or .gguf")->required();
    app.add_option("--cases", f.eval.cases, "held-out cases (gen_corpus.py JSONL)")->required();
    app.add_option("--loss-set", f.eval.loss_set, "rendered set prefix for the held-out loss");
    app.add_option("--out", f.out, "write the figures (JSON) here");
    app.add_option("--tokenizer-dir", f.tokenizer_dir, "default: the model directory");
    app.add_option("--max-tokens", f.eval.max_tokens, "tokens per completion");
    app.add_option("--threads", f.threads, "compute threads");
    app.add_option("--structured-max-tokens", f.eval.structured_max_tokens,
                   "tokens per json / tool_call completion (at least --max-tokens)");
    app.add_option("--limit", f.eval.limit, "first N cases (0: all)");
    app.add_flag("--structured-only", f.eval.structured_only, "json and tool_call cases only");
    app.add_flag("--grammar", f.eval.grammar,
                 "also run json / tool_call cases under the server's grammar (with_grammar)");
    app.add_flag("--compact-json", f.eval.compact_json,
                 "with --grammar: JSON without the optional space after , and :");
    app.add_option("--loss-limit", f.eval.loss_limit, "first N loss examples (0: all)");
    CLI11_PARSE(app, argc, argv);
    return dsi::run(f);
}
