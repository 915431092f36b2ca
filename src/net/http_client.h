// HttpClient: a small asynchronous HTTP/1.1 client -- the load generator's requests and
// membership/'s etcd JSON-gateway calls and watch streams. One TCP connection per
// request, so a request's latency never waits behind another's on a shared connection.
// The response body is handed over as it arrives (chunked or Content-Length), so SSE
// streams are timed token by token and a watch stream is read event by event.
//
// Thread model: the client owns one I/O thread; start() and cancel_all() may be called
// from any thread; handlers run on the I/O thread and must not block. Each request ends
// with exactly one on_done call: OK when the whole body arrived, UNAVAILABLE for
// connect/IO errors (connection refused, reset), DEADLINE_EXCEEDED when the request's
// deadline passed, CANCELLED after cancel_all() or when on_body returned false.
// The only translation unit with Beast/Asio is http_client.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace dsi::net {

struct HttpTarget {
    std::string host;
    std::string port = "80";
    std::string base_path;  // "" or "/prefix" (no trailing slash)
};

// "http://host[:port][/path]". INVALID_ARGUMENT otherwise (https is not supported).
Result<HttpTarget> parse_base_url(std::string_view url);

struct HttpRequest {
    std::string method = "POST";
    std::string path;  // appended to the target's base_path
    std::string body;
    std::vector<std::pair<std::string, std::string>> headers;
    int64_t timeout_ms = 0;  // whole request, connect to last byte; 0: none
};

struct HttpHandlers {
    std::function<void(int status)> on_status;
    std::function<bool(std::string_view bytes)> on_body;  // false: abort (CANCELLED)
    std::function<void(Status)> on_done;
};

class HttpClient {
public:
    explicit HttpClient(HttpTarget target);
    ~HttpClient();  // cancels what is in flight (on_done(CANCELLED)) and joins
    HttpClient(const HttpClient&) = delete;
    HttpClient& operator=(const HttpClient&) = delete;

    // Returns the request's id for cancel().
    uint64_t start(HttpRequest request, HttpHandlers handlers);
    // Ends request `id` with CANCELLED if it is still in flight (no-op otherwise).
    void cancel(uint64_t id);
    // Ends every request in flight with CANCELLED.
    void cancel_all();
    const HttpTarget& target() const { return target_; }

    struct Impl;

private:
    HttpTarget target_;
    std::unique_ptr<Impl> impl_;
};

// A whole response, for the blocking helper below.
struct HttpResponse {
    int status = 0;
    std::string body;
};

// Runs `request` on `client` and blocks until it ends. Errors as on_done reports them
// (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED); an HTTP error status is not an error here
// (the caller reads `status`). REQUIRES: not called on the client's I/O thread (a
// handler), which would wait for itself.
Result<HttpResponse> fetch(HttpClient& client, HttpRequest request);

}  // namespace dsi::net
