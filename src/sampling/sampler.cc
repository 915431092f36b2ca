#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

namespace dsi {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool finite_in(double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; }

}  // namespace

Status validate_sampling(const SamplingParams& p, int64_t vocab_size) {
    if (!(p.temperature >= 0.0) || !std::isfinite(p.temperature)) {
        return invalid_argument("temperature must be a finite number >= 0, got " +
                                std::to_string(p.temperature));
    }
    if (p.top_k < 0) return invalid_argument("top_k must be >= 0");
    if (!(p.top_p > 0.0 && p.top_p <= 1.0)) return invalid_argument("top_p must be in (0, 1]");
    if (!finite_in(p.min_p, 0.0, 1.0)) return invalid_argument("min_p must be in [0, 1]");
    if (!(p.repetition_penalty > 0.0) || !std::isfinite(p.repetition_penalty)) {
        return invalid_argument("repetition_penalty must be a finite number > 0");
    }
    if (!finite_in(p.frequency_penalty, -2.0, 2.0)) {
        return invalid_argument("frequency_penalty must be in [-2, 2]");
    }
    if (!finite_in(p.presence_penalty, -2.0, 2.0)) {
        return invalid_argument("presence_penalty must be in [-2, 2]");
    }
    if (p.max_tokens < 1) return invalid_argument("max_tokens must be >= 1");
    if (p.min_tokens < 0 || p.min_tokens > p.max_tokens) {
        return invalid_argument("min_tokens must be in [0, max_tokens]");
    }
    if (p.logprobs < -1 || p.logprobs > kMaxTopLogprobs) {
        return invalid_argument("logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) +
                                "] (or off)");
    }
    if (p.n < 1 || p.n > 128) return invalid_argument("n must be in [1, 128]");
    auto bad_id = [&](int32_t id) { return id < 0 || (vocab_size > 0 && id >= vocab_size); };
    for (const auto& [id, bias] : p.logit_bias) {
        if (bad_id(id))
            return invalid_argument("logit_bias token id out of range: " + std::to_string(id));
        if (!finite_in(bias, -100.0, 100.0))
            return invalid_argument("logit_bias must be in [-100, 100]");
    }
    for (int32_t id : p.stop_token_ids) {
        if (bad_id(id))
            return invalid_argument("stop_token_ids: id out of range: " + std::to_string(id));
    }
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
    uint64_t z =
        seed * 0x9e3779b97f4a7c15ULL + position * 0xd1b54a32d192ed03ULL + 0x632be59bd9b4e019ULL;
    for (int i = 0; i < 2; ++i) {
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
    }
    return static_cast<double>(z >> 11) * 0x1.0p-53;
}

uint64_t derive_seed(uint64_t seed, int32_t index) {
    if (index == 0) return seed;
    uint64_t z = seed ^ (static_cast<uint64_t>(index) * 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void TokenMask::reset(int64_t vocab_size, bool allowed) {
    size_ = vocab_size;
    words_.assign(static_cast<size_t>((vocab_size + 63) / 64), allowed ? ~uint64_t{0} : 0);
}

void TokenMask::set(int32_t id, bool allowed) {
    const uint64_t bit = uint64_t{1} << (id & 63);
    uint64_t& w = words_[static_cast<size_t>(id) >> 6];
    w = allowed ? (w | bit) : (w & ~bit);
}

SampledToken Sampler::sample(std::span<const float> logits, const SamplingParams& p,
                             const SampleContext& ctx, uint64_t position, DraftCheck* draft) {
    if (draft != nullptr) draft->accepted = false;
    const int64_t vocab = static_cast<int64_t>(logits.size());
    work_.assign(logits.begin(), logits.end());
    for (const auto& [id, bias] : p.logit_bias) {
        if (id < vocab) work_[id] += bias;
    }
    // Penalties.
    if (p.repetition_penalty != 1.0) {
        const float rp = static_cast<float>(p.repetition_penalty);
        counts_.assign(static_cast<size_t>(vocab), 0);
        for (auto span : {ctx.prompt, ctx.output}) {
            for (int32_t t : span) {
                if (t >= 0 && t < vocab && !counts_[t]++) {
                    work_[t] = work_[t] > 0 ? work_[t] / rp : work_[t] * rp;
                }
            }
        }
    }
    if (p.frequency_penalty != 0.0 || p.presence_penalty != 0.0) {
        counts_.assign(static_cast<size_t>(vocab), 0);
        for (int32_t t : ctx.output) {
            if (t >= 0 && t < vocab) ++counts_[t];
        }
        for (int32_t t = 0; t < vocab; ++t) {
            if (counts_[t]) {
                work_[t] -=
                    static_cast<float>(p.frequency_penalty * counts_[t] + p.presence_penalty);
            }
        }
    }
    // min_tokens: no end before the minimum.
    if (static_cast<int64_t>(ctx.output.size()) < p.min_tokens) {
        if (!p.ignore_eos && ctx.eos_id >= 0 && ctx.eos_id < vocab) work_[ctx.eos_id] = kNegInf;
        for (int32_t id : p.stop_token_ids) {
            if (id < vocab) work_[id] = kNegInf;
        }
    }
    if (ctx.mask) {
        mask_.reset(vocab, true);
        ctx.mask->fill(ctx.output, mask_);
        for (int32_t t = 0; t < vocab; ++t) {
            if (!mask_.allowed(t)) work_[t] = kNegInf;
        }
    }
    SampledToken out;
    const int32_t best = argmax(work_);
    if (work_[best] == kNegInf) return out;  // nothing allowed
    // Log-softmax normaliser of the processed row (fixed summation order).
    double lse = 0.0;
    if (p.logprobs >= 0) {
        double sum = 0.0;
        for (float v : work_) sum += std::exp(static_cast<double>(v) - work_[best]);
        lse = work_[best] + std::log(sum);
    }
    auto by_logit = [&](int32_t a, int32_t b) {
        return work_[a] > work_[b] || (work_[a] == work_[b] && a < b);
    };
    if (p.temperature == 0.0 || vocab == 1) {
        out.token = best;
    } else {
        // Candidates: the finite entries, walked in (logit desc, id asc) order. That
        // order is built lazily (sorted_prefix): a draw usually ends within the first
        // few candidates, and sorting all 129K entries cost ~10 ms per token.
        order_.clear();
        for (int32_t t = 0; t < vocab; ++t) {
            if (work_[t] != kNegInf) order_.push_back(t);
        }
        size_t sorted = 0;
        auto sorted_prefix = [&](size_t k) {  // order_[0, k) sorted, none after it before
            if (k <= sorted) return;
            size_t m = std::min(order_.size(), std::max({k, 2 * sorted, size_t{64}}));
            if (m > order_.size() / 8) m = order_.size();  // deep walk: sort the rest once
            if (m < order_.size()) {
                std::nth_element(order_.begin() + static_cast<long>(sorted),
                                 order_.begin() + static_cast<long>(m), order_.end(), by_logit);
            }
            std::sort(order_.begin() + static_cast<long>(sorted),
                      order_.begin() + static_cast<long>(m), by_logit);
            sorted = m;
        };
        const double mx = work_[best];
        probs_.resize(static_cast<size_t>(vocab));  // by id; candidates only
        for (int32_t t : order_) probs_[t] = std::exp((work_[t] - mx) / p.temperature);
        auto prob = [&](size_t i) { return probs_[order_[i]]; };
        size_t n = order_.size();
        double sum = 0;
        if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
            n = static_cast<size_t>(p.top_k);
            sorted_prefix(n);
            for (size_t i = 0; i < n; ++i) sum += prob(i);
        } else {
            for (int32_t t : order_) sum += probs_[t];  // id order: no sort needed
        }
        const size_t before_filters = n;
        if (p.top_p < 1.0) {
            double acc = 0;
            for (size_t i = 0; i < n; ++i) {
                sorted_prefix(i + 1);
                acc += prob(i) / sum;
                if (acc >= p.top_p) {
                    n = i + 1;
                    break;
                }
            }
        }
        if (p.min_p > 0.0) {
            // The first candidate has probability exp(0) = 1.
            size_t keep = 1;
            for (; keep < n; ++keep) {
                sorted_prefix(keep + 1);
                if (prob(keep) < p.min_p) break;
            }
            n = keep;
        }
        if (n != before_filters) {
            sum = 0;
            for (size_t i = 0; i < n; ++i) sum += prob(i);  // sorted by the filters above
        }
        // Rejection rule: the draft's probability among the candidates (0 when filtered
        // out); accepted with that probability, else it leaves the draw below.
        int32_t skip = -1;
        if (draft != nullptr && draft->token >= 0) {
            bool candidate = draft->token < vocab && work_[draft->token] != kNegInf;
            if (candidate && n < order_.size()) {  // a filter ran: within the sorted prefix?
                candidate = std::find(order_.begin(), order_.begin() + static_cast<long>(n),
                                      draft->token) != order_.begin() + static_cast<long>(n);
            }
            const double px = candidate ? probs_[draft->token] / sum : 0.0;
            if (counter_uniform(p.seed ^ kRejectionSalt, position) < px) {
                draft->accepted = true;
                out.token = draft->token;
            } else if (candidate) {
                sum -= probs_[draft->token];
                skip = draft->token;
            }
        }
        if (draft == nullptr || !draft->accepted) {
            double u = counter_uniform(p.seed, position) * sum;
            out.token = -1;
            for (size_t i = 0; i < n; ++i) {
                sorted_prefix(i + 1);
                if (order_[i] == skip) continue;
                out.token = order_[i];  // the last candidate left if rounding runs out
                u -= prob(i);
                if (u < 0) break;
            }
            if (out.token < 0) out.token = skip;  // only the draft was left
        }
    }
    if (p.logprobs >= 0) {
        out.logprob = static_cast<float>(work_[out.token] - lse);
        if (p.logprobs > 0) {
            order_.resize(static_cast<size_t>(vocab));
            std::iota(order_.begin(), order_.end(), 0);
            const size_t k = std::min<size_t>(static_cast<size_t>(p.logprobs), order_.size());
            std::partial_sort(order_.begin(), order_.begin() + static_cast<long>(k), order_.end(),
                              by_logit);
            for (size_t i = 0; i < k; ++i) {
                out.top_logprobs.emplace_back(order_[i],
                                              static_cast<float>(work_[order_[i]] - lse));
            }
        }
    }
    return out;
}

int32_t sample_token(std::span<const float> logits, const SamplingParams& params,
                     uint64_t position) {
    Sampler s;
    return s.sample(logits, params, SampleContext{}, position).token;
}

}  // namespace dsi
