// Metrics: the server's counters and latency histograms, rendered as Prometheus
// text (exposition format 0.0.4) together with a snapshot of the engine's stats.
//
// Thread model: every method is thread-safe (one mutex; updates are a few adds).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "base/mutex.h"
#include "server/engine_service.h"

namespace dsi::server {

class Histogram {
public:
    // Upper bounds in seconds (Prometheus `le`), then +Inf.
    static constexpr std::array<double, 14> kBounds = {
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0};
    void observe(double seconds);
    void render(const std::string& name, const std::string& help, std::string* out) const;

private:
    std::array<int64_t, kBounds.size() + 1> counts_{};
    double sum_ = 0.0;
    int64_t count_ = 0;
};

class Metrics {
public:
    void on_request(std::string_view endpoint, int http_status);
    void on_first_token(double seconds);
    void on_inter_token(double seconds);  // TPOT: time between consecutive tokens
    void on_finish(double e2e_seconds, int64_t prompt_tokens, int64_t output_tokens);
    void on_disconnect();
    // A connection deadline fired: "idle", "header", "body" or "write" (http_server.h).
    void on_timeout(std::string_view what);

    std::string render(const ServiceStats& stats, int64_t num_in_flight, bool ready) const;

private:
    mutable Mutex mu_;
    std::map<std::pair<std::string, int>, int64_t> requests_ DSI_GUARDED_BY(mu_);
    Histogram ttft_ DSI_GUARDED_BY(mu_);
    Histogram tpot_ DSI_GUARDED_BY(mu_);
    Histogram e2e_ DSI_GUARDED_BY(mu_);
    int64_t prompt_tokens_ DSI_GUARDED_BY(mu_) = 0;
    int64_t output_tokens_ DSI_GUARDED_BY(mu_) = 0;
    int64_t disconnects_ DSI_GUARDED_BY(mu_) = 0;
    std::map<std::string, int64_t> timeouts_ DSI_GUARDED_BY(mu_);  // by deadline kind
};

}  // namespace dsi::server
