#include "grammar/remote_compiler.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "grammar/internal/compile_wire.h"

namespace dsi::grammar {

namespace {

// Largest reply accepted: far above any grammar within Limits.
constexpr uint32_t kMaxReplyBytes = uint32_t{1} << 30;

// A connected socket, or UNAVAILABLE within `timeout_ms`.
Result<int> connect_with_timeout(const std::string& host, uint16_t port, int64_t timeout_ms) {
    std::string where = "compile server " + host + ":" + std::to_string(port);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
        return invalid_argument(where + ": not an IPv4 address");
    }
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return unavailable(where + ": socket: " + std::strerror(errno));
    int r = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    if (r != 0 && errno != EINPROGRESS) {
        Status s = unavailable(where + " unreachable: " + std::strerror(errno));
        ::close(fd);
        return s;
    }
    if (r != 0) {
        pollfd p{fd, POLLOUT, 0};
        int pr = ::poll(&p, 1, static_cast<int>(timeout_ms));
        int err = 0;
        socklen_t len = sizeof(err);
        if (pr <= 0) {
            ::close(fd);
            return unavailable(where + " unreachable: connect timed out after " + std::to_string(timeout_ms) +
                               " ms");
        }
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
            ::close(fd);
            return unavailable(where + " unreachable: " + std::strerror(err));
        }
    }
    int flags = fcntl(fd, F_GETFL, 0);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    return fd;
}

}  // namespace

Result<std::unique_ptr<RemoteCompiler>> RemoteCompiler::create(RemoteCompilerOptions options,
                                                               std::shared_ptr<const Vocabulary> vocab,
                                                               Env* env) {
    DSI_CHECK(vocab != nullptr);
    DSI_ASSIGN_OR_RETURN(internal::WireAddress a, internal::parse_wire_address(options.address));
    std::unique_ptr<RemoteCompiler> c(new RemoteCompiler());
    c->options_ = std::move(options);
    c->host_ = a.host;
    c->port_ = a.port;
    c->fingerprint_ = vocab->fingerprint();
    CompileServiceOptions local = c->options_.local;
    RemoteCompiler* self = c.get();
    local.compile = [self](const GrammarSpec& spec) -> Result<Grammar> {
        DSI_ASSIGN_OR_RETURN(std::string bytes, self->compile_serialized(spec));
        return Grammar::deserialize(bytes);
    };
    c->service_ = std::make_unique<CompileService>(std::move(local), env);
    return c;
}

Result<std::unique_ptr<CompileHandle>> RemoteCompiler::submit(const GrammarSpec& spec,
                                                              std::shared_ptr<const Vocabulary> vocab,
                                                              int64_t deadline_ns, CompileCallback callback) {
    DSI_CHECK(vocab != nullptr);
    if (vocab->fingerprint() != fingerprint_) {
        return invalid_argument("remote compiler: vocabulary fingerprint " +
                                internal::fingerprint_hex(vocab->fingerprint()) + " is not the one it was created for (" +
                                internal::fingerprint_hex(fingerprint_) + ")");
    }
    return service_->submit(spec, std::move(vocab), deadline_ns, std::move(callback));
}

Result<std::string> RemoteCompiler::compile_serialized(const GrammarSpec& spec) const {
    nlohmann::json req = {{"kind", grammar_kind_name(spec.kind)},
                          {"text", spec.text},
                          {"vocab_fingerprint", internal::fingerprint_hex(fingerprint_)}};
    if (spec.flexible_whitespace) req["flexible_whitespace"] = true;
    if (spec.any_property_order) req["any_property_order"] = true;
    std::string body = req.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::string where = "compile server " + options_.address;
    DSI_ASSIGN_OR_RETURN(int fd, connect_with_timeout(host_, port_, options_.connect_timeout_ms));
    internal::set_io_timeout(fd, options_.io_timeout_ms);
    std::string frame = std::string(internal::kWireMagic) + internal::wire_u32(static_cast<uint32_t>(body.size()));
    frame += body;
    // A send error is not final: the server may have answered early (request too
    // large, busy) and stopped reading; its reply is still there to read.
    Status sent = internal::send_all(fd, frame);
    std::string header, reply;
    Status got = internal::recv_exact(fd, 4, &header);
    if (got.is_ok()) {
        uint32_t n = internal::wire_read_u32(header.data());
        if (n == 0 || n > kMaxReplyBytes) {
            ::close(fd);
            return data_loss(where + ": bad reply length " + std::to_string(n));
        }
        got = internal::recv_exact(fd, n, &reply);
    }
    ::close(fd);
    if (!got.is_ok()) {
        const Status& s = sent.is_ok() ? got : sent;
        return Status(s.code() == StatusCode::kDeadlineExceeded ? StatusCode::kDeadlineExceeded
                                                                 : StatusCode::kUnavailable,
                      where + ": " + s.message());
    }
    auto code = static_cast<StatusCode>(static_cast<uint8_t>(reply[0]));
    if (code > StatusCode::kDataLoss) return data_loss(where + ": bad status code in reply");
    if (code != StatusCode::kOk) return Status(code, reply.substr(1));
    return reply.substr(1);
}

}  // namespace dsi::grammar
