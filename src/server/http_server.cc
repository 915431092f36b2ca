// The only translation unit that includes Asio (Beast's parser settings are shared
// with answer_offline through internal/http_parse.h). Exceptions: Asio calls use error_code
// overloads; run() catches what Asio may still throw (adapter rule, STYLE 2) -> a Status.
#include "server/http_server.h"

#include <algorithm>
#include <array>
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
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "base/check.h"
#include "base/env.h"
#include "base/logging.h"
#include "server/engine_rpc.h"
#include "server/http_rules.h"
#include "server/internal/http_parse.h"
#include "server/web_assets.h"

namespace dsi::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {
// After a reply that ends the connection: what the client is still sending is read
// and dropped for at most this long / this many bytes, so it reads the reply rather
// than a reset; then the socket is closed.
constexpr uint64_t kLingerLimitBytes = uint64_t{4} << 20;
constexpr auto kLingerTime = std::chrono::seconds(2);
// One socket read.
constexpr size_t kReadChunkBytes = 16 * 1024;
// Connections refused past max_connections that are still being answered; past this
// many a new connection is closed without a reply.
constexpr int64_t kMaxRefusing = 64;
constexpr auto kAcceptRetry = std::chrono::milliseconds(50);
constexpr auto kDrainPoll = std::chrono::milliseconds(20);
constexpr auto kAbortWait = std::chrono::seconds(5);

double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

using Parser = internal::RequestParser;
using internal::head_of;
using internal::parse_error_verdict;
using internal::start_body;
using internal::start_parser;

HttpReply verdict_reply(const HeadVerdict& v) {
    HttpReply r = error_reply(v.endpoint.value_or(Endpoint::kChatCompletions), v.status, v.message);
    for (const auto& h : v.headers) r.headers.push_back(h);
    return r;
}

}  // namespace

struct HttpServer::Impl {
    const ApiContext* ctx = nullptr;
    GenerationService* service = nullptr;
    Metrics* metrics = nullptr;
    ServerOptions options;
    // Sessions use what is declared before `ioc`: destroying it destroys them.
    std::unique_ptr<BodyBudget> body_budget;
    std::atomic<int> port{0};
    std::atomic<bool> draining{false};
    std::atomic<int64_t> in_flight{0};        // generations holding a concurrency slot
    std::atomic<int64_t> open_responses{0};   // generations whose reply is not yet written
    std::atomic<int64_t> num_connections{0};  // sessions counted against max_connections
    std::atomic<int64_t> num_refusing{0};     // sessions answering 503 past the cap
    std::atomic<uint64_t> next_ticket{1};
    // What a generation's update callback holds instead of its session and executor:
    // the service may keep (call, destroy) a callback after the server is gone, and a
    // session and its strand must die while the io_context they live on does.
    // ~HttpServer empties every hold first.
    struct SessionHold {
        std::mutex mu;
        Sink deliver;  // posts to the session; empty once the server has let go
    };
    std::mutex holds_mu;
    std::vector<std::weak_ptr<SessionHold>> holds;
    size_t holds_pruned_at = 64;
    std::shared_ptr<SessionHold> hold(Sink deliver);
    void release_holds();
    asio::io_context ioc;
    tcp::acceptor acceptor{ioc};
    asio::signal_set signals{ioc};
    asio::steady_timer drain_timer{ioc};
    asio::steady_timer accept_timer{ioc};
    Clock::time_point drain_deadline;
    bool aborted_all = false;

    void accept();
    void start_drain();
    void drain_tick();
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
public:
    Session(tcp::socket socket, HttpServer::Impl* server, bool refusing)
        : socket_(std::move(socket)),
          timer_(socket_.get_executor()),
          server_(server),
          refusing_(refusing),
          buffer_(static_cast<size_t>(kReadBufferBytes)) {
        (refusing_ ? server_->num_refusing : server_->num_connections).fetch_add(1);
    }
    ~Session() {
        release_body();
        (refusing_ ? server_->num_refusing : server_->num_connections).fetch_sub(1);
    }

    void start() {
        asio::dispatch(socket_.get_executor(), [self = shared_from_this()] {
            if (self->refusing_) return self->refuse();
            self->begin_request();
        });
    }

private:
    using Response = http::response<http::string_body>;
    // kHead / kBody: parsing a request; kDrop: dropping a refused body before its
    // reply; kAnswer: answering (a generation, a reply being written); kLinger: the
    // reply is out and the connection is closing.
    enum class Phase { kHead, kBody, kDrop, kAnswer, kLinger };

    const ApiContext& ctx() const { return *server_->ctx; }

    // ---- deadlines: one timer; every phase that waits on the client arms it ----
    // kIdle: a connection with no request byte yet -- new, or between keep-alive requests
    // (expiry closes quietly); kHead / kBody: a request whose first byte came but which
    // did not arrive in time (expiry answers 408 and closes); kWrite: a
    // reply the client does not read (expiry ends the connection, aborting a generation);
    // kLinger: the closing connection's last reads.
    enum class Deadline { kIdle, kHead, kBody, kWrite, kLinger };
    void arm(std::chrono::milliseconds after, Deadline what) {
        const uint64_t gen = ++timer_gen_;
        timer_.expires_after(after);
        timer_.async_wait([self = shared_from_this(), gen, what, after](beast::error_code ec) {
            if (ec || gen != self->timer_gen_ || self->closed_) return;
            self->on_deadline(what, after);
        });
    }
    void on_deadline(Deadline what, std::chrono::milliseconds after) {
        if (what == Deadline::kBody && phase_ == Phase::kDrop && !writing_) {
            server_->metrics->on_timeout("body");
            return answer_refusal();  // the refusal the dropped body was waiting for
        }
        if ((what == Deadline::kHead || what == Deadline::kBody) && !writing_ &&
            (phase_ == Phase::kHead || phase_ == Phase::kBody)) {
            server_->metrics->on_timeout(what == Deadline::kHead ? "header" : "body");
            HeadVerdict v = verdict_;
            v.status = 408;
            v.message = std::string("request timeout: the request ") +
                        (what == Deadline::kHead ? "head" : "body") + " did not arrive within " +
                        std::to_string(after.count()) + " ms";
            v.headers.clear();
            if (v.metric_name.empty()) v.metric_name = "other";
            v.close = true;
            return refuse_request(std::move(v));
        }
        if (what == Deadline::kWrite) server_->metrics->on_timeout("write");
        if (what == Deadline::kIdle) server_->metrics->on_timeout("idle");
        if (active_) disconnect();
        close();
    }
    void disarm() {
        ++timer_gen_;
        timer_.cancel();
    }
    static std::chrono::milliseconds ms(int64_t v) { return std::chrono::milliseconds(v); }
    // The idle deadline as the Keep-Alive header tells it (whole seconds, rounded down,
    // at least 1): a client that reads it (Node's undici does) closes an
    // idle connection before the server does instead of sending a request into the close.
    std::string keep_alive_value() const {
        return "timeout=" +
               std::to_string(std::max<int64_t>(1, ctx().limits.idle_timeout_ms / 1000));
    }

    // ---- reading ----
    // Waits for the next request; one already buffered (pipelined) is parsed at once.
    void begin_request() {
        if (closed_) return;
        parser_.emplace();
        start_parser(*parser_);
        verdict_ = HeadVerdict{};
        phase_ = Phase::kHead;
        // A new connection is idle until its first byte, like one between requests:
        // clients open connections ahead of their requests (undici's pool, a browser's
        // preconnect), and one cut at the head deadline before it is used fails the
        // request sent on it as the close arrives ("other side closed"). A slow head
        // still meets its deadline: it starts at the head's first byte.
        head_started_ = buffer_.size() > 0;
        if (head_started_) {
            arm(ms(ctx().limits.header_timeout_ms), Deadline::kHead);
        } else {
            arm(ms(ctx().limits.idle_timeout_ms), Deadline::kIdle);
        }
        process();
    }

    // One read at a time, into read_buf_ (buffer_ is consumed while it is pending).
    void read_more() {
        if (reading_ || closed_) return;
        const size_t room = buffer_.max_size() - buffer_.size();
        if (room == 0) {
            // A head or chunk line that does not fit: framing we will not buffer.
            if (phase_ == Phase::kHead || phase_ == Phase::kBody) {
                const beast::error_code ec =
                    phase_ == Phase::kHead ? http::error::header_limit : http::error::bad_chunk;
                return refuse_request(parse_error_verdict(ec, verdict_));
            }
            return;  // answering: pipelined bytes wait in the kernel
        }
        reading_ = true;
        socket_.async_read_some(
            asio::buffer(read_buf_.data(), std::min(room, read_buf_.size())),
            [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_read(ec, n); });
    }

    void on_read(beast::error_code ec, size_t n) {
        reading_ = false;
        if (closed_) return;
        if (ec) {
            if (active_) {
                disconnect();  // the client went away mid-generation
                return close();
            }
            if (phase_ == Phase::kAnswer) {
                peer_eof_ = true;  // finish writing the reply, then close
                return;
            }
            return close();
        }
        if (phase_ == Phase::kLinger) {
            lingered_bytes_ += n;
            if (lingered_bytes_ > kLingerLimitBytes) return close();
            return read_more();
        }
        auto dst = buffer_.prepare(n);
        std::memcpy(dst.data(), read_buf_.data(), n);
        buffer_.commit(n);
        if (phase_ == Phase::kAnswer) return read_more();  // watching; keeps what arrives
        process();
    }

    // Parses what is buffered as far as it goes.
    void process() {
        while (!closed_) {
            if (phase_ == Phase::kDrop) {
                const uint64_t n = std::min<uint64_t>(drop_left_, buffer_.size());
                buffer_.consume(n);
                drop_left_ -= n;
                if (drop_left_ == 0) return answer_refusal();
                return read_more();
            }
            if (phase_ != Phase::kHead && phase_ != Phase::kBody) return;
            if (phase_ == Phase::kHead && parser_->is_header_done()) {
                on_head();
                continue;
            }
            if (parser_->is_done()) return on_request();
            if (buffer_.size() == 0) return read_more();
            if (!head_started_) {
                head_started_ = true;  // the idle wait is over: the head has its own deadline
                arm(ms(ctx().limits.header_timeout_ms), Deadline::kHead);
            }
            beast::error_code ec;
            const size_t n = parser_->put(buffer_.data(), ec);
            buffer_.consume(n);
            if (ec == http::error::need_more) {
                if (n == 0) return read_more();
                continue;
            }
            if (ec) return refuse_request(parse_error_verdict(ec, verdict_));
        }
    }

    void on_head() {
        head_ = head_of(*parser_);
        keep_alive_ = parser_->get().keep_alive();
        HeadPolicy policy;
        policy.api_keys = &server_->options.api_keys;
        policy.max_body_bytes = ctx().limits.max_body_bytes;
        policy.retry_after_s = ctx().limits.retry_after_s;
        policy.draining = server_->draining.load();
        policy.engine_rpc = server_->options.engine_rpc;
        policy.swa_lookup = static_cast<bool>(server_->options.swa_lookup);
        verdict_ = check_head(head_, policy);
        if (verdict_.status != 0) {
            if (verdict_.drop_body_bytes > 0) {
                // Read and drop the declared body (never stored), then answer.
                keep_alive_ = false;
                phase_ = Phase::kDrop;
                drop_left_ = verdict_.drop_body_bytes;
                arm(ms(ctx().limits.body_timeout_ms), Deadline::kBody);
                return;
            }
            return refuse_request(verdict_);
        }
        phase_ = Phase::kBody;          // the head is checked
        if (!head_.has_body()) return;  // complete: process() answers it
        // The body must fit the global budget before a byte of it is stored.
        const int64_t want = head_.content_length ? static_cast<int64_t>(*head_.content_length)
                                                  : static_cast<int64_t>(verdict_.body_limit_bytes);
        if (!server_->body_budget->try_reserve(want)) {
            HeadVerdict busy = verdict_;
            busy.status = 503;
            busy.message = "server busy: too many request bodies in flight; retry later";
            busy.headers.emplace_back("Retry-After", std::to_string(ctx().limits.retry_after_s));
            busy.close = true;
            return refuse_request(busy);
        }
        body_reserved_bytes_ = want;
        start_body(*parser_, verdict_);
        arm(ms(ctx().limits.body_timeout_ms), Deadline::kBody);
        if (verdict_.send_continue && buffer_.size() == 0) {
            pending_ += "HTTP/1.1 100 Continue\r\n\r\n";
            flush();
        }
    }

    void release_body() {
        if (body_reserved_bytes_ > 0) {
            server_->body_budget->release(body_reserved_bytes_);
            body_reserved_bytes_ = 0;
        }
    }

    // Answers a request refused from its head or its framing.
    void refuse_request(HeadVerdict v) {
        verdict_ = std::move(v);
        if (verdict_.close) keep_alive_ = false;
        answer_refusal();
    }

    void answer_refusal() {
        phase_ = Phase::kAnswer;
        disarm();
        release_body();
        reply(verdict_reply(verdict_), verdict_.metric_name);
        read_more();
    }

    // Past max_connections: 503 + Retry-After, then close.
    void refuse() {
        HeadVerdict v;
        v.status = 503;
        v.message = "too many connections; retry later";
        v.headers.emplace_back("Retry-After", std::to_string(ctx().limits.retry_after_s));
        v.metric_name = "other";
        v.close = true;
        refuse_request(std::move(v));
    }

    // ---- answering ----
    void on_request() {
        phase_ = Phase::kAnswer;
        disarm();
        switch (verdict_.route) {
            case RouteKind::kHealth:
                reply(HttpReply{200, "application/json", "{\"status\":\"ok\"}", {}}, "health");
                break;
            case RouteKind::kReady: {
                const bool ready = !server_->draining.load();
                reply(HttpReply{ready ? 200 : 503,
                                "application/json",
                                ready ? "{\"status\":\"ready\"}" : "{\"status\":\"draining\"}",
                                {}},
                      "ready");
                break;
            }
            case RouteKind::kMetrics:
                reply(HttpReply{200,
                                "text/plain; version=0.0.4",
                                server_->metrics->render(server_->service->stats_snapshot(),
                                                         server_->in_flight.load(),
                                                         !server_->draining.load()),
                                {}},
                      "metrics");
                break;
            case RouteKind::kModels:
                reply(models_reply(ctx(), 0), "models");
                break;
            case RouteKind::kWeb: {
                // The built-in chat page: public static files; its API calls carry the key.
                const WebAsset* asset = find_web_asset(head_.path());
                DSI_CHECK(asset != nullptr, "check_head routed a missing web asset");
                reply(HttpReply{200,
                                std::string(asset->content_type),
                                std::string(asset->body),
                                {{"Cache-Control", "no-cache"},
                                 {"X-Content-Type-Options", "nosniff"},
                                 {"Content-Security-Policy",
                                  "default-src 'self'; frame-ancestors 'none'"}}},
                      "web");
                break;
            }
            case RouteKind::kGenerate:
                generate();
                break;
            case RouteKind::kEngineRpc:
                engine_rpc();
                break;
            case RouteKind::kSwaStates:
                if (server_->options.swa_states) {
                    reply(
                        HttpReply{
                            200, "application/json", server_->options.swa_states(head_.target), {}},
                        "swa_states");
                } else {
                    reply(HttpReply{404,
                                    "application/json",
                                    "{\"error\":\"this engine keeps no SWA states\"}",
                                    {}},
                          "swa_states");
                }
                break;
            case RouteKind::kSwaLookup:
                reply(
                    HttpReply{
                        200, "application/json", server_->options.swa_lookup(head_.target), {}},
                    "swa_lookup");
                break;
            case RouteKind::kNone:
                DSI_CHECK(false, "check_head accepted a request without a route");
        }
        // Watch the socket: EOF while generating means the client went away; bytes of a
        // pipelined next request stay buffered.
        read_more();
    }

    void generate() {
        const Endpoint e = *verdict_.endpoint;
        const std::string name(endpoint_name(e));
        if (server_->draining.load()) {
            keep_alive_ = false;
            return reply(error_reply(e, 503, "server is shutting down"), name);
        }
        const uint64_t ticket = server_->next_ticket.fetch_add(1);
        Result<Prepared> prepared = prepare_request(
            ctx(), e, parser_->get().body(), Env::default_env()->random_seed(), verdict_.key_salt);
        // The body is no longer needed (prepared holds what it said).
        std::string().swap(parser_->get().body());
        release_body();
        if (!prepared.is_ok()) return reply(error_reply(e, prepared.status()), name);
        if (!take_generation_slot(e, name)) return;
        std::string id = (e == Endpoint::kMessages      ? "msg_"
                          : e == Endpoint::kResponses   ? "resp_"
                          : e == Endpoint::kCompletions ? "cmpl-"
                                                        : "chatcmpl-") +
                         std::to_string(ticket);
        const int64_t now_s = Env::default_env()->wall_ns() / 1000000000;
        stream_mode_ = prepared->stream;
        prompt_tokens_ = static_cast<int64_t>(prepared->request.prompt.size());
        renderer_ = std::make_unique<Renderer>(ctx(), *prepared, std::move(id), now_s);
        rpc_mode_ = false;
        begin_generation(ticket,
                         Generation{std::move(prepared->request), std::move(prepared->structured)});
    }

    // Concurrency slot: held until the engine's final update. False (after replying
    // 429) when every slot is taken.
    bool take_generation_slot(Endpoint e, const std::string& name) {
        if (server_->in_flight.fetch_add(1) < ctx().limits.max_concurrent) return true;
        server_->in_flight.fetch_sub(1);
        HttpReply r = error_reply(e, 429, "too many concurrent requests; retry later");
        r.headers.emplace_back("Retry-After", std::to_string(ctx().limits.retry_after_s));
        reply(std::move(r), name);
        return false;
    }

    // The engine RPC (engine_rpc.h): token ids in, one JSON line per Update out.
    void engine_rpc() {
        const Endpoint e = *verdict_.endpoint;  // the error shape
        const std::string name = verdict_.metric_name;
        if (server_->draining.load()) {
            keep_alive_ = false;
            return reply(error_reply(e, 503, "server is shutting down"), name);
        }
        Result<Generation> g = decode_generation(ctx(), parser_->get().body());
        std::string().swap(parser_->get().body());
        release_body();
        if (!g.is_ok()) return reply(error_reply(e, g.status()), name);
        if (!take_generation_slot(e, name)) return;
        const uint64_t ticket = server_->next_ticket.fetch_add(1);
        rpc_mode_ = true;
        stream_mode_ = true;
        prompt_tokens_ = static_cast<int64_t>(g->request.prompt.size());
        begin_generation(ticket, std::move(g).value());
    }

    // Submits a prepared generation; its updates come back to on_update on this
    // connection's executor.
    void begin_generation(uint64_t ticket, Generation g) {
        ticket_ = ticket;
        active_ = true;
        headers_sent_ = false;
        start_time_ = Clock::now();
        server_->open_responses.fetch_add(1);
        counted_open_ = true;
        last_token_time_ = start_time_;
        num_tokens_ = 0;
        auto executor = socket_.get_executor();
        server_->service->start(
            ticket, std::move(g),
            [hold = server_->hold([self = shared_from_this(), executor](Update u) {
                asio::post(executor,
                           [self, u = std::move(u)]() mutable { self->on_update(std::move(u)); });
            })](Update u) {
                std::lock_guard lock(hold->mu);
                if (hold->deliver) hold->deliver(std::move(u));  // else the server is gone
            });
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
        const std::string name = verdict_.metric_name;
        if (!u.error.is_ok() && !headers_sent_) {
            return reply(error_reply(*verdict_.endpoint, u.error), name);
        }
        if (!stream_mode_) {
            renderer_->on_update(u);
            if (final_update) reply(renderer_->reply(), name);
            return;
        }
        if (!headers_sent_) {
            headers_sent_ = true;
            server_->metrics->on_request(name, 200);
            pending_ += rpc_mode_ ? "HTTP/1.1 200 OK\r\nServer: dsinfer\r\n"
                                    "Content-Type: application/x-ndjson\r\n"
                                  : "HTTP/1.1 200 OK\r\nServer: dsinfer\r\nContent-Type: "
                                    "text/event-stream\r\nCache-Control: no-cache\r\n";
            // HTTP/1.1: the SSE body as chunks, so the connection stays reusable. An
            // HTTP/1.0 client cannot read chunks (RFC 9112 §6.1): the body ends with the
            // connection.
            chunked_ = head_.version >= 11;
            if (!chunked_) keep_alive_ = false;
            if (chunked_) pending_ += "Transfer-Encoding: chunked\r\n";
            pending_ +=
                keep_alive_
                    ? "Connection: keep-alive\r\nKeep-Alive: " + keep_alive_value() + "\r\n\r\n"
                    : std::string("Connection: close\r\n\r\n");
        }
        if (rpc_mode_) {
            // Errors after the head travel inside the line (Update::error).
            append_body(encode_update(u));
            if (final_update) {
                if (chunked_) pending_ += "0\r\n\r\n";
                response_done_ = true;
            }
            return flush();
        }
        std::string sse;
        if (u.error.is_ok()) {
            sse = renderer_->on_update_sse(u);
        } else {
            // A failure after the head: the text that came with it, then the error, and
            // only then the end of the stream -- clients stop reading at [DONE], so an
            // error after it would be lost and the cut answer would read as complete.
            u.finished = false;
            sse = renderer_->on_update_sse(u);
            sse += "event: error\ndata: " + error_reply(*verdict_.endpoint, u.error).body + "\n\n";
            if (*verdict_.endpoint == Endpoint::kChatCompletions ||
                *verdict_.endpoint == Endpoint::kCompletions) {
                sse += "data: [DONE]\n\n";
            }
        }
        if (!sse.empty()) append_body(sse);
        if (final_update) {
            if (chunked_) pending_ += "0\r\n\r\n";
            response_done_ = true;
        }
        flush();
    }

    void append_body(const std::string& data) {
        if (!chunked_) {
            pending_ += data;
            return;
        }
        char size[24];
        std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
        pending_ += size;
        pending_ += data;
        pending_ += "\r\n";
    }

    // Writes what is pending; one write in flight at a time. While answering, a write
    // that a client does not read within write_timeout_ms ends the connection.
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
        const bool deadline = phase_ == Phase::kAnswer;
        if (deadline) arm(ms(ctx().limits.write_timeout_ms), Deadline::kWrite);
        asio::async_write(socket_, asio::buffer(inflight_),
                          [self = shared_from_this(), deadline](beast::error_code ec, size_t) {
                              self->writing_ = false;
                              if (self->inflight_.capacity() > kReadChunkBytes) {
                                  std::string().swap(self->inflight_);
                              }
                              self->inflight_.clear();
                              if (self->closed_) return;
                              if (ec) {
                                  self->disconnect();
                                  return self->close();
                              }
                              if (deadline && self->phase_ == Phase::kAnswer) self->disarm();
                              self->flush();
                          });
    }

    void reply(HttpReply r, const std::string& metric_name) {
        server_->metrics->on_request(metric_name, r.status);
        auto res = std::make_shared<Response>(static_cast<http::status>(r.status), 11);
        res->set(http::field::server, "dsinfer");
        res->set(http::field::content_type, r.content_type);
        for (const auto& [k, v] : r.headers) res->set(k, v);
        const bool keep = keep_alive_ && !server_->draining.load();
        // An HTTP/1.0 client keeps the connection only when told so explicitly.
        res->set(http::field::connection, keep ? "keep-alive" : "close");
        if (keep) res->set(http::field::keep_alive, keep_alive_value());
        res->body() = std::move(r.body);
        res->prepare_payload();
        // Serialise into pending_ so streaming and plain replies share one writer.
        std::ostringstream os;
        os << *res;
        pending_ += os.str();
        if (!keep) keep_alive_ = false;
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
        renderer_.reset();
        if (!keep_alive_ || peer_eof_) return linger();
        begin_request();  // a pipelined request already buffered is answered at once
    }

    // The reply is out; the client may still be sending (a refused body): read and
    // drop that for a short while so closing does not reset the connection before the
    // reply is read. At most kLingerTime and kLingerLimitBytes: a refused body is
    // never read in full.
    void linger() {
        phase_ = Phase::kLinger;
        buffer_.consume(buffer_.size());
        beast::error_code ec;
        socket_.shutdown(tcp::socket::shutdown_send, ec);
        arm(std::chrono::duration_cast<std::chrono::milliseconds>(kLingerTime), Deadline::kLinger);
        read_more();
    }

    void close() {
        release_open();
        release_body();
        if (closed_) return;
        closed_ = true;
        disarm();
        beast::error_code ec;
        socket_.close(ec);
    }

    tcp::socket socket_;
    asio::steady_timer timer_;
    uint64_t timer_gen_ = 0;
    HttpServer::Impl* server_;
    const bool refusing_;
    // Input: read_buf_ <- socket; buffer_ holds what is not parsed yet (bounded).
    std::array<char, kReadChunkBytes> read_buf_{};
    beast::flat_buffer buffer_;
    bool reading_ = false;
    bool peer_eof_ = false;
    std::optional<Parser> parser_;
    Phase phase_ = Phase::kHead;
    bool head_started_ = false;
    RequestHead head_;
    HeadVerdict verdict_;
    int64_t body_reserved_bytes_ = 0;
    uint64_t drop_left_ = 0;
    uint64_t lingered_bytes_ = 0;
    bool keep_alive_ = true;
    // The generation in flight (one per connection).
    std::unique_ptr<Renderer> renderer_;
    uint64_t ticket_ = 0;
    bool active_ = false;
    bool stream_mode_ = false;
    bool rpc_mode_ = false;  // answering the engine RPC: JSON lines, no renderer
    bool headers_sent_ = false;
    bool chunked_ = true;
    bool disconnected_ = false;
    int64_t prompt_tokens_ = 0;
    int64_t num_tokens_ = 0;
    Clock::time_point start_time_;
    Clock::time_point last_token_time_;
    // Output.
    std::string pending_;
    std::string inflight_;
    bool writing_ = false;
    bool response_done_ = false;
    bool closed_ = false;
    bool counted_open_ = false;
};

}  // namespace

void HttpServer::Impl::accept() {
    acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket s) {
        if (ec) {
            if (!acceptor.is_open()) return;  // closed by the drain
            DSI_LOG(kWarning) << "accept: " << ec.message();
            // Out of file descriptors and the like: retry shortly instead of spinning.
            accept_timer.expires_after(kAcceptRetry);
            accept_timer.async_wait([this](beast::error_code) {
                if (!draining.load()) accept();
            });
            return;
        }
        if (num_connections.load() < options.max_connections) {
            std::make_shared<Session>(std::move(s), this, false)->start();
        } else if (num_refusing.load() < kMaxRefusing) {
            std::make_shared<Session>(std::move(s), this, true)->start();  // 503 + Retry-After
        }                                                                  // else: `s` closes here
        if (!draining.load()) accept();
    });
}

void HttpServer::Impl::start_drain() {
    if (draining.exchange(true)) return;
    DSI_LOG(kInfo) << "draining: " << in_flight.load() << " requests in flight, grace "
                   << options.drain_grace_ms << " ms";
    beast::error_code ec;
    acceptor.close(ec);
    if (options.on_drain_start) options.on_drain_start();
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

std::shared_ptr<HttpServer::Impl::SessionHold> HttpServer::Impl::hold(Sink deliver) {
    auto h = std::make_shared<SessionHold>();
    h->deliver = std::move(deliver);
    std::lock_guard lock(holds_mu);
    if (holds.size() >= holds_pruned_at) {
        std::erase_if(holds, [](const std::weak_ptr<SessionHold>& w) { return w.expired(); });
        holds_pruned_at = std::max<size_t>(64, 2 * holds.size());
    }
    holds.push_back(h);
    return h;
}

void HttpServer::Impl::release_holds() {
    std::vector<std::weak_ptr<SessionHold>> all;
    {
        std::lock_guard lock(holds_mu);
        all.swap(holds);
    }
    for (const auto& w : all) {
        const auto h = w.lock();
        if (!h) continue;
        Sink deliver;
        {
            std::lock_guard lock(h->mu);
            deliver.swap(h->deliver);
        }
        // `deliver` may hold the last reference to its session: it ends here, with ioc alive.
    }
}

HttpServer::~HttpServer() {
    if (!impl_) return;
    impl_->ioc.stop();
    impl_->release_holds();
}

Result<std::unique_ptr<HttpServer>> HttpServer::create(const ApiContext* ctx,
                                                       GenerationService* service, Metrics* metrics,
                                                       ServerOptions options) {
    auto impl = std::make_unique<Impl>();
    impl->ctx = ctx;
    impl->service = service;
    impl->metrics = metrics;
    impl->options = std::move(options);
    if (impl->options.max_connections < 1) return invalid_argument("max_connections must be >= 1");
    if (impl->options.max_body_budget_bytes < ctx->limits.max_body_bytes) {
        return invalid_argument("max_body_budget_bytes must be >= max_body_bytes");
    }
    impl->body_budget = std::make_unique<BodyBudget>(impl->options.max_body_budget_bytes);
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
