// Chat encoders: Conversation -> Prompt (text | special-token pieces), exactly as
// the reference encoders render it (S-REC-1, S-REC-2):
//   - kDeepSeekV32: DeepSeek V3.2 "DSML" (encoding/encoding_dsv32.py);
//   - kDeepSeekV4:  DeepSeek V4 (encoding_dsv4.py: DSML `tool_calls`, tool results
//                   as <tool_result> blocks in a user turn);
//   - kDeepSeekV3Template: the Jinja chat template of the original V3
//                   tokenizer_config.json, reimplemented (checked against
//                   @huggingface/jinja in tests/protocol/).
// Template tokens become ids; all caller text stays text (no injection).
//
// Thread model: pure functions.
#pragma once

#include <string_view>

#include "base/status.h"
#include "protocol/conversation.h"
#include "protocol/prompt.h"

namespace dsi::protocol {

enum class ChatEncoding { kDeepSeekV32, kDeepSeekV4, kDeepSeekV3Template };

// Picks the encoding from a model's config.json `model_type` / architectures:
// "deepseek_v32" -> V32, "deepseek_v4" -> V4, anything else -> the V3 template.
ChatEncoding chat_encoding_for_model_type(std::string_view model_type);
std::string_view chat_encoding_name(ChatEncoding encoding);

struct EncodeOptions {
    // Thinking mode; defaults to Conversation::thinking when unset.
    std::optional<bool> thinking;
    // Drop reasoning of assistant turns before the last user turn (official default).
    bool drop_thinking = true;
    bool add_bos = true;
    // Open an assistant turn at the end (V4 and the V3 template; V3.2 always ends
    // a user/tool turn with the assistant opener).
    bool add_generation_prompt = true;
};

// INVALID_ARGUMENT naming the message for conversations the reference encoders
// reject (a tool result without a preceding tool call, an empty developer
// message, an assistant after the last user turn without reasoning or calls in
// V3.2 thinking mode).
Result<Prompt> encode_conversation(ChatEncoding encoding, const Conversation& conversation,
                                   const SpecialTokens& tokens, const EncodeOptions& options = {});

// The completion text of one assistant message as the model generates it after
// the prompt (reasoning + </think> in thinking mode, content, tool calls, EOS);
// used for round-trip tests of the output parser.
Result<Prompt> encode_completion(ChatEncoding encoding, const Message& assistant, bool thinking,
                                 const SpecialTokens& tokens);

}  // namespace dsi::protocol
