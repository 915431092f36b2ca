// Parser events -> API responses and SSE sequences (S-REC-1).
#include "protocol/adapters.h"

#include "base/check.h"

namespace dsi::protocol {

Completion fold_events(const std::vector<Event>& events) {
    Completion c;
    for (const Event& e : events) {
        switch (e.kind) {
            case EventKind::kReasoningDelta: c.reasoning += e.text; break;
            case EventKind::kContentDelta: c.content += e.text; break;
            case EventKind::kToolCallStart:
                c.tool_calls.push_back(ToolCall{e.tool_id, e.tool_name, ""});
                break;
            case EventKind::kToolCallArgs:
                if (e.tool_index >= 0 && static_cast<size_t>(e.tool_index) < c.tool_calls.size()) {
                    c.tool_calls[static_cast<size_t>(e.tool_index)].arguments += e.text;
                }
                break;
            case EventKind::kToolCallEnd: break;
            case EventKind::kFinish:
                c.finish = e.finish;
                c.malformed = e.malformed;
                break;
        }
    }
    return c;
}

}  // namespace dsi::protocol

namespace dsi::protocol {

OrderedJson speculative_usage_json(const SpeculativeUsage& s) {
    return OrderedJson{{"draft_tokens", s.draft_tokens},
                       {"accepted_tokens", s.accepted_tokens},
                       {"verify_steps", s.verify_steps}};
}

namespace {

using J = nlohmann::ordered_json;

std::string anthropic_stop(StopReason r) {
    switch (r) {
        case StopReason::kStop: return "end_turn";
        case StopReason::kLength: return "max_tokens";
        case StopReason::kToolCalls: return "tool_use";
    }
    return "end_turn";
}

// The model wrote `args`: deeper than a request may be is treated as not JSON (D1).
J parse_args_or_empty(const std::string& args) {
    if (!check_json_depth(args, kDefaultMaxJsonDepth, "").is_ok()) {
        return J::object();
    }
    J a = J::parse(args, nullptr, false);
    return a.is_object() ? a : J::object();
}

J with_speculative(J u, const ResponseMeta& m) {
    if (m.speculative_usage) u["speculative"] = speculative_usage_json(m.speculative);
    return u;
}

J chat_usage(const ResponseMeta& m) {
    J u = {{"prompt_tokens", m.prompt_tokens},
           {"completion_tokens", m.completion_tokens},
           {"total_tokens", m.prompt_tokens + m.completion_tokens}};
    u["prompt_tokens_details"] = {{"cached_tokens", m.cached_tokens}};
    u["completion_tokens_details"] = {{"reasoning_tokens", m.reasoning_tokens}};
    return with_speculative(std::move(u), m);
}

J responses_usage(const ResponseMeta& m) {
    return with_speculative(
        J{{"input_tokens", m.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", m.cached_tokens}}},
          {"output_tokens", m.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", m.reasoning_tokens}}},
          {"total_tokens", m.prompt_tokens + m.completion_tokens}},
        m);
}

J messages_usage(const ResponseMeta& m) {
    // Anthropic counts cache reads apart from input_tokens.
    return with_speculative(J{{"input_tokens", m.prompt_tokens - m.cached_tokens},
                              {"cache_creation_input_tokens", 0},
                              {"cache_read_input_tokens", m.cached_tokens},
                              {"output_tokens", m.completion_tokens}},
                            m);
}

J responses_reasoning_item(const std::string& id, const std::string& text, bool done) {
    J item = {{"id", id}, {"type", "reasoning"}, {"summary", J::array()}};
    item["content"] = J::array({J{{"type", "reasoning_text"}, {"text", text}}});
    if (!done) {
        item["content"] = J::array();
    }
    return item;
}

J responses_message_item(const std::string& id, const std::string& text, bool done) {
    J item = {{"id", id}, {"type", "message"}, {"status", done ? "completed" : "in_progress"},
              {"role", "assistant"}, {"content", J::array()}};
    if (done) {
        item["content"].push_back(
            J{{"type", "output_text"}, {"text", text}, {"annotations", J::array()}});
    }
    return item;
}

J responses_call_item(const std::string& id, const ToolCall& call, bool done) {
    return J{{"id", id},
             {"type", "function_call"},
             {"status", done ? "completed" : "in_progress"},
             {"call_id", call.id},
             {"name", call.name},
             {"arguments", done ? call.arguments : ""}};
}

J responses_object(const ResponseMeta& m, const std::string& status, const J& output) {
    J r = {{"id", m.id},          {"object", "response"}, {"created_at", m.created_s},
           {"status", status},    {"model", m.model},     {"output", output},
           {"parallel_tool_calls", true}, {"tool_choice", "auto"}, {"tools", J::array()}};
    if (status == "incomplete") {
        r["incomplete_details"] = {{"reason", "max_output_tokens"}};
    } else {
        r["incomplete_details"] = nullptr;
    }
    r["usage"] = status == "in_progress" ? J(nullptr) : responses_usage(m);
    return r;
}

J messages_object(const ResponseMeta& m, const J& content, const J& stop_reason) {
    return J{{"id", m.id},           {"type", "message"},         {"role", "assistant"},
             {"model", m.model},     {"content", content},        {"stop_reason", stop_reason},
             {"stop_sequence", nullptr}, {"usage", messages_usage(m)}};
}

}  // namespace

std::string SseEvent::to_wire() const {
    std::string out;
    if (!event.empty()) {
        out += "event: " + event + "\n";
    }
    out += "data: " + data + "\n\n";
    return out;
}

std::string json_error_body(ApiProtocol api, const Status& status) {
    // The message may quote the client's bytes (a JSON parse error shows the token it
    // read): invalid UTF-8 there becomes U+FFFD instead of a throw from dump()
    // (found by fuzz_http: one body with a stray 0x84 ended the process).
    const std::string& msg = status.message();
    const size_t colon = msg.find(": ");
    J param = colon == std::string::npos ? J(nullptr) : J(msg.substr(0, colon));
    const bool client = http_status(status.code()) < 500;
    if (api == ApiProtocol::kMessages) {
        return J{{"type", "error"},
                 {"error", {{"type", client ? "invalid_request_error" : "api_error"},
                            {"message", msg}}}}
            .dump(-1, ' ', false, J::error_handler_t::replace);
    }
    return J{{"error", {{"message", msg},
                        {"type", client ? "invalid_request_error" : "server_error"},
                        {"param", param},
                        {"code", nullptr}}}}
        .dump(-1, ' ', false, J::error_handler_t::replace);
}

std::string build_response(ApiProtocol api, const ResponseMeta& meta, const Completion& c) {
    switch (api) {
        case ApiProtocol::kChatCompletions: {
            J msg = {{"role", "assistant"}, {"content", c.content}};
            if (!c.reasoning.empty()) {
                msg["reasoning_content"] = c.reasoning;
            }
            if (!c.tool_calls.empty()) {
                J calls = J::array();
                for (const auto& t : c.tool_calls) {
                    calls.push_back(J{{"id", t.id}, {"type", "function"},
                                      {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
                }
                msg["tool_calls"] = calls;
            }
            J choice = {{"index", 0}, {"message", msg},
                        {"finish_reason", finish_reason_name(c.finish)}, {"logprobs", nullptr}};
            return J{{"id", meta.id}, {"object", "chat.completion"}, {"created", meta.created_s},
                     {"model", meta.model}, {"choices", J::array({choice})},
                     {"usage", chat_usage(meta)}}
                .dump();
        }
        case ApiProtocol::kResponses: {
            J out = J::array();
            if (!c.reasoning.empty()) {
                out.push_back(responses_reasoning_item("rs_" + meta.id, c.reasoning, true));
            }
            if (!c.content.empty() || c.tool_calls.empty()) {
                out.push_back(responses_message_item("msg_" + meta.id, c.content, true));
            }
            for (size_t i = 0; i < c.tool_calls.size(); ++i) {
                out.push_back(responses_call_item("fc_" + meta.id + "_" + std::to_string(i),
                                                  c.tool_calls[i], true));
            }
            const std::string status = c.finish == StopReason::kLength ? "incomplete"
                                                                          : "completed";
            return responses_object(meta, status, out).dump();
        }
        case ApiProtocol::kMessages: {
            J content = J::array();
            if (!c.reasoning.empty()) {
                content.push_back(J{{"type", "thinking"}, {"thinking", c.reasoning},
                                    {"signature", ""}});
            }
            if (!c.content.empty()) {
                content.push_back(J{{"type", "text"}, {"text", c.content}});
            }
            for (const auto& t : c.tool_calls) {
                content.push_back(J{{"type", "tool_use"}, {"id", t.id}, {"name", t.name},
                                    {"input", parse_args_or_empty(t.arguments)}});
            }
            return messages_object(meta, content, anthropic_stop(c.finish)).dump();
        }
        case ApiProtocol::kCompletions: break;  // text output: the server's Renderer
    }
    return "{}";
}

// ------------------------------------------------------------ streaming

StreamWriter::StreamWriter(ApiProtocol api, ResponseMeta meta)
    : api_(api), meta_(std::move(meta)) {
    DSI_CHECK(api != ApiProtocol::kCompletions, "legacy completions stream text, not events");
}

std::vector<SseEvent> StreamWriter::start() {
    std::vector<SseEvent> out;
    switch (api_) {
        case ApiProtocol::kChatCompletions: {
            J delta = {{"role", "assistant"}, {"content", ""}};
            J chunk = {{"id", meta_.id}, {"object", "chat.completion.chunk"},
                       {"created", meta_.created_s}, {"model", meta_.model},
                       {"choices", J::array({J{{"index", 0}, {"delta", delta},
                                               {"logprobs", nullptr},
                                               {"finish_reason", nullptr}}})}};
            out.push_back(SseEvent{"", chunk.dump()});
            break;
        }
        case ApiProtocol::kResponses: {
            J created = responses_object(meta_, "in_progress", J::array());
            out.push_back(SseEvent{"response.created",
                                   J{{"type", "response.created"}, {"sequence_number", sequence_++},
                                     {"response", created}}.dump()});
            out.push_back(SseEvent{"response.in_progress",
                                   J{{"type", "response.in_progress"},
                                     {"sequence_number", sequence_++}, {"response", created}}
                                       .dump()});
            break;
        }
        case ApiProtocol::kMessages: {
            J msg = messages_object(meta_, J::array(), nullptr);
            msg["usage"]["output_tokens"] = 0;
            out.push_back(SseEvent{"message_start",
                                   J{{"type", "message_start"}, {"message", msg}}.dump()});
            break;
        }
        case ApiProtocol::kCompletions: break;
    }
    return out;
}

std::vector<SseEvent> StreamWriter::on_event(const Event& e) {
    switch (api_) {
        case ApiProtocol::kChatCompletions: return chat_event(e);
        case ApiProtocol::kResponses: return responses_event(e);
        case ApiProtocol::kMessages: return messages_event(e);
        case ApiProtocol::kCompletions: break;
    }
    return {};
}

std::vector<SseEvent> StreamWriter::chat_event(const Event& e) {
    std::vector<SseEvent> out;
    auto chunk = [&](J delta, J finish) {
        J c = {{"id", meta_.id}, {"object", "chat.completion.chunk"}, {"created", meta_.created_s},
               {"model", meta_.model},
               {"choices", J::array({J{{"index", 0}, {"delta", std::move(delta)},
                                       {"logprobs", nullptr}, {"finish_reason", finish}}})}};
        out.push_back(SseEvent{"", c.dump()});
    };
    switch (e.kind) {
        case EventKind::kReasoningDelta: chunk(J{{"reasoning_content", e.text}}, nullptr); break;
        case EventKind::kContentDelta: chunk(J{{"content", e.text}}, nullptr); break;
        case EventKind::kToolCallStart:
            // OpenAI: the first delta of a call carries index, id, type and name.
            chunk(J{{"tool_calls",
                     J::array({J{{"index", e.tool_index}, {"id", e.tool_id}, {"type", "function"},
                                 {"function", {{"name", e.tool_name}, {"arguments", ""}}}}})}},
                  nullptr);
            break;
        case EventKind::kToolCallArgs:
            chunk(J{{"tool_calls", J::array({J{{"index", e.tool_index},
                                               {"function", {{"arguments", e.text}}}}})}},
                  nullptr);
            break;
        case EventKind::kToolCallEnd: break;
        case EventKind::kFinish: {
            chunk(J::object(), finish_reason_name(e.finish));
            if (meta_.include_usage) {
                J c = {{"id", meta_.id}, {"object", "chat.completion.chunk"},
                       {"created", meta_.created_s}, {"model", meta_.model},
                       {"choices", J::array()}, {"usage", chat_usage(meta_)}};
                out.push_back(SseEvent{"", c.dump()});
            }
            out.push_back(SseEvent{"", "[DONE]"});
            break;
        }
    }
    return out;
}

std::vector<SseEvent> StreamWriter::close_open_block() {
    std::vector<SseEvent> out;
    if (open_kind_ == 0) {
        return out;
    }
    if (api_ == ApiProtocol::kMessages) {
        out.push_back(SseEvent{"content_block_stop",
                               J{{"type", "content_block_stop"}, {"index", block_index_}}.dump()});
        open_kind_ = 0;
        return out;
    }
    // Responses: the item's done events, in the SDK's order.
    auto ev = [&](const std::string& type, J body) {
        J j = {{"type", type}, {"sequence_number", sequence_++}};
        for (auto& [k, v] : body.items()) {
            j[k] = v;
        }
        out.push_back(SseEvent{type, j.dump()});
    };
    J item;
    if (open_kind_ == 1) {
        ev("response.reasoning_text.done", J{{"item_id", open_item_id_},
                                             {"output_index", block_index_},
                                             {"content_index", 0}, {"text", open_text_}});
        ev("response.content_part.done",
           J{{"item_id", open_item_id_}, {"output_index", block_index_}, {"content_index", 0},
             {"part", {{"type", "reasoning_text"}, {"text", open_text_}}}});
        item = responses_reasoning_item(open_item_id_, open_text_, true);
    } else if (open_kind_ == 2) {
        J part = {{"type", "output_text"}, {"text", open_text_}, {"annotations", J::array()}};
        ev("response.output_text.done", J{{"item_id", open_item_id_},
                                          {"output_index", block_index_}, {"content_index", 0},
                                          {"text", open_text_}, {"logprobs", J::array()}});
        ev("response.content_part.done", J{{"item_id", open_item_id_},
                                           {"output_index", block_index_}, {"content_index", 0},
                                           {"part", part}});
        item = responses_message_item(open_item_id_, open_text_, true);
    } else {
        open_call_.arguments = open_text_;
        ev("response.function_call_arguments.done",
           J{{"item_id", open_item_id_}, {"output_index", block_index_},
             {"arguments", open_text_}});
        item = responses_call_item(open_item_id_, open_call_, true);
    }
    ev("response.output_item.done", J{{"output_index", block_index_}, {"item", item}});
    output_items_.push_back(item);
    open_kind_ = 0;
    return out;
}

std::vector<SseEvent> StreamWriter::responses_event(const Event& e) {
    std::vector<SseEvent> out;
    auto ev = [&](const std::string& type, J body) {
        J j = {{"type", type}, {"sequence_number", sequence_++}};
        for (auto& [k, v] : body.items()) {
            j[k] = v;
        }
        out.push_back(SseEvent{type, j.dump()});
    };
    auto open = [&](int kind, J item) {
        for (auto& s : close_open_block()) {
            out.push_back(std::move(s));
        }
        open_kind_ = kind;
        ++block_index_;
        open_text_.clear();
        open_item_id_ = item["id"].get<std::string>();
        ev("response.output_item.added", J{{"output_index", block_index_}, {"item", item}});
    };
    const std::string idx = std::to_string(block_index_ + 1);
    switch (e.kind) {
        case EventKind::kReasoningDelta:
            if (open_kind_ != 1) {
                open(1, responses_reasoning_item("rs_" + meta_.id + "_" + idx, "", false));
                // The SDK's accumulator needs the reasoning_text part before its deltas.
                ev("response.content_part.added",
                   J{{"item_id", open_item_id_}, {"output_index", block_index_},
                     {"content_index", 0}, {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
            }
            open_text_ += e.text;
            done_.reasoning += e.text;
            ev("response.reasoning_text.delta", J{{"item_id", open_item_id_},
                                                  {"output_index", block_index_},
                                                  {"content_index", 0}, {"delta", e.text}});
            break;
        case EventKind::kContentDelta:
            if (open_kind_ != 2) {
                open(2, responses_message_item("msg_" + meta_.id + "_" + idx, "", false));
                ev("response.content_part.added",
                   J{{"item_id", open_item_id_}, {"output_index", block_index_},
                     {"content_index", 0},
                     {"part", {{"type", "output_text"}, {"text", ""},
                               {"annotations", J::array()}}}});
            }
            open_text_ += e.text;
            done_.content += e.text;
            ev("response.output_text.delta", J{{"item_id", open_item_id_},
                                               {"output_index", block_index_},
                                               {"content_index", 0}, {"delta", e.text},
                                               {"logprobs", J::array()}});
            break;
        case EventKind::kToolCallStart:
            open_call_ = ToolCall{e.tool_id, e.tool_name, ""};
            open(3, responses_call_item("fc_" + meta_.id + "_" + idx, open_call_, false));
            break;
        case EventKind::kToolCallArgs:
            open_text_ += e.text;
            ev("response.function_call_arguments.delta",
               J{{"item_id", open_item_id_}, {"output_index", block_index_}, {"delta", e.text}});
            break;
        case EventKind::kToolCallEnd:
            for (auto& s : close_open_block()) {
                out.push_back(std::move(s));
            }
            break;
        case EventKind::kFinish: {
            for (auto& s : close_open_block()) {
                out.push_back(std::move(s));
            }
            const bool incomplete = e.finish == StopReason::kLength;
            const std::string status = incomplete ? "incomplete" : "completed";
            J items = J::array();
            for (const auto& it : output_items_) {
                items.push_back(it);
            }
            ev(incomplete ? "response.incomplete" : "response.completed",
               J{{"response", responses_object(meta_, status, items)}});
            break;
        }
    }
    return out;
}

std::vector<SseEvent> StreamWriter::messages_event(const Event& e) {
    std::vector<SseEvent> out;
    auto ev = [&](const std::string& type, J body) {
        J j = {{"type", type}};
        for (auto& [k, v] : body.items()) {
            j[k] = v;
        }
        out.push_back(SseEvent{type, j.dump()});
    };
    auto open = [&](int kind, J block) {
        for (auto& s : close_open_block()) {
            out.push_back(std::move(s));
        }
        open_kind_ = kind;
        ++block_index_;
        ev("content_block_start", J{{"index", block_index_}, {"content_block", block}});
    };
    switch (e.kind) {
        case EventKind::kReasoningDelta:
            if (open_kind_ != 1) {
                open(1, J{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
            }
            ev("content_block_delta", J{{"index", block_index_},
                                        {"delta", {{"type", "thinking_delta"},
                                                   {"thinking", e.text}}}});
            break;
        case EventKind::kContentDelta:
            if (open_kind_ != 2) {
                open(2, J{{"type", "text"}, {"text", ""}});
            }
            ev("content_block_delta", J{{"index", block_index_},
                                        {"delta", {{"type", "text_delta"}, {"text", e.text}}}});
            break;
        case EventKind::kToolCallStart:
            open(3, J{{"type", "tool_use"}, {"id", e.tool_id}, {"name", e.tool_name},
                      {"input", J::object()}});
            break;
        case EventKind::kToolCallArgs:
            ev("content_block_delta",
               J{{"index", block_index_},
                 {"delta", {{"type", "input_json_delta"}, {"partial_json", e.text}}}});
            break;
        case EventKind::kToolCallEnd:
            for (auto& s : close_open_block()) {
                out.push_back(std::move(s));
            }
            break;
        case EventKind::kFinish:
            for (auto& s : close_open_block()) {
                out.push_back(std::move(s));
            }
            ev("message_delta", J{{"delta", {{"stop_reason", anthropic_stop(e.finish)},
                                             {"stop_sequence", nullptr}}},
                                  {"usage", with_speculative(
                                                J{{"output_tokens", meta_.completion_tokens}},
                                                meta_)}});
            ev("message_stop", J::object());
            break;
    }
    return out;
}

}  // namespace dsi::protocol
