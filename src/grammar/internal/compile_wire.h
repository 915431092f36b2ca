// Wire format of the compile server (compile_server.h) and its client
// (remote_compiler.h), over a plain TCP socket (POSIX), one request per connection:
//
//   request : "DSCG" | u32 LE body length | body = JSON
//             {"kind": "json_schema"|"json_object"|"regex"|"ebnf"|"gbnf",
//              "text": "...", "vocab_fingerprint": "<16 hex digits>"}
//   reply   : u32 LE body length | body = 1 byte StatusCode | payload
//             payload = Grammar::serialize() bytes when the code is OK, else the
//             error message (the same code and message as a local compile).
//
// Thread model: free functions on a caller-owned fd.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"
#include "grammar/compile_service.h"

namespace dsi::grammar::internal {

inline constexpr std::string_view kWireMagic = "DSCG";
inline constexpr size_t kRequestHeaderBytes = 8;  // magic + length

std::string wire_u32(uint32_t v);
uint32_t wire_read_u32(const char* p);

// SO_RCVTIMEO / SO_SNDTIMEO: every blocking read / write is bounded.
void set_io_timeout(int fd, int64_t timeout_ms);
// UNAVAILABLE on a closed or broken connection, DEADLINE_EXCEEDED on a timeout.
Status send_all(int fd, std::string_view bytes);
Status recv_exact(int fd, size_t n, std::string* out);

Result<GrammarKind> parse_grammar_kind(std::string_view name);
std::string fingerprint_hex(uint64_t fingerprint);

// "HOST:PORT" (HOST an IPv4 literal or "localhost"; an optional "tcp://" prefix).
struct WireAddress {
    std::string host;
    uint16_t port = 0;
};
Result<WireAddress> parse_wire_address(std::string_view address);

}  // namespace dsi::grammar::internal
