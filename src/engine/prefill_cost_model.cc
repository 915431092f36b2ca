#include "engine/prefill_cost_model.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace dsi::engine {

Status PrefillCostModel::validate() const {
    const double coeffs[] = {base_ns, per_q_ns, per_c_ns, per_qc_ns, per_qq_ns};
    for (double v : coeffs) {
        if (!std::isfinite(v) || v < 0) {
            return invalid_argument("prefill cost model: coefficients must be finite and >= 0");
        }
    }
    if (per_q_ns + per_qq_ns <= 0) {
        return invalid_argument("prefill cost model: per_q_ns + per_qq_ns must be > 0");
    }
    return Status::ok();
}

double PrefillCostModel::cost_ns(int64_t q, int64_t c) const {
    if (q <= 0) {
        return 0.0;
    }
    const double qd = static_cast<double>(q);
    const double cd = static_cast<double>(c);
    return base_ns + per_q_ns * qd + per_c_ns * cd + per_qc_ns * qd * cd + per_qq_ns * qd * qd;
}

int64_t PrefillCostModel::max_chunk_tokens(double budget_ns, int64_t c, int64_t max_q) const {
    // S-LB: solve cost(q, c) <= budget for the largest integer q, capped at 32,768.
    const int64_t cap = std::min(max_q, kMaxPrefillChunkTokens);
    if (cap <= 0 || cost_ns(1, c) > budget_ns) {
        return 0;
    }
    if (cost_ns(cap, c) <= budget_ns) {
        return cap;
    }
    // a q^2 + b q + k <= 0 with a = per_qq, b = per_q + per_qc c, k = base + per_c c - budget.
    const double cd = static_cast<double>(c);
    const double a = per_qq_ns;
    const double b = per_q_ns + per_qc_ns * cd;
    const double k = base_ns + per_c_ns * cd - budget_ns;
    double root = 0;
    if (a > 0) {
        root = (-b + std::sqrt(b * b - 4 * a * k)) / (2 * a);
    } else {
        root = -k / b;
    }
    int64_t q = std::clamp<int64_t>(static_cast<int64_t>(root), 1, cap);
    // Rounding of the closed form can be off by one either way; settle exactly.
    while (q > 1 && cost_ns(q, c) > budget_ns) {
        --q;
    }
    while (q < cap && cost_ns(q + 1, c) <= budget_ns) {
        ++q;
    }
    return q;
}

}  // namespace dsi::engine
