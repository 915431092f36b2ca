// CompileServer: the compile service as its own process, the "SO machine" of SPEC
// S-SO (`dsinfer compile-server`). One CompileService over one vocabulary (the
// tokenizer given at start) answers compile requests from engines and entrypoints
// (RemoteCompiler, remote_compiler.h) over TCP on loopback.
//
// Protocol: a length-prefixed binary frame per direction, one request per
// connection (internal/compile_wire.h has the exact layout). Chosen over HTTP + JSON
// because it is a few dozen lines of POSIX sockets, needs no Beast/Asio in grammar/,
// and the payload (a serialised Grammar) is binary anyway.
//
// Policies:
//   - A request body over `max_request_bytes` gets RESOURCE_EXHAUSTED without being
//     read (the server drains it briefly so the client sees the reply, not a reset).
//   - At most `max_connections` requests are served at once; one more gets
//     RESOURCE_EXHAUSTED ("busy"); past 4x that a connection is closed unanswered.
//   - A request whose vocab fingerprint differs from the server's vocabulary gets
//     FAILED_PRECONDITION (the grammar's token tables would be for another tokenizer).
//   - Compile errors come back with the same code and message as a local
//     compile_grammar(); a compile not done within `compile_timeout_ms` is
//     DEADLINE_EXCEEDED. Every socket read / write is bounded by `io_timeout_ms`.
//
// Thread model: one accept thread plus one thread per connection; the CompileService
// has its own workers. start() / port() / stop() may be called from any thread.
// stop() (also the destructor) stops accepting and waits for the connections in
// flight, each bounded by its timeouts.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "base/env.h"
#include "base/status.h"
#include "grammar/compile_service.h"
#include "grammar/vocabulary.h"

namespace dsi::grammar {

struct CompileServerOptions {
    std::string host = "127.0.0.1";  // an IPv4 literal
    uint16_t port = 0;               // 0: an ephemeral port (see port())
    size_t max_request_bytes = (size_t{1} << 20) + 4096;  // schema limit + envelope
    int max_connections = 64;
    int64_t io_timeout_ms = 10000;
    int64_t compile_timeout_ms = 30000;
    CompileServiceOptions service;
};

class CompileServer {
public:
    // Binds and listens. REQUIRES: vocab != nullptr; `env` outlives the server.
    static Result<std::unique_ptr<CompileServer>> start(CompileServerOptions options,
                                                        std::shared_ptr<const Vocabulary> vocab,
                                                        Env* env = Env::default_env());
    ~CompileServer();
    CompileServer(const CompileServer&) = delete;
    CompileServer& operator=(const CompileServer&) = delete;

    uint16_t port() const { return port_; }
    // "HOST:PORT", what RemoteCompiler takes.
    std::string address() const;
    void stop();
    CompileServiceStats stats() const { return service_->stats(); }

private:
    CompileServer(CompileServerOptions options, std::shared_ptr<const Vocabulary> vocab, Env* env);
    void accept_loop();
    void serve_connection(int fd, bool over_limit);
    // The reply for one request body (already read).
    std::string handle_request(const std::string& body);

    CompileServerOptions options_;
    std::shared_ptr<const Vocabulary> vocab_;
    Env* env_;
    std::unique_ptr<CompileService> service_;
    int listen_fd_ = -1;
    uint16_t port_ = 0;
    std::atomic<bool> stopping_{false};
    std::thread accept_thread_;
    std::mutex mu_;
    std::condition_variable idle_cv_;
    int active_ = 0;  // GUARDED_BY(mu_): connection threads alive
};

}  // namespace dsi::grammar
