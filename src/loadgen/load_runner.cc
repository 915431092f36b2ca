#include "loadgen/load_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>

#include "loadgen/sse.h"

namespace dsi::loadgen {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
constexpr size_t kMaxErrorBodyBytes = 4096;

struct Turn {
    std::string user;
    std::string reply;
};

json request_body(const LoadSettings& s, const PlannedRequest& r, const std::vector<Turn>& history) {
    json body = {{"model", s.model}, {"max_tokens", r.output_tokens},
                 {"temperature", s.temperature}, {"stream", s.stream}};
    if (s.stream) body["stream_options"] = {{"include_usage", true}};
    if (s.ignore_eos) body["ignore_eos"] = true;
    if (s.api == ApiKind::kChat) {
        json messages = json::array();
        if (!r.system.empty()) messages.push_back({{"role", "system"}, {"content", r.system}});
        for (const Turn& t : history) {
            messages.push_back({{"role", "user"}, {"content", t.user}});
            messages.push_back({{"role", "assistant"}, {"content", t.reply}});
        }
        messages.push_back({{"role", "user"}, {"content", r.user}});
        body["messages"] = std::move(messages);
    } else {
        std::string prompt = r.system.empty() ? "" : r.system + "\n\n";
        for (const Turn& t : history) prompt += t.user + "\n\n" + t.reply + "\n\n";
        body["prompt"] = prompt + r.user;
    }
    return body;
}

// One request in flight; touched by the I/O thread until on_done hands it back.
struct Call {
    size_t index = 0;
    Clock::time_point start;
    Clock::time_point last_token;
    RequestRecord rec;
    SseParser sse;
    std::vector<SseEvent> events;
    int http_status = 0;
    std::string error_body;
    std::string body;  // non-streaming reply
    std::string text;
    std::string failure;
    bool saw_done = false;
    bool saw_token = false;
};

int64_t ns_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

// Returns false to abort the request (malformed stream).
bool on_stream_bytes(Call& c, std::string_view bytes) {
    if (Status st = c.sse.feed(bytes, c.events); !st.is_ok()) {
        c.failure = "malformed SSE: " + st.message();
        return false;
    }
    for (const SseEvent& e : c.events) {
        Result<StreamChunk> chunk = parse_stream_chunk(e.data);
        if (!chunk.is_ok()) {
            c.failure = chunk.status().code() == StatusCode::kInvalidArgument
                            ? "malformed SSE data: " + chunk.status().message()
                            : chunk.status().message();
            return false;
        }
        if (chunk->done) c.saw_done = true;
        if (!chunk->text.empty()) {
            const auto now = Clock::now();
            if (!c.saw_token) {
                c.rec.ttft_ns = ns_between(c.start, now);
                c.saw_token = true;
            } else {
                c.rec.itl_ns.push_back(ns_between(c.last_token, now));
            }
            c.last_token = now;
            c.text += chunk->text;
        }
        if (chunk->usage) {
            c.rec.prompt_tokens = chunk->usage->prompt_tokens;
            c.rec.output_tokens = chunk->usage->completion_tokens;
            c.rec.cached_tokens = chunk->usage->cached_tokens;
        }
    }
    c.events.clear();
    return true;
}

void finish_call(Call& c, const LoadSettings& s, const Status& status) {
    c.rec.e2e_ns = ns_between(c.start, Clock::now());
    if (!c.failure.empty()) {
        c.rec.error = c.failure;
    } else if (!status.is_ok()) {
        c.rec.error = status.message();
    } else if (c.http_status != 200) {
        c.rec.error = "HTTP " + std::to_string(c.http_status) + ": " + c.error_body;
    } else if (s.stream && !c.saw_done) {
        c.rec.error = "stream ended without [DONE]";
    } else if (!s.stream) {
        Result<ReplyInfo> info = parse_reply_body(c.body);
        if (!info.is_ok()) {
            c.rec.error = "malformed reply: " + info.status().message();
        } else {
            c.text = info->text;
            c.rec.ttft_ns = c.rec.e2e_ns;
            c.rec.prompt_tokens = info->usage.prompt_tokens;
            c.rec.output_tokens = info->usage.completion_tokens;
            c.rec.cached_tokens = info->usage.cached_tokens;
        }
    }
    if (c.rec.output_tokens == 0 && s.stream) {
        c.rec.output_tokens = c.saw_token ? static_cast<int64_t>(c.rec.itl_ns.size()) + 1 : 0;
    }
    c.rec.ok = c.rec.error.empty();
}

}  // namespace

Status LoadSettings::validate() const {
    if (model.empty()) return invalid_argument("--model is required");
    if (!(request_rate > 0)) return invalid_argument("request rate must be > 0 (or inf)");
    if (max_concurrency < 1) return invalid_argument("concurrency must be >= 1");
    if (timeout_ms < 0 || max_duration_s < 0) {
        return invalid_argument("timeout and duration must be >= 0");
    }
    return Status::ok();
}

LoadResult run_load(HttpClient& client, const LoadSettings& settings, const Dataset& dataset,
                    const std::atomic<bool>* cancel) {
    const size_t n = dataset.requests.size();
    // Earliest start of each request, ns from the run's start.
    std::vector<int64_t> not_before(n, 0);
    std::mt19937_64 rng(settings.seed);
    std::exponential_distribution<double> gap(
        std::isinf(settings.request_rate) ? 1.0 : settings.request_rate);
    double t_s = 0;
    for (size_t i = 0; i < n; ++i) {
        if (dataset.requests[i].arrival_ns >= 0) {
            not_before[i] = dataset.requests[i].arrival_ns;
        } else if (!std::isinf(settings.request_rate)) {
            t_s += gap(rng);
            not_before[i] = static_cast<int64_t>(t_s * 1e9);
        }
    }

    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::unique_ptr<Call>> finished;  // GUARDED_BY(mu)

    const int32_t num_conv = dataset.num_conversations;
    std::vector<std::vector<Turn>> history(static_cast<size_t>(std::max(num_conv, 0)));
    std::vector<int32_t> next_turn(history.size(), 0);
    std::vector<bool> started(n, false);
    size_t first_pending = 0;
    int32_t in_flight = 0;
    bool stop_issuing = false;
    bool cancelled_all = false;
    LoadResult result;

    const auto t0 = Clock::now();
    result.start_steady_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count();
    auto elapsed_ns = [&] { return ns_between(t0, Clock::now()); };
    auto start_one = [&](size_t i) {
        const PlannedRequest& r = dataset.requests[i];
        auto call = std::make_unique<Call>();
        call->index = i;
        call->rec.index = static_cast<int64_t>(i);
        call->rec.conversation = r.conversation;
        call->rec.turn = r.turn;
        static const std::vector<Turn> kNoHistory;
        const auto& hist = r.conversation >= 0 ? history[static_cast<size_t>(r.conversation)]
                                               : kNoHistory;
        HttpRequest req;
        req.path = settings.api == ApiKind::kChat ? "/v1/chat/completions" : "/v1/completions";
        req.body = request_body(settings, r, hist).dump();
        req.headers.emplace_back("content-type", "application/json");
        if (!settings.api_key.empty()) {
            req.headers.emplace_back("authorization", "Bearer " + settings.api_key);
        }
        req.timeout_ms = settings.timeout_ms;
        call->start = Clock::now();
        call->rec.start_ns = ns_between(t0, call->start);
        Call* raw = call.release();  // owned by the handlers until on_done
        HttpHandlers h;
        h.on_status = [raw](int status) { raw->http_status = status; };
        h.on_body = [raw, &settings](std::string_view bytes) {
            if (raw->http_status != 200) {
                raw->error_body.append(bytes.substr(
                    0, kMaxErrorBodyBytes - std::min(kMaxErrorBodyBytes, raw->error_body.size())));
                return true;
            }
            if (!settings.stream) {
                raw->body.append(bytes);
                return true;
            }
            return on_stream_bytes(*raw, bytes);
        };
        h.on_done = [raw, &settings, &mu, &cv, &finished](Status st) {
            std::unique_ptr<Call> owned(raw);
            finish_call(*owned, settings, st);
            std::lock_guard<std::mutex> lock(mu);
            finished.push_back(std::move(owned));
            cv.notify_one();
        };
        started[i] = true;
        ++in_flight;
        client.start(std::move(req), std::move(h));
    };

    std::unique_lock<std::mutex> lock(mu);
    while (true) {
        while (!finished.empty()) {
            std::unique_ptr<Call> c = std::move(finished.front());
            finished.pop_front();
            --in_flight;
            const PlannedRequest& r = dataset.requests[c->index];
            if (r.conversation >= 0) {
                // A failed turn ends its conversation's history with an empty reply.
                history[static_cast<size_t>(r.conversation)].push_back({r.user, c->text});
                next_turn[static_cast<size_t>(r.conversation)] = r.turn + 1;
            }
            result.records.push_back(std::move(c->rec));
        }
        const int64_t now_ns = elapsed_ns();
        if (cancel != nullptr && cancel->load() && !cancelled_all) {
            cancelled_all = true;
            stop_issuing = true;
            result.cancelled = true;
            client.cancel_all();
        }
        if (settings.max_duration_s > 0 && now_ns >= settings.max_duration_s * 1e9) {
            stop_issuing = true;
        }
        int64_t wake_ns = now_ns + 50'000'000;  // every wait has a deadline
        bool pending = false;
        if (!stop_issuing) {
            while (first_pending < n && started[first_pending]) ++first_pending;
            for (size_t i = first_pending; i < n && in_flight < settings.max_concurrency; ++i) {
                if (started[i]) continue;
                pending = true;
                const PlannedRequest& r = dataset.requests[i];
                if (r.conversation >= 0 &&
                    next_turn[static_cast<size_t>(r.conversation)] != r.turn) {
                    continue;
                }
                if (not_before[i] > now_ns) {
                    wake_ns = std::min(wake_ns, not_before[i]);
                    // Later requests may not pass an earlier arrival (replay order).
                    if (r.conversation < 0) break;
                    continue;
                }
                lock.unlock();
                start_one(i);
                lock.lock();
            }
            pending = pending || first_pending < n;
        }
        if (in_flight == 0 && (!pending || stop_issuing)) break;
        if (finished.empty()) {
            cv.wait_for(lock, std::chrono::nanoseconds(std::max<int64_t>(wake_ns - now_ns, 0)));
        }
    }
    result.duration_s = static_cast<double>(elapsed_ns()) / 1e9;
    return result;
}

LatencyStats latency_stats(std::vector<int64_t> values_ns) {
    LatencyStats s;
    if (values_ns.empty()) return s;
    std::sort(values_ns.begin(), values_ns.end());
    double sum = 0;
    for (int64_t v : values_ns) sum += static_cast<double>(v);
    const size_t n = values_ns.size();
    auto rank = [&](double q) {
        const auto k = static_cast<size_t>(std::ceil(q * static_cast<double>(n)));
        return static_cast<double>(values_ns[std::clamp<size_t>(k, 1, n) - 1]) / 1e6;
    };
    s.mean_ms = sum / static_cast<double>(n) / 1e6;
    s.p50_ms = rank(0.50);
    s.p90_ms = rank(0.90);
    s.p99_ms = rank(0.99);
    return s;
}

LoadSummary summarize(const LoadResult& result) {
    LoadSummary s;
    s.duration_s = result.duration_s;
    std::vector<int64_t> ttft, tpot, itl, e2e, ttft_first, ttft_later;
    for (const RequestRecord& r : result.records) {
        ++s.num_requests;
        if (!r.ok) {
            ++s.num_errors;
            ++s.errors[r.error.substr(0, 200)];
            continue;
        }
        ++s.num_ok;
        s.prompt_tokens += r.prompt_tokens;
        s.output_tokens += r.output_tokens;
        s.cached_tokens += r.cached_tokens;
        ttft.push_back(r.ttft_ns);
        (r.turn == 0 ? ttft_first : ttft_later).push_back(r.ttft_ns);
        e2e.push_back(r.e2e_ns);
        itl.insert(itl.end(), r.itl_ns.begin(), r.itl_ns.end());
        if (r.output_tokens > 1) tpot.push_back((r.e2e_ns - r.ttft_ns) / (r.output_tokens - 1));
    }
    if (s.duration_s > 0) {
        s.request_throughput = static_cast<double>(s.num_ok) / s.duration_s;
        s.output_throughput = static_cast<double>(s.output_tokens) / s.duration_s;
        s.total_throughput = static_cast<double>(s.prompt_tokens + s.output_tokens) / s.duration_s;
    }
    s.ttft = latency_stats(std::move(ttft));
    s.tpot = latency_stats(std::move(tpot));
    s.itl = latency_stats(std::move(itl));
    s.e2e = latency_stats(std::move(e2e));
    s.ttft_first_turn = latency_stats(std::move(ttft_first));
    s.ttft_later_turns = latency_stats(std::move(ttft_later));
    return s;
}

}  // namespace dsi::loadgen
