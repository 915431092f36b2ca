// The only translation unit of net/ that includes Beast/Asio. Asio reports errors
// through error_code here; no exception leaves this file.
#include "net/http_client.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <atomic>
#include <charconv>
#include <future>
#include <chrono>
#include <limits>
#include <optional>
#include <thread>
#include <unordered_map>

namespace dsi::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

Result<HttpTarget> parse_base_url(std::string_view url) {
    constexpr std::string_view kScheme = "http://";
    if (url.substr(0, kScheme.size()) != kScheme) {
        return invalid_argument("base URL must start with http:// (got '" + std::string(url) +
                                "')");
    }
    url.remove_prefix(kScheme.size());
    HttpTarget t;
    const size_t slash = url.find('/');
    std::string_view authority = url.substr(0, slash);
    if (slash != std::string_view::npos) {
        std::string_view path = url.substr(slash);
        while (!path.empty() && path.back() == '/') path.remove_suffix(1);
        t.base_path = std::string(path);
    }
    const size_t colon = authority.rfind(':');
    if (colon != std::string_view::npos && authority.find(']') == std::string_view::npos) {
        std::string_view port = authority.substr(colon + 1);
        int p = 0;
        auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
        if (ec != std::errc() || ptr != port.data() + port.size() || p <= 0 || p > 65535) {
            return invalid_argument("bad port in base URL: '" + std::string(port) + "'");
        }
        t.port = std::string(port);
        authority = authority.substr(0, colon);
    }
    if (authority.empty()) return invalid_argument("base URL has no host");
    t.host = std::string(authority);
    return t;
}

namespace {

class Call;

}  // namespace

struct HttpClient::Impl {
    asio::io_context io;
    std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work{
        asio::make_work_guard(io)};
    std::thread thread;
    // I/O thread only: requests in flight, for cancel_all.
    std::unordered_map<uint64_t, std::weak_ptr<Call>> calls;
    std::atomic<uint64_t> next_id{1};  // start() callers
};

namespace {

class Call : public std::enable_shared_from_this<Call> {
public:
    Call(HttpClient::Impl* client, uint64_t id, const HttpTarget& target, HttpRequest request,
         HttpHandlers handlers)
        : client_(client),
          id_(id),
          target_(target),
          request_(std::move(request)),
          handlers_(std::move(handlers)),
          resolver_(client->io),
          stream_(client->io) {}

    void start() {
        if (request_.timeout_ms > 0) {
            deadline_ = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(request_.timeout_ms);
        }
        resolver_.async_resolve(target_.host, target_.port,
                                [self = shared_from_this()](beast::error_code ec,
                                                            tcp::resolver::results_type r) {
                                    self->on_resolve(ec, std::move(r));
                                });
    }

    void cancel() { finish(cancelled("request cancelled")); }

private:
    void arm() {
        if (deadline_) {
            stream_.expires_at(*deadline_);
        } else {
            stream_.expires_never();
        }
    }

    Status io_error(const char* what, beast::error_code ec) {
        if (ec == beast::error::timeout) {
            return deadline_exceeded(std::string(what) + ": request timed out after " +
                                     std::to_string(request_.timeout_ms) + " ms");
        }
        return unavailable(std::string(what) + ": " + ec.message());
    }

    void on_resolve(beast::error_code ec, tcp::resolver::results_type results) {
        if (done_) return;
        if (ec) return finish(io_error("resolve", ec));
        arm();
        stream_.async_connect(results, [self = shared_from_this()](beast::error_code e,
                                                                   const tcp::endpoint&) {
            self->on_connect(e);
        });
    }

    void on_connect(beast::error_code ec) {
        if (done_) return;
        if (ec) return finish(io_error("connect", ec));
        stream_.socket().set_option(tcp::no_delay(true), ec);
        req_.method(http::string_to_verb(request_.method));
        req_.target(target_.base_path + request_.path);
        req_.version(11);
        req_.set(http::field::host, target_.host + ":" + target_.port);
        req_.set(http::field::user_agent, "dsinfer");
        req_.set(http::field::connection, "close");
        for (const auto& [k, v] : request_.headers) req_.set(k, v);
        req_.body() = std::move(request_.body);
        req_.prepare_payload();
        arm();
        http::async_write(stream_, req_, [self = shared_from_this()](beast::error_code e, size_t) {
            self->on_write(e);
        });
    }

    void on_write(beast::error_code ec) {
        if (done_) return;
        if (ec) return finish(io_error("write", ec));
        // Not boost::none: Beast 1.74 compares a Content-Length against an empty optional
        // as "over the limit".
        parser_.body_limit(std::numeric_limits<std::uint64_t>::max());
        arm();
        http::async_read_header(stream_, buffer_, parser_,
                                [self = shared_from_this()](beast::error_code e, size_t) {
                                    self->on_header(e);
                                });
    }

    void on_header(beast::error_code ec) {
        if (done_) return;
        if (ec) return finish(io_error("read header", ec));
        if (handlers_.on_status) handlers_.on_status(static_cast<int>(parser_.get().result_int()));
        read_body();
    }

    void read_body() {
        if (parser_.is_done()) return finish(Status::ok());
        parser_.get().body().data = chunk_;
        parser_.get().body().size = sizeof(chunk_);
        arm();
        http::async_read_some(stream_, buffer_, parser_,
                              [self = shared_from_this()](beast::error_code e, size_t) {
                                  self->on_body(e);
                              });
    }

    void on_body(beast::error_code ec) {
        if (done_) return;
        if (ec == http::error::need_buffer) ec = {};
        if (ec) return finish(io_error("read body", ec));
        const size_t n = sizeof(chunk_) - parser_.get().body().size;
        if (n > 0 && handlers_.on_body &&
            !handlers_.on_body(std::string_view(chunk_, n))) {
            return finish(cancelled("request aborted by its body handler"));
        }
        read_body();
    }

    void finish(Status status) {
        if (done_) return;
        done_ = true;
        beast::error_code ignored;
        resolver_.cancel();
        stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
        stream_.close();
        client_->calls.erase(id_);
        if (handlers_.on_done) handlers_.on_done(std::move(status));
    }

    HttpClient::Impl* client_;
    uint64_t id_;
    const HttpTarget& target_;
    HttpRequest request_;
    HttpHandlers handlers_;
    tcp::resolver resolver_;
    beast::tcp_stream stream_;
    beast::flat_buffer buffer_;
    http::request<http::string_body> req_;
    http::response_parser<http::buffer_body> parser_;
    char chunk_[16384];
    std::optional<std::chrono::steady_clock::time_point> deadline_;
    bool done_ = false;
};

}  // namespace

HttpClient::HttpClient(HttpTarget target)
    : target_(std::move(target)), impl_(std::make_unique<Impl>()) {
    impl_->thread = std::thread([impl = impl_.get()] { impl->io.run(); });
}

HttpClient::~HttpClient() {
    cancel_all();
    impl_->work.reset();
    impl_->thread.join();
}

uint64_t HttpClient::start(HttpRequest request, HttpHandlers handlers) {
    const uint64_t id = impl_->next_id.fetch_add(1);
    asio::post(impl_->io, [this, id, request = std::move(request),
                           handlers = std::move(handlers)]() mutable {
        auto call = std::make_shared<Call>(impl_.get(), id, target_, std::move(request),
                                           std::move(handlers));
        impl_->calls.emplace(id, call);
        call->start();
    });
    return id;
}

void HttpClient::cancel(uint64_t id) {
    // Posted after the start() of `id` (one I/O thread, FIFO): the call is there unless
    // it ended.
    asio::post(impl_->io, [impl = impl_.get(), id] {
        auto it = impl->calls.find(id);
        if (it == impl->calls.end()) return;
        if (auto c = it->second.lock()) c->cancel();
    });
}

void HttpClient::cancel_all() {
    asio::post(impl_->io, [impl = impl_.get()] {
        std::vector<std::shared_ptr<Call>> live;
        for (auto& [id, weak] : impl->calls) {
            if (auto c = weak.lock()) live.push_back(std::move(c));
        }
        for (auto& c : live) c->cancel();
    });
}

Result<HttpResponse> fetch(HttpClient& client, HttpRequest request) {
    // The handlers run on the I/O thread; the response is complete when on_done runs,
    // which is the last call, so `promise` may be set there.
    auto response = std::make_shared<HttpResponse>();
    auto promise = std::make_shared<std::promise<Status>>();
    std::future<Status> done = promise->get_future();
    HttpHandlers h;
    h.on_status = [response](int status) { response->status = status; };
    h.on_body = [response](std::string_view bytes) {
        response->body.append(bytes);
        return true;
    };
    h.on_done = [promise](Status s) { promise->set_value(std::move(s)); };
    client.start(std::move(request), std::move(h));
    Status s = done.get();
    if (!s.is_ok()) return s;
    return std::move(*response);
}

}  // namespace dsi::net
