// HttpServer: the HTTP/1.1 + SSE shell (Boost.Beast/Asio) over Api and a
// GenerationService (the engine in this process, or the router's remote engines). This header is
// Beast-free; Asio lives only in http_server.cc (one translation unit: CI builds on 2 cores; the
// parser settings it shares with answer_offline are in internal/http_parse.h).
//
// Per connection (at most max_connections; past it a connection gets 503 +
// Retry-After and is closed): bytes are read into a bounded buffer and parsed from
// there, so a request that arrived while the previous reply was written (pipelined)
// is answered next, in order. Every read has a deadline: idle_timeout_ms before a
// request's first byte -- on a new connection and between keep-alive requests (the
// connection is then closed quietly; replies say `Keep-Alive: timeout=` so clients close
// first) --, header_timeout_ms from that byte for the request's head and body_timeout_ms
// for its body (408 Request Timeout, then close); a
// write the client does not take within write_timeout_ms ends the connection (and
// aborts its generation).
// Once the head is parsed, http_rules.h's check_head decides before any body byte is
// read: framing (400, 501), Host (400), Expect (100 Continue / 417), route and
// method (404, 405), --api-key (401; the key's cache salt goes with the request),
// per-route body limit (GET routes take none;
// 413 over max_body_bytes). An accepted body must then fit the global
// max_body_budget_bytes (503 + Retry-After otherwise). A generation holds one of
// max_concurrent slots (429 + Retry-After when none is free) from admission until
// the engine's final update. While it runs, a read stays pending on the socket: EOF
// or an error aborts the generation at once (its KV blocks are freed by the engine)
// -- also on a failed write. HTTP/1.0 clients get streams close-delimited (no chunked
// coding).
// SIGTERM / SIGINT / shutdown(): stop accepting, answer 503 to new requests and
// /ready, wait for running generations up to drain_grace_ms, abort the rest, then
// run() returns OK.
//
// Memory per connection is bounded before authentication: the read buffer
// (kReadBufferBytes), the reply being written, and a body counted in the budget.
//
// Thread model: run() blocks the calling thread and runs num_io_threads Asio
// threads; each connection is served on its own strand. shutdown() and port()
// are thread-safe. Engine updates arrive on the engine thread and are posted to
// the connection's strand.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "server/api.h"
#include "server/engine_service.h"
#include "server/metrics.h"

namespace dsi::server {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8000;  // 0: any free port (see port())
    // Accepted keys (Bearer or x-api-key) and their tenants' cache salts (api.h,
    // effective_cache_salt). Empty: no authentication.
    std::vector<ApiKey> api_keys;
    int num_io_threads = 2;
    int64_t drain_grace_ms = 30000;
    int64_t max_connections = 1024;                      // open connections; 503 past it
    int64_t max_body_budget_bytes = int64_t{256} << 20;  // bodies held at once, all connections
    // Serve the engine RPC (engine_rpc.h) for a router: `serve --role ...`.
    bool engine_rpc = false;
    // With engine_rpc: the body of GET /internal/v1/swa_states (swa_announce.h) for the
    // request's target; null: that route answers 404 (an engine without SWA states).
    // Called on an I/O thread; must not block long.
    std::function<std::string(std::string_view target)> swa_states;
    // A router: the body of GET /internal/v1/swa_lookup for the request's target (its part
    // of the SWA-state directory); null: no such route. On an I/O thread; must not block.
    std::function<std::string(std::string_view target)> swa_lookup;
    // Called once (on the I/O thread) when a drain starts: an engine leaves the
    // cluster directory here, so routers stop sending it work while it finishes its
    // generations. Must not block long.
    std::function<void()> on_drain_start;
};

// Bytes a connection buffers ahead of parsing (a request head must fit).
inline constexpr int64_t kReadBufferBytes = 64 * 1024;

class HttpServer {
public:
    // Binds and listens. REQUIRES: ctx, service and metrics outlive the server.
    static Result<std::unique_ptr<HttpServer>> create(const ApiContext* ctx,
                                                      GenerationService* service, Metrics* metrics,
                                                      ServerOptions options);
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
