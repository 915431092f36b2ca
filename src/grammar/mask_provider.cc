#include "grammar/mask_provider.h"

#include <algorithm>
#include <chrono>

#include "base/check.h"

namespace dsi::grammar {

GrammarMaskProvider::GrammarMaskProvider(std::shared_ptr<const CompiledGrammar> grammar,
                                         int max_matchers)
    : grammar_(std::move(grammar)), max_matchers_(std::max(1, max_matchers)) {
    scratch_.resize(grammar_->vocab().size());
}

void GrammarMaskProvider::fill(std::span<const int32_t> output, TokenMask& allowed) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto t0 = std::chrono::steady_clock::now();
    fill_locked(output, allowed);
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - t0)
                           .count();
    ++stats_.fills;
    stats_.fill_ns_total += ns;
    stats_.fill_ns_max = std::max(stats_.fill_ns_max, ns);
}

void GrammarMaskProvider::fill_locked(std::span<const int32_t> output, TokenMask& allowed) {
    // The slot sharing the longest prefix with `output` (ties: most recently used).
    size_t best = SIZE_MAX;
    size_t best_lcp = 0;
    for (size_t i = 0; i < slots_.size(); ++i) {
        const std::vector<int32_t>& t = slots_[i].tokens;
        const size_t n = std::min(t.size(), output.size());
        size_t lcp = 0;
        while (lcp < n && t[lcp] == output[lcp]) ++lcp;
        if (best == SIZE_MAX || lcp > best_lcp ||
            (lcp == best_lcp && slots_[i].last_use > slots_[best].last_use)) {
            best = i;
            best_lcp = lcp;
        }
    }
    if (best == SIZE_MAX) {
        slots_.push_back(Slot{GrammarMatcher(grammar_), {}, 0});
        best = 0;
    } else if (best_lcp < slots_[best].tokens.size()) {
        // Rolling back would lose another completion's state: copy it into a free
        // slot, or reuse the least recently used one when all are taken.
        if (slots_.size() < static_cast<size_t>(max_matchers_)) {
            slots_.push_back(slots_[best]);
            best = slots_.size() - 1;
        } else {
            size_t lru = 0;
            for (size_t i = 1; i < slots_.size(); ++i) {
                if (slots_[i].last_use < slots_[lru].last_use) lru = i;
            }
            if (lru != best) slots_[lru] = slots_[best];
            best = lru;
        }
    }
    Slot& s = slots_[best];
    s.last_use = ++clock_;
    stats_.matchers = static_cast<int64_t>(slots_.size());
    if (best_lcp < s.tokens.size()) {
        const int n = static_cast<int>(s.tokens.size() - best_lcp);
        Status st = s.matcher.rollback(n);
        DSI_CHECK(st.is_ok(), st.to_string());
        s.tokens.resize(best_lcp);
        stats_.rolled_back_tokens += n;
    }
    const int32_t vocab = grammar_->vocab().size();
    for (size_t i = s.tokens.size(); i < output.size(); ++i) {
        const int32_t tok = output[i];
        if (tok < 0 || tok >= vocab || !s.matcher.advance(tok)) {
            ++stats_.rejected_tokens;
            allowed.reset(allowed.size(), false);
            return;
        }
        s.tokens.push_back(tok);
        ++stats_.advanced_tokens;
    }
    s.matcher.fill_mask(&scratch_);
    std::span<uint64_t> dst = allowed.words();
    std::span<const uint64_t> src = scratch_.words();
    const size_t common = std::min(dst.size(), src.size());
    for (size_t w = 0; w < common; ++w) dst[w] &= src[w];
    for (size_t w = common; w < dst.size(); ++w) dst[w] = 0;
}

GrammarMaskProvider::Stats GrammarMaskProvider::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
}

namespace {
CompileServiceOptions deserialising(CompileServiceOptions o) {
    o.compile = [](const GrammarSpec& spec) { return Grammar::deserialize(spec.text); };
    return o;
}
}  // namespace

PortableMaskBuilder::PortableMaskBuilder(std::shared_ptr<const Vocabulary> vocab,
                                         CompileServiceOptions options)
    : vocab_(std::move(vocab)), service_(deserialising(std::move(options))) {}

PortableMaskBuilder::PortableMaskBuilder(const Tokenizer& tokenizer, CompileServiceOptions options)
    : vocab_thread_([this, &tokenizer] { vocab_ = Vocabulary::from_tokenizer(tokenizer); }),
      service_(deserialising(std::move(options))) {}

PortableMaskBuilder::~PortableMaskBuilder() {
    if (warm_thread_.joinable()) warm_thread_.join();
    if (vocab_thread_.joinable()) vocab_thread_.join();
}

void PortableMaskBuilder::join_vocab() {
    std::call_once(vocab_once_, [this] {
        if (vocab_thread_.joinable()) vocab_thread_.join();
    });
}

void PortableMaskBuilder::start_table_warmup() {
    DSI_CHECK(!warm_thread_.joinable(), "start_table_warmup called twice");
    warm_thread_ = std::thread([this] {
        join_vocab();
        warmup_ = service_.warm_table_cache(vocab_);
    });
}

WarmupStats PortableMaskBuilder::wait_table_warmup() {
    if (warm_thread_.joinable()) warm_thread_.join();
    return warmup_;
}

Result<std::unique_ptr<CompileHandle>> PortableMaskBuilder::submit(const std::string& portable) {
    join_vocab();
    // The kind only keys the cache (text taken as given); the compile function above
    // deserialises whatever the kind.
    GrammarSpec spec;
    spec.kind = GrammarKind::kEbnf;
    spec.text = portable;
    return service_.submit(spec, vocab_);
}

std::shared_ptr<TokenMaskProvider> PortableMaskBuilder::provider(
    std::shared_ptr<const CompiledGrammar> grammar) {
    return std::make_shared<GrammarMaskProvider>(std::move(grammar));
}

}  // namespace dsi::grammar
