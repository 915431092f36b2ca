#include "loadgen/sse.h"

#include <nlohmann/json.hpp>

namespace dsi::loadgen {

using nlohmann::json;

Status SseParser::feed(std::string_view bytes, std::vector<SseEvent>& out) {
    for (const char c : bytes) {
        if (c == '\n' && last_was_cr_) {  // the LF of a CRLF pair
            last_was_cr_ = false;
            continue;
        }
        last_was_cr_ = c == '\r';
        if (c == '\n' || c == '\r') {
            DSI_RETURN_IF_ERROR(on_line(line_, out));
            line_.clear();
            continue;
        }
        if (line_.size() >= max_event_bytes_) {
            return invalid_argument("SSE line over " + std::to_string(max_event_bytes_) +
                                    " bytes");
        }
        line_.push_back(c);
    }
    return Status::ok();
}

Status SseParser::on_line(std::string_view line, std::vector<SseEvent>& out) {
    if (line.empty()) {  // dispatch
        if (has_data_) out.push_back(std::move(event_));
        event_ = SseEvent{};
        has_data_ = false;
        return Status::ok();
    }
    if (line.front() == ':') return Status::ok();  // comment / keep-alive
    const size_t colon = line.find(':');
    std::string_view field = line.substr(0, colon);
    std::string_view value = colon == std::string_view::npos ? "" : line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    if (field == "data") {
        if (has_data_) event_.data.push_back('\n');
        if (event_.data.size() + value.size() > max_event_bytes_) {
            return invalid_argument("SSE event over " + std::to_string(max_event_bytes_) +
                                    " bytes");
        }
        event_.data.append(value);
        has_data_ = true;
    } else if (field == "event") {
        event_.event = std::string(value);
    }
    return Status::ok();
}

namespace {

// Text of one choice: delta.content + delta.reasoning_content (chat stream),
// message.content (chat reply) or text (completions).
Result<std::string> choice_text(const json& choice) {
    if (!choice.is_object()) return invalid_argument("choice is not an object");
    std::string text;
    auto add = [&](const json& obj, const char* key) -> Status {
        auto it = obj.find(key);
        if (it == obj.end() || it->is_null()) return Status::ok();
        if (!it->is_string()) return invalid_argument(std::string(key) + " is not a string");
        text += it->get<std::string>();
        return Status::ok();
    };
    for (const char* holder : {"delta", "message"}) {
        if (auto it = choice.find(holder); it != choice.end()) {
            if (!it->is_object()) return invalid_argument(std::string(holder) + " is not an object");
            DSI_RETURN_IF_ERROR(add(*it, "reasoning_content"));
            DSI_RETURN_IF_ERROR(add(*it, "content"));
        }
    }
    DSI_RETURN_IF_ERROR(add(choice, "text"));
    return text;
}

Result<StreamUsage> read_usage(const json& u) {
    if (!u.is_object()) return invalid_argument("usage is not an object");
    StreamUsage usage;
    auto num = [&](const json& obj, const char* key, int64_t& v) -> Status {
        auto it = obj.find(key);
        if (it == obj.end() || it->is_null()) return Status::ok();
        if (!it->is_number_integer()) return invalid_argument(std::string(key) + " is not an integer");
        v = it->get<int64_t>();
        return Status::ok();
    };
    DSI_RETURN_IF_ERROR(num(u, "prompt_tokens", usage.prompt_tokens));
    DSI_RETURN_IF_ERROR(num(u, "completion_tokens", usage.completion_tokens));
    if (auto it = u.find("prompt_tokens_details"); it != u.end() && it->is_object()) {
        DSI_RETURN_IF_ERROR(num(*it, "cached_tokens", usage.cached_tokens));
    }
    return usage;
}

Result<json> parse_object(std::string_view text) {
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return invalid_argument("not a JSON object");
    if (auto it = j.find("error"); it != j.end() && !it->is_null()) {
        std::string msg = it->is_object() && it->contains("message") && (*it)["message"].is_string()
                              ? (*it)["message"].get<std::string>()
                              : it->dump();
        return unavailable("server error: " + msg);
    }
    return j;
}

}  // namespace

Result<StreamChunk> parse_stream_chunk(std::string_view data) {
    StreamChunk chunk;
    if (data == "[DONE]") {
        chunk.done = true;
        return chunk;
    }
    DSI_ASSIGN_OR_RETURN(json j, parse_object(data));
    if (auto it = j.find("choices"); it != j.end()) {
        if (!it->is_array()) return invalid_argument("choices is not an array");
        for (const json& c : *it) {
            DSI_ASSIGN_OR_RETURN(std::string t, choice_text(c));
            chunk.text += t;
            if (auto f = c.find("finish_reason"); f != c.end() && !f->is_null()) {
                chunk.finished = true;
            }
        }
    }
    if (auto it = j.find("usage"); it != j.end() && !it->is_null()) {
        DSI_ASSIGN_OR_RETURN(StreamUsage u, read_usage(*it));
        chunk.usage = u;
    }
    return chunk;
}

Result<ReplyInfo> parse_reply_body(std::string_view body) {
    DSI_ASSIGN_OR_RETURN(json j, parse_object(body));
    ReplyInfo info;
    auto it = j.find("choices");
    if (it == j.end() || !it->is_array()) return invalid_argument("reply has no choices array");
    for (const json& c : *it) {
        DSI_ASSIGN_OR_RETURN(std::string t, choice_text(c));
        info.text += t;
    }
    if (auto u = j.find("usage"); u != j.end() && !u->is_null()) {
        DSI_ASSIGN_OR_RETURN(info.usage, read_usage(*u));
    }
    return info;
}

}  // namespace dsi::loadgen
