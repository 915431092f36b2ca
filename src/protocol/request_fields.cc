// Each API's top-level request fields as data (OpenAI / Anthropic API references,
// 2025), with the JSON types they accept, plus the extensions dsinfer reads: DeepSeek
// `thinking`, vLLM `guided_regex` / `guided_grammar` / `ignore_eos` / `cache_salt`, and
// dsinfer's `traffic_class` / `timeout_ms` (request.h). OpenAI answers any other field
// with 400 "Unrecognized request argument supplied: X"; Anthropic with 400 "X: Extra
// inputs are not permitted". Fields the official SDKs send are all listed.
#include <algorithm>
#include <string>

#include "protocol/internal/json_fields.h"
#include "protocol/request.h"

namespace dsi::protocol {
namespace {

using internal::J;

// Accepted JSON types (a mask); null is always accepted.
enum : unsigned {
    kStr = 1,
    kBool = 2,
    kInt = 4,
    kNum = 8,  // any number
    kObj = 16,
    kArr = 32,
};

struct Field {
    std::string_view name;
    unsigned types;
};

constexpr std::string_view kUnrecognizedField = "Unrecognized request argument supplied: ";

constexpr Field kCommonOpenAiFields[] = {
    {"model", kStr},           {"stream", kBool},
    {"stream_options", kObj},  {"temperature", kNum},
    {"top_p", kNum},           {"seed", kInt},
    {"user", kStr},            {"metadata", kObj},
    {"store", kBool},          {"service_tier", kStr},
    {"prompt_cache_key", kStr}, {"prompt_cache_retention", kStr},
    {"safety_identifier", kStr}, {"ignore_eos", kBool},
    {"thinking", kObj},        {"guided_regex", kStr},
    {"guided_grammar", kStr},
};
// dsinfer's serving controls, in every API (request.h).
constexpr Field kServingFields[] = {
    {"cache_salt", kStr}, {"traffic_class", kStr}, {"timeout_ms", kInt},
    {"speculative_usage", kBool}};
constexpr Field kChatFields[] = {
    {"messages", kArr},          {"audio", kObj},
    {"frequency_penalty", kNum}, {"function_call", kStr | kObj},
    {"functions", kArr},         {"logit_bias", kObj},
    {"logprobs", kBool},         {"max_completion_tokens", kInt},
    {"max_tokens", kInt},        {"modalities", kArr},
    {"n", kInt},                 {"parallel_tool_calls", kBool},
    {"prediction", kObj},        {"presence_penalty", kNum},
    {"reasoning_effort", kStr},  {"response_format", kObj},
    {"stop", kStr | kArr},       {"tool_choice", kStr | kObj},
    {"tools", kArr},             {"top_logprobs", kInt},
    {"verbosity", kStr},         {"web_search_options", kObj},
};
constexpr Field kCompletionsFields[] = {
    {"prompt", kStr | kArr},     {"best_of", kInt},     {"echo", kBool},
    {"frequency_penalty", kNum}, {"logit_bias", kObj},  {"logprobs", kInt},
    {"max_tokens", kInt},        {"n", kInt},           {"presence_penalty", kNum},
    {"stop", kStr | kArr},       {"suffix", kStr},
};
constexpr Field kResponsesFields[] = {
    {"input", kStr | kArr},          {"background", kBool},
    {"conversation", kStr | kObj},   {"include", kArr},
    {"instructions", kStr},          {"max_output_tokens", kInt},
    {"max_tool_calls", kInt},        {"parallel_tool_calls", kBool},
    {"previous_response_id", kStr},  {"prompt", kObj},
    {"reasoning", kObj},             {"text", kObj},
    {"tool_choice", kStr | kObj},    {"tools", kArr},
    {"top_logprobs", kInt},          {"truncation", kStr},
};
constexpr Field kMessagesFields[] = {
    {"model", kStr},           {"messages", kArr},       {"max_tokens", kInt},
    {"container", kStr | kObj}, {"context_management", kObj}, {"mcp_servers", kArr},
    {"metadata", kObj},        {"output_config", kObj},  {"service_tier", kStr},
    {"stop_sequences", kArr},  {"stream", kBool},        {"system", kStr | kArr},
    {"temperature", kNum},     {"thinking", kObj},       {"tool_choice", kObj},
    {"tools", kArr},           {"top_k", kInt},          {"top_p", kNum},
};

template <size_t N>
const Field* find(const Field (&table)[N], std::string_view key) {
    auto it = std::find_if(std::begin(table), std::end(table),
                           [&](const Field& f) { return f.name == key; });
    return it == std::end(table) ? nullptr : &*it;
}

const Field* lookup(ApiProtocol api, std::string_view key) {
    if (const Field* f = find(kServingFields, key)) {
        return f;
    }
    switch (api) {
        case ApiProtocol::kMessages: return find(kMessagesFields, key);
        case ApiProtocol::kChatCompletions: {
            const Field* f = find(kChatFields, key);
            return f != nullptr ? f : find(kCommonOpenAiFields, key);
        }
        case ApiProtocol::kCompletions: {
            const Field* f = find(kCompletionsFields, key);
            return f != nullptr ? f : find(kCommonOpenAiFields, key);
        }
        case ApiProtocol::kResponses: {
            const Field* f = find(kResponsesFields, key);
            return f != nullptr ? f : find(kCommonOpenAiFields, key);
        }
    }
    return nullptr;
}

bool has_type(const J& v, unsigned types) {
    switch (v.type()) {
        case J::value_t::null: return true;
        case J::value_t::string: return (types & kStr) != 0;
        case J::value_t::boolean: return (types & kBool) != 0;
        case J::value_t::number_integer:
        case J::value_t::number_unsigned: return (types & (kInt | kNum)) != 0;
        case J::value_t::number_float: return (types & kNum) != 0;
        case J::value_t::object: return (types & kObj) != 0;
        case J::value_t::array: return (types & kArr) != 0;
        default: return false;
    }
}

std::string type_names(unsigned types) {
    std::string out;
    for (auto [bit, name] : {std::pair{kStr, "a string"}, std::pair{kBool, "a boolean"},
                             std::pair{kInt, "an integer"}, std::pair{kNum, "a number"},
                             std::pair{kObj, "an object"}, std::pair{kArr, "an array"}}) {
        if ((types & bit) != 0) {
            out += out.empty() ? name : std::string(" or ") + name;
        }
    }
    return out;
}

}  // namespace

Status check_request_fields(ApiProtocol api, const OrderedJson& body) {
    for (const auto& [key, value] : body.items()) {
        const Field* f = lookup(api, key);
        if (f == nullptr) {
            if (api == ApiProtocol::kMessages) {
                return invalid_argument(key + ": Extra inputs are not permitted");
            }
            return invalid_argument(std::string(kUnrecognizedField) + key);
        }
        if (!has_type(value, f->types)) {
            return internal::field_error(key, "expected " + type_names(f->types));
        }
    }
    return Status::ok();
}

bool is_unrecognized_field_error(const Status& status) {
    return status.message().rfind(kUnrecognizedField, 0) == 0;
}

}  // namespace dsi::protocol
