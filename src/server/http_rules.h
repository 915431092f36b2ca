// HTTP/1.1 request rules the server applies once a request's head (start line +
// header fields) has been parsed, before a byte of its body is read: framing the
// parser leaves to the application (RFC 9112 §6.1, §6.3), Host (RFC 9112 §3.2),
// Expect (RFC 9110 §10.1.1), routes with their methods and body limits, and the API
// key (RFC 9110 §11: the auth scheme is case-insensitive; the key is compared in
// constant time). Beast-free and socket-free: the sessions (http_server.cc), the
// offline request path the fuzzer drives (answer_offline) and the tests call it.
//
// Thread model: pure functions; BodyBudget is thread-safe (one atomic).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/api.h"

namespace dsi::server {

// Largest request line + header fields; 431 above (the parser enforces it).
inline constexpr uint64_t kHeaderLimitBytes = 16 * 1024;
// A POST to an API route declaring a body over max_body_bytes but at most this is
// read and dropped (never stored) before its 413, so clients that are still
// uploading (undici) read the reply; larger declared bodies get the 413 at once.
inline constexpr uint64_t kDropLimitBytes = uint64_t{64} << 20;

// One request's head, as parsed.
struct RequestHead {
    std::string method;  // as sent: "GET", "POST", ...
    std::string target;  // request-target as sent (path + query)
    int version = 11;    // 10 * major + minor
    std::vector<std::pair<std::string, std::string>> fields;  // in order, names as sent
    std::optional<uint64_t> content_length;                   // the parser's (validated) value
    bool chunked = false;  // the parser frames the body as chunked

    std::string path() const;  // target without the query
    // Values of every field named `name` (case-insensitive), in order.
    std::vector<std::string_view> values(std::string_view name) const;
    bool has_body() const { return chunked || content_length.value_or(0) > 0; }
};

struct HeadPolicy {
    const std::vector<ApiKey>* api_keys = nullptr;  // none / empty: no authentication
    int64_t max_body_bytes = int64_t{4} << 20;
    int64_t retry_after_s = 1;
    bool draining = false;
    // POST /internal/v1/generate and GET /internal/v1/swa_states (engine_rpc.h) are
    // routed; otherwise they are a 404.
    bool engine_rpc = false;
    // GET /internal/v1/swa_lookup (a router's SWA directory part) is routed.
    bool swa_lookup = false;
};

enum class RouteKind {
    kHealth,
    kReady,
    kMetrics,
    kModels,
    kWeb,
    kGenerate,
    kEngineRpc,
    kSwaStates,
    kSwaLookup,
    kNone
};

// What to do with a request after its head.
struct HeadVerdict {
    // 0: accepted (read the body if any within body_limit_bytes, then answer the
    // route); otherwise the status of the reply to send without reading the body.
    int status = 0;
    std::string message;
    std::vector<std::pair<std::string, std::string>> headers;  // Allow, Retry-After
    RouteKind route = RouteKind::kNone;
    std::optional<Endpoint> endpoint;  // the API whose error shape answers
    std::string metric_name;           // metrics label: endpoint name, health, ..., other
    uint64_t body_limit_bytes = 0;     // accepted: the route's body limit
    bool send_continue = false;        // accepted: answer `Expect: 100-continue` first
    // Rejected POST to an API route whose client is sending a declared body (no
    // Expect: 100-continue) of at most kDropLimitBytes: read and drop these bytes
    // before the reply (413, 401), then close.
    uint64_t drop_body_bytes = 0;
    // The connection ends after the reply: framing unsafe, or a body left unread.
    bool close = false;
    std::string key_salt;  // accepted: the cache salt of the API key it carried
};

HeadVerdict check_head(const RequestHead& head, const HeadPolicy& policy);

// The key the head carries (`Authorization: <Bearer, any case> KEY` or `x-api-key:
// KEY`) among `keys`, or nullptr. Every key is compared with every credential in
// constant time (no early exit). REQUIRES: the returned pointer lives as `keys`.
const ApiKey* authorized_key(const RequestHead& head, const std::vector<ApiKey>& keys);

// Equality whose running time depends only on `given`'s length, not on where it
// first differs from `secret` (API key comparison).
bool constant_time_equals(std::string_view given, std::string_view secret);

// A global cap on request body bytes held in memory at once (all connections): a
// body is admitted only when its declared length (or, for a chunked body, the
// route's limit) fits. Thread-safe.
class BodyBudget {
public:
    explicit BodyBudget(int64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}
    // True when `bytes` fit; they are then held until release(bytes).
    bool try_reserve(int64_t bytes);
    void release(int64_t bytes);
    int64_t reserved_bytes() const { return reserved_bytes_.load(); }
    int64_t capacity_bytes() const { return capacity_bytes_; }

private:
    const int64_t capacity_bytes_;
    std::atomic<int64_t> reserved_bytes_{0};
};

// The request path without a socket or an engine, for the fuzzer and tests
// (http_offline.cc): parses `input` as one connection's bytes (EOF after them) and
// answers each request in order as a session does -- the same parser settings and
// check_head, then prepare_request for an API body (the protocol adapters) --
// stopping where a generation would be submitted (answered 200) or where the
// connection would close. `api_keys`: as --api-key (empty: none). Returns each reply's
// status.
std::vector<int> answer_offline(const ApiContext& ctx, const std::vector<ApiKey>& api_keys,
                                std::string_view input);

}  // namespace dsi::server
