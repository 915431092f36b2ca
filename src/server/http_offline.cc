// answer_offline and the parser helpers the sessions share (internal/http_parse.h).
// Beast's HTTP parser only; sockets live in http_server.cc.
#include <boost/asio/buffer.hpp>
#include <limits>
#include <string>
#include <vector>

#include "server/http_rules.h"
#include "server/internal/http_parse.h"

namespace dsi::server {

namespace beast = boost::beast;
namespace http = beast::http;

namespace internal {

void start_parser(RequestParser& p) {
    p.header_limit(kHeaderLimitBytes);
    // Beast 1.74: body_limit(boost::none) would refuse every Content-Length body.
    p.body_limit(std::numeric_limits<uint64_t>::max());
    p.eager(false);
}

void start_body(RequestParser& p, const HeadVerdict& v) {
    p.body_limit(v.body_limit_bytes);
    p.eager(true);
}

RequestHead head_of(const RequestParser& p) {
    const auto& req = p.get();
    RequestHead h;
    h.method = std::string(req.method_string());
    h.target = std::string(req.target());
    h.version = static_cast<int>(req.version());
    for (const auto& f : req) {
        h.fields.emplace_back(std::string(f.name_string()), std::string(f.value()));
    }
    if (const auto len = p.content_length()) h.content_length = *len;
    h.chunked = p.chunked();
    return h;
}

HeadVerdict parse_error_verdict(const beast::error_code& ec, const HeadVerdict& head) {
    HeadVerdict v;
    v.endpoint = head.endpoint;
    v.metric_name = head.metric_name.empty() ? "other" : head.metric_name;
    v.close = true;
    if (ec == http::error::header_limit) {
        v.status = 431;
        v.message =
            "request header fields are over " + std::to_string(kHeaderLimitBytes) + " bytes";
    } else if (ec == http::error::body_limit) {
        v.status = 413;
        v.message =
            "request body is over the limit of " + std::to_string(head.body_limit_bytes) + " bytes";
    } else {
        v.status = 400;
        v.message = "malformed HTTP request: " + ec.message();
    }
    return v;
}

}  // namespace internal

std::vector<int> answer_offline(const ApiContext& ctx, const std::vector<ApiKey>& api_keys,
                                std::string_view input) {
    using internal::RequestParser;
    std::vector<int> statuses;
    HeadPolicy policy;
    policy.api_keys = &api_keys;
    policy.max_body_bytes = ctx.limits.max_body_bytes;
    policy.retry_after_s = ctx.limits.retry_after_s;
    auto put = [&input](RequestParser& p, beast::error_code& ec) {
        const size_t n = p.put(boost::asio::buffer(input.data(), input.size()), ec);
        input.remove_prefix(n);
    };
    while (!input.empty()) {
        RequestParser parser;
        internal::start_parser(parser);
        beast::error_code ec;
        put(parser, ec);
        if (ec == http::error::need_more) break;  // EOF inside a head: closed, no reply
        if (ec) {
            statuses.push_back(internal::parse_error_verdict(ec, HeadVerdict{}).status);
            break;
        }
        const RequestHead head = internal::head_of(parser);
        const HeadVerdict verdict = check_head(head, policy);
        if (verdict.status != 0) {
            statuses.push_back(verdict.status);
            if (verdict.close) break;
            continue;
        }
        if (!parser.is_done()) {
            internal::start_body(parser, verdict);
            put(parser, ec);
            if (ec && ec != http::error::need_more) {
                statuses.push_back(internal::parse_error_verdict(ec, verdict).status);
                break;
            }
            if (!parser.is_done()) break;  // EOF inside a body
        }
        if (verdict.route == RouteKind::kGenerate) {
            Result<Prepared> prepared =
                prepare_request(ctx, *verdict.endpoint, parser.get().body(), /*seed=*/1,
                                verdict.key_salt);
            statuses.push_back(prepared.is_ok()
                                   ? 200
                                   : error_reply(*verdict.endpoint, prepared.status()).status);
        } else {
            statuses.push_back(200);
        }
        if (!parser.get().keep_alive()) break;
    }
    return statuses;
}

}  // namespace dsi::server
