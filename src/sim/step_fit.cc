#include "sim/step_fit.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace dsi::sim {

namespace {

constexpr int kMaxColumns = 4;
using Row = std::array<double, kMaxColumns>;

// The squared weight of a step that took t ns in the relative fit (steps under 1 us count
// as 1 us), times `count`: 1 for a prefill step (each step's error over its own time: a 5
// ms step counts as much as a 500 ms one, TTFT percentiles are made of both), the tokens
// a decode step makes (TPOT is a per-token figure: a step of 50 sequences holds 50 of
// them, a step of 1 one; weighing steps alike let the many small steps of a lightly
// loaded stretch set the costs of the full batches where most tokens are made).
double weight(double t_ns, double count = 1.0) {
    const double t = std::max(t_ns, 1e3);
    return count / (t * t);
}

// Weighted least squares, y ~ X b minimising sum w (X b - y)^2 with w = weight(t, count):
// t the step's measured time (y is t less the parts taken out at the calibration: context
// terms, a join's recompute; weighing by y would let a step whose y is near 0 outweigh
// thousands), over the columns in `mask` (the others fixed at 0), by the normal equations
// and Gaussian elimination with partial pivoting. False when singular.
bool solve_subset(std::span<const Row> x, std::span<const double> y, std::span<const double> w,
                  int num_cols, unsigned mask, Row& b) {
    int cols[kMaxColumns];
    int k = 0;
    for (int j = 0; j < num_cols; ++j) {
        if ((mask >> j) & 1u) cols[k++] = j;
    }
    double a[kMaxColumns][kMaxColumns + 1] = {};
    for (size_t i = 0; i < x.size(); ++i) {
        for (int r = 0; r < k; ++r) {
            for (int c = 0; c < k; ++c) a[r][c] += w[i] * x[i][cols[r]] * x[i][cols[c]];
            a[r][k] += w[i] * x[i][cols[r]] * y[i];
        }
    }
    double scale = 0;
    for (int r = 0; r < k; ++r) scale = std::max(scale, std::abs(a[r][r]));
    for (int p = 0; p < k; ++p) {
        int best = p;
        for (int r = p + 1; r < k; ++r) {
            if (std::abs(a[r][p]) > std::abs(a[best][p])) best = r;
        }
        if (std::abs(a[best][p]) <= 1e-12 * scale) return false;
        for (int c = 0; c <= k; ++c) std::swap(a[p][c], a[best][c]);
        for (int r = 0; r < k; ++r) {
            if (r == p) continue;
            const double f = a[r][p] / a[p][p];
            for (int c = p; c <= k; ++c) a[r][c] -= f * a[p][c];
        }
    }
    b = Row{};
    for (int r = 0; r < k; ++r) b[cols[r]] = a[r][k] / a[r][r];
    return true;
}

// Non-negative weighted least squares for up to 4 columns: the subset of columns whose
// unconstrained solution is all >= 0 with the smallest residual (exact for so few).
Row nonneg_least_squares(std::span<const Row> x, std::span<const double> y,
                         std::span<const double> w, int num_cols) {
    Row best{};
    double best_sse = std::numeric_limits<double>::infinity();
    for (unsigned mask = 1; mask < (1u << num_cols); ++mask) {
        Row b;
        if (!solve_subset(x, y, w, num_cols, mask, b)) continue;
        if (std::any_of(b.begin(), b.end(), [](double v) { return v < 0; })) continue;
        double sse = 0;
        for (size_t i = 0; i < x.size(); ++i) {
            double f = 0;
            for (int j = 0; j < num_cols; ++j) f += b[j] * x[i][j];
            sse += w[i] * (f - y[i]) * (f - y[i]);
        }
        if (sse < best_sse) {
            best_sse = sse;
            best = b;
        }
    }
    return best;
}

// One engine's steps in start order: each step's cost (wall + the host's gap before it)
// and CPU time; steps without items are skipped (their time is not a forward pass). The
// gap is the host's when it is short (StepFitOptions::max_gap_ns) or when a sequence of
// the step before runs on in this one (an item [q', c + q] after [q, c]: the engine
// was not idle, its host was late: post-processing, or waiting for its core).
struct Timed {
    const engine::StepRecord* record;
    double cost_ns;
    int64_t cpu_ns;
};

std::vector<Timed> timed_steps(std::span<const engine::StepRecord> records,
                               const StepFitOptions& o) {
    std::vector<const engine::StepRecord*> sorted;
    for (const engine::StepRecord& r : records) sorted.push_back(&r);
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const auto* a, const auto* b) { return a->start_ns < b->start_ns; });
    std::vector<Timed> out;
    int64_t prev_end_ns = -1;
    const engine::StepRecord* prev = nullptr;
    auto runs_on = [](const engine::StepRecord& a, const engine::StepRecord& b) {
        for (const engine::StepRecord::Item& x : a.items) {
            for (const engine::StepRecord::Item& y : b.items) {
                if (y.c == x.c + x.q) return true;
            }
        }
        return false;
    };
    for (const engine::StepRecord* r : sorted) {
        double cost = static_cast<double>(r->end_ns - r->start_ns);
        const int64_t gap = prev_end_ns < 0 ? -1 : r->start_ns - prev_end_ns;
        if (gap >= 0 && (gap <= o.max_gap_ns || runs_on(*prev, *r))) {
            cost += static_cast<double>(gap);
        }
        prev_end_ns = r->end_ns;
        prev = r;
        if (!r->items.empty()) out.push_back({r, cost, r->cpu_ns});
    }
    return out;
}

double wall_over_cpu(std::span<const Timed> steps) {
    double wall = 0;
    double cpu = 0;
    for (const Timed& t : steps) {
        if (t.cpu_ns < 0) return 0;
        wall += static_cast<double>(t.record->end_ns - t.record->start_ns);
        cpu += static_cast<double>(t.cpu_ns);
    }
    return cpu > 0 ? wall / cpu : 0;
}

// Mean |fit - y| / t: each step's error over its measured time.
double mean_rel_error(std::span<const Row> x, std::span<const double> y, std::span<const double> t,
                      const Row& b, int num_cols) {
    double sum = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        double f = 0;
        for (int j = 0; j < num_cols; ++j) f += b[j] * x[i][j];
        sum += t[i] > 0 ? std::abs(f - y[i]) / t[i] : 0;
    }
    return x.empty() ? 0 : sum / static_cast<double>(x.size());
}

Status bad_line(size_t line, const std::string& why) {
    return invalid_argument("step log line " + std::to_string(line) + ": " + why);
}

}  // namespace

Result<std::vector<engine::StepRecord>> parse_step_log(std::string_view jsonl) {
    std::vector<engine::StepRecord> out;
    size_t line_no = 0;
    while (!jsonl.empty()) {
        const size_t nl = jsonl.find('\n');
        const std::string_view line = jsonl.substr(0, nl);
        jsonl.remove_prefix(nl == std::string_view::npos ? jsonl.size() : nl + 1);
        ++line_no;
        if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (j.is_discarded() || !j.is_object()) return bad_line(line_no, "not a JSON object");
        engine::StepRecord r;
        for (const char* key : {"start_ns", "end_ns", "cpu_ns"}) {
            if (!j.contains(key) || !j[key].is_number_integer()) {
                return bad_line(line_no, std::string("\"") + key + "\" must be an integer");
            }
        }
        r.start_ns = j["start_ns"].get<int64_t>();
        r.end_ns = j["end_ns"].get<int64_t>();
        r.cpu_ns = j["cpu_ns"].get<int64_t>();
        if (r.end_ns < r.start_ns) return bad_line(line_no, "end_ns before start_ns");
        if (!j.contains("items") || !j["items"].is_array()) {
            return bad_line(line_no, "\"items\" must be an array");
        }
        for (const nlohmann::json& it : j["items"]) {
            if (!it.is_array() || it.size() != 2 || !it[0].is_number_integer() ||
                !it[1].is_number_integer() || it[0].get<int64_t>() < 0 ||
                it[1].get<int64_t>() < 0) {
                return bad_line(line_no, "an item must be [q, c], integers >= 0");
            }
            r.items.push_back({it[0].get<int64_t>(), it[1].get<int64_t>()});
        }
        out.push_back(std::move(r));
    }
    return out;
}

Result<StepCostFit> fit_step_costs(std::span<const engine::StepRecord> prefill,
                                   std::span<const engine::StepRecord> decode,
                                   const engine::PrefillCostModel& calibrated,
                                   const StepFitOptions& options) {
    const std::vector<Timed> p = timed_steps(prefill, options);
    const std::vector<Timed> d = timed_steps(decode, options);
    if (p.size() < 3 || d.size() < 3) {
        return invalid_argument("step fit: needs >= 3 prefill and >= 3 decode steps, got " +
                                std::to_string(p.size()) + " and " + std::to_string(d.size()));
    }
    StepCostFit fit;

    // Prefill: columns [1, items, sum q, sum q^2]; the calibration's context terms
    // (per_c, per_qc) taken out first and kept.
    std::vector<Row> x;
    std::vector<double> y;
    std::vector<double> step_ns;  // each step's measured time (the fit's relative scale)
    std::vector<double> w;        // each step's weight in the fit
    double cost_sum = 0;
    double wall_sum = 0;
    double cpu_sum = 0;
    bool have_cpu = true;
    for (const Timed& t : p) {
        double cost = 0;
        double context_ns = 0;
        Row r = {1.0, 0.0, 0.0, 0.0};
        for (const engine::StepRecord::Item& it : t.record->items) {
            cost += calibrated.cost_ns(it.q, it.c);
            const double q = static_cast<double>(it.q);
            const double c = static_cast<double>(it.c);
            context_ns += calibrated.per_c_ns * c + calibrated.per_qc_ns * q * c;
            r[1] += 1;
            r[2] += q;
            r[3] += q * q;
        }
        x.push_back(r);
        y.push_back(std::max(1.0, t.cost_ns - context_ns));
        step_ns.push_back(t.cost_ns);
        w.push_back(weight(t.cost_ns));
        cost_sum += cost;
        wall_sum += static_cast<double>(t.record->end_ns - t.record->start_ns);
        have_cpu = have_cpu && t.cpu_ns >= 0;
        cpu_sum += static_cast<double>(t.cpu_ns);
    }
    Row b = nonneg_least_squares(x, y, w, 4);
    fit.prefill_step_overhead_ns = b[0];
    fit.prefill_time_cost = calibrated;
    fit.prefill_time_cost.base_ns = b[1];
    fit.prefill_time_cost.per_q_ns = b[2];
    fit.prefill_time_cost.per_qq_ns = b[3];
    fit.num_prefill_steps = static_cast<int64_t>(p.size());
    fit.prefill_wall_over_calibration = cost_sum > 0 ? wall_sum / cost_sum : 0;
    fit.prefill_cpu_over_calibration = have_cpu && cost_sum > 0 ? cpu_sum / cost_sum : 0;
    fit.prefill_wall_over_cpu = wall_over_cpu(p);
    fit.prefill_mean_rel_error = mean_rel_error(x, y, step_ns, b, 4);

    // Decode: columns [1, items, KV tokens], the join items' calibrated cost taken out.
    x.clear();
    y.clear();
    step_ns.clear();
    w.clear();
    for (const Timed& t : d) {
        double join_ns = 0;
        double kv_tokens = 0;
        for (const engine::StepRecord::Item& it : t.record->items) {
            if (it.q > 1) join_ns += calibrated.cost_ns(it.q, it.c);
            kv_tokens += static_cast<double>(it.c + it.q);
        }
        x.push_back({1.0, static_cast<double>(t.record->items.size()), kv_tokens, 0.0});
        y.push_back(std::max(0.0, t.cost_ns - join_ns));
        step_ns.push_back(t.cost_ns);
        w.push_back(weight(t.cost_ns, static_cast<double>(t.record->items.size())));
    }
    b = nonneg_least_squares(x, y, w, 3);
    fit.decode_base_ns = b[0];
    fit.decode_per_request_ns = b[1];
    fit.decode_per_kv_token_ns = b[2];
    fit.num_decode_steps = static_cast<int64_t>(d.size());
    fit.decode_wall_over_cpu = wall_over_cpu(d);
    fit.decode_mean_rel_error = mean_rel_error(x, y, step_ns, b, 3);
    return fit;
}

std::string step_fit_overlay_json(const StepCostFit& fit) {
    const engine::PrefillCostModel& m = fit.prefill_time_cost;
    const nlohmann::json j = {{"prefill_time_cost",
                               {{"base_ns", m.base_ns},
                                {"per_q_ns", m.per_q_ns},
                                {"per_c_ns", m.per_c_ns},
                                {"per_qc_ns", m.per_qc_ns},
                                {"per_qq_ns", m.per_qq_ns}}},
                              {"prefill_step_overhead_ns", fit.prefill_step_overhead_ns},
                              {"decode_base_ns", fit.decode_base_ns},
                              {"decode_per_request_ns", fit.decode_per_request_ns},
                              {"decode_per_kv_token_ns", fit.decode_per_kv_token_ns}};
    return j.dump(1) + "\n";
}

}  // namespace dsi::sim
