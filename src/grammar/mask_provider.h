// GrammarMaskProvider: the engine's structured-output hook (sampling/sampler.h
// TokenMaskProvider) backed by a compiled grammar. The engine calls fill(output,
// allowed) before sampling each token, with the tokens generated so far; the
// provider brings a GrammarMatcher to exactly `output` and ANDs the grammar's mask
// into `allowed`. Stop ids (EOS) stay allowed only where the grammar accepts; ids
// past the grammar's vocabulary (the model's padded rows) are disallowed.
//
// The engine gives no completion index and may shrink `output` after a preemption,
// so the provider keeps a few matchers, each with the tokens it has consumed: fill()
// takes the one sharing the longest prefix with `output`, rolls it back to that
// prefix and advances over the rest. A request with n > 1 completions (which share
// one provider) gets one matcher per completion this way; when a matcher would have
// to roll back while another slot is free, it is copied first, so completions that
// diverge do not thrash one matcher. More than max_matchers live completions still
// work (LRU reuse), just with more replay.
//
// A token that the grammar rejects (only possible if someone else changed the
// sampled token) makes that output dead: its mask allows nothing, and the engine
// finishes the completion with an error.
//
// Thread model: fill() may be called from any thread; calls are serialised by an
// internal mutex (the engine calls it from its one worker thread).
// REQUIRES: the CompiledGrammar's vocabulary is the model's tokenizer's.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "grammar/compile_service.h"
#include "grammar/matcher.h"
#include "grammar/table_warmup.h"
#include "grammar/vocabulary.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace dsi::grammar {

class GrammarMaskProvider : public TokenMaskProvider {
public:
    explicit GrammarMaskProvider(std::shared_ptr<const CompiledGrammar> grammar,
                                 int max_matchers = 8);

    void fill(std::span<const int32_t> output, TokenMask& allowed) override;
    // The serialised Grammar (Grammar::serialize): PortableMaskBuilder rebuilds this
    // provider from it in another process.
    std::string portable_form() const override { return grammar_->grammar().serialize(); }

    struct Stats {
        int64_t fills = 0;
        int64_t advanced_tokens = 0;  // tokens fed to matchers (replay included)
        int64_t rolled_back_tokens = 0;
        int64_t rejected_tokens = 0;  // tokens the grammar refused (dead outputs)
        int64_t matchers = 0;
        int64_t fill_ns_total = 0;  // time inside fill() (steady clock)
        int64_t fill_ns_max = 0;
    };
    Stats stats() const;

private:
    struct Slot {
        GrammarMatcher matcher;
        std::vector<int32_t> tokens;  // consumed, in order (rollback-able)
        uint64_t last_use = 0;
    };

    void fill_locked(std::span<const int32_t> output, TokenMask& allowed);

    std::shared_ptr<const CompiledGrammar> grammar_;
    int max_matchers_;
    mutable std::mutex mu_;
    std::vector<Slot> slots_;  // GUARDED_BY(mu_)
    TokenBitmask scratch_;     // GUARDED_BY(mu_)
    uint64_t clock_ = 0;       // GUARDED_BY(mu_)
    Stats stats_;              // GUARDED_BY(mu_)
};

// Rebuilds GrammarMaskProviders from their portable form (the serialised Grammar a
// compile made) in another process over the same tokenizer's vocabulary: an --ep rank
// samples the requests whose grammars the front with no model compiled
// (engine/dp_front.h). The same Grammar over the same vocabulary gives the same masks,
// so the rank's tokens are the front's would-be tokens bit for bit, and no schema is
// parsed twice. It is a CompileService whose compile function deserialises: the same
// cache (keyed by the bytes), de-duplication, shared position tables and worker threads
// as a compile, so the caller (the rank's step loop) never waits on a build.
//
// Thread model: thread-safe (as CompileService).
class PortableMaskBuilder {
public:
    // REQUIRES: vocab != nullptr (the tokenizer's, as the compiling process's).
    explicit PortableMaskBuilder(std::shared_ptr<const Vocabulary> vocab,
                                 CompileServiceOptions options = {});
    // Over `tokenizer`'s vocabulary, built on a thread started here (tens of ms at the V3
    // vocabulary; a submit waits for it), so a rank's first grammar does not stall its
    // group's steps. REQUIRES: `tokenizer` outlives this.
    explicit PortableMaskBuilder(const Tokenizer& tokenizer, CompileServiceOptions options = {});
    ~PortableMaskBuilder();  // joins the vocabulary's thread
    // Starts rebuilding (or finds cached) the grammar of `portable`; bytes that are not a
    // serialised Grammar are DATA_LOSS at the handle.
    Result<std::unique_ptr<CompileHandle>> submit(const std::string& portable);
    // The engine's provider over a rebuilt grammar.
    static std::shared_ptr<TokenMaskProvider> provider(
        std::shared_ptr<const CompiledGrammar> grammar);
    // Warms the table cache the rebuilt grammars share with the common tables
    // (table_warmup.h; what `serve` does before it listens, ~0.1 s at the V3
    // vocabulary) on a thread of its own once the vocabulary is built, so the rank's
    // first grammars do not build them in its decode steps. Called at most once.
    void start_table_warmup();
    // Waits for the warm-up start_table_warmup began; {} when none was started.
    WarmupStats wait_table_warmup();

private:
    void join_vocab();
    std::shared_ptr<const Vocabulary> vocab_;  // written by vocab_thread_, then read
    std::thread vocab_thread_;                 // joined once (vocab_once_) before a read
    std::once_flag vocab_once_;
    CompileService service_;
    WarmupStats warmup_;  // written by warm_thread_, read after joining it
    std::thread warm_thread_;
};

}  // namespace dsi::grammar
