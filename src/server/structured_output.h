// StructuredOutput: the server's side of structured output (SPEC S-SO, issue 7).
// Which grammar a request asks for is read by protocol/ (protocol/structured_output.h,
// once per request in protocol::parse_api_request); this compiles it through one
// grammar::CompileService (created with the server's tokenizer vocabulary) and hands
// back a GrammarMaskProvider for the engine request.
//
// The HTTP handler waits for the compile (bounded by `compile_timeout_ns`) before the
// request enters the engine; the engine's step loop never waits on a compile.
// Unsupported keywords, invalid schemas, regexes and grammars are INVALID_ARGUMENT
// (400) naming the request field and the problem.
//
// Thread model: thread-safe (the CompileService is); one per server.
#pragma once

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "grammar/compile_service.h"
#include "grammar/vocabulary.h"
#include "protocol/structured_output.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace dsi::server {

using protocol::StructuredRequest;

class StructuredOutput {
public:
    // REQUIRES: tokenizer outlives this object.
    explicit StructuredOutput(const Tokenizer& tokenizer,
                              grammar::CompileServiceOptions options = {},
                              int64_t compile_timeout_ns = int64_t{10} * 1000000000);

    // Compiles (or finds cached) `req` and returns the engine mask provider. Blocks the
    // calling thread (an HTTP handler) up to the compile timeout.
    Result<std::shared_ptr<TokenMaskProvider>> provider(const StructuredRequest& req);

    grammar::CompileServiceStats stats() const { return service_.stats(); }
    // The compile service's table-cache warm-up (grammar/table_warmup.h), on the calling
    // thread: `dsinfer serve` runs it at start so the first requests do not build the
    // common tables inside decode steps.
    grammar::WarmupStats warm_table_cache() { return service_.warm_table_cache(vocab_); }

private:
    std::shared_ptr<const grammar::Vocabulary> vocab_;
    int64_t compile_timeout_ns_;
    grammar::CompileService service_;
};

}  // namespace dsi::server
