#include "loadgen/report.h"

namespace dsi::loadgen {

using nlohmann::json;

namespace {

json stats_json(const LatencyStats& s) {
    return {{"mean", s.mean_ms}, {"p50", s.p50_ms}, {"p90", s.p90_ms}, {"p99", s.p99_ms}};
}

}  // namespace

json summary_json(const LoadSummary& s) {
    json errors = json::object();
    for (const auto& [msg, count] : s.errors) errors[msg] = count;
    return {{"num_requests", s.num_requests},
            {"num_ok", s.num_ok},
            {"num_errors", s.num_errors},
            {"errors", std::move(errors)},
            {"duration_s", s.duration_s},
            {"request_throughput", s.request_throughput},
            {"output_token_throughput", s.output_throughput},
            {"total_token_throughput", s.total_throughput},
            {"prompt_tokens", s.prompt_tokens},
            {"output_tokens", s.output_tokens},
            {"cached_prompt_tokens", s.cached_tokens},
            {"ttft_ms", stats_json(s.ttft)},
            {"tpot_ms", stats_json(s.tpot)},
            {"itl_ms", stats_json(s.itl)},
            {"e2e_ms", stats_json(s.e2e)},
            {"ttft_first_turn_ms", stats_json(s.ttft_first_turn)},
            {"ttft_later_turns_ms", stats_json(s.ttft_later_turns)}};
}

std::string records_jsonl(const LoadResult& r, int run) {
    std::string out;
    for (const RequestRecord& rec : r.records) {
        out += json{{"run", run},
                    {"index", rec.index},
                    {"ok", rec.ok},
                    {"start_steady_ns", r.start_steady_ns + rec.start_ns},
                    {"ttft_ns", rec.ttft_ns},
                    {"e2e_ns", rec.e2e_ns},
                    {"prompt_tokens", rec.prompt_tokens},
                    {"output_tokens", rec.output_tokens},
                    {"itl_ns", rec.itl_ns}}
                   .dump();
        out += '\n';
    }
    return out;
}

}  // namespace dsi::loadgen
