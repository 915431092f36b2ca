// http_rules.h: head checks (RFC 9112/9110 framing, Host, Expect, routes and body
// limits), auth, the body budget. answer_offline (the sessions' request path on bytes)
// is tested in server_test.cc, which has a tokenizer.
#include "server/http_rules.h"

#include <gtest/gtest.h>

namespace dsi::server {
namespace {

RequestHead head(std::string method, std::string target,
                 std::vector<std::pair<std::string, std::string>> fields, int version = 11) {
    RequestHead h;
    h.method = std::move(method);
    h.target = std::move(target);
    h.version = version;
    h.fields = std::move(fields);
    for (const auto& [k, v] : h.fields) {
        if (k == "Content-Length") h.content_length = std::stoull(v);
        if (k == "Transfer-Encoding" && v.size() >= 7 && v.substr(v.size() - 7) == "chunked") {
            h.chunked = true;
        }
    }
    return h;
}

HeadPolicy policy() {
    HeadPolicy p;
    p.max_body_bytes = 1000;
    return p;
}

TEST(HttpRules, ConstantTimeEquals) {
    EXPECT_TRUE(constant_time_equals("sekrit", "sekrit"));
    EXPECT_FALSE(constant_time_equals("sekri", "sekrit"));
    EXPECT_FALSE(constant_time_equals("sekritt", "sekrit"));
    EXPECT_FALSE(constant_time_equals("sekriT", "sekrit"));
    EXPECT_FALSE(constant_time_equals("", "sekrit"));
    EXPECT_FALSE(constant_time_equals("sekritsekrit", "sekrit"));  // the key cycled
    EXPECT_TRUE(constant_time_equals("", ""));
    EXPECT_FALSE(constant_time_equals("x", ""));
}

TEST(HttpRules, AuthSchemeIsCaseInsensitive) {
    const auto with = [](std::string name, std::string value) {
        return head("GET", "/v1/models", {{"Host", "x"}, {std::move(name), std::move(value)}});
    };
    const std::vector<ApiKey> keys = {{"k1", ""}, {"k2", "tenant2"}};
    const auto key_of = [&](const RequestHead& h) -> std::string {
        const ApiKey* k = authorized_key(h, keys);
        return k == nullptr ? "none" : k->key;
    };
    EXPECT_EQ(key_of(with("Authorization", "Bearer k1")), "k1");
    EXPECT_EQ(key_of(with("authorization", "bearer k1")), "k1");
    EXPECT_EQ(key_of(with("Authorization", "BEARER   k2 ")), "k2");
    EXPECT_EQ(key_of(with("X-Api-Key", "k2")), "k2");
    EXPECT_EQ(key_of(with("Authorization", "Basic k1")), "none");
    EXPECT_EQ(key_of(with("Authorization", "Bearer k3")), "none");
    EXPECT_EQ(key_of(with("Authorization", "Bearerk1")), "none");
    EXPECT_EQ(key_of(with("x-api-key", "k")), "none");
    HeadPolicy p = policy();
    p.api_keys = &keys;
    EXPECT_EQ(check_head(with("Authorization", "bearer wrong"), p).status, 401);
    HeadVerdict v = check_head(with("Authorization", "bearer k2"), p);
    EXPECT_EQ(v.status, 0);
    EXPECT_EQ(v.key_salt, "tenant2");  // the key's cache salt goes with the request
    // /health stays open; no keys configured: everything is.
    EXPECT_EQ(check_head(head("GET", "/health", {{"Host", "x"}}), p).status, 0);
    EXPECT_EQ(check_head(with("x-api-key", "anything"), policy()).status, 0);
}

TEST(HttpRules, TransferEncoding) {
    // A coding we do not decode: 501 (RFC 9112 §6.1), connection closed.
    HeadVerdict v = check_head(head("POST", "/v1/chat/completions",
                                    {{"Host", "x"}, {"Transfer-Encoding", "gzip, chunked"}}),
                               policy());
    EXPECT_EQ(v.status, 501);
    EXPECT_TRUE(v.close);
    v = check_head(
        head("POST", "/v1/chat/completions",
             {{"Host", "x"}, {"Transfer-Encoding", "gzip"}, {"Transfer-Encoding", "chunked"}}),
        policy());
    EXPECT_EQ(v.status, 501);
    // chunked not last: the length is unknown, 400 (RFC 9112 §6.3).
    v = check_head(head("POST", "/v1/chat/completions",
                        {{"Host", "x"}, {"Transfer-Encoding", "chunked, gzip"}}),
                   policy());
    EXPECT_EQ(v.status, 400);
    EXPECT_TRUE(v.close);
    v = check_head(head("POST", "/v1/chat/completions",
                        {{"Host", "x"}, {"Transfer-Encoding", "chunked, chunked"}}),
                   policy());
    EXPECT_EQ(v.status, 400);
    // HTTP/1.0 with Transfer-Encoding: faulty framing.
    v = check_head(head("POST", "/v1/chat/completions", {{"Transfer-Encoding", "chunked"}}, 10),
                   policy());
    EXPECT_EQ(v.status, 400);
    EXPECT_TRUE(v.close);
    v = check_head(
        head("POST", "/v1/chat/completions", {{"Host", "x"}, {"Transfer-Encoding", "Chunked"}}),
        policy());
    EXPECT_EQ(v.status, 0);
    EXPECT_EQ(v.body_limit_bytes, 1000u);
}

TEST(HttpRules, HostVersionExpect) {
    EXPECT_EQ(check_head(head("GET", "/health", {}), policy()).status, 400);
    EXPECT_EQ(check_head(head("GET", "/health", {}, 10), policy()).status, 0);
    EXPECT_EQ(check_head(head("GET", "/health", {{"Host", "a"}, {"host", "b"}}), policy()).status,
              400);
    EXPECT_EQ(check_head(head("GET", "/health", {{"Host", "a"}}, 20), policy()).status, 505);
    HeadVerdict v =
        check_head(head("POST", "/v1/completions",
                        {{"Host", "x"}, {"Expect", "100-Continue"}, {"Content-Length", "10"}}),
                   policy());
    EXPECT_EQ(v.status, 0);
    EXPECT_TRUE(v.send_continue);
    v = check_head(head("POST", "/v1/completions",
                        {{"Host", "x"}, {"Expect", "fly"}, {"Content-Length", "10"}}),
                   policy());
    EXPECT_EQ(v.status, 417);
    EXPECT_TRUE(v.close);
    // HTTP/1.0 ignores Expect.
    v = check_head(
        head("POST", "/v1/completions", {{"Expect", "fly"}, {"Content-Length", "10"}}, 10),
        policy());
    EXPECT_EQ(v.status, 0);
    EXPECT_FALSE(v.send_continue);
}

TEST(HttpRules, RoutesAndBodyLimits) {
    const std::pair<std::string, std::string> host{"Host", "x"};
    // GET routes and unknown routes take no body: refused from the head, never read.
    HeadVerdict v =
        check_head(head("GET", "/health", {host, {"Content-Length", "67108864"}}), policy());
    EXPECT_EQ(v.status, 413);
    EXPECT_TRUE(v.close);
    EXPECT_EQ(v.drop_body_bytes, 0u);
    v = check_head(head("POST", "/nothing", {host, {"Content-Length", "67108864"}}), policy());
    EXPECT_EQ(v.status, 404);
    EXPECT_TRUE(v.close);
    EXPECT_EQ(v.drop_body_bytes, 0u);
    v = check_head(head("GET", "/nothing", {host}), policy());
    EXPECT_EQ(v.status, 404);
    EXPECT_FALSE(v.close);  // no body: the connection stays usable
    v = check_head(head("GET", "/v1/chat/completions", {host}), policy());
    EXPECT_EQ(v.status, 405);
    ASSERT_EQ(v.headers.size(), 1u);
    EXPECT_EQ(v.headers[0].second, "POST");
    EXPECT_EQ(check_head(head("POST", "/health", {host}), policy()).status, 405);
    // An oversized POST body: dropped (not stored) before the 413 up to 64 MiB.
    v = check_head(head("POST", "/v1/messages", {host, {"Content-Length", "5000"}}), policy());
    EXPECT_EQ(v.status, 413);
    EXPECT_EQ(v.drop_body_bytes, 5000u);
    EXPECT_EQ(v.endpoint, Endpoint::kMessages);
    v = check_head(head("POST", "/v1/messages", {host, {"Content-Length", "100000000"}}), policy());
    EXPECT_EQ(v.status, 413);
    EXPECT_EQ(v.drop_body_bytes, 0u);
    v = check_head(head("POST", "/v1/messages?x=1", {host, {"Content-Length", "1000"}}), policy());
    EXPECT_EQ(v.status, 0);
    EXPECT_EQ(v.route, RouteKind::kGenerate);
    HeadPolicy draining = policy();
    draining.draining = true;
    EXPECT_EQ(check_head(head("POST", "/v1/messages", {host}), draining).status, 503);
}

TEST(HttpRules, BodyBudget) {
    BodyBudget b(100);
    EXPECT_TRUE(b.try_reserve(60));
    EXPECT_FALSE(b.try_reserve(41));
    EXPECT_TRUE(b.try_reserve(40));
    EXPECT_EQ(b.reserved_bytes(), 100);
    b.release(60);
    EXPECT_TRUE(b.try_reserve(50));
    EXPECT_EQ(b.reserved_bytes(), 90);
}

}  // namespace
}  // namespace dsi::server
