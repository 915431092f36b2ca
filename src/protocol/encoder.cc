// Chat encoders (S-REC-1, S-REC-2). Each function mirrors its reference encoder
// line by line; template tokens go through Prompt::token (ids), caller text
// through Prompt::text (never recognised as special tokens).
#include "protocol/encoder.h"

#include <string>

#include "protocol/internal/python_json.h"
#include "protocol/json_limits.h"

namespace dsi::protocol {

using internal::python_dumps;

namespace {

constexpr std::string_view kResponseFormatTemplate =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

// Template text: every "<think>", "</think>" and "｜DSML｜" in it becomes the token
// when the vocabulary has one (the reference tokenises its whole string with
// special tokens recognised). Only template text goes through here, never caller
// text (S-REC-2).
void template_text(Prompt* p, const SpecialTokens& t, std::string_view s) {
    const std::pair<std::string_view, int32_t> marks[] = {
        {kThinkBeginToken, t.think_begin}, {kThinkEndToken, t.think_end}, {kDsmlToken, t.dsml}};
    size_t pos = 0;
    while (pos < s.size()) {
        size_t best = std::string_view::npos;
        std::string_view best_s;
        int32_t best_id = -1;
        for (const auto& [spelling, id] : marks) {
            if (id < 0) {
                continue;
            }
            size_t hit = s.find(spelling, pos);
            if (hit < best) {
                best = hit;
                best_s = spelling;
                best_id = id;
            }
        }
        if (best == std::string_view::npos) {
            p->text(s.substr(pos));
            return;
        }
        p->text(s.substr(pos, best - pos));
        p->token(best_id, best_s);
        pos = best + best_s.size();
    }
}

std::string tool_schemas(const std::vector<Tool>& tools) {
    std::string out;
    for (size_t i = 0; i < tools.size(); ++i) {
        if (i > 0) {
            out.push_back('\n');
        }
        out.append(python_dumps(tools[i].function));
    }
    return out;
}

// Both DSML dialects render tool-call arguments the same way: a string value raw
// with string="true", anything else json.dumps'ed with string="false".
Result<std::string> dsml_invoke(const ToolCall& call) {
    OrderedJson args;
    DSI_RETURN_IF_ERROR(check_json_depth(call.arguments, kDefaultMaxJsonDepth,
                                         "tool call '" + call.name + "' arguments"));
    try {
        args = OrderedJson::parse(call.arguments.empty() ? std::string("{}") : call.arguments);
    } catch (const nlohmann::json::exception&) {
        return invalid_argument("tool call '" + call.name + "': arguments are not valid JSON");
    }
    if (!args.is_object()) {
        return invalid_argument("tool call '" + call.name + "': arguments are not a JSON object");
    }
    std::string out = "<｜DSML｜invoke name=\"" + call.name + "\">\n";
    bool first = true;
    for (const auto& [k, v] : args.items()) {
        if (!first) {
            out.push_back('\n');
        }
        first = false;
        out += "<｜DSML｜parameter name=\"" + k + "\" string=\"";
        if (v.is_string()) {
            out += "true\">" + v.get<std::string>();
        } else {
            out += "false\">" + python_dumps(v);
        }
        out += "</｜DSML｜parameter>";
    }
    out += "\n</｜DSML｜invoke>";
    return out;
}

Result<std::string> dsml_calls(const std::vector<ToolCall>& calls, std::string_view block) {
    std::string out = "\n\n<｜DSML｜" + std::string(block) + ">\n";
    for (size_t i = 0; i < calls.size(); ++i) {
        if (i > 0) {
            out.push_back('\n');
        }
        DSI_ASSIGN_OR_RETURN(std::string inv, dsml_invoke(calls[i]));
        out += inv;
    }
    out += "\n</｜DSML｜" + std::string(block) + ">";
    return out;
}

// Conversation-level tools and response format go onto the leading system
// message (the V3.2 golden protocol's placement); one is created when missing.
std::vector<Message> with_tools_attached(const Conversation& c) {
    std::vector<Message> msgs = c.messages;
    if (c.tools.empty() && !c.response_format) {
        return msgs;
    }
    if (msgs.empty() || msgs[0].role != Role::kSystem) {
        Message sys;
        sys.role = Role::kSystem;
        msgs.insert(msgs.begin(), sys);
    }
    for (const auto& t : c.tools) {
        msgs[0].tools.push_back(t);
    }
    if (c.response_format && !msgs[0].response_format) {
        msgs[0].response_format = c.response_format;
    }
    return msgs;
}

std::string msg_error(size_t i, std::string_view what) {
    return "messages[" + std::to_string(i) + "]: " + std::string(what);
}

// ---------------------------------------------------------------- V3.2 (DSML)

constexpr std::string_view kV32ToolsHead =
    "## Tools\n\nYou have access to a set of tools you can use to answer the user's question.\n"
    "You can invoke functions by writing a \"<｜DSML｜function_calls>\" block like the following "
    "as part of your reply to the user:\n"
    "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"$FUNCTION_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
    "</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$FUNCTION_NAME2\">\n...\n"
    "</｜DSML｜invoke>\n</｜DSML｜function_calls>\n\n"
    "String and scalar parameters should be specified as is without any escaping or quotes, "
    "while lists and objects should use JSON format. The \"string\" attribute should be set to "
    "\"true\" for string type parameters and \"false\" for other types (numbers, booleans, "
    "arrays, objects).\n\n"
    "If the thinking_mode is enabled, then after function results you should strongly consider "
    "outputting a thinking block. Here is an example:\n\n"
    "<｜DSML｜function_calls>\n...\n</｜DSML｜function_calls>\n\n<function_results>\n...\n"
    "</function_results>\n\n";
constexpr std::string_view kV32ToolsTail =
    "\n\nHere are the functions available in JSONSchema format:\n<functions>\n";

void v32_tools(Prompt* p, const SpecialTokens& t, const std::vector<Tool>& tools) {
    template_text(p, t, kV32ToolsHead);
    template_text(p, t, "<think>...thinking about results</think>");
    template_text(p, t, kV32ToolsTail);
    p->text(tool_schemas(tools));
    p->text("\n</functions>\n");
}

int last_user_index(const std::vector<Message>& msgs, bool include_tool) {
    for (size_t i = msgs.size(); i-- > 0;) {
        const Role r = msgs[i].role;
        if (r == Role::kUser || r == Role::kDeveloper || (include_tool && r == Role::kTool)) {
            return static_cast<int>(i);
        }
    }
    return -1;
}

// An assistant answer in either DSML dialect: [reasoning </think>] content
// [tool-call block] EOS.
Status dsml_answer(Prompt* p, const SpecialTokens& t, const Message& m, bool with_reasoning,
                   std::string_view block) {
    std::string calls;
    if (!m.tool_calls.empty()) {
        DSI_ASSIGN_OR_RETURN(calls, dsml_calls(m.tool_calls, block));
    }
    if (with_reasoning) {
        p->text(m.reasoning.value_or(""));
        p->token(t.think_end, kThinkEndToken);
    }
    p->text(m.content);
    template_text(p, t, calls);
    p->token(t.eos, kEosToken);
    return Status::ok();
}

Result<Prompt> encode_v32(const Conversation& c, const SpecialTokens& t, bool thinking,
                          const EncodeOptions& opt) {
    std::vector<Message> msgs = with_tools_attached(c);
    const int last_user = last_user_index(msgs, false);
    if (thinking && opt.drop_thinking) {
        for (size_t i = 0; i < msgs.size(); ++i) {
            if (msgs[i].role == Role::kAssistant && static_cast<int>(i) < last_user) {
                msgs[i].reasoning.reset();
            }
        }
    }
    Prompt p;
    if (opt.add_bos) {
        p.token(t.bos, kBosToken);
    }
    for (size_t i = 0; i < msgs.size(); ++i) {
        const Message& m = msgs[i];
        const int idx = static_cast<int>(i);
        switch (m.role) {
            case Role::kSystem:
                p.text(m.content);
                if (!m.tools.empty()) {
                    p.text("\n\n");
                    v32_tools(&p, t, m.tools);
                }
                if (m.response_format) {
                    p.text("\n\n");
                    p.text(kResponseFormatTemplate);
                    p.text(python_dumps(*m.response_format));
                }
                break;
            case Role::kDeveloper:
            case Role::kUser:
                if (m.role == Role::kDeveloper && m.content.empty()) {
                    return invalid_argument(msg_error(i, "developer message has no content"));
                }
                p.token(t.user, kUserToken);
                if (m.role == Role::kDeveloper) {
                    if (!m.tools.empty()) {
                        p.text("\n\n");
                        v32_tools(&p, t, m.tools);
                    }
                    if (m.response_format) {
                        p.text("\n\n");
                        p.text(kResponseFormatTemplate);
                        p.text(python_dumps(*m.response_format));
                    }
                    p.text("\n\n# The user's message is: ");
                }
                p.text(m.content);
                p.token(t.assistant, kAssistantToken);
                if (idx == last_user && thinking) {
                    p.token(t.think_begin, kThinkBeginToken);
                } else {
                    p.token(t.think_end, kThinkEndToken);
                }
                break;
            case Role::kTool: {
                int prev = idx - 1;
                while (prev >= 0 && msgs[prev].role == Role::kTool) {
                    --prev;
                }
                if (prev < 0 || msgs[prev].role != Role::kAssistant) {
                    return invalid_argument(
                        msg_error(i, "tool message does not follow an assistant tool call"));
                }
                const size_t order = static_cast<size_t>(idx - prev);
                const size_t num_calls = msgs[prev].tool_calls.size();
                if (num_calls < order) {
                    return invalid_argument(
                        msg_error(i, "more tool results than the assistant made tool calls"));
                }
                if (order == 1) {
                    p.text("\n\n<function_results>");
                }
                p.text("\n<result>");
                p.text(m.content);
                p.text("</result>");
                if (order == num_calls) {
                    p.text("\n</function_results>\n\n");
                    if (idx >= last_user && thinking) {
                        p.token(t.think_begin, kThinkBeginToken);
                    } else {
                        p.token(t.think_end, kThinkEndToken);
                    }
                }
                break;
            }
            case Role::kAssistant: {
                const bool after_last_user = thinking && idx > last_user;
                if (after_last_user && !m.reasoning && m.tool_calls.empty()) {
                    return invalid_argument(msg_error(
                        i, "assistant after the last user message needs reasoning or tool calls "
                           "in thinking mode"));
                }
                DSI_RETURN_IF_ERROR(dsml_answer(&p, t, m, after_last_user, "function_calls"));
                break;
            }
            case Role::kLatestReminder:
                return invalid_argument(
                    msg_error(i, "role 'latest_reminder' is not part of the V3.2 encoding"));
        }
    }
    return p;
}

// ---------------------------------------------------------------- V4 (DSML tool_calls)

constexpr std::string_view kV4ToolsHead =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can "
    "invoke tools by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n"
    "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
    "</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other "
    "types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete "
    "reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
constexpr std::string_view kV4ToolsTail =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
    "tool calls.\n";
constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
constexpr std::string_view kV4EffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

void v4_tools(Prompt* p, const SpecialTokens& t, const std::vector<Tool>& tools) {
    template_text(p, t, kV4ToolsHead);
    p->text(tool_schemas(tools));
    template_text(p, t, kV4ToolsTail);
}

void v4_system_extras(Prompt* p, const SpecialTokens& t, const Message& m) {
    if (!m.tools.empty()) {
        p->text("\n\n");
        v4_tools(p, t, m.tools);
    }
    if (m.response_format) {
        p->text("\n\n");
        p->text(kResponseFormatTemplate);
        p->text(python_dumps(*m.response_format));
    }
}

Result<Prompt> encode_v4(const Conversation& c, const SpecialTokens& t, bool thinking,
                         const EncodeOptions& opt) {
    std::vector<Message> msgs = with_tools_attached(c);
    bool has_tools = false;
    for (const auto& m : msgs) {
        has_tools = has_tools || !m.tools.empty();
    }
    // Dropping is off with tools: tool calling needs the full reasoning trace.
    const bool drop = opt.drop_thinking && !has_tools;
    const int last_user = last_user_index(msgs, true);
    Prompt p;
    if (opt.add_bos) {
        p.token(t.bos, kBosToken);
    }
    if (thinking && c.reasoning_effort == ReasoningEffort::kMax) {
        p.text(kV4EffortMax);
    }
    auto user_run = [](Role r) { return r == Role::kUser || r == Role::kTool; };
    for (size_t i = 0; i < msgs.size(); ++i) {
        const Message& m = msgs[i];
        switch (m.role) {
            case Role::kSystem:
            case Role::kDeveloper:
                if (m.role == Role::kDeveloper) {
                    p.token(t.user, kUserToken);
                }
                p.text(m.content);
                v4_system_extras(&p, t, m);
                break;
            case Role::kLatestReminder:
                p.text(kLatestReminder);
                p.text(m.content);
                break;
            case Role::kUser:
            case Role::kTool:
                // A run of user/tool messages is one user turn.
                if (i == 0 || !user_run(msgs[i - 1].role)) {
                    p.token(t.user, kUserToken);
                } else {
                    p.text("\n\n");
                }
                if (m.role == Role::kTool) {
                    p.text("<tool_result>");
                    p.text(m.content);
                    p.text("</tool_result>");
                } else {
                    p.text(m.content);
                }
                break;
            case Role::kAssistant: {
                p.token(t.assistant, kAssistantToken);
                const bool keep = thinking && (!drop || static_cast<int>(i) > last_user);
                if (keep) {
                    p.token(t.think_begin, kThinkBeginToken);
                } else {
                    p.token(t.think_end, kThinkEndToken);
                }
                DSI_RETURN_IF_ERROR(dsml_answer(&p, t, m, keep, "tool_calls"));
                break;
            }
        }
    }
    if (opt.add_generation_prompt && (msgs.empty() || msgs.back().role != Role::kAssistant)) {
        p.token(t.assistant, kAssistantToken);
        p.token(thinking ? t.think_begin : t.think_end, thinking ? kThinkBeginToken : kThinkEndToken);
    }
    return p;
}

// ---------------------------------------------------------------- V3 Jinja template

// Reimplements the original V3 tokenizer_config.json chat_template statement by
// statement, including its quirks (ns.is_first / ns.is_output_first are never
// reset; <｜tool▁calls▁end｜> is written only after a second tool call; tools are
// not rendered). Equality with @huggingface/jinja is tested in tests/protocol/.
Result<Prompt> encode_v3_template(const Conversation& c, const SpecialTokens& t,
                                  const EncodeOptions& opt) {
    Prompt p;
    if (opt.add_bos) {
        p.token(t.bos, kBosToken);
    }
    bool first_sp = true;
    for (const auto& m : c.messages) {
        if (m.role == Role::kSystem) {
            if (!first_sp) {
                p.text("\n\n");
            }
            p.text(m.content);
            first_sp = false;
        }
    }
    bool is_first = false;
    bool is_tool = false;
    bool is_output_first = true;
    for (size_t i = 0; i < c.messages.size(); ++i) {
        const Message& m = c.messages[i];
        if (m.role == Role::kUser) {
            is_tool = false;
            p.token(t.user, kUserToken);
            p.text(m.content);
        }
        if (m.role == Role::kAssistant && m.content_is_null) {
            is_tool = false;
            for (const auto& call : m.tool_calls) {
                if (!is_first) {
                    p.token(t.assistant, kAssistantToken);
                    p.token(t.tool_calls_begin, "<｜tool▁calls▁begin｜>");
                    p.token(t.tool_call_begin, "<｜tool▁call▁begin｜>");
                } else {
                    p.text("\n");
                    p.token(t.tool_call_begin, "<｜tool▁call▁begin｜>");
                }
                p.text("function");
                p.token(t.tool_sep, "<｜tool▁sep｜>");
                p.text(call.name + "\n```json\n" + call.arguments + "\n```");
                p.token(t.tool_call_end, "<｜tool▁call▁end｜>");
                if (is_first) {
                    p.token(t.tool_calls_end, "<｜tool▁calls▁end｜>");
                    p.token(t.eos, kEosToken);
                }
                is_first = true;
            }
        }
        if (m.role == Role::kAssistant && !m.content_is_null) {
            if (is_tool) {
                p.token(t.tool_outputs_end, "<｜tool▁outputs▁end｜>");
                is_tool = false;
            } else {
                p.token(t.assistant, kAssistantToken);
            }
            p.text(m.content);
            p.token(t.eos, kEosToken);
        }
        if (m.role == Role::kTool) {
            is_tool = true;
            if (is_output_first) {
                p.token(t.tool_outputs_begin, "<｜tool▁outputs▁begin｜>");
                is_output_first = false;
            } else {
                p.text("\n");
            }
            p.token(t.tool_output_begin, "<｜tool▁output▁begin｜>");
            p.text(m.content);
            p.token(t.tool_output_end, "<｜tool▁output▁end｜>");
        }
        if (m.role == Role::kDeveloper || m.role == Role::kLatestReminder) {
            return invalid_argument(msg_error(i, "role '" + std::string(role_name(m.role)) +
                                                     "' is not supported by the V3 template"));
        }
    }
    if (is_tool) {
        p.token(t.tool_outputs_end, "<｜tool▁outputs▁end｜>");
    }
    if (opt.add_generation_prompt && !is_tool) {
        p.token(t.assistant, kAssistantToken);
    }
    return p;
}

}  // namespace

ChatEncoding chat_encoding_for_model_type(std::string_view model_type) {
    if (model_type == "deepseek_v32") {
        return ChatEncoding::kDeepSeekV32;
    }
    if (model_type == "deepseek_v4") {
        return ChatEncoding::kDeepSeekV4;
    }
    return ChatEncoding::kDeepSeekV3Template;
}

std::string_view chat_encoding_name(ChatEncoding encoding) {
    switch (encoding) {
        case ChatEncoding::kDeepSeekV32: return "deepseek_v32";
        case ChatEncoding::kDeepSeekV4: return "deepseek_v4";
        case ChatEncoding::kDeepSeekV3Template: return "deepseek_v3_template";
    }
    return "?";
}

Result<Prompt> encode_conversation(ChatEncoding encoding, const Conversation& conversation,
                                   const SpecialTokens& tokens, const EncodeOptions& options) {
    const bool thinking = options.thinking.value_or(conversation.thinking);
    switch (encoding) {
        case ChatEncoding::kDeepSeekV32: return encode_v32(conversation, tokens, thinking, options);
        case ChatEncoding::kDeepSeekV4: return encode_v4(conversation, tokens, thinking, options);
        case ChatEncoding::kDeepSeekV3Template:
            return encode_v3_template(conversation, tokens, options);
    }
    return invalid_argument("unknown chat encoding");
}

Result<Prompt> encode_completion(ChatEncoding encoding, const Message& m, bool thinking,
                                 const SpecialTokens& t) {
    Prompt p;
    switch (encoding) {
        case ChatEncoding::kDeepSeekV32:
            DSI_RETURN_IF_ERROR(dsml_answer(&p, t, m, thinking, "function_calls"));
            return p;
        case ChatEncoding::kDeepSeekV4:
            DSI_RETURN_IF_ERROR(dsml_answer(&p, t, m, thinking, "tool_calls"));
            return p;
        case ChatEncoding::kDeepSeekV3Template:
            break;
    }
    return unimplemented("completion rendering for the V3 template");
}

}  // namespace dsi::protocol
