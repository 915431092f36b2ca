#include "loadgen/report.h"

#include "workload/svg_plot.h"

namespace dsi::loadgen {

using nlohmann::json;

namespace {

json stats_json(const LatencyStats& s) {
    return {{"mean", s.mean_ms}, {"p50", s.p50_ms}, {"p90", s.p90_ms}, {"p99", s.p99_ms}};
}

// Moves an <svg ...> document down by `y_px` so two can be stacked in one outer <svg>.
std::string offset_svg(const std::string& svg, int y_px) {
    const size_t at = svg.find("<svg");
    if (at == std::string::npos) return svg;
    std::string out = svg;
    out.insert(at + 4, " x=\"0\" y=\"" + std::to_string(y_px) + "\"");
    if (const size_t decl = out.find("<?xml"); decl != std::string::npos) {
        out.erase(decl, out.find("?>", decl) + 2 - decl);
    }
    return out;
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

std::string sweep_svg(const std::string& title, const std::string& x_label,
                      const std::vector<SweepPoint>& points) {
    constexpr int kWidth = 760, kHeight = 400;
    workload::SvgPlot lat;
    lat.title = title + ": latency";
    lat.x_label = x_label;
    lat.y_label = "ms";
    lat.log_x = true;
    struct Col {
        const char* name;
        double (*get)(const LoadSummary&);
    };
    const Col cols[] = {
        {"TTFT p50", [](const LoadSummary& s) { return s.ttft.p50_ms; }},
        {"TTFT p99", [](const LoadSummary& s) { return s.ttft.p99_ms; }},
        {"TPOT p50", [](const LoadSummary& s) { return s.tpot.p50_ms; }},
        {"ITL p50", [](const LoadSummary& s) { return s.itl.p50_ms; }},
        {"ITL p99", [](const LoadSummary& s) { return s.itl.p99_ms; }},
    };
    for (const Col& c : cols) {
        workload::SvgSeries series{c.name, {}};
        for (const SweepPoint& p : points) series.points.emplace_back(p.x, c.get(p.summary));
        lat.series.push_back(std::move(series));
    }
    workload::SvgPlot thr;
    thr.title = title + ": throughput";
    thr.x_label = x_label;
    thr.y_label = "tokens/s";
    thr.log_x = true;
    workload::SvgSeries out{"output tok/s", {}};
    workload::SvgSeries total{"total tok/s", {}};
    for (const SweepPoint& p : points) {
        out.points.emplace_back(p.x, p.summary.output_throughput);
        total.points.emplace_back(p.x, p.summary.total_throughput);
    }
    thr.series = {std::move(out), std::move(total)};
    return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(kWidth) +
           "\" height=\"" + std::to_string(2 * kHeight) + "\">\n" +
           offset_svg(lat.render(kWidth, kHeight), 0) +
           offset_svg(thr.render(kWidth, kHeight), kHeight) + "</svg>\n";
}

}  // namespace dsi::loadgen
