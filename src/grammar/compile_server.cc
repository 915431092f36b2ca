#include "grammar/compile_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "grammar/internal/compile_wire.h"

namespace dsi::grammar {

using internal::kRequestHeaderBytes;
using internal::kWireMagic;

namespace {

std::string reply_frame(const Status& s, std::string_view payload) {
    std::string body(1, static_cast<char>(s.code()));
    body += s.is_ok() ? payload : std::string_view(s.message());
    return internal::wire_u32(static_cast<uint32_t>(body.size())) + body;
}

// After an early reply: stop writing, read (and drop) what the client is still
// sending, bounded, so closing does not reset the connection before it reads.
void drain_and_close(int fd, size_t max_bytes) {
    ::shutdown(fd, SHUT_WR);
    char buf[16384];
    size_t total = 0;
    while (total < max_bytes) {
        ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        total += static_cast<size_t>(n);
    }
    ::close(fd);
}

}  // namespace

CompileServer::CompileServer(CompileServerOptions options, std::shared_ptr<const Vocabulary> vocab,
                             Env* env)
    : options_(std::move(options)), vocab_(std::move(vocab)), env_(env) {
    service_ = std::make_unique<CompileService>(options_.service, env_);
}

Result<std::unique_ptr<CompileServer>> CompileServer::start(CompileServerOptions options,
                                                            std::shared_ptr<const Vocabulary> vocab,
                                                            Env* env) {
    DSI_CHECK(vocab != nullptr);
    std::unique_ptr<CompileServer> s(new CompileServer(std::move(options), std::move(vocab), env));
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return unavailable(std::string("compile server: socket: ") + std::strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(s->options_.port);
    if (inet_pton(AF_INET, s->options_.host.c_str(), &addr.sin_addr) != 1) {
        ::close(fd);
        return invalid_argument("compile server: host '" + s->options_.host + "' is not an IPv4 address");
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 128) != 0) {
        Status st = unavailable("compile server: bind/listen " + s->options_.host + ":" +
                                std::to_string(s->options_.port) + ": " + std::strerror(errno));
        ::close(fd);
        return st;
    }
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    s->listen_fd_ = fd;
    s->port_ = ntohs(addr.sin_port);
    s->accept_thread_ = std::thread([p = s.get()] { p->accept_loop(); });
    return s;
}

CompileServer::~CompileServer() { stop(); }

std::string CompileServer::address() const { return options_.host + ":" + std::to_string(port_); }

void CompileServer::stop() {
    if (stopping_.exchange(true)) {
        return;
    }
    if (accept_thread_.joinable()) accept_thread_.join();
    if (listen_fd_ >= 0) ::close(listen_fd_);
    listen_fd_ = -1;
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return active_ == 0; });
}

void CompileServer::accept_loop() {
    while (!stopping_.load()) {
        pollfd p{listen_fd_, POLLIN, 0};
        int r = ::poll(&p, 1, 100);  // wakes to notice stop()
        if (r <= 0) continue;
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) continue;
        bool over_limit = false;
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (active_ >= 4 * options_.max_connections) {
                ::close(fd);
                continue;
            }
            over_limit = active_ >= options_.max_connections;
            ++active_;
        }
        std::thread([this, fd, over_limit] {
            serve_connection(fd, over_limit);
            std::lock_guard<std::mutex> lock(mu_);
            --active_;
            idle_cv_.notify_all();
        }).detach();
    }
}

void CompileServer::serve_connection(int fd, bool over_limit) {
    internal::set_io_timeout(fd, options_.io_timeout_ms);
    if (over_limit) {
        (void)internal::send_all(fd, reply_frame(resource_exhausted(
            "compile server busy: " + std::to_string(options_.max_connections) +
            " requests in flight"), ""));
        drain_and_close(fd, options_.max_request_bytes);
        return;
    }
    std::string header;
    if (!internal::recv_exact(fd, kRequestHeaderBytes, &header).is_ok()) {
        ::close(fd);
        return;
    }
    if (std::string_view(header).substr(0, 4) != kWireMagic) {
        (void)internal::send_all(fd, reply_frame(invalid_argument("not a compile-server request"), ""));
        drain_and_close(fd, options_.max_request_bytes);
        return;
    }
    uint32_t body_bytes = internal::wire_read_u32(header.data() + 4);
    if (body_bytes > options_.max_request_bytes) {
        (void)internal::send_all(
            fd, reply_frame(resource_exhausted("compile request of " + std::to_string(body_bytes) +
                                               " bytes exceeds the limit of " +
                                               std::to_string(options_.max_request_bytes) + " bytes"),
                            ""));
        drain_and_close(fd, body_bytes);
        return;
    }
    std::string body;
    if (!internal::recv_exact(fd, body_bytes, &body).is_ok()) {
        ::close(fd);
        return;
    }
    (void)internal::send_all(fd, handle_request(body));
    ::close(fd);
}

std::string CompileServer::handle_request(const std::string& body) {
    using json = nlohmann::json;
    json req = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (req.is_discarded() || !req.is_object()) {
        return reply_frame(invalid_argument("compile request is not a JSON object"), "");
    }
    for (const char* k : {"kind", "vocab_fingerprint"}) {
        if (!req.contains(k) || !req[k].is_string()) {
            return reply_frame(invalid_argument(std::string("compile request: '") + k + "' must be a string"), "");
        }
    }
    if (req.contains("text") && !req["text"].is_string()) {
        return reply_frame(invalid_argument("compile request: 'text' must be a string"), "");
    }
    for (const char* k : {"flexible_whitespace", "any_property_order"}) {
        if (req.contains(k) && !req[k].is_boolean()) {
            return reply_frame(
                invalid_argument(std::string("compile request: '") + k + "' must be a boolean"),
                "");
        }
    }
    Result<GrammarKind> kind = internal::parse_grammar_kind(req["kind"].get<std::string>());
    if (!kind.is_ok()) return reply_frame(kind.status(), "");
    std::string want = internal::fingerprint_hex(vocab_->fingerprint());
    if (req["vocab_fingerprint"].get<std::string>() != want) {
        return reply_frame(failed_precondition("tokenizer fingerprint " + req["vocab_fingerprint"].get<std::string>() +
                                               " does not match the compile server's " + want +
                                               " (start it with the same tokenizer)"),
                           "");
    }
    GrammarSpec spec{*kind, req.value("text", std::string())};
    spec.flexible_whitespace = req.value("flexible_whitespace", false);
    spec.any_property_order = req.value("any_property_order", false);
    int64_t timeout_ns = options_.compile_timeout_ms * 1000000;
    auto handle = service_->submit(spec, vocab_, env_->now_ns() + timeout_ns);
    if (!handle.is_ok()) return reply_frame(handle.status(), "");
    CompileResult r = (*handle)->wait_for(timeout_ns);
    if (!r.is_ok()) {
        if (r.status().code() == StatusCode::kUnavailable) {
            return reply_frame(deadline_exceeded("compile not done within " +
                                                 std::to_string(options_.compile_timeout_ms) + " ms"),
                               "");
        }
        return reply_frame(r.status(), "");
    }
    return reply_frame(Status::ok(), (*r)->grammar().serialize());
}

}  // namespace dsi::grammar
