// RemoteCompiler: the client of a compile server (compile_server.h; `dsinfer
// compile-server`), with CompileService's interface, so a server or engine can use
// either: submit() returns the same CompileHandle (poll / wait_for / cancel /
// callback), with the same cache, de-duplication, deadlines and bounded queue,
// because it *is* a local CompileService whose compile function is the remote call.
// The compile server returns the serialised Grammar; the CompiledGrammar (token
// tables, mask cache) is built here over the local vocabulary.
//
// Errors: a compile error comes back with the server's code and message (equal to a
// local compile's); server down / unreachable / connection broken is UNAVAILABLE
// naming the address (connect bounded by `connect_timeout_ms`, every read and write by
// `io_timeout_ms`: no hang); a vocabulary other than the one given at construction is
// INVALID_ARGUMENT at submit; the server's FAILED_PRECONDITION when its tokenizer
// differs.
//
// Thread model: thread-safe (as CompileService). Remote calls run on its worker
// threads, one connection per compile.
#pragma once

#include <memory>
#include <string>

#include "base/env.h"
#include "base/status.h"
#include "grammar/compile_service.h"
#include "grammar/vocabulary.h"

namespace dsi::grammar {

struct RemoteCompilerOptions {
    std::string address;  // "HOST:PORT" of the compile server
    int64_t connect_timeout_ms = 2000;
    int64_t io_timeout_ms = 60000;  // covers the server's compile time
    CompileServiceOptions local;    // workers = concurrent remote calls; cache; queue
};

class RemoteCompiler {
public:
    // REQUIRES: vocab != nullptr; `env` outlives this.
    static Result<std::unique_ptr<RemoteCompiler>> create(RemoteCompilerOptions options,
                                                          std::shared_ptr<const Vocabulary> vocab,
                                                          Env* env = Env::default_env());

    // As CompileService::submit. INVALID_ARGUMENT when vocab is not the one given to
    // create() (by fingerprint).
    Result<std::unique_ptr<CompileHandle>> submit(const GrammarSpec& spec,
                                                  std::shared_ptr<const Vocabulary> vocab,
                                                  int64_t deadline_ns = 0,
                                                  CompileCallback callback = nullptr);
    CompileServiceStats stats() const { return service_->stats(); }

    // One blocking round trip, no cache: the server's Grammar::serialize() bytes.
    Result<std::string> compile_serialized(const GrammarSpec& spec) const;

private:
    RemoteCompiler() = default;
    RemoteCompilerOptions options_;
    std::string host_;
    uint16_t port_ = 0;
    uint64_t fingerprint_ = 0;
    std::unique_ptr<CompileService> service_;
};

}  // namespace dsi::grammar
