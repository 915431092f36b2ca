#include "grammar/internal/compile_wire.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace dsi::grammar::internal {

std::string wire_u32(uint32_t v) {
    std::string s(4, '\0');
    for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
    return s;
}

uint32_t wire_read_u32(const char* p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(p[i])} << (8 * i);
    return v;
}

void set_io_timeout(int fd, int64_t timeout_ms) {
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout_ms / 1000);
    tv.tv_usec = static_cast<suseconds_t>((timeout_ms % 1000) * 1000);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

namespace {
Status io_error(const char* what) {
    int e = errno;
    if (e == EAGAIN || e == EWOULDBLOCK) return deadline_exceeded(std::string(what) + ": timed out");
    return unavailable(std::string(what) + ": " + std::strerror(e));
}
}  // namespace

Status send_all(int fd, std::string_view bytes) {
    while (!bytes.empty()) {
        ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return io_error("send");
        }
        bytes.remove_prefix(static_cast<size_t>(n));
    }
    return Status::ok();
}

Status recv_exact(int fd, size_t n, std::string* out) {
    out->resize(n);
    size_t got = 0;
    while (got < n) {
        ssize_t r = ::recv(fd, out->data() + got, n - got, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            return io_error("recv");
        }
        if (r == 0) return unavailable("connection closed after " + std::to_string(got) + " of " +
                                       std::to_string(n) + " bytes");
        got += static_cast<size_t>(r);
    }
    return Status::ok();
}

Result<GrammarKind> parse_grammar_kind(std::string_view name) {
    if (name == "json_schema") return GrammarKind::kJsonSchema;
    if (name == "json_object") return GrammarKind::kJsonObject;
    if (name == "regex") return GrammarKind::kRegex;
    if (name == "ebnf" || name == "gbnf") return GrammarKind::kEbnf;
    return invalid_argument("unknown grammar kind '" + std::string(name) +
                            "' (json_schema, json_object, regex, gbnf)");
}

std::string fingerprint_hex(uint64_t fingerprint) {
    char buf[17];
    std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(fingerprint));
    return buf;
}

Result<WireAddress> parse_wire_address(std::string_view address) {
    std::string_view a = address;
    if (a.substr(0, 6) == "tcp://") a.remove_prefix(6);
    size_t colon = a.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == a.size()) {
        return invalid_argument("compile server address '" + std::string(address) + "': want HOST:PORT");
    }
    WireAddress out;
    out.host = std::string(a.substr(0, colon));
    if (out.host == "localhost") out.host = "127.0.0.1";
    std::string port(a.substr(colon + 1));
    if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 ||
        std::stoul(port) > 65535) {
        return invalid_argument("compile server address '" + std::string(address) + "': bad port");
    }
    out.port = static_cast<uint16_t>(std::stoul(port));
    return out;
}

}  // namespace dsi::grammar::internal
