// Sampler cost per token at temperature > 0 on a full 129,280-entry row (SPEC S-SAMPLE;
// noticed in issue 21's end-to-end bench: ~16 ms per sequence per step): dsinfer's
// Sampler, which orders the candidates lazily (as far as the draw walks), against the
// same rule with every candidate sorted first (the previous implementation), in the same
// run: both warmed up, alternating repetitions, medians with min-max.
//
//   build/bench/sampler_bench [--repetitions 5] [--samples 200]
//
// Rows: "peaked" (a trained model's shape: one logit far above a normal(0, 3) rest),
// "flat" (normal(0, 1): the draw walks deep), each at temperature 1 without filters, and
// with top_p 0.9. The tokens of both sides are checked equal.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "sampling/sampler.h"

namespace {

using dsi::SamplingParams;

// The rule with a full sort: every finite candidate sorted (logit desc, id asc), top-p,
// one walk; the sum in id order without filters (as the Sampler).
int32_t full_sort_sample(const std::vector<float>& l, const SamplingParams& p, uint64_t position,
                         std::vector<int32_t>& order, std::vector<double>& pr) {
    order.resize(l.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    const size_t all = order.size();
    pr.resize(all);
    const double mx = l[order[0]];
    for (size_t i = 0; i < all; ++i) pr[i] = std::exp((l[order[i]] - mx) / p.temperature);
    double sum = 0;
    for (size_t t = 0; t < l.size(); ++t) sum += std::exp((l[t] - mx) / p.temperature);
    size_t n = all;
    if (p.top_p < 1.0) {
        double acc = 0;
        for (size_t i = 0; i < n; ++i) {
            acc += pr[i] / sum;
            if (acc >= p.top_p) {
                n = i + 1;
                break;
            }
        }
        sum = std::accumulate(pr.begin(), pr.begin() + static_cast<long>(n), 0.0);
    }
    double u = dsi::counter_uniform(p.seed, position) * sum;
    int32_t token = -1;
    for (size_t i = 0; i < n; ++i) {
        token = order[i];
        u -= pr[i];
        if (u < 0) break;
    }
    return token;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    int reps = 5, samples = 200;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--repetitions")) reps = std::atoi(argv[i + 1]);
        if (!std::strcmp(argv[i], "--samples")) samples = std::atoi(argv[i + 1]);
    }
    constexpr int kVocab = 129280;
    std::mt19937 rng(3);
    std::vector<float> peaked(kVocab), flat(kVocab);
    std::normal_distribution<float> n3(0.0f, 3.0f), n1(0.0f, 1.0f);
    for (auto& x : peaked) x = n3(rng);
    peaked[1234] = 30.0f;
    for (auto& x : flat) x = n1(rng);
    struct Case {
        const char* name;
        const std::vector<float>* row;
        double top_p;
    };
    const Case cases[] = {{"peaked", &peaked, 1.0}, {"flat", &flat, 1.0},
                          {"peaked top_p 0.9", &peaked, 0.9}, {"flat top_p 0.9", &flat, 0.9}};
    std::printf("| row | Sampler (lazy order) ms/token | full sort ms/token | speed-up |\n|---|---|---|---|\n");
    for (const Case& c : cases) {
        SamplingParams p;
        p.temperature = 1.0;
        p.top_p = c.top_p;
        p.seed = 42;
        dsi::Sampler sampler;
        std::vector<int32_t> order;
        std::vector<double> pr;
        std::vector<double> lazy_ms, full_ms;
        auto run_lazy = [&](int n) {
            const auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < n; ++i) {
                (void)sampler.sample(*c.row, p, dsi::SampleContext{}, static_cast<uint64_t>(i));
            }
            return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / n;
        };
        auto run_full = [&](int n) {
            const auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < n; ++i) (void)full_sort_sample(*c.row, p, static_cast<uint64_t>(i), order, pr);
            return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / n;
        };
        for (int i = 0; i < samples; ++i) {  // the same tokens
            const int32_t a = sampler.sample(*c.row, p, dsi::SampleContext{}, static_cast<uint64_t>(i)).token;
            const int32_t b = full_sort_sample(*c.row, p, static_cast<uint64_t>(i), order, pr);
            if (a != b) {
                std::fprintf(stderr, "%s: position %d: %d vs %d\n", c.name, i, a, b);
                return 1;
            }
        }
        run_lazy(samples / 4 + 1);  // warm-up
        run_full(samples / 4 + 1);
        for (int r = 0; r < reps; ++r) {
            lazy_ms.push_back(run_lazy(samples));
            full_ms.push_back(run_full(samples / 10 + 1));
        }
        const auto [lmin, lmax] = std::minmax_element(lazy_ms.begin(), lazy_ms.end());
        const auto [fmin, fmax] = std::minmax_element(full_ms.begin(), full_ms.end());
        std::printf("| %s | %.3f (%.3f-%.3f) | %.2f (%.2f-%.2f) | %.1fx |\n", c.name, median(lazy_ms),
                    *lmin, *lmax, median(full_ms), *fmin, *fmax, median(full_ms) / median(lazy_ms));
    }
    return 0;
}
