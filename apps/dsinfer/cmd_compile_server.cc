// `dsinfer compile-server`: the structured-output compile service as its own process
// (the "SO machine" of SPEC S-SO; grammar/compile_server.h has the protocol and
// policies). Engines and entrypoints reach it through grammar::RemoteCompiler.
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "base/env.h"
#include "base/logging.h"
#include "base/settings.h"
#include "grammar/compile_server.h"
#include "grammar/vocabulary.h"
#include "serving/data_dir.h"
#include "tokenizer/tokenizer.h"

namespace dsi {
namespace {

volatile std::sig_atomic_t g_compile_server_stop = 0;
void on_compile_server_signal(int) { g_compile_server_stop = 1; }

struct CompileServerFlags {
    // "" = the tokenizer `dsinfer serve` builds its embedded default model from (the
    // installed data, serving/data_dir.h).
    std::string tokenizer_dir;
    std::string host = "127.0.0.1";
    int port = 8100;
    int workers = 2;
    int64_t max_request_bytes = (int64_t{1} << 20) + 4096;
    int max_connections = 64;
    int64_t compile_timeout_ms = 30000;
    int64_t cache_entries = 256;
};

int run_compile_server(const CompileServerFlags& f) {
    Env* env = Env::default_env();
    auto fail = [](const Status& s) {
        std::fprintf(stderr, "dsinfer compile-server: %s\n", s.to_string().c_str());
        return 1;
    };
    if (f.port < 0 || f.port > 65535 || f.workers < 1 || f.max_connections < 1 ||
        f.max_request_bytes < 64) {
        return fail(
            invalid_argument("--port must be 0..65535, --workers and --max-connections >= 1, "
                             "--max-request-bytes >= 64"));
    }
    std::string tok_dir = f.tokenizer_dir;
    if (tok_dir.empty()) {
        Result<std::string> data = serving::find_tokenizer_data_dir(env);
        if (!data.is_ok()) return fail(data.status().with_context("--tokenizer-dir"));
        tok_dir = *data;
    }
    Result<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::load(env, tok_dir);
    if (!tokenizer.is_ok())
        return fail(tokenizer.status().with_context("--tokenizer-dir " + tok_dir));
    std::shared_ptr<const grammar::Vocabulary> vocab =
        grammar::Vocabulary::from_tokenizer(**tokenizer);
    grammar::CompileServerOptions o;
    o.host = f.host;
    o.port = static_cast<uint16_t>(f.port);
    o.max_request_bytes = static_cast<size_t>(f.max_request_bytes);
    o.max_connections = f.max_connections;
    o.compile_timeout_ms = f.compile_timeout_ms;
    o.service.num_workers = f.workers;
    o.service.cache_entries = static_cast<size_t>(f.cache_entries);
    auto server = grammar::CompileServer::start(o, vocab, env);
    if (!server.is_ok()) return fail(server.status());
    std::signal(SIGINT, on_compile_server_signal);
    std::signal(SIGTERM, on_compile_server_signal);
    std::printf(
        "dsinfer compile-server listening on %s (vocabulary %d tokens, fingerprint %016llx)\n",
        (*server)->address().c_str(), vocab->size(),
        static_cast<unsigned long long>(vocab->fingerprint()));
    std::fflush(stdout);
    while (g_compile_server_stop == 0) env->sleep_ns(50'000'000);
    (*server)->stop();
    grammar::CompileServiceStats s = (*server)->stats();
    DSI_LOG(kInfo) << "compile-server stopped: " << s.submitted << " requests, " << s.cache_hits
                   << " cache hits, " << s.compiled << " compiles, " << s.failed << " failed";
    return 0;
}

}  // namespace

void register_compile_server_command(CLI::App& app) {
    auto f = std::make_shared<CompileServerFlags>();
    CLI::App* cmd = app.add_subcommand(
        "compile-server",
        "structured-output compile service as its own process (grammar/compile_server.h)");
    add_setting(*cmd, "--tokenizer-dir", f->tokenizer_dir,
                "tokenizer the grammars are compiled for (default: the embedded model's)");
    add_setting(*cmd, "--host", f->host, "listen address (IPv4)");
    add_setting(*cmd, "--port", f->port, "listen port (0: any free port, printed)");
    add_setting(*cmd, "--workers", f->workers, "compile worker threads");
    add_setting(*cmd, "--max-request-bytes", f->max_request_bytes,
                "larger requests are refused (429)");
    add_setting(*cmd, "--max-connections", f->max_connections,
                "requests served at once; busy (429) above");
    add_setting(*cmd, "--compile-timeout-ms", f->compile_timeout_ms,
                "504 for a compile not done by then");
    add_setting(*cmd, "--cache-entries", f->cache_entries, "compiled grammars kept (LRU)");
    cmd->callback([f] { throw CLI::RuntimeError(run_compile_server(*f)); });
}

}  // namespace dsi
