// Evaluation of a model on held-out generated tasks (issue 17): task accuracy per
// family, reasoning closed before the answer, first-draft MTP acceptance and the
// held-out loss. Used by tools/eval/eval_model (CLI) and the default model's ctest.
//
// Cases are tools/corpus/gen_corpus.py lines. Each request is cut after its last
// user message, rendered with the V3.2 encoding `dsinfer serve` uses, and completed
// greedily (no grammar); the output is parsed with the server's OutputParser and
// checked per `check.kind`:
//   number    the content contains the number as a word      (arith, count, ...)
//   contains  the content contains the answer text
//   exact     the content equals the answer (whitespace-trimmed)
//   json      the content is a JSON object with the schema's required keys and types
//             (json_valid) and equals the answer (correct)
//   tool_call a well-formed tool call (tool_form), naming the expected tool
//             (tool_name) with the expected arguments (correct)
//   english   at least three words, all printable ASCII
// Thinking prompts also count reasoning_closed (</think> came before the end).
// MTP: at every decode step the MTP head drafts the token after the next; the
// first-draft acceptance is the share of drafts the greedy model then produced.
// loss_set: mean next-token loss (nats) over the produced tokens (mask 2) of a set
// rendered by render_chat, by teacher forcing over the full vocabulary.
// Greedy decoding with batch-invariant kernels makes every figure deterministic.
//
// Thread model: single-threaded driver (the model uses its own pool).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"
#include "model/deepseek.h"
#include "tokenizer/tokenizer.h"

namespace dsi::tools {

struct EvalOptions {
    std::string cases;     // gen_corpus.py JSONL
    std::string loss_set;  // render_chat prefix; "" = no loss
    int max_tokens = 96;
    // json and tool_call cases: at least this many tokens. A V3.2 DSML tool call is
    // 50-90 tokens (each tag is about six), plus the reasoning before it; 48 cut
    // most of them, which scored a cut call as malformed.
    int structured_max_tokens = 160;
    int limit = 0;       // first N cases (0: all)
    int loss_limit = 0;  // first N loss examples (0: all)
    bool structured_only = false;  // json and tool_call cases only (limit counts those)
    // Also run the json and tool_call cases under the grammar the server would apply
    // (their response_format; tool_choice "required" for tool calls, thinking off)
    // and report them under with_grammar.{accuracy,counts}.
    bool grammar = false;
    // With `grammar`: JSON without the optional space after ',' and ':'
    // (grammar::JsonSchemaOptions::space_after_separators off), for comparison.
    bool compact_json = false;
};

// Figures as JSON: cases, output_tokens, accuracy.{task|all}.{metric}
// (with_grammar.accuracy.{task|all}.{metric} with `grammar`),
// counts.{task}.{metric} = [hits, n], reasoning_closed, mtp_first_draft_acceptance,
// mtp_drafts, heldout_loss_nats, heldout_loss_tokens, samples (first 40 outputs).
Result<nlohmann::json> evaluate_model(DeepseekModel& model, const Tokenizer& tokenizer,
                                      const EvalOptions& options);

}  // namespace dsi::tools
