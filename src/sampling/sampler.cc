#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

namespace dsi {

Status validate_sampling(const SamplingParams& p) {
    if (!(p.temperature >= 0.0) || !std::isfinite(p.temperature)) {
        return invalid_argument("temperature must be a finite number >= 0, got " +
                                std::to_string(p.temperature));
    }
    if (p.top_k < 0) return invalid_argument("top_k must be >= 0");
    if (!(p.top_p > 0.0 && p.top_p <= 1.0)) return invalid_argument("top_p must be in (0, 1]");
    return Status::ok();
}

int32_t argmax(std::span<const float> logits) {
    int32_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i) {
        if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
    }
    return best;
}

double counter_uniform(uint64_t seed, uint64_t position) {
    // Two rounds of the SplitMix64 finaliser over (seed, position).
    uint64_t z = seed * 0x9e3779b97f4a7c15ULL + position * 0xd1b54a32d192ed03ULL + 0x632be59bd9b4e019ULL;
    for (int i = 0; i < 2; ++i) {
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
    }
    return static_cast<double>(z >> 11) * 0x1.0p-53;
}

int32_t sample_token(std::span<const float> logits, const SamplingParams& p, uint64_t position) {
    if (p.temperature == 0.0 || logits.size() == 1) return argmax(logits);
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    // Candidates sorted by logit, ties by id: a fixed order.
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    size_t n = order.size();
    if (p.top_k > 0) n = std::min<size_t>(n, static_cast<size_t>(p.top_k));
    std::vector<double> probs(n);
    const double mx = logits[order[0]];
    double sum = 0;
    for (size_t i = 0; i < n; ++i) {
        probs[i] = std::exp((logits[order[i]] - mx) / p.temperature);
        sum += probs[i];
    }
    if (p.top_p < 1.0) {
        double acc = 0;
        size_t keep = n;
        for (size_t i = 0; i < n; ++i) {
            acc += probs[i] / sum;
            if (acc >= p.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        sum = std::accumulate(probs.begin(), probs.begin() + static_cast<long>(n), 0.0);
    }
    double u = counter_uniform(p.seed, position) * sum;
    for (size_t i = 0; i < n; ++i) {
        u -= probs[i];
        if (u < 0) return order[i];
    }
    return order[n - 1];
}

}  // namespace dsi
