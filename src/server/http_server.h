// HttpServer: the HTTP/1.1 + SSE shell (Boost.Beast/Asio) over Api and
// EngineService. This header is Beast-free; Beast and Asio live only in
// http_server.cc (one translation unit: CI builds on 2 cores).
//
// Per connection: read the header (deadline: header_timeout_ms for a new
// connection, idle_timeout_ms between keep-alive requests), check route, method
// and --api-key (401), read the body (413 over max_body_bytes), answer. A
// generation holds one of max_concurrent slots (429 + Retry-After when none is
// free) from admission until the engine's final update. While it runs, a read
// stays pending on the socket: EOF or an error aborts the generation at once
// (its KV blocks are freed by the engine) -- also on a failed write.
// SIGTERM / SIGINT / shutdown(): stop accepting, answer 503 to new requests and
// /ready, wait for running generations up to drain_grace_ms, abort the rest, then
// run() returns OK.
//
// Thread model: run() blocks the calling thread and runs num_io_threads Asio
// threads; each connection is served on its own strand. shutdown() and port()
// are thread-safe. Engine updates arrive on the engine thread and are posted to
// the connection's strand.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "server/api.h"
#include "server/engine_service.h"
#include "server/metrics.h"

namespace dsi::server {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8000;      // 0: any free port (see port())
    std::string api_key;  // empty: no authentication
    int num_io_threads = 2;
    int64_t drain_grace_ms = 30000;
};

class HttpServer {
public:
    // Binds and listens. REQUIRES: ctx, service and metrics outlive the server.
    static Result<std::unique_ptr<HttpServer>> create(const ApiContext* ctx, EngineService* service,
                                                      Metrics* metrics, ServerOptions options);
    ~HttpServer();

    int port() const;
    // Serves until a signal or shutdown(), then drains. OK after a drain.
    Status run();
    // Starts the drain (as SIGTERM does).
    void shutdown();

    struct Impl;

private:
    explicit HttpServer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace dsi::server
