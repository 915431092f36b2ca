#include "server/structured_output.h"

#include <utility>

#include "grammar/mask_provider.h"

namespace dsi::server {

namespace {
grammar::CompileServiceOptions with_compile_function(grammar::CompileServiceOptions o) {
    if (!o.compile) {
        o.compile = [json = o.json](const grammar::GrammarSpec& spec) {
            return protocol::compile_request_grammar(spec, json);
        };
    }
    return o;
}
}  // namespace

StructuredOutput::StructuredOutput(const Tokenizer& tokenizer,
                                   grammar::CompileServiceOptions options,
                                   int64_t compile_timeout_ns)
    : vocab_(grammar::Vocabulary::from_tokenizer(tokenizer)),
      compile_timeout_ns_(compile_timeout_ns),
      service_(with_compile_function(std::move(options))) {}

Result<std::shared_ptr<TokenMaskProvider>> StructuredOutput::provider(
    const StructuredRequest& req) {
    auto field_error = [&](const Status& s) {
        return invalid_argument(req.field + ": " + s.message());
    };
    auto handle = service_.submit(req.spec, vocab_);
    if (!handle.is_ok()) {
        if (handle.status().code() == StatusCode::kInvalidArgument) {
            return field_error(handle.status());
        }
        return handle.status();
    }
    grammar::CompileResult r = (*handle)->wait_for(compile_timeout_ns_);
    if (!r.is_ok()) {
        switch (r.status().code()) {
            case StatusCode::kInvalidArgument:
            case StatusCode::kUnimplemented:
            case StatusCode::kOutOfRange:
            case StatusCode::kResourceExhausted:  // a grammar over the size limits
                // Compile errors are about the request's grammar: a 400 naming it.
                // (A full queue is rejected at submit, above.)
                return field_error(r.status());
            case StatusCode::kUnavailable:
                return deadline_exceeded(req.field + ": grammar compile took longer than " +
                                         std::to_string(compile_timeout_ns_ / 1000000) + " ms");
            default:
                return r.status();
        }
    }
    return std::shared_ptr<TokenMaskProvider>(
        std::make_shared<grammar::GrammarMaskProvider>(std::move(r).value()));
}

}  // namespace dsi::server
