// The only translation unit that includes Beast/Asio. Exceptions: Asio calls use
// error_code overloads; run() catches what Asio may still throw (adapter rule,
// STYLE 2) and turns it into a Status.
#include "server/http_server.h"

#include <atomic>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <csignal>
#include <deque>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "base/env.h"
#include "base/logging.h"

namespace dsi::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {
constexpr size_t kHeaderLimitBytes = 16 * 1024;
// An oversized body up to this size is read and dropped before the 413.
constexpr uint64_t kDiscardLimitBytes = uint64_t{64} << 20;
// After a 413 (or another reply that leaves input unread): bytes drained before closing.
constexpr uint64_t kLingerLimitBytes = uint64_t{4} << 20;
constexpr auto kDrainPoll = std::chrono::milliseconds(20);
constexpr auto kAbortWait = std::chrono::seconds(5);

double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

struct HttpServer::Impl {
    const ApiContext* ctx = nullptr;
    EngineService* service = nullptr;
    Metrics* metrics = nullptr;
    ServerOptions options;
    asio::io_context ioc;
    tcp::acceptor acceptor{ioc};
    asio::signal_set signals{ioc};
    asio::steady_timer drain_timer{ioc};
    std::atomic<int> port{0};
    std::atomic<bool> draining{false};
    std::atomic<int64_t> in_flight{0};       // generations holding a concurrency slot
    std::atomic<int64_t> open_responses{0};  // generations whose reply is not yet written
    std::atomic<uint64_t> next_ticket{1};
    Clock::time_point drain_deadline;
    bool aborted_all = false;

    void accept();
    void start_drain();
    void drain_tick();
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
public:
    Session(tcp::socket socket, HttpServer::Impl* server)
        : stream_(std::move(socket)), server_(server) {}

    void start() {
        asio::dispatch(stream_.get_executor(),
                       [self = shared_from_this()] { self->read_header(); });
    }

private:
    using Response = http::response<http::string_body>;

    const ApiContext& ctx() const { return *server_->ctx; }

    void read_header() {
        parser_.emplace();
        parser_->header_limit(kHeaderLimitBytes);
        // Beast checks Content-Length against this while parsing the header; the
        // server's own limit is applied in on_header (so an oversized body gets a 413).
        parser_->body_limit(kDiscardLimitBytes);
        const int64_t ms =
            num_requests_ == 0 ? ctx().limits.header_timeout_ms : ctx().limits.idle_timeout_ms;
        stream_.expires_after(std::chrono::milliseconds(ms));
        http::async_read_header(
            stream_, buffer_, *parser_,
            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
    }

    void on_header(beast::error_code ec) {
        if (ec == http::error::body_limit) {
            std::string target(parser_->get().target());
            endpoint_ = endpoint_for_path(target.substr(0, target.find('?')));
            return too_large();
        }
        if (ec) return close();  // timeout (slow loris), EOF, or a malformed header
        ++num_requests_;
        const auto& req = parser_->get();
        target_ = std::string(req.target());
        if (const size_t q = target_.find('?'); q != std::string::npos) target_.resize(q);
        endpoint_ = endpoint_for_path(target_);
        keep_alive_ = req.keep_alive();
        if (endpoint_ && req.method() == http::verb::post) {
            // A body over the limit fails this read with body_limit before buffering it.
            if (const auto len = parser_->content_length();
                len && *len > static_cast<uint64_t>(ctx().limits.max_body_bytes)) {
                if (*len > kDiscardLimitBytes) return too_large();
                // Read (and drop) a moderately large body first: clients such as
                // undici fail on a reply that arrives while they are still sending.
                stream_.expires_after(std::chrono::milliseconds(ctx().limits.body_timeout_ms));
                http::async_read(stream_, buffer_, *parser_,
                                 [self = shared_from_this()](beast::error_code e, size_t) {
                                     if (e) return self->close();
                                     self->parser_->get().body().clear();
                                     self->too_large();
                                 });
                return;
            }
            parser_->body_limit(static_cast<uint64_t>(ctx().limits.max_body_bytes));
            stream_.expires_after(std::chrono::milliseconds(ctx().limits.body_timeout_ms));
            http::async_read(
                stream_, buffer_, *parser_,
                [self = shared_from_this()](beast::error_code e, size_t) { self->on_body(e); });
            return;
        }
        if (!parser_->is_done()) {
            // Any other request with a body: read it (within the limit), then route.
            stream_.expires_after(std::chrono::milliseconds(ctx().limits.body_timeout_ms));
            http::async_read(stream_, buffer_, *parser_,
                             [self = shared_from_this()](beast::error_code e, size_t) {
                                 if (e) return self->close();
                                 self->route();
                             });
            return;
        }
        route();
    }

    void on_body(beast::error_code ec) {
        if (ec == http::error::body_limit) return too_large();
        if (ec) return close();
        route();
    }

    void too_large() {
        keep_alive_ = false;  // the unread body makes the connection unusable
        discard_input_ = true;
        const Endpoint e = endpoint_.value_or(Endpoint::kChatCompletions);
        reply(error_reply(e, 413,
                          "request body is over the limit of " +
                              std::to_string(ctx().limits.max_body_bytes) + " bytes"),
              std::string(endpoint_name(e)));
    }

    bool authorized() const {
        const std::string& key = server_->options.api_key;
        if (key.empty()) return true;
        const auto& req = parser_->get();
        if (auto it = req.find(http::field::authorization); it != req.end()) {
            if (it->value() == "Bearer " + key) return true;
        }
        if (auto it = req.find("x-api-key"); it != req.end()) {
            if (it->value() == key) return true;
        }
        return false;
    }

    void route() {
        const auto& req = parser_->get();
        const http::verb method = req.method();
        if (target_ == "/health" && method == http::verb::get) {
            return reply(HttpReply{200, "application/json", "{\"status\":\"ok\"}", {}}, "health");
        }
        if (target_ == "/ready" && method == http::verb::get) {
            const bool ready = !server_->draining.load();
            return reply(HttpReply{ready ? 200 : 503,
                                   "application/json",
                                   ready ? "{\"status\":\"ready\"}" : "{\"status\":\"draining\"}",
                                   {}},
                         "ready");
        }
        if (target_ == "/metrics" && method == http::verb::get) {
            std::string text =
                server_->metrics->render(server_->service->stats_snapshot(),
                                         server_->in_flight.load(), !server_->draining.load());
            return reply(HttpReply{200, "text/plain; version=0.0.4", std::move(text), {}},
                         "metrics");
        }
        const bool is_api = target_.rfind("/v1/", 0) == 0;
        const Endpoint shape = endpoint_.value_or(Endpoint::kChatCompletions);
        if (is_api && !authorized()) {
            return reply(error_reply(shape, 401, "invalid or missing API key"),
                         endpoint_ ? std::string(endpoint_name(shape)) : "other");
        }
        if (target_ == "/v1/models" && method == http::verb::get) {
            return reply(models_reply(ctx(), 0), "models");
        }
        if (!endpoint_) {
            return reply(error_reply(shape, 404, "no route for " + target_), "other");
        }
        if (method != http::verb::post) {
            HttpReply r = error_reply(shape, 405, "use POST for " + target_);
            r.headers.emplace_back("Allow", "POST");
            return reply(std::move(r), std::string(endpoint_name(shape)));
        }
        generate();
    }

    void generate() {
        const Endpoint e = *endpoint_;
        const std::string name(endpoint_name(e));
        if (server_->draining.load()) {
            return reply(error_reply(e, 503, "server is shutting down"), name);
        }
        const uint64_t ticket = server_->next_ticket.fetch_add(1);
        Result<Prepared> prepared =
            prepare_request(ctx(), e, parser_->get().body(), Env::default_env()->random_seed());
        if (!prepared.is_ok()) return reply(error_reply(e, prepared.status()), name);
        // Concurrency slot: held until the engine's final update.
        if (server_->in_flight.fetch_add(1) >= ctx().limits.max_concurrent) {
            server_->in_flight.fetch_sub(1);
            HttpReply r = error_reply(e, 429, "too many concurrent requests; retry later");
            r.headers.emplace_back("Retry-After", std::to_string(ctx().limits.retry_after_s));
            return reply(std::move(r), name);
        }
        parser_->get().body().clear();
        std::string id = (e == Endpoint::kMessages      ? "msg_"
                          : e == Endpoint::kResponses   ? "resp_"
                          : e == Endpoint::kCompletions ? "cmpl-"
                                                        : "chatcmpl-") +
                         std::to_string(ticket);
        const int64_t now_s = Env::default_env()->wall_ns() / 1000000000;
        stream_mode_ = prepared->stream;
        prompt_tokens_ = static_cast<int64_t>(prepared->request.prompt.size());
        renderer_ = std::make_unique<Renderer>(ctx(), *prepared, std::move(id), now_s);
        ticket_ = ticket;
        active_ = true;
        headers_sent_ = false;
        start_time_ = Clock::now();
        server_->open_responses.fetch_add(1);
        counted_open_ = true;
        last_token_time_ = start_time_;
        num_tokens_ = 0;
        auto executor = stream_.get_executor();
        server_->service->submit(
            ticket, std::move(prepared->request), [self = shared_from_this(), executor](Update u) {
                asio::post(executor,
                           [self, u = std::move(u)]() mutable { self->on_update(std::move(u)); });
            });
        // Watch the socket: EOF while generating means the client went away.
        stream_.expires_never();
        watch();
    }

    void watch() {
        if (watching_ || closed_) return;
        watching_ = true;
        stream_.async_read_some(
            buffer_.prepare(4096),
            [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_watch(ec, n); });
    }

    void on_watch(beast::error_code ec, size_t n) {
        watching_ = false;
        if (ec) {
            if (active_) disconnect();
            return close();
        }
        buffer_.commit(n);
        if (active_ || writing_) {
            // A pipelined next request: keep it buffered; stop watching if it grows.
            if (buffer_.size() < kHeaderLimitBytes) watch();
            return;
        }
        read_header();
    }

    void disconnect() {
        if (!active_ || disconnected_) return;
        disconnected_ = true;
        server_->metrics->on_disconnect();
        server_->service->abort(ticket_);
    }

    void on_update(Update u) {
        const bool final_update = u.finished;
        if (final_update) server_->in_flight.fetch_sub(1);
        if (!u.tokens.empty()) {
            const auto now = Clock::now();
            if (num_tokens_ == 0) {
                server_->metrics->on_first_token(seconds_since(start_time_));
            } else {
                server_->metrics->on_inter_token(
                    std::chrono::duration<double>(now - last_token_time_).count());
            }
            last_token_time_ = now;
            num_tokens_ += static_cast<int64_t>(u.tokens.size());
        }
        if (final_update) {
            active_ = false;
            server_->metrics->on_finish(seconds_since(start_time_), prompt_tokens_, num_tokens_);
        }
        if (disconnected_ || closed_) {
            if (final_update) close();
            return;
        }
        const std::string name(endpoint_name(*endpoint_));
        if (!u.error.is_ok() && !headers_sent_) {
            return reply(error_reply(*endpoint_, u.error), name);
        }
        if (!stream_mode_) {
            renderer_->on_update(u);
            if (final_update) reply(renderer_->reply(), name);
            return;
        }
        if (!headers_sent_) {
            headers_sent_ = true;
            server_->metrics->on_request(name, 200);
            // SSE body as HTTP/1.1 chunks, so the connection stays reusable.
            pending_ +=
                "HTTP/1.1 200 OK\r\nServer: dsinfer\r\nContent-Type: text/event-stream\r\n"
                "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
            pending_ +=
                keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
        }
        std::string sse = renderer_->on_update_sse(u);
        if (!u.error.is_ok()) {
            sse += "event: error\ndata: " + error_reply(*endpoint_, u.error).body + "\n\n";
        }
        if (!sse.empty()) append_chunk(sse);
        if (final_update) {
            pending_ += "0\r\n\r\n";
            response_done_ = true;
        }
        flush();
    }

    void append_chunk(const std::string& data) {
        char size[24];
        std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
        pending_ += size;
        pending_ += data;
        pending_ += "\r\n";
    }

    // Writes what is pending; one write in flight at a time.
    void flush() {
        if (writing_ || closed_) return;
        if (pending_.empty()) {
            if (response_done_) {
                response_done_ = false;
                after_response();
            }
            return;
        }
        writing_ = true;
        inflight_.swap(pending_);
        pending_.clear();
        asio::async_write(stream_, asio::buffer(inflight_),
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                              self->writing_ = false;
                              self->inflight_.clear();
                              if (ec) {
                                  self->disconnect();
                                  return self->close();
                              }
                              self->flush();
                          });
    }

    void reply(HttpReply r, const std::string& metric_name) {
        server_->metrics->on_request(metric_name, r.status);
        auto res = std::make_shared<Response>(static_cast<http::status>(r.status), 11);
        res->set(http::field::server, "dsinfer");
        res->set(http::field::content_type, r.content_type);
        for (const auto& [k, v] : r.headers) res->set(k, v);
        res->keep_alive(keep_alive_ && !server_->draining.load());
        res->body() = std::move(r.body);
        res->prepare_payload();
        // Serialise into pending_ so streaming and plain replies share one writer.
        std::ostringstream os;
        os << *res;
        pending_ += os.str();
        if (!res->keep_alive()) keep_alive_ = false;
        response_done_ = true;
        flush();
    }

    void release_open() {
        if (counted_open_) {
            counted_open_ = false;
            server_->open_responses.fetch_sub(1);
        }
    }

    void after_response() {
        release_open();
        if (discard_input_) return discard_then_close();
        if (!keep_alive_) {
            beast::error_code ec;
            stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
            return close();
        }
        if (watching_) {
            // The watch read becomes the wait for the next request.
            stream_.expires_after(std::chrono::milliseconds(ctx().limits.idle_timeout_ms));
            return;
        }
        read_header();
    }

    // After a 413 the client may still be sending its body: read and drop it for a
    // short while so closing does not reset the connection before the reply is read.
    void discard_then_close() {
        beast::error_code ec;
        if (discard_.empty()) {
            stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
            stream_.expires_after(std::chrono::seconds(2));
            discard_.resize(64 * 1024);
        }
        // Read (and drop) what the client is still sending for a short while, so it sees
        // the reply rather than a reset; at most 2 s and kLingerLimitBytes, then close:
        // an oversized body is never read in full.
        stream_.async_read_some(asio::buffer(discard_),
                                [self = shared_from_this()](beast::error_code e, size_t n) {
                                    self->discarded_bytes_ += n;
                                    if (e || self->discarded_bytes_ > kLingerLimitBytes) {
                                        return self->close();
                                    }
                                    self->discard_then_close();
                                });
    }

    void close() {
        release_open();
        if (closed_) return;
        closed_ = true;
        beast::error_code ec;
        stream_.socket().close(ec);
    }

    beast::tcp_stream stream_;
    HttpServer::Impl* server_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
    std::string target_;
    std::optional<Endpoint> endpoint_;
    bool keep_alive_ = true;
    int64_t num_requests_ = 0;
    // The generation in flight (one per connection).
    std::unique_ptr<Renderer> renderer_;
    uint64_t ticket_ = 0;
    bool active_ = false;
    bool stream_mode_ = false;
    bool headers_sent_ = false;
    bool disconnected_ = false;
    int64_t prompt_tokens_ = 0;
    int64_t num_tokens_ = 0;
    Clock::time_point start_time_;
    Clock::time_point last_token_time_;
    // Output.
    std::string pending_;
    std::string inflight_;
    bool writing_ = false;
    bool watching_ = false;
    bool response_done_ = false;
    bool closed_ = false;
    bool counted_open_ = false;
    bool discard_input_ = false;
    std::string discard_;
    uint64_t discarded_bytes_ = 0;
};

}  // namespace

void HttpServer::Impl::accept() {
    acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket s) {
        if (ec) {
            if (!acceptor.is_open()) return;  // closed by the drain
            DSI_LOG(kWarning) << "accept: " << ec.message();
        } else {
            std::make_shared<Session>(std::move(s), this)->start();
        }
        if (!draining.load()) accept();
    });
}

void HttpServer::Impl::start_drain() {
    if (draining.exchange(true)) return;
    DSI_LOG(kInfo) << "draining: " << in_flight.load() << " requests in flight, grace "
                   << options.drain_grace_ms << " ms";
    beast::error_code ec;
    acceptor.close(ec);
    drain_deadline = Clock::now() + std::chrono::milliseconds(options.drain_grace_ms);
    drain_tick();
}

void HttpServer::Impl::drain_tick() {
    if (in_flight.load() == 0 && open_responses.load() == 0) {
        ioc.stop();
        return;
    }
    const auto now = Clock::now();
    if (now >= drain_deadline) {
        if (!aborted_all) {
            aborted_all = true;
            DSI_LOG(kWarning) << "drain grace over: aborting " << in_flight.load() << " requests";
            service->abort_all();
            drain_deadline = now + kAbortWait;
        } else {
            ioc.stop();  // aborts did not come back in time; exit anyway
            return;
        }
    }
    drain_timer.expires_after(kDrainPoll);
    drain_timer.async_wait([this](beast::error_code) { drain_tick(); });
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() {
    if (impl_) impl_->ioc.stop();
}

Result<std::unique_ptr<HttpServer>> HttpServer::create(const ApiContext* ctx,
                                                       EngineService* service, Metrics* metrics,
                                                       ServerOptions options) {
    auto impl = std::make_unique<Impl>();
    impl->ctx = ctx;
    impl->service = service;
    impl->metrics = metrics;
    impl->options = std::move(options);
    beast::error_code ec;
    const asio::ip::address addr = asio::ip::make_address(impl->options.host, ec);
    if (ec) return invalid_argument("--host: " + ec.message());
    const tcp::endpoint ep(addr, static_cast<uint16_t>(impl->options.port));
    impl->acceptor.open(ep.protocol(), ec);
    if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) impl->acceptor.bind(ep, ec);
    if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
        return unavailable("listen on " + impl->options.host + ":" +
                           std::to_string(impl->options.port) + ": " + ec.message());
    }
    impl->port = impl->acceptor.local_endpoint(ec).port();
    return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::port() const { return impl_->port.load(); }

void HttpServer::shutdown() {
    asio::post(impl_->ioc, [impl = impl_.get()] { impl->start_drain(); });
}

Status HttpServer::run() {
    Impl* impl = impl_.get();
    beast::error_code ec;
    impl->signals.add(SIGINT, ec);
    impl->signals.add(SIGTERM, ec);
    impl->signals.async_wait([impl](beast::error_code e, int sig) {
        if (e) return;
        DSI_LOG(kInfo) << "signal " << sig << ": shutting down";
        impl->start_drain();
    });
    impl->accept();
    auto body = [impl]() -> Status {
        try {
            impl->ioc.run();
        } catch (const std::exception& e) {
            return internal_error(std::string("io loop: ") + e.what());
        }
        return Status::ok();
    };
    std::vector<std::thread> threads;
    std::vector<Status> results(static_cast<size_t>(std::max(1, impl->options.num_io_threads)));
    for (size_t i = 1; i < results.size(); ++i) {
        threads.emplace_back([&results, i, &body] { results[i] = body(); });
    }
    results[0] = body();
    for (std::thread& t : threads) t.join();
    for (const Status& s : results) {
        if (!s.is_ok()) return s;
    }
    return Status::ok();
}

}  // namespace dsi::server
