#include "loadgen/dataset.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "workload/trace.h"

namespace dsi::loadgen {

namespace {

// Common English words: one BPE token each (with their leading space) in GPT-style and
// DeepSeek vocabularies, so a planned length in words is close to the token count.
constexpr const char* kWords[] = {
    "the",   "of",    "and",   "to",    "in",    "is",    "for",   "that",  "on",    "with",
    "as",    "it",    "was",   "by",    "this",  "be",    "are",   "from",  "at",    "or",
    "an",    "have",  "not",   "has",   "but",   "which", "they",  "one",   "you",   "all",
    "were",  "their", "can",   "more",  "been",  "also",  "new",   "will",  "when",  "there",
    "would", "who",   "if",    "first", "time",  "other", "may",   "its",   "some",  "into",
    "two",   "after", "most",  "many",  "over",  "only",  "made",  "use",   "year",  "world",
    "these", "years", "then",  "she",   "them",  "used",  "city",  "state", "such",  "work",
    "well",  "where", "school", "part", "between", "name", "known", "both", "high",  "life",
    "house", "music", "water", "game",  "team",  "power", "group", "line",  "case",  "point",
    "small", "large", "early", "light", "green", "river", "north", "south", "book",  "story"};
constexpr size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);

int32_t scaled_len(std::mt19937_64& rng, int32_t len, double ratio) {
    if (ratio <= 0) return len;
    const auto lo = static_cast<int32_t>(std::floor(len * (1.0 - ratio)));
    const auto hi = static_cast<int32_t>(std::ceil(len * (1.0 + ratio)));
    return std::uniform_int_distribution<int32_t>(std::max(1, lo), std::max(1, hi))(rng);
}

Dataset make_random(const DatasetSettings& s) {
    Dataset d;
    d.name = "random";
    std::mt19937_64 rng(s.seed);
    for (int64_t i = 0; i < s.num_requests; ++i) {
        PlannedRequest r;
        r.input_tokens = scaled_len(rng, s.input_tokens, s.range_ratio);
        r.output_tokens = scaled_len(rng, s.output_tokens, s.range_ratio);
        r.user = synthetic_text(rng(), r.input_tokens);
        d.requests.push_back(std::move(r));
    }
    return d;
}

Dataset make_multi_turn(const DatasetSettings& s) {
    Dataset d;
    d.name = "multi-turn";
    d.num_conversations = s.num_conversations;
    std::mt19937_64 rng(s.seed);
    const std::string system =
        s.system_prefix_tokens > 0 ? synthetic_text(rng(), s.system_prefix_tokens) : "";
    for (int32_t t = 0; t < s.num_turns; ++t) {
        for (int32_t c = 0; c < s.num_conversations; ++c) {
            PlannedRequest r;
            r.conversation = c;
            r.turn = t;
            r.system = system;
            const int32_t n = scaled_len(rng, s.input_tokens, s.range_ratio);
            r.user = synthetic_text(rng(), n);
            r.input_tokens = s.system_prefix_tokens + n;
            r.output_tokens = scaled_len(rng, s.output_tokens, s.range_ratio);
            d.requests.push_back(std::move(r));
        }
    }
    return d;
}

Result<Dataset> make_trace(Env* env, const DatasetSettings& s) {
    DSI_ASSIGN_OR_RETURN(workload::Trace trace, workload::load_trace(env, s.trace_path));
    Dataset d;
    d.name = "trace:" + s.trace_path;
    const size_t n = s.num_requests > 0
                         ? std::min(trace.requests.size(), static_cast<size_t>(s.num_requests))
                         : trace.requests.size();
    for (size_t i = 0; i < n; ++i) {
        const workload::TraceRequest& tr = trace.requests[i];
        PlannedRequest r;
        r.arrival_ns = static_cast<int64_t>(static_cast<double>(tr.arrival_ns) * s.time_scale);
        r.input_tokens = std::clamp(
            static_cast<int32_t>(std::lround(tr.input_tokens * s.length_scale)), 1,
            s.max_input_tokens);
        r.output_tokens = std::clamp(
            static_cast<int32_t>(std::lround(tr.output_tokens * s.length_scale)), 1,
            s.max_output_tokens);
        // Prefix blocks: the text of a block depends on its id only (shared prefixes stay
        // shared); block sizes scale with the lengths.
        const auto block_words = std::max<int32_t>(
            1, static_cast<int32_t>(std::lround(trace.block_tokens * s.length_scale)));
        std::string text;
        int32_t words = 0;
        for (uint64_t id : trace.blocks_of(tr)) {
            if (words >= r.input_tokens) break;
            const int32_t take = std::min(block_words, r.input_tokens - words);
            text += synthetic_text(id * 0x9E3779B97F4A7C15ull + 17, take);
            text.push_back(' ');
            words += take;
        }
        if (words < r.input_tokens) text += synthetic_text(s.seed * 1000003 + i, r.input_tokens - words);
        r.user = std::move(text);
        d.requests.push_back(std::move(r));
    }
    return d;
}

}  // namespace

Status DatasetSettings::validate() const {
    if (num_requests < 0) return invalid_argument("num_requests must be >= 0");
    if (input_tokens < 1 || output_tokens < 1) {
        return invalid_argument("input and output lengths must be >= 1");
    }
    if (!(range_ratio >= 0 && range_ratio < 1)) {
        return invalid_argument("range_ratio must be in [0, 1)");
    }
    if (kind == DatasetKind::kMultiTurn &&
        (num_conversations < 1 || num_turns < 1 || system_prefix_tokens < 0)) {
        return invalid_argument("multi-turn needs conversations >= 1, turns >= 1, prefix >= 0");
    }
    if (kind == DatasetKind::kTrace) {
        if (trace_path.empty()) return invalid_argument("trace dataset needs a trace path");
        if (!(time_scale > 0) || !(length_scale > 0)) {
            return invalid_argument("time_scale and length_scale must be > 0");
        }
        if (max_input_tokens < 1 || max_output_tokens < 1) {
            return invalid_argument("max input/output tokens must be >= 1");
        }
    }
    return Status::ok();
}

Result<Dataset> make_dataset(Env* env, const DatasetSettings& settings) {
    DSI_RETURN_IF_ERROR(settings.validate());
    switch (settings.kind) {
        case DatasetKind::kRandom:
            return make_random(settings);
        case DatasetKind::kMultiTurn:
            return make_multi_turn(settings);
        case DatasetKind::kTrace:
            return make_trace(env, settings);
    }
    return invalid_argument("unknown dataset kind");
}

std::string synthetic_text(uint64_t seed, int32_t num_words) {
    std::mt19937_64 rng(seed);
    std::string out;
    out.reserve(static_cast<size_t>(std::max(num_words, 0)) * 6);
    for (int32_t i = 0; i < num_words; ++i) {
        if (i > 0) out.push_back(' ');
        out += kWords[rng() % kNumWords];
    }
    return out;
}

}  // namespace dsi::loadgen
