// loadgen: SSE parsing (incl. malformed input), the HTTP client against a tiny in-test
// server (streamed bodies, connection refused, timeouts, cancellation), datasets and the
// runner's timing and error accounting.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loadgen/dataset.h"
#include "loadgen/load_runner.h"
#include "loadgen/report.h"
#include "loadgen/sse.h"
#include "net/http_client.h"

namespace dsi::loadgen {
namespace {

// ---- SSE ----

TEST(Sse, EventsAcrossArbitrarySplitsAndLineEndings) {
    const std::string stream =
        ": keep-alive\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: l1\ndata: l2\n\ndata:[DONE]\r\r";
    for (size_t split = 0; split <= stream.size(); ++split) {
        SseParser p;
        std::vector<SseEvent> ev;
        ASSERT_TRUE(p.feed(stream.substr(0, split), ev).is_ok());
        ASSERT_TRUE(p.feed(stream.substr(split), ev).is_ok());
        ASSERT_EQ(ev.size(), 3u) << split;
        EXPECT_EQ(ev[0].data, "{\"a\":1}");
        EXPECT_EQ(ev[1].event, "x");
        EXPECT_EQ(ev[1].data, "l1\nl2");
        EXPECT_EQ(ev[2].data, "[DONE]");
        EXPECT_FALSE(p.has_partial());
    }
}

TEST(Sse, OverlongLineIsAnError) {
    SseParser p(64);
    std::vector<SseEvent> ev;
    EXPECT_EQ(p.feed("data: " + std::string(100, 'x'), ev).code(), StatusCode::kInvalidArgument);
    SseParser q(64);
    std::string many;
    for (int i = 0; i < 10; ++i) many += "data: " + std::string(20, 'y') + "\n";
    EXPECT_EQ(q.feed(many, ev).code(), StatusCode::kInvalidArgument);
}

TEST(Sse, ChunkParsing) {
    auto c = parse_stream_chunk(
        R"({"choices":[{"delta":{"reasoning_content":"r","content":"hi"},"finish_reason":null}]})");
    ASSERT_TRUE(c.is_ok());
    EXPECT_EQ(c->text, "rhi");
    EXPECT_FALSE(c->finished);
    c = parse_stream_chunk(
        R"({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,)"
        R"("prompt_tokens_details":{"cached_tokens":2}}})");
    ASSERT_TRUE(c.is_ok());
    ASSERT_TRUE(c->usage.has_value());
    EXPECT_EQ(c->usage->prompt_tokens, 5);
    EXPECT_EQ(c->usage->completion_tokens, 3);
    EXPECT_EQ(c->usage->cached_tokens, 2);
    EXPECT_TRUE(parse_stream_chunk("[DONE]")->done);
    EXPECT_EQ(parse_stream_chunk(R"({"choices":[{"text":"t","finish_reason":"length"}]})")->text,
              "t");
    // Malformed data.
    for (const char* bad : {"{", "[1,2]", "nope", R"({"choices":{}})",
                            R"({"choices":[{"delta":{"content":5}}]})",
                            R"({"choices":[],"usage":{"prompt_tokens":"x"}})"}) {
        EXPECT_EQ(parse_stream_chunk(bad).status().code(), StatusCode::kInvalidArgument) << bad;
    }
    auto err = parse_stream_chunk(R"({"error":{"message":"boom","type":"x"}})");
    EXPECT_EQ(err.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(err.status().message().find("boom"), std::string::npos);
}

TEST(Url, Parse) {
    auto t = parse_base_url("http://127.0.0.1:8080/api/");
    ASSERT_TRUE(t.is_ok());
    EXPECT_EQ(t->host, "127.0.0.1");
    EXPECT_EQ(t->port, "8080");
    EXPECT_EQ(t->base_path, "/api");
    EXPECT_EQ(parse_base_url("http://localhost")->port, "80");
    for (const char* bad : {"https://x", "127.0.0.1:80", "http://:80", "http://h:0", "http://h:x"}) {
        EXPECT_FALSE(parse_base_url(bad).is_ok()) << bad;
    }
}

// ---- a tiny HTTP server: one thread, one connection at a time ----

// Reads one request (headers + Content-Length body), then runs `respond(fd, body)`.
class TinyServer {
public:
    using Respond = std::function<void(int fd, const std::string& body)>;
    explicit TinyServer(Respond respond) : respond_(std::move(respond)) {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
        EXPECT_EQ(::listen(fd_, 64), 0);
        socklen_t len = sizeof(a);
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
        port_ = ntohs(a.sin_port);
        thread_ = std::thread([this] { loop(); });
    }
    ~TinyServer() {
        stop_ = true;
        ::shutdown(fd_, SHUT_RDWR);
        ::close(fd_);
        thread_.join();
    }
    HttpTarget target() const { return {"127.0.0.1", std::to_string(port_), ""}; }
    std::vector<std::string> bodies() {
        std::lock_guard<std::mutex> l(mu_);
        return bodies_;
    }

    static void send_all(int fd, const std::string& s) {
        size_t off = 0;
        while (off < s.size()) {
            const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
            if (n <= 0) return;
            off += static_cast<size_t>(n);
        }
    }
    static std::string chunk(const std::string& s) {
        char hex[16];
        std::snprintf(hex, sizeof(hex), "%zx", s.size());
        return std::string(hex) + "\r\n" + s + "\r\n";
    }
    static void sse_reply(int fd, const std::vector<std::string>& events, bool end) {
        send_all(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n");
        for (const auto& e : events) send_all(fd, chunk(e));
        if (end) send_all(fd, "0\r\n\r\n");
    }

private:
    void loop() {
        while (!stop_) {
            const int c = ::accept(fd_, nullptr, nullptr);
            if (c < 0) return;
            std::string req;
            char buf[4096];
            size_t need = std::string::npos;
            while (true) {
                const size_t hdr_end = req.find("\r\n\r\n");
                if (hdr_end != std::string::npos && need == std::string::npos) {
                    const size_t cl = req.find("Content-Length: ");
                    const size_t body_len =
                        cl == std::string::npos ? 0 : std::stoul(req.substr(cl + 16));
                    need = hdr_end + 4 + body_len;
                }
                if (need != std::string::npos && req.size() >= need) break;
                const ssize_t n = ::recv(c, buf, sizeof(buf), 0);
                if (n <= 0) break;
                req.append(buf, static_cast<size_t>(n));
            }
            const size_t hdr_end = req.find("\r\n\r\n");
            std::string body = hdr_end == std::string::npos ? "" : req.substr(hdr_end + 4);
            {
                std::lock_guard<std::mutex> l(mu_);
                bodies_.push_back(body);
            }
            respond_(c, body);
            ::close(c);
        }
    }

    Respond respond_;
    int fd_ = -1;
    uint16_t port_ = 0;
    std::atomic<bool> stop_{false};
    std::thread thread_;
    std::mutex mu_;
    std::vector<std::string> bodies_;
};

struct Outcome {
    int status = 0;
    std::string body;
    Status done;
};

Outcome run_request(HttpClient& client, HttpRequest req) {
    auto out = std::make_shared<Outcome>();
    std::promise<void> p;
    HttpHandlers h;
    h.on_status = [out](int s) { out->status = s; };
    h.on_body = [out](std::string_view b) {
        out->body.append(b);
        return true;
    };
    h.on_done = [out, &p](Status s) {
        out->done = std::move(s);
        p.set_value();
    };
    client.start(std::move(req), std::move(h));
    p.get_future().wait();
    return *out;
}

HttpRequest post(std::string body, int64_t timeout_ms = 5000) {
    HttpRequest r;
    r.path = "/v1/chat/completions";
    r.body = std::move(body);
    r.timeout_ms = timeout_ms;
    return r;
}

TEST(HttpClient, StreamsAChunkedBody) {
    TinyServer server([](int fd, const std::string&) {
        TinyServer::sse_reply(fd, {"data: a\n\n", "data: b\n\n"}, true);
    });
    HttpClient client(server.target());
    Outcome o = run_request(client, post("{\"x\":1}"));
    EXPECT_TRUE(o.done.is_ok()) << o.done.to_string();
    EXPECT_EQ(o.status, 200);
    EXPECT_EQ(o.body, "data: a\n\ndata: b\n\n");
    EXPECT_EQ(server.bodies().at(0), "{\"x\":1}");
}

TEST(HttpClient, ConnectionRefused) {
    HttpTarget t;
    {
        TinyServer gone([](int, const std::string&) {});
        t = gone.target();
    }  // the port is closed now
    HttpClient client(t);
    Outcome o = run_request(client, post("{}"));
    EXPECT_EQ(o.done.code(), StatusCode::kUnavailable) << o.done.to_string();
    EXPECT_EQ(o.status, 0);
}

TEST(HttpClient, TimeoutWhenTheServerStalls) {
    std::atomic<bool> release{false};
    TinyServer server([&](int fd, const std::string&) {
        TinyServer::sse_reply(fd, {"data: a\n\n"}, false);  // then nothing
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    });
    HttpClient client(server.target());
    Outcome o = run_request(client, post("{}", 200));
    release = true;
    EXPECT_EQ(o.done.code(), StatusCode::kDeadlineExceeded) << o.done.to_string();
    EXPECT_EQ(o.body, "data: a\n\n");  // what arrived before the deadline was delivered
}

// Starts a request that the server answers with one event and then holds open, runs
// `cancel(client, id)` once the server has sent that event, and returns how the request
// ended.
Status cancel_held_request(const std::function<void(HttpClient&, uint64_t)>& cancel) {
    std::atomic<bool> release{false};
    std::atomic<int> served{0};
    TinyServer server([&](int fd, const std::string&) {
        TinyServer::sse_reply(fd, {"data: a\n\n"}, false);
        ++served;
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    });
    HttpClient client(server.target());
    auto out = std::make_shared<Outcome>();
    std::promise<void> p;
    HttpHandlers h;
    h.on_body = [](std::string_view) { return true; };
    h.on_done = [out, &p](Status s) {
        out->done = std::move(s);
        p.set_value();
    };
    const uint64_t id = client.start(post("{}", 0), std::move(h));
    client.cancel(id + 1000);  // no such request: nothing happens
    while (served == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    cancel(client, id);
    p.get_future().wait();
    release = true;
    client.cancel(id);  // ended already: nothing happens
    return out->done;
}

TEST(HttpClient, CancelAllEndsRequestsInFlight) {
    Status done = cancel_held_request([](HttpClient& c, uint64_t) { c.cancel_all(); });
    EXPECT_EQ(done.code(), StatusCode::kCancelled) << done.to_string();
}

TEST(HttpClient, CancelEndsOneRequest) {
    Status done = cancel_held_request([](HttpClient& c, uint64_t id) { c.cancel(id); });
    EXPECT_EQ(done.code(), StatusCode::kCancelled) << done.to_string();
}

// ---- datasets ----

TEST(Dataset, RandomLengthsWithinRangeAndDeterministic) {
    DatasetSettings s;
    s.num_requests = 50;
    s.input_tokens = 100;
    s.output_tokens = 20;
    s.range_ratio = 0.5;
    auto a = make_dataset(nullptr, s);
    auto b = make_dataset(nullptr, s);
    ASSERT_TRUE(a.is_ok());
    ASSERT_EQ(a->requests.size(), 50u);
    bool varied = false;
    for (size_t i = 0; i < 50; ++i) {
        const auto& r = a->requests[i];
        EXPECT_GE(r.input_tokens, 50);
        EXPECT_LE(r.input_tokens, 150);
        EXPECT_GE(r.output_tokens, 10);
        EXPECT_LE(r.output_tokens, 30);
        // One word per planned token.
        EXPECT_EQ(static_cast<int32_t>(std::count(r.user.begin(), r.user.end(), ' ')) + 1,
                  r.input_tokens);
        EXPECT_EQ(r.user, b->requests[i].user);
        varied = varied || r.input_tokens != a->requests[0].input_tokens;
    }
    EXPECT_TRUE(varied);
    s.range_ratio = 1.0;
    EXPECT_FALSE(make_dataset(nullptr, s).is_ok());
    s.range_ratio = 0;
    s.input_tokens = 0;
    EXPECT_FALSE(make_dataset(nullptr, s).is_ok());
}

TEST(Dataset, MultiTurnSharesTheSystemPrefix) {
    DatasetSettings s;
    s.kind = DatasetKind::kMultiTurn;
    s.num_conversations = 3;
    s.num_turns = 2;
    s.system_prefix_tokens = 40;
    auto d = make_dataset(nullptr, s);
    ASSERT_TRUE(d.is_ok());
    ASSERT_EQ(d->requests.size(), 6u);
    EXPECT_EQ(d->num_conversations, 3);
    for (const auto& r : d->requests) {
        EXPECT_EQ(r.system, d->requests[0].system);
        EXPECT_FALSE(r.system.empty());
    }
    EXPECT_EQ(d->requests[4].conversation, 1);
    EXPECT_EQ(d->requests[4].turn, 1);
}

TEST(Dataset, TraceReplayKeepsArrivalsAndSharedBlocks) {
    const std::string path = ::testing::TempDir() + "/loadgen_trace.jsonl";
    {
        FILE* f = std::fopen(path.c_str(), "w");
        ASSERT_NE(f, nullptr);
        std::fputs("{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 10, "
                   "\"hash_ids\": [1, 2]}\n"
                   "{\"timestamp\": 500, \"input_length\": 1024, \"output_length\": 20, "
                   "\"hash_ids\": [1, 3]}\n",
                   f);
        std::fclose(f);
    }
    DatasetSettings s;
    s.kind = DatasetKind::kTrace;
    s.trace_path = path;
    s.length_scale = 0.25;
    s.time_scale = 2.0;
    auto d = make_dataset(Env::default_env(), s);
    ASSERT_TRUE(d.is_ok()) << d.status().to_string();
    ASSERT_EQ(d->requests.size(), 2u);
    EXPECT_EQ(d->requests[1].arrival_ns, 1'000'000'000);
    EXPECT_EQ(d->requests[0].input_tokens, 250);
    EXPECT_EQ(d->requests[1].output_tokens, 5);
    // Block 1 (128 words after scaling) is the same text in both; block 2 vs 3 differ.
    const std::string& a = d->requests[0].user;
    const std::string& b = d->requests[1].user;
    size_t common = 0;
    while (common < a.size() && common < b.size() && a[common] == b[common]) ++common;
    const std::string block1 = synthetic_text(1 * 0x9E3779B97F4A7C15ull + 17, 128);
    EXPECT_GE(common, block1.size());
    EXPECT_LT(common, a.size());
    s.trace_path = ::testing::TempDir() + "/no_such_trace.jsonl";
    EXPECT_FALSE(make_dataset(Env::default_env(), s).is_ok());
}

// ---- runner ----

std::string sse_chunk(const std::string& text) {
    return "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + text +
           "\"},\"finish_reason\":null}]}\n\n";
}

TEST(Runner, TimesTokensAndCountsErrors) {
    // Every third request gets malformed SSE, every third + 1 a 429; the rest stream
    // three tokens 20 ms apart plus usage.
    std::atomic<int> n{0};
    TinyServer server([&](int fd, const std::string&) {
        const int k = n++;
        if (k % 3 == 1) {
            TinyServer::send_all(fd, "HTTP/1.1 429 Too Many Requests\r\nContent-Length: 4\r\n"
                                     "Retry-After: 1\r\n\r\nbusy");
            return;
        }
        if (k % 3 == 2) {
            TinyServer::sse_reply(fd, {sse_chunk("a"), "data: {not json\n\n"}, true);
            return;
        }
        TinyServer::sse_reply(fd, {sse_chunk("a")}, false);
        for (const char* t : {"b", "c"}) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            TinyServer::send_all(fd, TinyServer::chunk(sse_chunk(t)));
        }
        TinyServer::send_all(
            fd, TinyServer::chunk("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,"
                                  "\"completion_tokens\":3,\"prompt_tokens_details\":"
                                  "{\"cached_tokens\":4}}}\n\ndata: [DONE]\n\n") +
                    "0\r\n\r\n");
    });
    HttpClient client(server.target());
    DatasetSettings ds;
    ds.num_requests = 6;
    ds.input_tokens = 8;
    ds.output_tokens = 3;
    auto d = make_dataset(nullptr, ds);
    ASSERT_TRUE(d.is_ok());
    LoadSettings ls;
    ls.model = "m";
    ls.max_concurrency = 1;  // the tiny server serves one connection at a time
    LoadResult r = run_load(client, ls, *d);
    ASSERT_EQ(r.records.size(), 6u);
    LoadSummary s = summarize(r);
    EXPECT_EQ(s.num_ok, 2);
    EXPECT_EQ(s.num_errors, 4);
    int http429 = 0, malformed = 0;
    for (const auto& [msg, count] : s.errors) {
        if (msg.rfind("HTTP 429: busy", 0) == 0) http429 += static_cast<int>(count);
        if (msg.rfind("malformed SSE data", 0) == 0) malformed += static_cast<int>(count);
    }
    EXPECT_EQ(http429, 2) << summary_json(s).dump();
    EXPECT_EQ(malformed, 2);
    EXPECT_EQ(s.output_tokens, 6);
    EXPECT_EQ(s.prompt_tokens, 14);
    EXPECT_EQ(s.cached_tokens, 8);
    for (const auto& rec : r.records) {
        if (!rec.ok) continue;
        ASSERT_EQ(rec.itl_ns.size(), 2u);
        for (int64_t gap : rec.itl_ns) EXPECT_GE(gap, 15'000'000);  // the server slept 20 ms
        EXPECT_LE(rec.ttft_ns, rec.e2e_ns);
    }
    // The request bodies are OpenAI chat requests.
    const std::string body = server.bodies().at(0);
    EXPECT_NE(body.find("\"messages\""), std::string::npos);
    EXPECT_NE(body.find("\"ignore_eos\":true"), std::string::npos);
    EXPECT_NE(body.find("\"include_usage\":true"), std::string::npos);
    const nlohmann::json j = summary_json(s);
    EXPECT_EQ(j["num_errors"], 4);
    // The fields tools/plots/plot.py draws a report's figure from.
    for (const char* key : {"ttft_ms", "tpot_ms", "itl_ms"}) {
        EXPECT_TRUE(j[key].contains("p50") && j[key].contains("p99")) << key;
    }
    EXPECT_TRUE(j.contains("output_token_throughput") && j.contains("total_token_throughput"));
    // --records-out: one line per request, each dataset index once, on the steady clock.
    const std::string lines = records_jsonl(r, 3);
    std::vector<bool> seen(6, false);
    size_t begin = 0;
    int ok_lines = 0;
    for (size_t end; (end = lines.find('\n', begin)) != std::string::npos; begin = end + 1) {
        const nlohmann::json rec = nlohmann::json::parse(lines.substr(begin, end - begin));
        EXPECT_EQ(rec["run"], 3);
        const int64_t index = rec["index"].get<int64_t>();
        ASSERT_TRUE(index >= 0 && index < 6);
        EXPECT_FALSE(seen[index]);
        seen[index] = true;
        EXPECT_GE(rec["start_steady_ns"].get<int64_t>(), r.start_steady_ns);
        if (rec["ok"].get<bool>()) {
            ++ok_lines;
            EXPECT_LE(rec["ttft_ns"].get<int64_t>(), rec["e2e_ns"].get<int64_t>());
            EXPECT_EQ(rec["itl_ns"].size(), 2u);
        }
    }
    EXPECT_EQ(begin, lines.size());
    EXPECT_EQ(ok_lines, 2);
    EXPECT_GT(r.start_steady_ns, 0);
}

TEST(Runner, MultiTurnCarriesRepliesAndStreamCutIsAnError) {
    std::atomic<int> n{0};
    TinyServer server([&](int fd, const std::string&) {
        if (n++ == 3) {  // cut before [DONE]
            TinyServer::sse_reply(fd, {sse_chunk("x")}, true);
            return;
        }
        TinyServer::sse_reply(fd, {sse_chunk("REPLY"), "data: [DONE]\n\n"}, true);
    });
    HttpClient client(server.target());
    DatasetSettings ds;
    ds.kind = DatasetKind::kMultiTurn;
    ds.num_conversations = 2;
    ds.num_turns = 2;
    ds.system_prefix_tokens = 4;
    ds.input_tokens = 3;
    auto d = make_dataset(nullptr, ds);
    ASSERT_TRUE(d.is_ok());
    LoadSettings ls;
    ls.model = "m";
    LoadResult r = run_load(client, ls, *d);
    ASSERT_EQ(r.records.size(), 4u);
    const auto bodies = server.bodies();
    // Second turns carry the first reply as an assistant message.
    EXPECT_EQ(bodies[0].find("REPLY"), std::string::npos);
    EXPECT_NE(bodies[2].find("{\"content\":\"REPLY\",\"role\":\"assistant\"}"),
              std::string::npos)
        << bodies[2];
    LoadSummary s = summarize(r);
    EXPECT_EQ(s.num_errors, 1);
    EXPECT_EQ(s.errors.begin()->first, "stream ended without [DONE]");
}

TEST(Runner, RefusedConnectionsAreErrorsAndCancelStopsTheRun) {
    HttpTarget t;
    {
        TinyServer gone([](int, const std::string&) {});
        t = gone.target();
    }
    HttpClient refused(t);
    DatasetSettings ds;
    ds.num_requests = 3;
    auto d = make_dataset(nullptr, ds);
    LoadSettings ls;
    ls.model = "m";
    ls.max_concurrency = 3;
    LoadSummary s = summarize(run_load(refused, ls, *d));
    EXPECT_EQ(s.num_errors, 3);

    std::atomic<bool> release{false};
    TinyServer stall([&](int fd, const std::string&) {
        TinyServer::sse_reply(fd, {sse_chunk("a")}, false);
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    });
    HttpClient client(stall.target());
    ds.num_requests = 100;
    d = make_dataset(nullptr, ds);
    std::atomic<bool> cancel{false};
    std::thread canceller([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        cancel = true;
    });
    ls.max_concurrency = 1;
    ls.timeout_ms = 0;
    LoadResult r = run_load(client, ls, *d, &cancel);
    canceller.join();
    release = true;
    EXPECT_TRUE(r.cancelled);
    ASSERT_EQ(r.records.size(), 1u);  // the stalled one; nothing issued after the cancel
    EXPECT_EQ(r.records[0].error, "request cancelled");
    LoadSettings bad = ls;
    bad.max_concurrency = 0;
    EXPECT_FALSE(bad.validate().is_ok());
}

TEST(Stats, NearestRankPercentiles) {
    std::vector<int64_t> v;
    for (int i = 100; i >= 1; --i) v.push_back(i * 1'000'000);
    LatencyStats s = latency_stats(v);
    EXPECT_DOUBLE_EQ(s.p50_ms, 50);
    EXPECT_DOUBLE_EQ(s.p90_ms, 90);
    EXPECT_DOUBLE_EQ(s.p99_ms, 99);
    EXPECT_DOUBLE_EQ(s.mean_ms, 50.5);
    EXPECT_EQ(latency_stats({}).p99_ms, 0);
}

}  // namespace
}  // namespace dsi::loadgen
