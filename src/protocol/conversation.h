// Conversation: the one request form that the three HTTP APIs (Chat Completions,
// Responses, Messages) are converted into and the chat encoders render from
// (SPEC S-REC-1). Plain data; tool schemas and response formats keep their JSON
// key order (nlohmann::ordered_json) because the DeepSeek encodings print them
// as given.
//
// Thread model: plain values; no internal synchronisation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsi::protocol {

using OrderedJson = nlohmann::ordered_json;

// kLatestReminder: DeepSeek V4's <｜latest_reminder｜> block (V4 encoder only).
enum class Role { kSystem, kDeveloper, kUser, kAssistant, kTool, kLatestReminder };
std::string_view role_name(Role role);
// "system" | "developer" | "user" | "assistant" | "tool" (API role names).
std::optional<Role> role_from_name(std::string_view name);

struct ToolCall {
    std::string id;         // "call_…"; not part of the encoded text
    std::string name;
    std::string arguments;  // a JSON object as text (OpenAI form)
    bool operator==(const ToolCall&) const = default;
};

// A function tool: `function` is {"name", "description"?, "parameters"?} in the
// caller's key order (rendered with json.dumps by the DSML encoders).
struct Tool {
    OrderedJson function;
    std::string name() const;
};

struct Message {
    Role role = Role::kUser;
    std::string content;
    bool content_is_null = false;          // JSON null / absent (matters to the V3 template)
    std::optional<std::string> reasoning;  // DeepSeek reasoning_content
    std::vector<ToolCall> tool_calls;      // assistant only
    std::string tool_call_id;              // tool only
    std::string name;                      // optional participant / tool name
    // Per-message tools / response format (the V3.2 golden protocol puts the tools
    // on messages[0]); the encoders also attach Conversation::tools there.
    std::vector<Tool> tools;
    std::optional<OrderedJson> response_format;
};

// Sampling as the client asked for it: unset fields take the server's defaults when
// the server fills the engine's dsi::SamplingParams (server/api.cc).
struct SamplingRequest {
    std::optional<double> temperature;
    std::optional<double> top_p;
    std::optional<int64_t> top_k;
    std::optional<double> presence_penalty;
    std::optional<double> frequency_penalty;
    std::optional<int64_t> max_tokens;
    std::optional<uint64_t> seed;
    std::vector<std::string> stop;
};

// DeepSeek's reasoning controls: `thinking` {"type":"enabled|disabled"} and
// `reasoning_effort` low|high|max (API aliases minimal→low, medium/xhigh→high).
enum class ReasoningEffort { kDefault, kLow, kHigh, kMax };

struct Conversation {
    std::string model;
    std::vector<Message> messages;
    std::vector<Tool> tools;
    // "auto" | "none" | "required" | a function name (forced).
    std::string tool_choice = "auto";
    std::optional<OrderedJson> response_format;  // JSON schema object, when requested
    bool thinking = false;
    ReasoningEffort reasoning_effort = ReasoningEffort::kDefault;
    SamplingRequest sampling;
    bool stream = false;
    bool include_usage = false;  // Chat Completions stream_options.include_usage
};

}  // namespace dsi::protocol
