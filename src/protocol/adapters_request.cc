// Request JSON -> Conversation for the three APIs (S-REC-1). nlohmann exceptions
// stay inside this file (STYLE 2); every rejection names the offending field.
#include <algorithm>
#include <cctype>
#include <limits>

#include "protocol/adapters.h"
#include "protocol/internal/json_fields.h"
#include "protocol/json_limits.h"
#include "protocol/request.h"

namespace dsi::protocol {

using namespace internal;  // NOLINT: J and the field helpers

namespace {

// Image inputs (Chat Completions "image_url", Responses "input_image", Messages "image"):
// a 400 that says why, until a vision encoder exists (DeepSeek V4.1's vision_config is
// read and checked, docs/models_v41.md; no model here encodes images yet).
bool is_image_type(std::string_view type) {
    return type == "image_url" || type == "input_image" || type == "image";
}
Status image_error(std::string_view path, const std::string& type) {
    return field_error(path, "image input (content type '" + type +
                                 "') is not supported: no vision encoder is implemented yet");
}

constexpr int64_t kMaxTokens = std::numeric_limits<int32_t>::max();

// content: string | null | [{type:"text"|"input_text"|"output_text", text}].
Result<std::string> text_content(const J& msg, std::string_view key, std::string_view path,
                                 bool* is_null) {
    const J* c = member(msg, key);
    if (is_null != nullptr) {
        *is_null = c == nullptr;
    }
    if (c == nullptr) {
        return std::string();
    }
    const std::string p = join_path(path, key);
    if (c->is_string()) {
        return c->get<std::string>();
    }
    if (!c->is_array()) {
        return field_error(p, "expected a string or an array of content parts");
    }
    std::string out;
    for (size_t i = 0; i < c->size(); ++i) {
        const J& part = (*c)[i];
        const std::string pp = index_path(p, i);
        DSI_RETURN_IF_ERROR(expect_object(part, pp));
        DSI_ASSIGN_OR_RETURN(std::string type, req_string(part, "type", pp));
        if (is_image_type(type)) return image_error(join_path(pp, "type"), type);
        if (type != "text" && type != "input_text" && type != "output_text") {
            return field_error(join_path(pp, "type"),
                               "unsupported content part type '" + type + "'");
        }
        DSI_ASSIGN_OR_RETURN(std::string text, req_string(part, "text", pp));
        out += text;
    }
    return out;
}

Status check_arguments(const std::string& args, std::string_view path, int max_depth) {
    DSI_RETURN_IF_ERROR(check_json_depth(args, max_depth, path));
    try {
        J a = J::parse(args.empty() ? std::string("{}") : args);
        if (!a.is_object()) {
            return field_error(path, "must be a JSON object");
        }
    } catch (const nlohmann::json::exception&) {
        return field_error(path, "is not valid JSON");
    }
    return Status::ok();
}

Status reasoning_effort(std::string_view effort, std::string_view path, Conversation* c) {
    // DeepSeek: minimal→low, medium/xhigh→high, ultra→max; "none" disables thinking.
    if (effort == "none") {
        c->thinking = false;
    } else if (effort == "minimal" || effort == "low") {
        c->reasoning_effort = ReasoningEffort::kLow;
    } else if (effort == "medium" || effort == "high" || effort == "xhigh") {
        c->reasoning_effort = ReasoningEffort::kHigh;
    } else if (effort == "max" || effort == "ultra") {
        c->reasoning_effort = ReasoningEffort::kMax;
    } else {
        return field_error(path, "unknown reasoning effort '" + std::string(effort) + "'");
    }
    return Status::ok();
}

Status thinking_switch(const J& j, std::string_view path, Conversation* c) {
    const J* t = member(j, "thinking");
    if (t == nullptr) {
        return Status::ok();
    }
    const std::string p = join_path(path, "thinking");
    DSI_RETURN_IF_ERROR(expect_object(*t, p));
    DSI_ASSIGN_OR_RETURN(std::string type, req_string(*t, "type", p));
    // Known but not applied (no thinking budget here): still type-checked, as the APIs
    // do (Anthropic also wants >= 1024; smaller budgets are accepted here).
    DSI_ASSIGN_OR_RETURN(auto budget, opt_int(*t, "budget_tokens", p, 1, INT64_MAX));
    (void)budget;
    if (type == "enabled" || type == "adaptive") {
        c->thinking = true;
    } else if (type == "disabled") {
        c->thinking = false;
    } else {
        return field_error(join_path(p, "type"), "must be 'enabled' or 'disabled'");
    }
    return Status::ok();
}

Status stop_list(const J& j, std::string_view key, std::string_view path, Conversation* c) {
    const J* s = member(j, key);
    if (s == nullptr) {
        return Status::ok();
    }
    const std::string p = join_path(path, key);
    if (s->is_string()) {
        c->sampling.stop.push_back(s->get<std::string>());
        return Status::ok();
    }
    DSI_RETURN_IF_ERROR(expect_array(*s, p));
    for (size_t i = 0; i < s->size(); ++i) {
        if (!(*s)[i].is_string()) {
            return field_error(index_path(p, i), "expected a string");
        }
        c->sampling.stop.push_back((*s)[i].get<std::string>());
    }
    return Status::ok();
}

Status common_sampling(const J& j, Conversation* c) {
    DSI_ASSIGN_OR_RETURN(c->sampling.temperature, opt_number(j, "temperature", "", 0.0, 2.0));
    DSI_ASSIGN_OR_RETURN(c->sampling.top_p, opt_number(j, "top_p", "", 0.0, 1.0));
    DSI_ASSIGN_OR_RETURN(auto stream, opt_bool(j, "stream", ""));
    c->stream = stream.value_or(false);
    return Status::ok();
}

// Tool names as the APIs accept them: OpenAI ^[a-zA-Z0-9_-]{1,64}$, Anthropic
// ^[a-zA-Z0-9_-]{1,128}$ (issue 22 D9). The name is printed into the DSML prompt.
Status check_tool_name(const std::string& name, size_t max_chars, std::string_view path) {
    const bool ok =
        !name.empty() && name.size() <= max_chars &&
        std::all_of(name.begin(), name.end(), [](char ch) {
            return std::isalnum(static_cast<unsigned char>(ch)) != 0 || ch == '_' || ch == '-';
        });
    if (!ok) {
        return field_error(path, "must match ^[a-zA-Z0-9_-]{1," + std::to_string(max_chars) +
                                     "}$, got '" + name.substr(0, 80) + "'");
    }
    return Status::ok();
}

Status penalties(const J& j, Conversation* c) {
    DSI_ASSIGN_OR_RETURN(c->sampling.presence_penalty,
                         opt_number(j, "presence_penalty", "", -2.0, 2.0));
    DSI_ASSIGN_OR_RETURN(c->sampling.frequency_penalty,
                         opt_number(j, "frequency_penalty", "", -2.0, 2.0));
    return Status::ok();
}

// Chat Completions / Completions `stream_options.include_usage`.
Status stream_options(const J& j, Conversation* c) {
    if (const J* so = member(j, "stream_options")) {
        DSI_RETURN_IF_ERROR(expect_object(*so, "stream_options"));
        DSI_ASSIGN_OR_RETURN(auto iu, opt_bool(*so, "include_usage", "stream_options"));
        c->include_usage = iu.value_or(false);
    }
    return Status::ok();
}

// `seed`: any integer (negative ones wrap, as before).
Status seed(const J& j, Conversation* c) {
    DSI_ASSIGN_OR_RETURN(auto v, opt_int(j, "seed", "", INT64_MIN, INT64_MAX));
    if (v) {
        c->sampling.seed = static_cast<uint64_t>(*v);
    }
    return Status::ok();
}

// OpenAI function tool: {type:"function", function:{name, description?, parameters?}}
// (Chat Completions) or flat {type:"function", name, …} (Responses).
Result<Tool> function_tool(const J& t, std::string_view path, bool flat) {
    DSI_RETURN_IF_ERROR(expect_object(t, path));
    DSI_ASSIGN_OR_RETURN(auto type, opt_string(t, "type", path));
    if (type.value_or("function") != "function") {
        return field_error(join_path(path, "type"), "only 'function' tools are supported");
    }
    const J* f = &t;
    std::string fp(path);
    if (!flat) {
        f = member(t, "function");
        fp = join_path(path, "function");
        if (f == nullptr) {
            return field_error(fp, "required field is missing");
        }
        DSI_RETURN_IF_ERROR(expect_object(*f, fp));
    }
    DSI_ASSIGN_OR_RETURN(std::string name, req_string(*f, "name", fp));
    DSI_RETURN_IF_ERROR(check_tool_name(name, 64, join_path(fp, "name")));
    Tool tool;
    tool.function = J::object();
    tool.function["name"] = name;
    for (const char* k : {"description", "parameters", "strict"}) {
        if (const J* v = member(*f, k)) {
            tool.function[k] = *v;
        }
    }
    if (const J* p = member(*f, "parameters"); p != nullptr && !p->is_object()) {
        return field_error(join_path(fp, "parameters"), "expected an object");
    }
    return tool;
}

Status check_tool_choice(const Conversation& c, std::string_view path) {
    if (c.tool_choice == "auto" || c.tool_choice == "none" || c.tool_choice == "required") {
        return Status::ok();
    }
    for (const auto& t : c.tools) {
        if (t.name() == c.tool_choice) {
            return Status::ok();
        }
    }
    return field_error(path, "names a function that is not in tools: '" + c.tool_choice + "'");
}

// ------------------------------------------------------------ Chat Completions

Result<Conversation> chat_conversation(const J& j, int max_depth) {
    Conversation c;
    DSI_ASSIGN_OR_RETURN(c.model, req_string(j, "model", ""));
    const J* msgs = member(j, "messages");
    if (msgs == nullptr) {
        return field_error("messages", "required field is missing");
    }
    DSI_RETURN_IF_ERROR(expect_array(*msgs, "messages"));
    if (msgs->empty()) {
        return field_error("messages", "must contain at least one message");
    }
    for (size_t i = 0; i < msgs->size(); ++i) {
        const J& m = (*msgs)[i];
        const std::string mp = index_path("messages", i);
        DSI_RETURN_IF_ERROR(expect_object(m, mp));
        DSI_ASSIGN_OR_RETURN(std::string role, req_string(m, "role", mp));
        Message msg;
        const std::optional<Role> r = role_from_name(role);
        if (!r) {
            return field_error(join_path(mp, "role"), "unknown role '" + role + "'");
        }
        msg.role = *r;
        DSI_ASSIGN_OR_RETURN(msg.content, text_content(m, "content", mp, &msg.content_is_null));
        if (msg.content_is_null && msg.role != Role::kAssistant) {
            return field_error(join_path(mp, "content"), "required field is missing");
        }
        DSI_ASSIGN_OR_RETURN(auto reasoning, opt_string(m, "reasoning_content", mp));
        msg.reasoning = reasoning;
        DSI_ASSIGN_OR_RETURN(auto name, opt_string(m, "name", mp));
        msg.name = name.value_or("");
        if (msg.role == Role::kTool) {
            // Optional: DeepSeek's encoders pair results with calls by position.
            DSI_ASSIGN_OR_RETURN(auto call_id, opt_string(m, "tool_call_id", mp));
            msg.tool_call_id = call_id.value_or("");
        }
        if (const J* calls = member(m, "tool_calls")) {
            const std::string cp = join_path(mp, "tool_calls");
            if (msg.role != Role::kAssistant) {
                return field_error(cp, "only assistant messages may carry tool calls");
            }
            DSI_RETURN_IF_ERROR(expect_array(*calls, cp));
            for (size_t k = 0; k < calls->size(); ++k) {
                const J& tc = (*calls)[k];
                const std::string tp = index_path(cp, k);
                DSI_RETURN_IF_ERROR(expect_object(tc, tp));
                ToolCall call;
                DSI_ASSIGN_OR_RETURN(auto id, opt_string(tc, "id", tp));
                call.id = id.value_or("");
                const J* f = member(tc, "function");
                if (f == nullptr) {
                    return field_error(join_path(tp, "function"), "required field is missing");
                }
                const std::string fp = join_path(tp, "function");
                DSI_RETURN_IF_ERROR(expect_object(*f, fp));
                DSI_ASSIGN_OR_RETURN(call.name, req_string(*f, "name", fp));
                DSI_ASSIGN_OR_RETURN(call.arguments, req_string(*f, "arguments", fp));
                DSI_RETURN_IF_ERROR(
                    check_arguments(call.arguments, join_path(fp, "arguments"), max_depth));
                msg.tool_calls.push_back(std::move(call));
            }
        }
        if (msg.role == Role::kAssistant && msg.content_is_null && msg.tool_calls.empty() &&
            !msg.reasoning) {
            return field_error(join_path(mp, "content"),
                               "assistant message needs content or tool_calls");
        }
        c.messages.push_back(std::move(msg));
    }
    if (const J* tools = member(j, "tools")) {
        DSI_RETURN_IF_ERROR(expect_array(*tools, "tools"));
        for (size_t i = 0; i < tools->size(); ++i) {
            DSI_ASSIGN_OR_RETURN(Tool t, function_tool((*tools)[i], index_path("tools", i), false));
            c.tools.push_back(std::move(t));
        }
    }
    if (const J* tc = member(j, "tool_choice")) {
        if (tc->is_string()) {
            c.tool_choice = tc->get<std::string>();
            if (c.tool_choice != "auto" && c.tool_choice != "none" && c.tool_choice != "required") {
                return field_error("tool_choice",
                                   "must be 'auto', 'none', 'required' or an object");
            }
        } else {
            DSI_RETURN_IF_ERROR(expect_object(*tc, "tool_choice"));
            const J* f = member(*tc, "function");
            if (f == nullptr || !f->is_object()) {
                return field_error("tool_choice.function", "required field is missing");
            }
            DSI_ASSIGN_OR_RETURN(c.tool_choice, req_string(*f, "name", "tool_choice.function"));
        }
        DSI_RETURN_IF_ERROR(check_tool_choice(c, "tool_choice"));
    }
    if (const J* rf = member(j, "response_format")) {
        DSI_RETURN_IF_ERROR(expect_object(*rf, "response_format"));
        DSI_ASSIGN_OR_RETURN(std::string type, req_string(*rf, "type", "response_format"));
        if (type == "json_schema") {
            const J* js = member(*rf, "json_schema");
            if (js == nullptr || !js->is_object() || member(*js, "schema") == nullptr) {
                return field_error("response_format.json_schema.schema",
                                   "required field is missing");
            }
            c.response_format = (*js)["schema"];
        } else if (type == "json_object") {
            c.response_format = J{{"type", "object"}};
        } else if (type != "text") {
            return field_error("response_format.type", "unknown type '" + type + "'");
        }
    }
    DSI_RETURN_IF_ERROR(thinking_switch(j, "", &c));
    DSI_ASSIGN_OR_RETURN(auto effort, opt_string(j, "reasoning_effort", ""));
    if (effort) {
        DSI_RETURN_IF_ERROR(reasoning_effort(*effort, "reasoning_effort", &c));
    }
    DSI_RETURN_IF_ERROR(common_sampling(j, &c));
    DSI_RETURN_IF_ERROR(penalties(j, &c));
    DSI_ASSIGN_OR_RETURN(auto max_tokens, opt_int(j, "max_tokens", "", 1, kMaxTokens));
    DSI_ASSIGN_OR_RETURN(auto max_completion,
                         opt_int(j, "max_completion_tokens", "", 1, kMaxTokens));
    c.sampling.max_tokens = max_completion ? max_completion : max_tokens;
    DSI_RETURN_IF_ERROR(seed(j, &c));
    DSI_RETURN_IF_ERROR(stop_list(j, "stop", "", &c));
    DSI_RETURN_IF_ERROR(stream_options(j, &c));
    return c;
}

// ------------------------------------------------------------ Responses

Result<Conversation> responses_conversation(const J& j, int max_depth) {
    Conversation c;
    DSI_ASSIGN_OR_RETURN(c.model, req_string(j, "model", ""));
    DSI_ASSIGN_OR_RETURN(auto instructions, opt_string(j, "instructions", ""));
    if (instructions) {
        Message sys;
        sys.role = Role::kSystem;
        sys.content = *instructions;
        c.messages.push_back(std::move(sys));
    }
    const J* input = member(j, "input");
    if (input == nullptr) {
        return field_error("input", "required field is missing");
    }
    if (input->is_string()) {
        Message u;
        u.role = Role::kUser;
        u.content = input->get<std::string>();
        c.messages.push_back(std::move(u));
    } else {
        DSI_RETURN_IF_ERROR(expect_array(*input, "input"));
        for (size_t i = 0; i < input->size(); ++i) {
            const J& it = (*input)[i];
            const std::string ip = index_path("input", i);
            DSI_RETURN_IF_ERROR(expect_object(it, ip));
            DSI_ASSIGN_OR_RETURN(auto type, opt_string(it, "type", ip));
            const std::string t = type.value_or("message");
            if (t == "message") {
                DSI_ASSIGN_OR_RETURN(std::string role, req_string(it, "role", ip));
                Message m;
                const std::optional<Role> r = role_from_name(role);
                if (!r || *r == Role::kTool) {
                    return field_error(join_path(ip, "role"), "unknown role '" + role + "'");
                }
                m.role = *r;
                bool is_null = false;
                DSI_ASSIGN_OR_RETURN(m.content, text_content(it, "content", ip, &is_null));
                if (is_null) {
                    return field_error(join_path(ip, "content"), "required field is missing");
                }
                // Consecutive assistant items (reasoning, message, calls) form one turn.
                if (m.role == Role::kAssistant && !c.messages.empty() &&
                    c.messages.back().role == Role::kAssistant &&
                    c.messages.back().tool_calls.empty() && c.messages.back().content.empty()) {
                    c.messages.back().content = m.content;
                    c.messages.back().content_is_null = false;
                } else {
                    c.messages.push_back(std::move(m));
                }
            } else if (t == "reasoning") {
                std::string text;
                if (const J* ct = member(it, "content"); ct != nullptr && ct->is_array()) {
                    for (const auto& part : *ct) {
                        if (part.is_object() && part.contains("text") && part["text"].is_string()) {
                            text += part["text"].get<std::string>();
                        }
                    }
                }
                Message m;
                m.role = Role::kAssistant;
                m.content_is_null = true;
                m.reasoning = text;
                c.messages.push_back(std::move(m));
            } else if (t == "function_call") {
                ToolCall call;
                DSI_ASSIGN_OR_RETURN(call.id, req_string(it, "call_id", ip));
                DSI_ASSIGN_OR_RETURN(call.name, req_string(it, "name", ip));
                DSI_ASSIGN_OR_RETURN(call.arguments, req_string(it, "arguments", ip));
                DSI_RETURN_IF_ERROR(
                    check_arguments(call.arguments, join_path(ip, "arguments"), max_depth));
                if (c.messages.empty() || c.messages.back().role != Role::kAssistant) {
                    Message m;
                    m.role = Role::kAssistant;
                    m.content_is_null = true;
                    c.messages.push_back(std::move(m));
                }
                c.messages.back().tool_calls.push_back(std::move(call));
            } else if (t == "function_call_output") {
                Message m;
                m.role = Role::kTool;
                DSI_ASSIGN_OR_RETURN(m.tool_call_id, req_string(it, "call_id", ip));
                DSI_ASSIGN_OR_RETURN(m.content, text_content(it, "output", ip, nullptr));
                c.messages.push_back(std::move(m));
            } else {
                return field_error(join_path(ip, "type"),
                                   "unsupported input item type '" + t + "'");
            }
        }
    }
    if (const J* tools = member(j, "tools")) {
        DSI_RETURN_IF_ERROR(expect_array(*tools, "tools"));
        for (size_t i = 0; i < tools->size(); ++i) {
            DSI_ASSIGN_OR_RETURN(Tool t, function_tool((*tools)[i], index_path("tools", i), true));
            c.tools.push_back(std::move(t));
        }
    }
    if (const J* tc = member(j, "tool_choice")) {
        if (tc->is_string()) {
            c.tool_choice = tc->get<std::string>();
        } else {
            DSI_RETURN_IF_ERROR(expect_object(*tc, "tool_choice"));
            DSI_ASSIGN_OR_RETURN(c.tool_choice, req_string(*tc, "name", "tool_choice"));
        }
        DSI_RETURN_IF_ERROR(check_tool_choice(c, "tool_choice"));
    }
    if (const J* r = member(j, "reasoning")) {
        DSI_RETURN_IF_ERROR(expect_object(*r, "reasoning"));
        DSI_ASSIGN_OR_RETURN(auto effort, opt_string(*r, "effort", "reasoning"));
        if (effort) {
            c.thinking = true;
            DSI_RETURN_IF_ERROR(reasoning_effort(*effort, "reasoning.effort", &c));
        }
    }
    DSI_RETURN_IF_ERROR(thinking_switch(j, "", &c));
    if (const J* text = member(j, "text")) {
        DSI_RETURN_IF_ERROR(expect_object(*text, "text"));
        if (const J* f = member(*text, "format")) {
            DSI_RETURN_IF_ERROR(expect_object(*f, "text.format"));
            DSI_ASSIGN_OR_RETURN(std::string type, req_string(*f, "type", "text.format"));
            if (type == "json_schema") {
                const J* s = member(*f, "schema");
                if (s == nullptr) {
                    return field_error("text.format.schema", "required field is missing");
                }
                c.response_format = *s;
            } else if (type == "json_object") {
                c.response_format = J{{"type", "object"}};
            } else if (type != "text") {
                return field_error("text.format.type", "unknown type '" + type + "'");
            }
        }
    }
    DSI_RETURN_IF_ERROR(common_sampling(j, &c));
    DSI_ASSIGN_OR_RETURN(c.sampling.max_tokens, opt_int(j, "max_output_tokens", "", 1, kMaxTokens));
    DSI_RETURN_IF_ERROR(seed(j, &c));
    return c;
}

// ------------------------------------------------------------ Anthropic Messages

// `input` of tool_use blocks is a JSON value (checked with the body), not text.
Result<Conversation> messages_conversation(const J& j, int /*max_depth*/) {
    Conversation c;
    DSI_ASSIGN_OR_RETURN(c.model, req_string(j, "model", ""));
    DSI_ASSIGN_OR_RETURN(c.sampling.max_tokens, opt_int(j, "max_tokens", "", 1, kMaxTokens));
    if (!c.sampling.max_tokens) {
        return field_error("max_tokens", "required field is missing");
    }
    if (const J* sys = member(j, "system")) {
        Message m;
        m.role = Role::kSystem;
        J wrapper = J{{"system", *sys}};
        DSI_ASSIGN_OR_RETURN(m.content, text_content(wrapper, "system", "", nullptr));
        c.messages.push_back(std::move(m));
    }
    const J* msgs = member(j, "messages");
    if (msgs == nullptr) {
        return field_error("messages", "required field is missing");
    }
    DSI_RETURN_IF_ERROR(expect_array(*msgs, "messages"));
    if (msgs->empty()) {
        return field_error("messages", "must contain at least one message");
    }
    for (size_t i = 0; i < msgs->size(); ++i) {
        const J& m = (*msgs)[i];
        const std::string mp = index_path("messages", i);
        DSI_RETURN_IF_ERROR(expect_object(m, mp));
        DSI_ASSIGN_OR_RETURN(std::string role, req_string(m, "role", mp));
        if (role != "user" && role != "assistant") {
            return field_error(join_path(mp, "role"), "must be 'user' or 'assistant'");
        }
        const J* content = member(m, "content");
        const std::string cp = join_path(mp, "content");
        if (content == nullptr) {
            return field_error(cp, "required field is missing");
        }
        Message msg;
        msg.role = role == "user" ? Role::kUser : Role::kAssistant;
        if (content->is_string()) {
            msg.content = content->get<std::string>();
            c.messages.push_back(std::move(msg));
            continue;
        }
        DSI_RETURN_IF_ERROR(expect_array(*content, cp));
        bool has_text = false;
        std::vector<Message> tool_results;
        for (size_t k = 0; k < content->size(); ++k) {
            const J& b = (*content)[k];
            const std::string bp = index_path(cp, k);
            DSI_RETURN_IF_ERROR(expect_object(b, bp));
            DSI_ASSIGN_OR_RETURN(std::string type, req_string(b, "type", bp));
            if (type == "text") {
                DSI_ASSIGN_OR_RETURN(std::string text, req_string(b, "text", bp));
                msg.content += text;
                has_text = true;
            } else if (type == "thinking" && msg.role == Role::kAssistant) {
                DSI_ASSIGN_OR_RETURN(std::string text, req_string(b, "thinking", bp));
                msg.reasoning = msg.reasoning.value_or("") + text;
            } else if (type == "redacted_thinking" && msg.role == Role::kAssistant) {
                continue;
            } else if (type == "tool_use" && msg.role == Role::kAssistant) {
                ToolCall call;
                DSI_ASSIGN_OR_RETURN(call.id, req_string(b, "id", bp));
                DSI_ASSIGN_OR_RETURN(call.name, req_string(b, "name", bp));
                const J* input = member(b, "input");
                if (input == nullptr || !input->is_object()) {
                    return field_error(join_path(bp, "input"), "expected an object");
                }
                call.arguments = input->dump();
                msg.tool_calls.push_back(std::move(call));
            } else if (type == "tool_result" && msg.role == Role::kUser) {
                Message t;
                t.role = Role::kTool;
                DSI_ASSIGN_OR_RETURN(t.tool_call_id, req_string(b, "tool_use_id", bp));
                DSI_ASSIGN_OR_RETURN(t.content, text_content(b, "content", bp, nullptr));
                tool_results.push_back(std::move(t));
            } else if (is_image_type(type)) {
                return image_error(join_path(bp, "type"), type);
            } else {
                return field_error(join_path(bp, "type"), "unsupported content block type '" +
                                                              type + "' for role " + role);
            }
        }
        for (auto& t : tool_results) {
            c.messages.push_back(std::move(t));
        }
        if (msg.role == Role::kAssistant) {
            msg.content_is_null = !has_text;
            c.messages.push_back(std::move(msg));
        } else if (has_text || tool_results.empty()) {
            c.messages.push_back(std::move(msg));
        }
    }
    if (const J* tools = member(j, "tools")) {
        DSI_RETURN_IF_ERROR(expect_array(*tools, "tools"));
        for (size_t i = 0; i < tools->size(); ++i) {
            const J& t = (*tools)[i];
            const std::string tp = index_path("tools", i);
            DSI_RETURN_IF_ERROR(expect_object(t, tp));
            Tool tool;
            tool.function = J::object();
            DSI_ASSIGN_OR_RETURN(std::string name, req_string(t, "name", tp));
            DSI_RETURN_IF_ERROR(check_tool_name(name, 128, join_path(tp, "name")));
            tool.function["name"] = name;
            if (const J* d = member(t, "description")) {
                tool.function["description"] = *d;
            }
            const J* schema = member(t, "input_schema");
            if (schema == nullptr || !schema->is_object()) {
                return field_error(join_path(tp, "input_schema"), "expected an object");
            }
            tool.function["parameters"] = *schema;
            c.tools.push_back(std::move(tool));
        }
    }
    if (const J* tc = member(j, "tool_choice")) {
        DSI_RETURN_IF_ERROR(expect_object(*tc, "tool_choice"));
        DSI_ASSIGN_OR_RETURN(std::string type, req_string(*tc, "type", "tool_choice"));
        if (type == "auto" || type == "none") {
            c.tool_choice = type;
        } else if (type == "any") {
            c.tool_choice = "required";
        } else if (type == "tool") {
            DSI_ASSIGN_OR_RETURN(c.tool_choice, req_string(*tc, "name", "tool_choice"));
        } else {
            return field_error("tool_choice.type", "unknown type '" + type + "'");
        }
        DSI_RETURN_IF_ERROR(check_tool_choice(c, "tool_choice"));
    }
    DSI_RETURN_IF_ERROR(thinking_switch(j, "", &c));
    if (const J* oc = member(j, "output_config")) {
        DSI_RETURN_IF_ERROR(expect_object(*oc, "output_config"));
        DSI_ASSIGN_OR_RETURN(auto effort, opt_string(*oc, "effort", "output_config"));
        if (effort) {
            DSI_RETURN_IF_ERROR(reasoning_effort(*effort, "output_config.effort", &c));
        }
    }
    DSI_RETURN_IF_ERROR(common_sampling(j, &c));
    DSI_ASSIGN_OR_RETURN(c.sampling.top_k, opt_int(j, "top_k", "", 0, kMaxTokens));
    DSI_RETURN_IF_ERROR(stop_list(j, "stop_sequences", "", &c));
    return c;
}

// ------------------------------------------------------------ legacy completions

// {"model", "prompt": string, "max_tokens" (default 16, OpenAI's), "temperature",
// "top_p", "presence_penalty", "frequency_penalty", "seed", "stop" (up to 4),
// "stream", "stream_options"}: the sampling checks are Chat's.
Result<Conversation> completions_settings(const J& j) {
    Conversation c;
    DSI_ASSIGN_OR_RETURN(c.model, req_string(j, "model", ""));
    DSI_RETURN_IF_ERROR(common_sampling(j, &c));
    DSI_RETURN_IF_ERROR(penalties(j, &c));
    DSI_ASSIGN_OR_RETURN(c.sampling.max_tokens, opt_int(j, "max_tokens", "", 1, kMaxTokens));
    if (!c.sampling.max_tokens) {
        c.sampling.max_tokens = 16;
    }
    DSI_RETURN_IF_ERROR(seed(j, &c));
    DSI_RETURN_IF_ERROR(stop_list(j, "stop", "", &c));
    if (c.sampling.stop.size() > 4) {
        return field_error("stop", "expected a string or up to 4 strings");
    }
    DSI_RETURN_IF_ERROR(stream_options(j, &c));
    return c;
}

// ------------------------------------------------------------ the serving controls

constexpr size_t kMaxCacheSaltBytes = 256;
constexpr int64_t kMaxTimeoutMs = int64_t{24} * 3600 * 1000;

Status serving_controls(const J& j, Request* r) {
    DSI_ASSIGN_OR_RETURN(auto salt, opt_string(j, "cache_salt", ""));
    if (salt) {
        // Control characters are refused so that a client's salt can never spell the
        // server's per-key namespace (server/api.h, effective_cache_salt).
        const bool printable = std::none_of(salt->begin(), salt->end(), [](char ch) {
            return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f;
        });
        if (salt->empty() || salt->size() > kMaxCacheSaltBytes || !printable) {
            return field_error("cache_salt", "must be a non-empty string of at most " +
                                                 std::to_string(kMaxCacheSaltBytes) +
                                                 " bytes without control characters");
        }
        r->cache_salt = std::move(*salt);
    }
    DSI_ASSIGN_OR_RETURN(auto traffic, opt_string(j, "traffic_class", ""));
    if (traffic) {
        if (*traffic == "chat") {
            r->traffic_class = TrafficClass::kChat;
        } else if (*traffic == "agent") {
            r->traffic_class = TrafficClass::kAgent;
        } else {
            return field_error("traffic_class",
                               "must be 'chat' or 'agent', got '" + traffic->substr(0, 40) + "'");
        }
    }
    DSI_ASSIGN_OR_RETURN(r->timeout_ms, opt_int(j, "timeout_ms", "", 1, kMaxTimeoutMs));
    DSI_ASSIGN_OR_RETURN(auto spec_usage, opt_bool(j, "speculative_usage", ""));
    r->speculative_usage = spec_usage.value_or(false);
    return Status::ok();
}

// logprobs / top_logprobs / n as each OpenAI API spells them.
Status output_options(ApiProtocol api, const J& j, Request* r) {
    if (api == ApiProtocol::kChatCompletions) {
        DSI_ASSIGN_OR_RETURN(auto on, opt_bool(j, "logprobs", ""));
        DSI_ASSIGN_OR_RETURN(auto top, opt_int(j, "top_logprobs", "", 0, 20));
        if (on.value_or(false)) {
            r->logprobs = static_cast<int32_t>(top.value_or(0));
        } else if (top) {
            return field_error("top_logprobs", "requires logprobs: true");
        }
    } else if (api == ApiProtocol::kCompletions) {
        DSI_ASSIGN_OR_RETURN(auto k, opt_int(j, "logprobs", "", 0, 5));
        r->logprobs = k ? static_cast<int32_t>(*k) : -1;
    } else if (api == ApiProtocol::kResponses) {
        // On when `include` has "message.output_text.logprobs"; top_logprobs 0-20.
        bool on = false;
        if (const J* inc = member(j, "include")) {
            DSI_RETURN_IF_ERROR(expect_array(*inc, "include"));
            for (size_t i = 0; i < inc->size(); ++i) {
                if (!(*inc)[i].is_string()) {
                    return field_error(index_path("include", i), "expected a string");
                }
                on = on || (*inc)[i].get<std::string>() == "message.output_text.logprobs";
            }
        }
        DSI_ASSIGN_OR_RETURN(auto top, opt_int(j, "top_logprobs", "", 0, 20));
        if (on) {
            r->logprobs = static_cast<int32_t>(top.value_or(0));
        }
    }
    if (api == ApiProtocol::kChatCompletions || api == ApiProtocol::kCompletions) {
        DSI_ASSIGN_OR_RETURN(auto n, opt_int(j, "n", "", INT64_MIN, INT64_MAX));
        if (n && *n != 1) {
            return field_error("n", "only 1 is supported");
        }
    }
    if (api != ApiProtocol::kMessages) {
        DSI_ASSIGN_OR_RETURN(auto ignore_eos, opt_bool(j, "ignore_eos", ""));
        r->ignore_eos = ignore_eos.value_or(false);
    }
    if (api == ApiProtocol::kChatCompletions || api == ApiProtocol::kResponses) {
        DSI_ASSIGN_OR_RETURN(auto parallel, opt_bool(j, "parallel_tool_calls", ""));
        r->parallel_tool_calls = parallel.value_or(true);
    }
    return Status::ok();
}

}  // namespace

Result<Request> parse_api_request(ApiProtocol api, std::string_view body,
                                  const RequestOptions& options) {
    DSI_ASSIGN_OR_RETURN(J j, parse_request_body(body, options.max_json_depth));
    DSI_RETURN_IF_ERROR(check_request_fields(api, j));
    Request r;
    r.api = api;
    if (api == ApiProtocol::kCompletions) {
        DSI_ASSIGN_OR_RETURN(r.conversation, completions_settings(j));
        DSI_ASSIGN_OR_RETURN(r.prompt, req_string(j, "prompt", ""));
    } else {
        DSI_ASSIGN_OR_RETURN(r.conversation,
                             conversation_from_json(api, j, options.max_json_depth));
    }
    DSI_ASSIGN_OR_RETURN(r.grammar, read_structured_request(api, j));
    DSI_RETURN_IF_ERROR(output_options(api, j, &r));
    if (api != ApiProtocol::kCompletions) {
        DSI_ASSIGN_OR_RETURN(auto forced_tool, read_tool_choice(r.conversation, options.encoding,
                                                                r.parallel_tool_calls));
        if (forced_tool) {
            if (r.grammar) {
                return field_error("tool_choice", "cannot be combined with " + r.grammar->field);
            }
            r.grammar = std::move(forced_tool);
        }
    }
    // With a grammar the output is the final answer only: thinking off (the prompt
    // closes the think block), so the mask covers every output token.
    if (r.grammar) {
        r.conversation.thinking = false;
    }
    DSI_RETURN_IF_ERROR(serving_controls(j, &r));
    return r;
}

Result<Conversation> conversation_from_json(ApiProtocol api, const OrderedJson& body,
                                            int max_depth) {
    switch (api) {
        case ApiProtocol::kChatCompletions:
            return chat_conversation(body, max_depth);
        case ApiProtocol::kResponses:
            return responses_conversation(body, max_depth);
        case ApiProtocol::kMessages:
            return messages_conversation(body, max_depth);
        case ApiProtocol::kCompletions:
            break;
    }
    return invalid_argument("legacy completions carry a prompt, not a conversation");
}

Result<OrderedJson> parse_request_body(std::string_view body, int max_depth) {
    DSI_ASSIGN_OR_RETURN(J j, parse_json(body, max_depth, ""));
    if (!j.is_object()) {
        return field_error("body", "expected a JSON object");
    }
    return j;
}

Result<Conversation> parse_request(ApiProtocol api, std::string_view body, int max_depth) {
    DSI_ASSIGN_OR_RETURN(J j, parse_request_body(body, max_depth));
    return conversation_from_json(api, j, max_depth);
}

Result<Conversation> parse_chat_completions_request(std::string_view body, int max_depth) {
    return parse_request(ApiProtocol::kChatCompletions, body, max_depth);
}
Result<Conversation> parse_responses_request(std::string_view body, int max_depth) {
    return parse_request(ApiProtocol::kResponses, body, max_depth);
}
Result<Conversation> parse_messages_request(std::string_view body, int max_depth) {
    return parse_request(ApiProtocol::kMessages, body, max_depth);
}

}  // namespace dsi::protocol
