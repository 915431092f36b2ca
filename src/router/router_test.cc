// router/: RemoteService behind a real HttpServer, routing to engine servers (tiny
// in-memory model, EngineService, HttpServer with the engine RPC) on loopback ports:
// the router answers as an engine does; a stream cut mid-way (a proxy that drops the
// connection, as a killed engine does) fails over to the other engine and the client
// gets the same tokens without a seam; refusals pass through; no engine -> 503.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/clock.h"
#include "kv/swa_pool.h"
#include "kvstore/block_format.h"
#include "kvstore/shm_store.h"
#include "model/deepseek.h"
#include "model/deepseek_v4.h"
#include "model/synthetic.h"
#include "net/http_client.h"
#include "router/remote_service.h"
#include "server/engine_service.h"
#include "server/handoff_service.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/structured_output.h"
#include "server/swa_announce.h"
#include "server/swa_pull_service.h"
#include "server/test_support.h"
#include "serving/swa_fetch.h"
#include "transfer/fault_transport.h"

namespace dsi::router {
namespace {

using J = nlohmann::json;

using server::testing::tokenizer;

server::ApiContext context() { return server::testing::api_context(); }

// One grammar compile service for every engine and router that has structured output
// (thread-safe, as `serve` shares one between its sessions).
server::StructuredOutput& structured_output() {
    static server::StructuredOutput so(tokenizer());
    return so;
}

// An HttpServer on a free loopback port, run on its own thread.
class ServerThread {
public:
    ServerThread(const server::ApiContext* ctx, server::GenerationService* service, bool engine_rpc,
                 int64_t drain_grace_ms = 2000,
                 std::function<std::string(std::string_view)> swa_states = nullptr,
                 std::function<std::string(std::string_view)> swa_lookup = nullptr) {
        server::ServerOptions o;
        o.port = 0;
        o.num_io_threads = 1;
        o.drain_grace_ms = drain_grace_ms;
        o.engine_rpc = engine_rpc;
        o.swa_states = std::move(swa_states);
        o.swa_lookup = std::move(swa_lookup);
        auto s = server::HttpServer::create(ctx, service, &metrics_, o);
        EXPECT_TRUE(s.is_ok()) << s.status().to_string();
        server_ = std::move(s).value();
        thread_ = std::thread([this] { (void)server_->run(); });
    }
    ~ServerThread() { stop(); }
    // Drains (as SIGTERM does) and waits for the server to end.
    void stop() {
        if (!thread_.joinable()) return;
        server_->shutdown();
        thread_.join();
    }
    int port() const { return server_->port(); }

private:
    server::Metrics metrics_;
    std::unique_ptr<server::HttpServer> server_;
    std::thread thread_;
};

// What an engine does with KV hand-overs (as `serve --role` sets them up). kSwaPeer
// (V4): a shared store below the engine, its own SWA pool announced on
// /internal/v1/swa_states, an SwaFetchServer on it and an SwaPullService in front.
enum class Kv { kNone, kSends, kReceives, kSwaPeer };

// The tiny model (V3) or tiny-v4 (V4: KV of three cache groups and an SWA state slot).
std::unique_ptr<CausalLm> load_model(bool v4) {
    if (v4) {
        DeepseekV4Model::Options o;
        o.num_threads = 1;
        auto m = DeepseekV4Model::load(
            synthetic_v4_memory_model(synthetic_preset("tiny-v4").value(), 7), o);
        EXPECT_TRUE(m.is_ok()) << m.status().to_string();
        return std::move(m).value();
    }
    auto m = DeepseekModel::load(synthetic_memory_model(synthetic_preset("tiny").value(), 7), {1});
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return std::move(m).value();
}

// An engine process in miniature: the tiny model (same weights in every engine; tiny-v4
// with `v4`), its EngineService and an HttpServer that serves the engine RPC; with
// Kv::kSends a HandoffService in front, with Kv::kReceives an shm store tier and a
// KvInbox into it (V4: and into the engine's SWA pool, as `serve` wires them).
struct Engine {
    explicit Engine(int64_t drain_grace_ms = 2000, Kv kv = Kv::kNone,
                    std::optional<transfer::FaultPlan> send_faults = std::nullopt, bool v4 = false,
                    kvstore::BlockStore* shared_store = nullptr, bool grammars = false) {
        model = load_model(v4);
        engine::EngineOptions eo;
        eo.num_kv_blocks = 64;
        eo.tokenizer = &tokenizer();
        const std::optional<engine::StoreBlockShape> shape = engine::store_block_shape(*model);
        EXPECT_TRUE(shape.has_value());
        std::function<std::string(std::string_view)> swa_states;
        if (kv == Kv::kSwaPeer && shape) {
            eo.kv_store = shared_store;
            swa_pool = std::make_unique<kv::SwaStatePool>(int64_t{64} << 20);
            eo.swa_pool = swa_pool.get();
            serving::SwaFetchServerOptions fo;
            fo.host = "127.0.0.1";
            fo.incarnation = 1;
            fo.pool = swa_pool.get();
            fetch = serving::SwaFetchServer::start(fo).value();
            swa_states = [pool = swa_pool.get(), port = fetch->port()](std::string_view target) {
                server::SwaAnnouncementReply r;
                r.incarnation = 1;  // member()'s
                r.fetch_address = "127.0.0.1:" + std::to_string(port);
                r.changes = pool->changes_since(server::swa_announcement_since(target));
                return server::encode_swa_announcement(r);
            };
        }
        if (kv == Kv::kReceives && shape) {
            static std::atomic<int> n{0};
            kvstore::ShmStoreOptions so;
            so.name = "dsi_router_test_" + std::to_string(::getpid()) + "_" + std::to_string(++n);
            so.num_slots = 16;
            so.slot_bytes = static_cast<int64_t>(
                (kvstore::header_bytes(shape->num_layers()) + shape->block_bytes() + 4095) / 4096 *
                4096);
            so.unlink_on_close = true;
            inbox_store = kvstore::ShmBlockStore::open(so).value();
            eo.kv_store = inbox_store.get();
            serving::KvInboxOptions io;
            io.host = "127.0.0.1";
            io.self = {"decode", transfer::PeerRole::kDecode, 1};
            io.model_id = eo.model_id;
            io.dtype = shape->dtype;
            io.layer_block_bytes = shape->layer_block_bytes;
            if (shape->swa_state_bytes > 0) {
                swa_pool = std::make_unique<kv::SwaStatePool>(int64_t{64} << 20);
                eo.swa_pool = swa_pool.get();
                io.swa_state_bytes = shape->swa_state_bytes;
                io.swa_pool = swa_pool.get();
            }
            inbox = serving::KvInbox::start(io, inbox_store.get()).value();
        }
        auto eng = engine::Engine::create(model.get(), eo, Env::default_env());
        EXPECT_TRUE(eng.is_ok()) << eng.status().to_string();
        service = std::make_unique<server::EngineService>(std::move(eng).value());
        server::GenerationService* front = service.get();
        if (kv == Kv::kSends) {
            server::HandoffServiceOptions ho;
            ho.self = {"prefill", transfer::PeerRole::kPrefill, 1};
            std::unique_ptr<transfer::Transport> transport;
            if (send_faults) {
                static const std::unique_ptr<transfer::Transport> tcp =
                    transfer::make_tcp_transport();
                transport =
                    std::make_unique<transfer::FaultInjectingTransport>(tcp.get(), *send_faults);
            }
            handoff =
                std::make_unique<server::HandoffService>(service.get(), ho, std::move(transport));
            front = handoff.get();
        }
        if (kv == Kv::kSwaPeer && shape) {
            server::SwaPullServiceOptions po;
            po.pool = swa_pool.get();
            po.fetch.incarnation = 1;
            po.fetch.state_bytes = shape->swa_state_bytes;
            po.fetch.timeout = transfer::Timeout(5000);
            pull = std::make_unique<server::SwaPullService>(front, po);
            front = pull.get();
        }
        ctx = context();
        if (grammars) ctx.structured_output = &structured_output();
        http = std::make_unique<ServerThread>(&ctx, front, /*engine_rpc=*/true, drain_grace_ms,
                                              std::move(swa_states));
    }
    // As `serve` ends: the server drains and stops (it stays allocated), the engine
    // thread ends (its last sinks run into the hand-over service and the sessions),
    // then the hand-over threads, then the server goes.
    ~Engine() {
        http->stop();
        service->stop();
        pull.reset();
        handoff.reset();
        inbox.reset();
        fetch.reset();
        http.reset();
    }
    std::string transfer_address() const { return "127.0.0.1:" + std::to_string(inbox->port()); }
    std::unique_ptr<CausalLm> model;
    std::unique_ptr<kvstore::ShmBlockStore> inbox_store;
    std::unique_ptr<kv::SwaStatePool> swa_pool;  // V4 decode: the inbox's and engine's
    std::unique_ptr<serving::KvInbox> inbox;
    std::unique_ptr<server::EngineService> service;
    std::unique_ptr<server::HandoffService> handoff;
    std::unique_ptr<serving::SwaFetchServer> fetch;  // kSwaPeer
    std::unique_ptr<server::SwaPullService> pull;    // kSwaPeer
    server::ApiContext ctx;
    std::unique_ptr<ServerThread> http;
};

membership::Member member(std::string id, int port,
                          membership::Role role = membership::Role::kBoth) {
    membership::Member m;
    m.id = std::move(id);
    m.role = role;
    m.address = "127.0.0.1:" + std::to_string(port);
    m.incarnation = 1;
    return m;
}

// A socket listening on a free loopback port (its number in *port).
int listen_on_loopback(int* port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd, 16), 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    *port = ntohs(a.sin_port);
    return fd;
}

// A TCP proxy to `target_port` that cuts every connection (both ways) once
// `cut_after_bytes` of the answer went through: an engine that dies mid-stream.
class CutProxy {
public:
    CutProxy(int target_port, size_t cut_after_bytes)
        : target_port_(target_port), cut_after_(cut_after_bytes) {
        fd_ = listen_on_loopback(&port_);
        thread_ = std::thread([this] { loop(); });
    }
    ~CutProxy() {
        stop_ = true;
        ::shutdown(fd_, SHUT_RDWR);
        ::close(fd_);
        thread_.join();
    }
    int port() const { return port_; }
    int num_cut() const { return num_cut_; }

private:
    void loop() {
        while (!stop_) {
            const int c = ::accept(fd_, nullptr, nullptr);
            if (c < 0) return;
            const int t = ::socket(AF_INET, SOCK_STREAM, 0);
            sockaddr_in a{};
            a.sin_family = AF_INET;
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            a.sin_port = htons(static_cast<uint16_t>(target_port_));
            if (::connect(t, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) relay(c, t);
            ::close(t);
            ::close(c);
        }
    }
    void relay(int client, int target) {
        size_t answered = 0;
        char buf[4096];
        while (!stop_) {
            pollfd p[2] = {{client, POLLIN, 0}, {target, POLLIN, 0}};
            if (::poll(p, 2, 100) < 0) return;
            if (p[0].revents & (POLLIN | POLLHUP)) {
                const ssize_t n = ::recv(client, buf, sizeof(buf), 0);
                if (n <= 0) return;
                if (::send(target, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) return;
            }
            if (p[1].revents & (POLLIN | POLLHUP)) {
                ssize_t n = ::recv(target, buf, sizeof(buf), 0);
                if (n <= 0) return;
                const size_t room = cut_after_ - answered;
                const bool cut = static_cast<size_t>(n) >= room;
                if (cut) n = static_cast<ssize_t>(room);
                if (n > 0 && ::send(client, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) return;
                answered += static_cast<size_t>(n);
                if (cut) {
                    ++num_cut_;
                    return;  // both connections close: the "engine" died
                }
            }
        }
    }

    int target_port_;
    size_t cut_after_;
    int fd_ = -1;
    int port_ = 0;
    std::atomic<bool> stop_{false};
    std::atomic<int> num_cut_{0};
    std::thread thread_;
};

net::HttpResponse post(int port, const std::string& path, const std::string& body) {
    net::HttpClient client({"127.0.0.1", std::to_string(port), ""});
    net::HttpRequest req;
    req.path = path;
    req.body = body;
    req.headers = {{"Content-Type", "application/json"}};
    req.timeout_ms = 60000;
    auto r = net::fetch(client, req);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? *r : net::HttpResponse{};
}

std::string chat_body(bool stream, int max_tokens = 24) {
    return J{{"model", "m"},
             {"messages", J::array({J{{"role", "user"}, {"content", "Tell me a story"}}})},
             {"max_tokens", max_tokens},
             {"temperature", 0.8},
             {"seed", 1234},
             {"stream", stream}}
        .dump();
}

// The content of a Chat Completions SSE stream.
std::string sse_content(const std::string& body) {
    std::string content;
    size_t pos = 0;
    while ((pos = body.find("data: ", pos)) != std::string::npos) {
        const size_t end = body.find("\n\n", pos);
        const std::string data = body.substr(pos + 6, end - pos - 6);
        pos = end;
        if (data == "[DONE]") break;
        J j = J::parse(data, nullptr, false);
        if (j.is_discarded() || !j.contains("choices") || j["choices"].empty()) continue;
        const J& d = j["choices"][0]["delta"];
        if (d.contains("content") && d["content"].is_string()) {
            content += d["content"].get<std::string>();
        }
    }
    return content;
}

TEST(Router, AnswersAsTheEngineDoes) {
    Engine a, b;
    RemoteService remote;
    remote.set_engines({member("a", a.http->port()), member("b", b.http->port())});
    const server::ApiContext ctx = context();
    ServerThread router(&ctx, &remote, /*engine_rpc=*/false);

    const net::HttpResponse direct = post(a.http->port(), "/v1/chat/completions", chat_body(false));
    ASSERT_EQ(direct.status, 200) << direct.body;
    const std::string expected =
        J::parse(direct.body)["choices"][0]["message"]["content"].get<std::string>();
    EXPECT_FALSE(expected.empty());
    for (int i = 0; i < 2; ++i) {  // DecodeLb spreads them; both engines answer the same
        const net::HttpResponse routed =
            post(router.port(), "/v1/chat/completions", chat_body(false));
        ASSERT_EQ(routed.status, 200) << routed.body;
        EXPECT_EQ(J::parse(routed.body)["choices"][0]["message"]["content"], expected);
    }
    const net::HttpResponse streamed = post(router.port(), "/v1/chat/completions", chat_body(true));
    ASSERT_EQ(streamed.status, 200);
    EXPECT_EQ(sse_content(streamed.body), expected);
    EXPECT_EQ(remote.router_stats().num_routed, 3);
    EXPECT_EQ(remote.router_stats().num_failovers, 0);
}

// The grammar's options travel with its source: a JSON schema with
// flexible_whitespace and any_property_order gives the same output through the router
// as from one engine, and the options are in effect (with whitespace favoured, the
// flexible grammar's output is not the compact one's).
TEST(Router, AGrammarsOptionsReachTheEngine) {
    Engine a(2000, Kv::kNone, std::nullopt, false, nullptr, /*grammars=*/true);
    Engine b(2000, Kv::kNone, std::nullopt, false, nullptr, /*grammars=*/true);
    RemoteService remote;
    remote.set_engines({member("a", a.http->port()), member("b", b.http->port())});
    server::ApiContext ctx = context();
    ctx.structured_output = &structured_output();  // the router checks grammars too
    ServerThread router(&ctx, &remote, /*engine_rpc=*/false);

    J bias = J::object();
    for (const char* ws : {" ", "\n", "  "}) {
        for (int32_t id : tokenizer().encode(ws)) bias[std::to_string(id)] = 100;
    }
    const auto body = [&](bool options) {
        J schema = {{"type", "object"},
                    {"properties", {{"b", {{"type", "integer"}}}, {"a", {{"type", "string"}}}}},
                    {"required", J::array({"b", "a"})}};
        J format = {{"name", "x"}, {"schema", std::move(schema)}};
        if (options) {
            format["flexible_whitespace"] = true;
            format["any_property_order"] = true;
        }
        return J{{"model", "m"},
                 {"messages", J::array({J{{"role", "user"}, {"content", "Give me JSON"}}})},
                 {"max_tokens", 12},
                 {"temperature", 0},
                 {"logit_bias", bias},
                 {"response_format", {{"type", "json_schema"}, {"json_schema", format}}}}
            .dump();
    };
    const auto content = [](const net::HttpResponse& r) {
        return J::parse(r.body)["choices"][0]["message"]["content"].get<std::string>();
    };
    const net::HttpResponse direct = post(a.http->port(), "/v1/chat/completions", body(true));
    ASSERT_EQ(direct.status, 200) << direct.body;
    const net::HttpResponse compact = post(a.http->port(), "/v1/chat/completions", body(false));
    ASSERT_EQ(compact.status, 200) << compact.body;
    EXPECT_NE(content(direct), content(compact));
    for (int i = 0; i < 2; ++i) {  // both engines
        const net::HttpResponse routed = post(router.port(), "/v1/chat/completions", body(true));
        ASSERT_EQ(routed.status, 200) << routed.body;
        EXPECT_EQ(content(routed), content(direct));
    }
    EXPECT_EQ(remote.router_stats().num_routed, 2);
}

TEST(Router, AStreamCutMidwayFailsOverWithoutASeam) {
    Engine a, b;
    const net::HttpResponse direct = post(b.http->port(), "/v1/chat/completions", chat_body(false));
    ASSERT_EQ(direct.status, 200);
    const std::string expected =
        J::parse(direct.body)["choices"][0]["message"]["content"].get<std::string>();

    // "a" (first by id, chosen first) dies after ~5 update lines of its answer.
    CutProxy dying(a.http->port(), 900);
    RemoteService remote;
    remote.set_engines({member("a", dying.port()), member("b", b.http->port())});
    const server::ApiContext ctx = context();
    ServerThread router(&ctx, &remote, /*engine_rpc=*/false);
    const net::HttpResponse streamed = post(router.port(), "/v1/chat/completions", chat_body(true));
    ASSERT_EQ(streamed.status, 200);
    EXPECT_EQ(dying.num_cut(), 1);
    EXPECT_EQ(sse_content(streamed.body), expected);
    EXPECT_NE(streamed.body.find("[DONE]"), std::string::npos);
    const RouterStats s = remote.router_stats();
    EXPECT_EQ(s.num_failovers, 1);
    EXPECT_EQ(s.num_failed, 0);
    EXPECT_EQ(s.num_in_flight, 0);
    // The cut connection aborted the generation on engine a: nothing left running.
    for (int i = 0; i < 500 && a.service->stats_snapshot().num_running > 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(a.service->stats_snapshot().num_running, 0);
}

TEST(Router, AGenerationWaitsForAnEngineToJoin) {
    // Membership has gaps (every lease expires at once when etcd comes back after a
    // stop; a router starts before its engines): a request waits for an engine.
    Engine a;
    const net::HttpResponse direct = post(a.http->port(), "/v1/chat/completions", chat_body(false));
    ASSERT_EQ(direct.status, 200);
    RemoteService remote;
    const server::ApiContext ctx = context();
    ServerThread router(&ctx, &remote, /*engine_rpc=*/false);
    auto routed = std::async(std::launch::async, [&] {
        return post(router.port(), "/v1/chat/completions", chat_body(false));
    });
    for (int i = 0; i < 500 && remote.router_stats().engine_waiting == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(remote.router_stats().engine_waiting, 1);
    remote.apply({membership::ChangeKind::kJoined, member("a", a.http->port())});
    const net::HttpResponse r = routed.get();
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(J::parse(r.body)["choices"][0]["message"]["content"],
              J::parse(direct.body)["choices"][0]["message"]["content"]);
    EXPECT_EQ(remote.router_stats().num_engine_waits, 1);
    EXPECT_EQ(remote.router_stats().engine_waiting, 0);
}

TEST(Router, AStreamCutWithNoEngineLeftEndsWithTheErrorBeforeDone) {
    Engine a;
    // The only engine dies after ~5 update lines: the client must be told, in a way its
    // SDK sees -- the error event before [DONE], where OpenAI clients stop reading.
    CutProxy dying(a.http->port(), 900);
    RemoteServiceOptions o;
    o.no_engine_wait_ms = 100;
    RemoteService remote(o);
    remote.set_engines({member("a", dying.port())});
    const server::ApiContext ctx = context();
    ServerThread router(&ctx, &remote, /*engine_rpc=*/false);
    const net::HttpResponse streamed = post(router.port(), "/v1/chat/completions", chat_body(true));
    ASSERT_EQ(streamed.status, 200);
    EXPECT_EQ(dying.num_cut(), 1);
    EXPECT_FALSE(sse_content(streamed.body).empty());  // the part before the cut came
    const size_t error = streamed.body.find("event: error\ndata: {\"error\"");
    const size_t done = streamed.body.find("data: [DONE]");
    ASSERT_NE(error, std::string::npos) << streamed.body;
    ASSERT_NE(done, std::string::npos) << streamed.body;
    EXPECT_LT(error, done);
    EXPECT_NE(streamed.body.find("no engine is available"), std::string::npos);
    // Not dressed up as a complete answer.
    EXPECT_EQ(streamed.body.find("\"finish_reason\":\"stop\""), std::string::npos);
    EXPECT_EQ(remote.router_stats().num_failed, 1);
}

// A service may keep a generation's sink after its final update (the router's pump
// drops failed calls a moment later) and call or destroy it after the server is gone:
// neither may touch the server (this was a use-after-free in CI under ASan).
TEST(Router, ASinkKeptPastTheServerIsHarmless) {
    class KeepsSinks final : public server::GenerationService {
    public:
        void start(server::Ticket ticket, server::Generation, server::Sink sink) override {
            server::Update u;
            u.ticket = ticket;
            u.finished = true;
            u.error = unavailable("kept");
            sink(u);
            std::lock_guard lock(mu_);
            sinks_.push_back(std::move(sink));
        }
        void abort(server::Ticket) override {}
        void abort_all() override {}
        server::ServiceStats stats_snapshot() const override { return {}; }
        std::vector<server::Sink> take() {
            std::lock_guard lock(mu_);
            return std::move(sinks_);
        }

    private:
        std::mutex mu_;
        std::vector<server::Sink> sinks_;
    };
    KeepsSinks service;
    const server::ApiContext ctx = context();
    {
        ServerThread server(&ctx, &service, /*engine_rpc=*/false);
        for (bool stream : {false, true}) {
            const net::HttpResponse r =
                post(server.port(), "/v1/chat/completions", chat_body(stream));
            EXPECT_EQ(r.status, 503) << r.body;
            EXPECT_NE(r.body.find("kept"), std::string::npos) << r.body;
        }
    }
    std::vector<server::Sink> sinks = service.take();
    ASSERT_EQ(sinks.size(), 2u);
    server::Update late;
    late.finished = true;
    for (auto& sink : sinks) sink(late);  // dropped: nobody to deliver to
    sinks.clear();                        // the sessions are gone already
}

TEST(Router, RefusalsPassThroughAndNoEngineIs503) {
    Engine a;
    RemoteServiceOptions o;
    o.no_engine_wait_ms = 200;
    RemoteService remote(o);
    const server::ApiContext ctx = context();
    ServerThread router(&ctx, &remote, /*engine_rpc=*/false);
    // No engine yet, and none joins within the wait: 503 in the caller's protocol.
    net::HttpResponse r = post(router.port(), "/v1/chat/completions", chat_body(false));
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_NE(r.body.find("no engine is available"), std::string::npos) << r.body;
    EXPECT_EQ(remote.router_stats().num_engine_waits, 1);

    remote.apply({membership::ChangeKind::kJoined, member("a", a.http->port())});
    // A grammar the engine cannot compile (it has no structured output) is refused by
    // the engine with 501; the router passes it on and does not fail over. The router
    // itself has no structured output either, so it refuses first: ask for json_object
    // through an engine-only request instead.
    server::Generation g;
    g.request.prompt = {0, 1, 2};
    g.request.sampling.max_tokens = 4;
    g.structured = protocol::StructuredRequest{{grammar::GrammarKind::kJsonObject, ""}, "x"};
    std::promise<server::Update> done;
    remote.start(99, std::move(g), [&](server::Update u) {
        if (u.finished) done.set_value(std::move(u));
    });
    server::Update u = done.get_future().get();
    EXPECT_EQ(u.error.code(), StatusCode::kUnimplemented) << u.error.to_string();
    EXPECT_EQ(remote.router_stats().num_failovers, 0);

    // The engine leaves: 503 again.
    remote.apply({membership::ChangeKind::kLeft, member("a", a.http->port())});
    r = post(router.port(), "/v1/chat/completions", chat_body(false));
    EXPECT_EQ(r.status, 503);
}

TEST(Router, AbortEndsTheRemoteGeneration) {
    Engine a;
    RemoteService remote;
    remote.set_engines({member("a", a.http->port())});
    server::Generation g;
    g.request.prompt = {0, 1, 2};
    g.request.sampling.max_tokens = 100;
    g.request.sampling.ignore_eos = true;
    std::atomic<int> tokens{0};
    std::promise<server::Update> done;
    remote.start(7, std::move(g), [&](server::Update u) {
        tokens += static_cast<int>(u.tokens.size());
        if (u.finished) done.set_value(std::move(u));
    });
    while (tokens == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    remote.abort(7);
    server::Update u = done.get_future().get();
    EXPECT_EQ(u.reason, engine::FinishReason::kAbort);
    EXPECT_EQ(remote.router_stats().num_in_flight, 0);
    for (int i = 0; i < 500 && a.service->stats_snapshot().num_running > 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(a.service->stats_snapshot().num_running, 0);
    remote.abort(7);  // unknown now: nothing happens
}

// Runs `g` through `remote` and returns every token it streamed and the final update.
// The text the client got of the last run() (token texts concatenated).
std::string g_last_text;

std::pair<std::vector<int32_t>, server::Update> run(RemoteService& remote, server::Ticket t,
                                                    server::Generation g,
                                                    const std::function<void()>& after_first) {
    std::vector<int32_t> tokens;
    std::string text;
    std::mutex mu;
    std::promise<server::Update> done;
    std::promise<void> first;
    bool first_set = false;
    remote.start(t, std::move(g), [&](server::Update u) {
        std::lock_guard<std::mutex> l(mu);
        for (const auto& tok : u.tokens) {
            tokens.push_back(tok.token);
            text += tok.text;
        }
        if (!tokens.empty() && !first_set) {
            first_set = true;
            first.set_value();
        }
        if (u.finished) done.set_value(std::move(u));
    });
    first.get_future().wait();
    if (after_first) after_first();
    server::Update last = done.get_future().get();
    std::lock_guard<std::mutex> l(mu);
    g_last_text = text;
    return {tokens, last};
}

server::Generation long_generation() {
    server::Generation g;
    g.request.prompt = {0, 7, 11, 13};
    g.request.sampling.max_tokens = 100;
    g.request.sampling.ignore_eos = true;
    g.request.sampling.temperature = 0.9;
    g.request.sampling.seed = 77;
    return g;
}

TEST(Router, AnEngineThatLeavesAndComesBackMidStreamKeepsTakingRequests) {
    // When etcd comes back after a stop, every lease has expired: each engine leaves and
    // publishes itself again while its streams go on. What those streams hold must
    // count on the engine's new record, or their ends drive its counts below zero.
    Engine a;
    RemoteServiceOptions o;
    o.no_engine_wait_ms = 100;
    RemoteService remote(o);
    remote.set_engines({member("a", a.http->port())});
    const auto [tokens, last] = run(remote, 1, long_generation(), [&] {
        remote.apply({membership::ChangeKind::kLeft, member("a", a.http->port())});
        remote.apply({membership::ChangeKind::kJoined, member("a", a.http->port())});
    });
    EXPECT_TRUE(last.error.is_ok()) << last.error.to_string();
    EXPECT_EQ(tokens.size(), 100u);
    for (int i = 0; i < 3; ++i) {
        const auto [more, more_last] = run(remote, 2 + i, long_generation(), nullptr);
        EXPECT_TRUE(more_last.error.is_ok()) << more_last.error.to_string();
        EXPECT_EQ(more, tokens);
    }
    EXPECT_EQ(remote.router_stats().num_failed, 0);
    EXPECT_EQ(remote.router_stats().requests_on_engine.at("a"), 0);
}

TEST(Router, AnEngineDrainingPastItsGraceHandsItsGenerationsOver) {
    Engine a(/*drain_grace_ms=*/0), b;
    RemoteService only_b;
    only_b.set_engines({member("b", b.http->port())});
    const auto [expected, expected_last] = run(only_b, 1, long_generation(), nullptr);
    ASSERT_EQ(expected.size(), 100u);

    RemoteService remote;
    remote.set_engines({member("a", a.http->port()), member("b", b.http->port())});
    // a (first by id) gets it; after its first token a drains with no grace: it aborts
    // the generation, which goes on at b.
    const auto [tokens, last] = run(remote, 2, long_generation(), [&] {
        remote.apply({membership::ChangeKind::kLeft, member("a", a.http->port())});
        a.http->stop();
    });
    EXPECT_TRUE(last.error.is_ok()) << last.error.to_string();
    EXPECT_EQ(last.reason, engine::FinishReason::kLength);
    EXPECT_EQ(tokens, expected);
    EXPECT_EQ(remote.router_stats().num_failovers, 1);
}

TEST(Router, ADrainedGenerationDoesNotUseUpAnAttempt) {
    // A drain moves generations on purpose: even with one attempt per generation, the
    // move to the next engine happens (a broken engine would have used it up).
    Engine a(/*drain_grace_ms=*/0), b;
    RemoteService only_b;
    only_b.set_engines({member("b", b.http->port())});
    const auto [expected, expected_last] = run(only_b, 1, long_generation(), nullptr);
    RemoteServiceOptions o;
    o.max_attempts = 1;
    RemoteService remote(o);
    remote.set_engines({member("a", a.http->port()), member("b", b.http->port())});
    const auto [tokens, last] = run(remote, 2, long_generation(), [&] {
        remote.apply({membership::ChangeKind::kLeft, member("a", a.http->port())});
        a.http->stop();
    });
    EXPECT_TRUE(last.error.is_ok()) << last.error.to_string();
    EXPECT_EQ(tokens, expected);
    EXPECT_EQ(remote.router_stats().num_failovers, 1);
    EXPECT_EQ(remote.router_stats().num_failed, 0);
}

TEST(Router, DisaggregatedPrefillHandsOverToDecodeAfterTheFirstToken) {
    Engine p, d;
    RemoteService only_d;
    only_d.set_engines({member("d", d.http->port())});
    const auto [expected, expected_last] = run(only_d, 1, long_generation(), nullptr);

    RemoteService remote;
    remote.set_engines({member("p", p.http->port(), membership::Role::kPrefill),
                        member("d", d.http->port(), membership::Role::kDecode)});
    const auto [tokens, last] = run(remote, 2, long_generation(), nullptr);
    EXPECT_TRUE(last.error.is_ok()) << last.error.to_string();
    EXPECT_EQ(last.reason, engine::FinishReason::kLength);
    EXPECT_EQ(tokens, expected);
    const RouterStats s = remote.router_stats();
    EXPECT_EQ(s.num_handovers, 1);
    EXPECT_EQ(s.num_failovers, 0);
    // The prefill engine gave the generation up after its first token.
    for (int i = 0; i < 500 && p.service->stats_snapshot().num_running > 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(p.service->stats_snapshot().num_running, 0);
    EXPECT_LT(p.service->stats_snapshot().engine.output_tokens, 10);

    // S-KV-4: a request whose prompt the store holds (the check says so before routing)
    // skips prefill and goes straight to the decode engine.
    RemoteServiceOptions with_hits;
    with_hits.prefix_hit = [](const engine::GenerateRequest& r) {
        return static_cast<int64_t>(r.prompt.size());
    };
    RemoteService checked(with_hits);
    checked.set_engines({member("p", p.http->port(), membership::Role::kPrefill),
                         member("d", d.http->port(), membership::Role::kDecode)});
    const auto [direct, direct_last] = run(checked, 4, long_generation(), nullptr);
    EXPECT_EQ(direct, expected);
    EXPECT_EQ(checked.router_stats().num_handovers, 0);
    EXPECT_EQ(checked.router_stats().num_direct_decode, 1);
    EXPECT_EQ(checked.router_stats().num_prefix_checks, 1);
    EXPECT_EQ(checked.router_stats().prefix_hit_tokens, 4);

    // Without a decode engine the prefill engine runs it all.
    RemoteService prefill_only;
    prefill_only.set_engines({member("p", p.http->port(), membership::Role::kPrefill)});
    const auto [alone, alone_last] = run(prefill_only, 3, long_generation(), nullptr);
    EXPECT_EQ(alone, expected);
    EXPECT_EQ(prefill_only.router_stats().num_handovers, 0);
}

// A "prefill engine" that never answers: a listening socket nobody accepts on (the
// kernel completes the connection, the request sits unread).
class SilentEngine {
public:
    SilentEngine() { fd_ = listen_on_loopback(&port_); }
    ~SilentEngine() { ::close(fd_); }
    int port() const { return port_; }

private:
    int fd_ = -1;
    int port_ = 0;
};

// S-LB prefill: new generations wait in the router and prefill engines pull them while
// the prefill cost they hold is under their bucket's cap (here 1 ns: one at a time; an
// empty engine always takes the head). A silent prefill engine holds its first pull for
// ever, so the rest wait, deterministically: an abort ends a waiting one without any
// engine seeing it, a deadline fails one, and when a real prefill engine joins (the LB
// is rebuilt with the waiting work) it pulls the waiting one; when the silent one leaves,
// its quiet stream is cut and fails over to the real one. Every client gets exactly the
// tokens a single decode engine gives.
TEST(Router, PrefillEnginesPullWaitingGenerationsWithinTheirQuota) {
    Engine p, d;
    RemoteService only_d;
    only_d.set_engines({member("d", d.http->port())});
    auto generation = [](uint64_t seed) {
        server::Generation g = long_generation();
        g.request.sampling.max_tokens = 12;
        g.request.sampling.seed = seed;
        return g;
    };
    std::map<server::Ticket, std::vector<int32_t>> expected;
    for (server::Ticket t : {1, 2})
        expected[t] = run(only_d, 100 + t, generation(t), nullptr).first;

    SilentEngine silent;
    RemoteServiceOptions o;
    o.prefill_lb.bucket_quota_ns = {1, 1, 1, 1};
    o.prefill_cost_ns = [](int64_t miss, int64_t) { return static_cast<double>(miss); };
    o.pump_interval_ms = 10;
    RemoteService remote(o);
    remote.set_engines({member("s", silent.port(), membership::Role::kPrefill),
                        member("d", d.http->port(), membership::Role::kDecode)});
    struct Client {
        std::mutex mu;
        std::vector<int32_t> tokens;
        std::promise<server::Update> done;
    };
    std::map<server::Ticket, Client> clients;
    for (server::Ticket t : {1, 2, 3, 4}) {
        server::Generation g = generation(t);
        if (t == 4) g.request.deadline_ns = steady_clock_ns() + 300'000'000;
        Client& c = clients[t];
        remote.start(t, std::move(g), [&c](server::Update u) {
            std::lock_guard<std::mutex> l(c.mu);
            for (const auto& tok : u.tokens) c.tokens.push_back(tok.token);
            if (u.finished) c.done.set_value(std::move(u));
        });
    }
    RouterStats s = remote.router_stats();
    EXPECT_EQ(s.num_prefill_queued, 4);
    EXPECT_EQ(s.num_routed, 1);  // the silent engine pulled the first, holds it
    EXPECT_EQ(s.prefill_waiting, 3);

    remote.abort(3);
    server::Update aborted = clients[3].done.get_future().get();
    EXPECT_EQ(aborted.reason, engine::FinishReason::kAbort);
    EXPECT_EQ(remote.router_stats().prefill_waiting, 2);

    server::Update late = clients[4].done.get_future().get();
    EXPECT_EQ(late.error.code(), StatusCode::kDeadlineExceeded) << late.error.to_string();
    EXPECT_EQ(remote.router_stats().prefill_waiting, 1);
    EXPECT_EQ(remote.router_stats().num_routed, 1);

    remote.apply(
        {membership::ChangeKind::kJoined, member("p", p.http->port(), membership::Role::kPrefill)});
    remote.apply(
        {membership::ChangeKind::kLeft, member("s", silent.port(), membership::Role::kPrefill)});
    for (server::Ticket t : {1, 2}) {
        server::Update last = clients[t].done.get_future().get();
        EXPECT_TRUE(last.error.is_ok()) << t << ": " << last.error.to_string();
        EXPECT_EQ(last.reason, engine::FinishReason::kLength);
        std::lock_guard<std::mutex> l(clients[t].mu);
        EXPECT_EQ(clients[t].tokens, expected[t]) << t;
    }
    s = remote.router_stats();
    EXPECT_EQ(s.prefill_waiting, 0);
    EXPECT_EQ(s.num_routed, 2);     // ticket 2, pulled by p
    EXPECT_EQ(s.num_failovers, 1);  // ticket 1, from the silent engine to p
    EXPECT_EQ(s.num_handovers, 2);
    EXPECT_EQ(s.num_failed, 1);  // the deadline
    // Both prefills ran on p: a first token each (it may sample one more before the
    // router's close reaches it), never the whole generation.
    EXPECT_GE(p.service->stats_snapshot().engine.output_tokens, 2);
    EXPECT_LT(p.service->stats_snapshot().engine.output_tokens, 12);
}

// A prefill engine that held several generations and finished them all is empty again,
// exactly: costs 0.1 + 0.2 + 0.3 taken off in any order leave a rounding residue, and an
// engine that is not empty never pulls a prompt that costs more than its whole quota (the
// live router stalled with 273 generations waiting behind one). Here the fourth prompt
// costs 5 against a quota of 1: it runs only once the engine counts as empty.
TEST(Router, APrefillEngineThatFinishedEverythingPullsAPromptLargerThanItsQuota) {
    Engine p, d;
    RemoteServiceOptions o;
    o.prefill_lb.bucket_quota_ns = {1, 1, 1, 1};
    // By prompt length: 4, 5 and 6 tokens cost 0.1, 0.2 and 0.3; 7 tokens cost 5.
    o.prefill_cost_ns = [](int64_t miss, int64_t) {
        return miss == 4 ? 0.1 : miss == 5 ? 0.2 : miss == 6 ? 0.3 : 5.0;
    };
    o.pump_interval_ms = 10;
    RemoteService remote(o);
    remote.set_engines({member("p", p.http->port(), membership::Role::kPrefill),
                        member("d", d.http->port(), membership::Role::kDecode)});
    struct Client {
        std::promise<server::Update> done;
    };
    std::map<server::Ticket, Client> clients;
    for (server::Ticket t : {1, 2, 3, 4}) {
        server::Generation g = long_generation();
        g.request.prompt.resize(3 + t, 13);  // 4, 5, 6, 7 tokens
        g.request.sampling.max_tokens = 4;
        g.request.sampling.seed = t;
        // Fails the test (not hangs it) if the fourth is never pulled.
        g.request.deadline_ns = steady_clock_ns() + 20'000'000'000;
        Client& c = clients[t];
        remote.start(t, std::move(g), [&c](server::Update u) {
            if (u.finished) c.done.set_value(std::move(u));
        });
    }
    EXPECT_EQ(remote.router_stats().num_routed, 3);  // 0.1 + 0.2 + 0.3 within the quota
    for (server::Ticket t : {1, 2, 3, 4}) {
        server::Update last = clients[t].done.get_future().get();
        EXPECT_TRUE(last.error.is_ok()) << t << ": " << last.error.to_string();
        EXPECT_EQ(last.reason, engine::FinishReason::kLength) << t;
    }
    const RouterStats s = remote.router_stats();
    EXPECT_EQ(s.num_routed, 4);
    EXPECT_EQ(s.prefill_waiting, 0);
    EXPECT_EQ(s.num_failed, 0);
}

// The KV hand-over: the prefill engine sends the prompt's full blocks to the decode
// engine's inbox (its shm store tier) before the router continues there, so the decode
// engine computes only the partial last block and the first token; the client's tokens
// are one engine's. A decode engine whose inbox is gone costs the hand-over, not the
// generation (the prompt is computed again).
TEST(Router, TheKvHandOffLetsTheDecodeEngineSkipThePromptsFullBlocks) {
    Engine ref, p(2000, Kv::kSends), d(2000, Kv::kReceives);
    server::Generation g = long_generation();
    g.request.prompt.clear();
    for (int i = 0; i < 2 * 128 + 44; ++i) g.request.prompt.push_back(100 + (i * 37) % 5000);
    // A stop string that begins with the first token's text and never completes: an
    // engine holds that text back until the next token rules the stop out. The client's
    // text must not depend on where the generation was split.
    {
        server::Generation probe = g;
        probe.request.sampling.max_tokens = 1;
        RemoteService only_ref;
        only_ref.set_engines({member("ref", ref.http->port())});
        (void)run(only_ref, 9, probe, nullptr);
        ASSERT_FALSE(g_last_text.empty());
        g.request.sampling.stop = {g_last_text + "\x01never"};
    }
    RemoteService only_ref;
    only_ref.set_engines({member("ref", ref.http->port())});
    const auto [expected, expected_last] = run(only_ref, 1, g, nullptr);
    ASSERT_EQ(expected.size(), 100u);
    const std::string expected_text = g_last_text;

    membership::Member dm = member("d", d.http->port(), membership::Role::kDecode);
    dm.transfer_address = d.transfer_address();
    RemoteService remote;
    remote.set_engines({member("p", p.http->port(), membership::Role::kPrefill), dm});
    const auto [tokens, last] = run(remote, 2, g, nullptr);
    EXPECT_TRUE(last.error.is_ok()) << last.error.to_string();
    EXPECT_EQ(last.reason, engine::FinishReason::kLength);
    EXPECT_EQ(tokens, expected);
    EXPECT_EQ(g_last_text, expected_text);
    // usage.cached_tokens is the prefill engine's (cold: 0), not the decode engine's
    // hits on the handed-over blocks.
    EXPECT_EQ(last.cached_prompt_tokens, 0);
    const RouterStats s = remote.router_stats();
    EXPECT_EQ(s.num_handovers, 1);
    EXPECT_EQ(s.num_kv_handoffs, 1);
    EXPECT_EQ(s.kv_handoff_blocks, 2);
    EXPECT_EQ(s.num_failovers, 0);
    EXPECT_EQ(p.handoff->handoff_stats().num_sent, 1);
    EXPECT_EQ(d.inbox->stats().blocks_stored, 2);
    const engine::EngineStats de = d.service->stats_snapshot().engine;
    EXPECT_EQ(de.store_hit_blocks, 2);
    EXPECT_EQ(de.computed_prefill_tokens, 44 + 1);  // the partial block + the first token
    EXPECT_EQ(p.service->stats_snapshot().engine.output_tokens, 1);

    // The decode engine's inbox is gone: the hand-over fails, the generation does not.
    Engine d2;
    membership::Member gone = member("d2", d2.http->port(), membership::Role::kDecode);
    const uint16_t closed_port = d.inbox->port();
    d.inbox.reset();
    gone.transfer_address = "127.0.0.1:" + std::to_string(closed_port);
    RemoteService broken;
    broken.set_engines({member("p", p.http->port(), membership::Role::kPrefill), gone});
    const auto [again, again_last] = run(broken, 3, g, nullptr);
    EXPECT_TRUE(again_last.error.is_ok()) << again_last.error.to_string();
    EXPECT_EQ(again, expected);
    EXPECT_EQ(broken.router_stats().num_kv_handoffs_failed, 1);
    EXPECT_EQ(broken.router_stats().num_handovers, 1);
    EXPECT_EQ(d2.service->stats_snapshot().engine.computed_prefill_tokens, 300 + 1);
}

// V4 (tiny-v4): the prefill engine hands over the blocks of every cache group up to its
// store position P and the SWA state at P; the decode engine continues from P (one exact
// SWA hit, nothing replayed) and the router streams what one engine streams.
TEST(Router, AV4HandOffCarriesTheSwaStateAndTheStreamIsOneEngines) {
    Engine ref(2000, Kv::kNone, std::nullopt, true);
    Engine p(2000, Kv::kSends, std::nullopt, true), d(2000, Kv::kReceives, std::nullopt, true);
    server::Generation g = long_generation();
    g.request.sampling.max_tokens = 12;
    g.request.prompt.clear();
    for (int i = 0; i < 2 * 128 + 44; ++i) g.request.prompt.push_back(100 + (i * 37) % 5000);
    RemoteService only_ref;
    only_ref.set_engines({member("ref", ref.http->port())});
    const auto [expected, expected_last] = run(only_ref, 1, g, nullptr);
    ASSERT_EQ(expected.size(), 12u);

    membership::Member dm = member("d", d.http->port(), membership::Role::kDecode);
    dm.transfer_address = d.transfer_address();
    RemoteService remote;
    remote.set_engines({member("p", p.http->port(), membership::Role::kPrefill), dm});
    const auto [tokens, last] = run(remote, 2, g, nullptr);
    EXPECT_TRUE(last.error.is_ok()) << last.error.to_string();
    EXPECT_EQ(tokens, expected);
    const RouterStats s = remote.router_stats();
    EXPECT_EQ(s.num_kv_handoffs, 1);
    EXPECT_EQ(s.kv_handoff_blocks, 2);  // P = 256
    EXPECT_EQ(d.inbox->stats().blocks_stored, 2);
    EXPECT_EQ(d.inbox->stats().states_stored, 1);
    const engine::EngineStats de = d.service->stats_snapshot().engine;
    EXPECT_EQ(de.swa.total().swa_exact_hits, 1);
    EXPECT_EQ(de.swa.total().replays, 0);
    EXPECT_EQ(de.store_hit_blocks, 2);
    EXPECT_EQ(de.computed_prefill_tokens, 44 + 1);  // [256, 300) and the first token
}

// A hand-over damaged on the wire (one byte of the first data frame flipped) fails the
// inbox's digest check: nothing is stored, the router continues on the decode engine
// anyway, and the stream is still one engine's.
TEST(Router, ACorruptedHandOffIsRefusedAndTheStreamIsUnchanged) {
    transfer::FaultPlan corrupt;
    corrupt.corrupt_rate = 1.0;
    corrupt.spare_first_writes = 2;  // Hello and Begin pass; the first State frame does not
    Engine ref, p(2000, Kv::kSends, corrupt), d(2000, Kv::kReceives);
    server::Generation g = long_generation();
    g.request.prompt.clear();
    for (int i = 0; i < 2 * 128 + 10; ++i) g.request.prompt.push_back(200 + (i * 53) % 4000);
    RemoteService only_ref;
    only_ref.set_engines({member("ref", ref.http->port())});
    const auto [expected, expected_last] = run(only_ref, 1, g, nullptr);

    membership::Member dm = member("d", d.http->port(), membership::Role::kDecode);
    dm.transfer_address = d.transfer_address();
    RemoteService remote;
    remote.set_engines({member("p", p.http->port(), membership::Role::kPrefill), dm});
    const auto [tokens, last] = run(remote, 2, g, nullptr);
    EXPECT_TRUE(last.error.is_ok()) << last.error.to_string();
    EXPECT_EQ(tokens, expected);
    EXPECT_EQ(remote.router_stats().num_kv_handoffs_failed, 1);
    EXPECT_EQ(remote.router_stats().num_kv_handoffs, 0);
    for (int i = 0; i < 500 && d.inbox->stats().num_failed == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(d.inbox->stats().num_failed, 1);
    EXPECT_EQ(d.inbox->stats().blocks_stored, 0);
    EXPECT_EQ(d.service->stats_snapshot().engine.computed_prefill_tokens, 2 * 128 + 10 + 1);
}

// S-KV-8..10 across engines: request A's prefill leaves its SWA state at 256 on the
// engine that ran it (b-holder); the router's directory learns it from that engine's
// announcements. Request B shares A's first 256 tokens and goes to another engine
// (a-puller, which the LB picks on a tie): the router plans the hit (L1 = 256, a state
// there -> hit 256) and tells a-puller where the state is; a-puller pulls it over
// transfer/ and starts from it (one exact SWA hit, [256, 400) computed). B's tokens are
// one engine's without any cache. A state the holder has dropped since (the directory
// is a hint) fails the pull; that request still completes, computed from 0.
TEST(Router, AV4PrefixHitPullsTheSwaStateFromTheEngineThatHoldsIt) {
    kvstore::ShmStoreOptions so;
    so.name = "dsi_router_test_swa_" + std::to_string(::getpid());
    so.num_slots = 32;
    so.slot_bytes = int64_t{1} << 20;
    so.unlink_on_close = true;
    std::unique_ptr<kvstore::ShmBlockStore> store = kvstore::ShmBlockStore::open(so).value();
    Engine holder(2000, Kv::kSwaPeer, std::nullopt, true, store.get());
    Engine puller(2000, Kv::kSwaPeer, std::nullopt, true, store.get());
    const auto shape = engine::store_block_shape(*holder.model).value();
    ASSERT_LE(kvstore::header_bytes(shape.num_layers()) + shape.block_bytes(), uint64_t{1} << 20);
    const std::string model_id = engine::EngineOptions{}.model_id;
    auto chain = [model_id](const engine::GenerateRequest& r) {
        return kv::chain_keys(r.prompt, kv::make_salt(model_id, r.cache_salt));
    };
    auto store_blocks = [&store, chain](const engine::GenerateRequest& r) {
        std::vector<kvstore::StoreKey> keys;
        for (const kv::BlockKey& k : chain(r)) keys.push_back({k.lo, k.hi});
        Result<int64_t> n = store->match_prefix(keys, steady_clock_ns() + 1000000000);
        return n.is_ok() ? *n : int64_t{-1};
    };
    RemoteServiceOptions ro;
    ro.prefix_hit = [store_blocks](const engine::GenerateRequest& r) {
        const int64_t n = store_blocks(r);
        return n < 0 ? n : n * kv::kBlockTokens;
    };
    ro.swa_chain_keys = chain;
    ro.swa_directory.poll_interval_ms = 3600 * 1000;  // polled by hand (poll_now)
    RemoteService remote(ro);
    const membership::Member hm = member("b-holder", holder.http->port());
    const membership::Member pm = member("a-puller", puller.http->port());
    RemoteService only_puller;  // the reference: B computed from 0 on one engine
    only_puller.set_engines({pm});

    server::Ticket ticket = 1;
    // One round: A on the holder, B's reference, then B through both engines. Returns the
    // prefill tokens the puller computed for the routed B.
    auto round = [&](int salt, bool drop_state) {
        server::Generation a = long_generation();
        a.request.sampling.max_tokens = 4;
        a.request.prompt.clear();
        for (int i = 0; i < 300; ++i) a.request.prompt.push_back(100 + (i * 37 + salt) % 5000);
        server::Generation b = a;
        b.request.prompt.resize(256);
        for (int i = 0; i < 144; ++i) b.request.prompt.push_back(300 + (i * 11 + salt) % 4000);
        b.request.sampling.max_tokens = 8;
        const kv::SwaStateKey key = kv::swa_state_key(chain(b.request), 256);

        remote.set_engines({hm});
        const auto [a_tokens, a_last] = run(remote, ticket++, a, nullptr);
        EXPECT_TRUE(a_last.error.is_ok()) << a_last.error.to_string();
        // The holder's state reaches the directory, with no announcement left in flight
        // (one could name the drop below).
        for (int i = 0; i < 500; ++i) {
            remote.swa_directory()->poll_now();
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            const SwaDirectoryServiceStats st = remote.swa_directory()->stats();
            if (store_blocks(b.request) >= 2 && !remote.swa_directory()->holders(key).empty() &&
                st.num_answers == st.num_polls) {
                break;
            }
        }
        EXPECT_TRUE(holder.swa_pool->contains(key));
        // The reference (its state goes at 384, not 256: nothing for the puller to hold).
        const auto [expected, expected_last] = run(only_puller, ticket++, b, nullptr);
        EXPECT_EQ(expected.size(), 8u);
        EXPECT_FALSE(puller.swa_pool->contains(key));
        if (drop_state) {
            EXPECT_TRUE(holder.swa_pool->erase(key));  // the directory is stale
        }
        const int64_t computed = puller.service->stats_snapshot().engine.computed_prefill_tokens;
        remote.set_engines({pm, hm});
        const auto [tokens, last] = run(remote, ticket++, b, nullptr);
        EXPECT_TRUE(last.error.is_ok()) << last.error.to_string();
        EXPECT_EQ(tokens, expected);
        return puller.service->stats_snapshot().engine.computed_prefill_tokens - computed;
    };

    EXPECT_EQ(round(0, /*drop_state=*/false), 400 - 256);
    EXPECT_EQ(puller.pull->pull_stats().num_pulls, 1);
    EXPECT_EQ(puller.pull->pull_stats().num_failed, 0);
    const engine::EngineStats first = puller.service->stats_snapshot().engine;
    EXPECT_EQ(first.swa.total().swa_exact_hits, 1);
    EXPECT_EQ(first.swa.total().replays, 0);
    const SwaDirectoryServiceStats d = remote.swa_directory()->stats();
    EXPECT_EQ(d.num_state_hits, 1);  // B (A had no prefix hit)
    EXPECT_EQ(d.hit_tokens, 256);
    EXPECT_EQ(remote.router_stats().num_swa_pull_hints, 1);
    EXPECT_EQ(holder.fetch->stats().num_served, 1);

    EXPECT_EQ(round(1, /*drop_state=*/true), 400);  // no state: computed from 0
    EXPECT_EQ(remote.router_stats().num_swa_pull_hints, 2);
    EXPECT_EQ(puller.pull->pull_stats().num_pulls, 1);
    EXPECT_EQ(puller.pull->pull_stats().num_failed, 1);  // NOT_FOUND at the holder
    EXPECT_EQ(holder.fetch->stats().num_not_found, 1);
    EXPECT_EQ(puller.service->stats_snapshot().engine.swa.total().swa_exact_hits, 1);
}

// Two routers split the SWA directory's keys (swa_owner) and ask each other for the
// rest: every key is found from either router, each holds only its part, and a router
// that stops answering costs the other only the state (a replay plan, counted).
TEST(Router, TheSwaDirectoryIsSplitOverRoutersThatAskEachOther) {
    server::ApiContext ctx = context();
    RemoteService idle;  // the servers' generation service (never used)
    std::vector<std::vector<kv::BlockKey>> chains;
    std::vector<kv::SwaStateKey> states;
    for (uint64_t i = 0; i < 16; ++i) {
        chains.push_back({kv::BlockKey{i, 1}, kv::BlockKey{i, 2}});
        states.push_back(kv::swa_state_key(chains.back(), 256));
    }
    ServerThread engine(&ctx, &idle, /*engine_rpc=*/true, 2000, [states](std::string_view) {
        server::SwaAnnouncementReply r;
        r.incarnation = 1;
        r.fetch_address = "127.0.0.1:1";
        r.changes.next = 1;
        r.changes.snapshot = true;
        r.changes.added = states;
        return server::encode_swa_announcement(r);
    });
    SwaDirectoryServiceOptions o1;
    o1.self_id = "r1";
    o1.poll_interval_ms = 3600 * 1000;
    o1.lookup_timeout_ms = 5000;
    SwaDirectoryServiceOptions o2 = o1;
    o2.self_id = "r2";
    SwaDirectoryService d1(o1), d2(o2);
    ServerThread s1(&ctx, &idle, false, 2000, nullptr,
                    [&d1](std::string_view t) { return d1.answer_lookup(t); });
    ServerThread s2(&ctx, &idle, false, 2000, nullptr,
                    [&d2](std::string_view t) { return d2.answer_lookup(t); });
    const std::vector<membership::Member> members = {
        member("r1", s1.port(), membership::Role::kRouter),
        member("r2", s2.port(), membership::Role::kRouter), member("e", engine.port())};
    d1.set_members(members);
    d2.set_members(members);
    for (int i = 0; i < 500; ++i) {
        d1.poll_now();
        d2.poll_now();
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (d1.stats().directory.announcements >= 1 && d2.stats().directory.announcements >= 1) {
            break;
        }
    }
    const int64_t n1 = d1.stats().directory.num_states, n2 = d2.stats().directory.num_states;
    EXPECT_EQ(n1 + n2, 16);  // each holds its part
    EXPECT_GT(n1, 0);
    EXPECT_GT(n2, 0);
    EXPECT_EQ(d1.stats().num_routers, 2);
    for (size_t i = 0; i < chains.size(); ++i) {
        for (SwaDirectoryService* d : {&d1, &d2}) {
            const SwaRoutePlan p = d->plan(chains[i], 400, 256);
            EXPECT_EQ(p.plan.kind, kv::SwaHitKind::kExact) << i;
            EXPECT_EQ(p.plan.hit_tokens, 256);
            EXPECT_EQ(p.key, states[i]);
            ASSERT_EQ(p.holders.size(), 1u) << i;
            EXPECT_EQ(p.holders[0].engine, "e");
        }
    }
    // A plan asks about L1 = 256 and L1 - 128 = 128: one lookup when the other router
    // owns either key.
    const std::vector<std::string> routers = {"r1", "r2"};
    int64_t asks_r2 = 0, asks_r1 = 0;
    for (const auto& chain : chains) {
        const int o256 = cluster::swa_owner(to_state_id(kv::swa_state_key(chain, 256)), routers);
        const int o128 = cluster::swa_owner(to_state_id(kv::swa_state_key(chain, 128)), routers);
        asks_r2 += (o256 == 1 || o128 == 1) ? 1 : 0;
        asks_r1 += (o256 == 0 || o128 == 0) ? 1 : 0;
    }
    EXPECT_EQ(d1.stats().num_remote_lookups, asks_r2);
    EXPECT_EQ(d2.stats().num_remote_lookups, asks_r1);
    EXPECT_EQ(d1.stats().num_remote_lookup_failures, 0);
    // r2 stops answering: its keys are a replay at r1 (hit 256 - 128), never an error.
    s2.stop();
    int64_t replays = 0;
    for (const auto& chain : chains) {
        const SwaRoutePlan p = d1.plan(chain, 400, 256);
        if (p.plan.kind == kv::SwaHitKind::kReplay) {
            ++replays;
            EXPECT_EQ(p.plan.hit_tokens, 128);
            EXPECT_TRUE(p.holders.empty());
        }
    }
    EXPECT_EQ(replays, n2);
    EXPECT_EQ(d1.stats().num_remote_lookup_failures, asks_r2);
}

}  // namespace
}  // namespace dsi::router
