#include "server/http_rules.h"

#include <algorithm>
#include <cctype>

#include "server/engine_rpc.h"
#include "server/web_assets.h"

namespace dsi::server {

namespace {

bool iequals(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) ==
                      std::tolower(static_cast<unsigned char>(y));
           });
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

// The non-empty elements of comma-separated field values (RFC 9110 §5.6.1).
std::vector<std::string_view> list_elements(const std::vector<std::string_view>& values) {
    std::vector<std::string_view> out;
    for (std::string_view v : values) {
        while (!v.empty()) {
            const size_t comma = v.find(',');
            const std::string_view item = trim(v.substr(0, comma));
            if (!item.empty()) out.push_back(item);
            if (comma == std::string_view::npos) break;
            v.remove_prefix(comma + 1);
        }
    }
    return out;
}

struct Route {
    RouteKind kind = RouteKind::kNone;
    const char* method = "GET";  // the one method the route takes
    const char* metric = "other";
};

Route route_of(std::string_view path, std::optional<Endpoint> endpoint, bool engine_rpc,
               bool swa_lookup) {
    if (swa_lookup && path == kSwaLookupPath) return {RouteKind::kSwaLookup, "GET", "swa_lookup"};
    if (engine_rpc && path == kEngineRpcPath) return {RouteKind::kEngineRpc, "POST", "engine_rpc"};
    if (engine_rpc && path == kSwaStatesPath) return {RouteKind::kSwaStates, "GET", "swa_states"};
    if (path == "/health") return {RouteKind::kHealth, "GET", "health"};
    if (path == "/ready") return {RouteKind::kReady, "GET", "ready"};
    if (path == "/metrics") return {RouteKind::kMetrics, "GET", "metrics"};
    if (path == "/v1/models") return {RouteKind::kModels, "GET", "models"};
    if (find_web_asset(path) != nullptr) return {RouteKind::kWeb, "GET", "web"};
    if (endpoint) return {RouteKind::kGenerate, "POST", "generate"};
    return {};
}

}  // namespace

std::string RequestHead::path() const { return target.substr(0, target.find('?')); }

std::vector<std::string_view> RequestHead::values(std::string_view name) const {
    std::vector<std::string_view> out;
    for (const auto& [k, v] : fields) {
        if (iequals(k, name)) out.emplace_back(v);
    }
    return out;
}

bool constant_time_equals(std::string_view given, std::string_view secret) {
    // Every byte of `given` is compared (against the secret, cycled), so the time
    // depends on given.size() only; lengths are folded into the same accumulator.
    volatile unsigned char diff = given.size() == secret.size() ? 0 : 1;
    if (secret.empty()) return given.empty();
    for (size_t i = 0; i < given.size(); ++i) {
        diff = static_cast<unsigned char>(diff |
                                          (static_cast<unsigned char>(given[i]) ^
                                           static_cast<unsigned char>(secret[i % secret.size()])));
    }
    return diff == 0;
}

const ApiKey* authorized_key(const RequestHead& head, const std::vector<ApiKey>& keys) {
    // credentials = auth-scheme 1*SP token68 (RFC 9110 §11.4); the scheme is
    // case-insensitive.
    std::vector<std::string_view> given;
    for (std::string_view v : head.values("authorization")) {
        v = trim(v);
        const size_t sp = v.find(' ');
        if (sp == std::string_view::npos || !iequals(v.substr(0, sp), "bearer")) continue;
        given.push_back(trim(v.substr(sp + 1)));
    }
    for (std::string_view v : head.values("x-api-key")) given.push_back(trim(v));
    const ApiKey* match = nullptr;
    for (const ApiKey& k : keys) {
        for (std::string_view g : given) {
            if (constant_time_equals(g, k.key) && match == nullptr) match = &k;
        }
    }
    return match;
}

HeadVerdict check_head(const RequestHead& head, const HeadPolicy& policy) {
    HeadVerdict v;
    const std::string path = head.path();
    v.endpoint = endpoint_for_path(path);
    const Route route = route_of(path, v.endpoint, policy.engine_rpc, policy.swa_lookup);
    // The engine RPC answers errors in the Chat Completions error shape.
    if (route.kind == RouteKind::kEngineRpc) v.endpoint = Endpoint::kChatCompletions;
    v.route = route.kind;
    v.metric_name = v.endpoint && route.kind != RouteKind::kEngineRpc
                        ? std::string(endpoint_name(*v.endpoint))
                        : route.metric;
    const bool has_body = head.has_body();
    auto reject = [&](int status, std::string message, bool close) {
        v.status = status;
        v.message = std::move(message);
        // A body this request declared is not read: its bytes would be taken for the
        // next request, so the connection ends after the reply.
        v.close = close || has_body;
        return v;
    };

    // Framing first: if it cannot be trusted, nothing after this request can be.
    if (head.version / 10 != 1) return reject(505, "HTTP version not supported", true);
    const std::vector<std::string_view> codings = list_elements(head.values("transfer-encoding"));
    if (!head.values("transfer-encoding").empty()) {
        // RFC 9112 §6.1: Transfer-Encoding in HTTP/1.0 means faulty framing.
        if (head.version < 11) {
            return reject(400, "Transfer-Encoding is not allowed in an HTTP/1.0 request", true);
        }
        // RFC 9112 §6.3: chunked not last -> the body length is unknown: 400 and close.
        if (codings.empty() || !iequals(codings.back(), "chunked")) {
            return reject(400, "Transfer-Encoding must end with chunked", true);
        }
        // RFC 9112 §6.1: chunked at most once; a coding we do not decode (gzip,
        // deflate, ...) -> 501 Not Implemented.
        if (codings.size() > 1) {
            if (std::any_of(codings.begin(), codings.end() - 1,
                            [](std::string_view c) { return iequals(c, "chunked"); })) {
                return reject(400, "chunked applied more than once", true);
            }
            return reject(501,
                          "transfer coding '" + std::string(codings.front()) +
                              "' is not implemented (only chunked)",
                          true);
        }
    }
    // RFC 9112 §3.2: HTTP/1.1 needs exactly one Host.
    const std::vector<std::string_view> hosts = head.values("host");
    if (head.version >= 11 && hosts.empty()) return reject(400, "missing Host header", false);
    if (hosts.size() > 1) return reject(400, "more than one Host header", false);
    // RFC 9110 §10.1.1: 100-continue is the one expectation; HTTP/1.0 ignores Expect.
    bool expects_continue = false;
    if (head.version >= 11) {
        const std::vector<std::string_view> expects = head.values("expect");
        if (!expects.empty()) {
            if (expects.size() != 1 || !iequals(trim(expects[0]), "100-continue")) {
                return reject(417, "only Expect: 100-continue is supported", true);
            }
            expects_continue = true;
            v.send_continue = has_body;
        }
    }
    // A refused body is dropped before the reply only when the client is sending it:
    // one waiting for 100 Continue gets the final status at once.
    const auto droppable = [&]() -> uint64_t {
        const uint64_t len = head.content_length.value_or(0);
        return expects_continue || len > kDropLimitBytes ? 0 : len;
    };

    const bool is_api = path.rfind("/v1/", 0) == 0 || route.kind == RouteKind::kEngineRpc ||
                        route.kind == RouteKind::kSwaStates || route.kind == RouteKind::kSwaLookup;
    const bool need_key = policy.api_keys != nullptr && !policy.api_keys->empty();
    const ApiKey* key = need_key ? authorized_key(head, *policy.api_keys) : nullptr;
    if (key != nullptr) v.key_salt = key->cache_salt;
    if (is_api && need_key && key == nullptr) {
        if ((route.kind == RouteKind::kGenerate || route.kind == RouteKind::kEngineRpc) &&
            head.method == "POST") {
            v.drop_body_bytes = droppable();
        }
        return reject(401, "invalid or missing API key", true);
    }
    if (route.kind == RouteKind::kNone) return reject(404, "no route for " + path, false);
    if (head.method != route.method) {
        reject(405, std::string("use ") + route.method + " for " + path, false);
        v.headers.emplace_back("Allow", route.method);
        return v;
    }
    if (route.kind != RouteKind::kGenerate && route.kind != RouteKind::kEngineRpc) {
        // GET routes take no body: refused from the head, never read.
        if (has_body) return reject(413, path + " takes no request body", true);
        return v;
    }
    if (policy.draining) return reject(503, "server is shutting down", true);
    const auto max_body = static_cast<uint64_t>(policy.max_body_bytes);
    if (head.content_length && *head.content_length > max_body) {
        v.drop_body_bytes = droppable();
        return reject(
            413, "request body is over the limit of " + std::to_string(max_body) + " bytes", true);
    }
    v.body_limit_bytes = max_body;
    return v;
}

bool BodyBudget::try_reserve(int64_t bytes) {
    if (bytes <= 0) return true;
    if (reserved_bytes_.fetch_add(bytes) + bytes > capacity_bytes_) {
        reserved_bytes_.fetch_sub(bytes);
        return false;
    }
    return true;
}

void BodyBudget::release(int64_t bytes) {
    if (bytes > 0) reserved_bytes_.fetch_sub(bytes);
}

}  // namespace dsi::server
