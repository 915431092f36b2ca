// The request parser settings and conversions shared by the sessions
// (http_server.cc) and answer_offline (http_offline.cc), so both parse alike. Beast's
// HTTP parser only (no Asio): included by those two translation units alone.
#pragma once

#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "server/http_rules.h"

namespace dsi::server::internal {

using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

// The head alone first (eager off) with no body limit, so check_head sees an
// oversized Content-Length before any body byte; header_limit kHeaderLimitBytes.
void start_parser(RequestParser& p);
// After check_head accepted the head: the body within the route's limit.
void start_body(RequestParser& p, const HeadVerdict& v);
// REQUIRES: p.is_header_done().
RequestHead head_of(const RequestParser& p);
// A request the parser refused: 431 for an oversized head, 413 for a chunked body
// over the route's limit (`head`: the verdict of the head, if it was parsed), 400 for
// any other framing error; the connection then ends.
HeadVerdict parse_error_verdict(const boost::beast::error_code& ec, const HeadVerdict& head);

}  // namespace dsi::server::internal
