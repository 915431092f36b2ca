#include "protocol/renderer.h"

#include <algorithm>
#include <utility>

namespace dsi::protocol {
namespace {

using J = nlohmann::json;

std::string token_string(const Tokenizer& tk, int32_t id) {
    return utf8_lossy(tk.decode(std::span<const int32_t>(&id, 1)));
}

J token_bytes(const Tokenizer& tk, int32_t id) {
    const std::string b = tk.decode(std::span<const int32_t>(&id, 1));
    J out = J::array();
    for (unsigned char c : b) out.push_back(static_cast<int>(c));
    return out;
}

// Responses object: every output_text part of every message item gets `logprobs`.
void set_output_text_logprobs(J& response, const J& logprobs) {
    if (!response.contains("output") || !response["output"].is_array()) return;
    for (J& item : response["output"]) {
        if (item.value("type", "") != "message" || !item.contains("content")) continue;
        for (J& part : item["content"]) {
            if (part.value("type", "") == "output_text") part["logprobs"] = logprobs;
        }
    }
}

// Legacy completions usage (with the request's prefix-cache hit).
J completions_usage(const ResponseMeta& m, int64_t completion_tokens) {
    J u = {{"prompt_tokens", m.prompt_tokens},
           {"completion_tokens", completion_tokens},
           {"total_tokens", m.prompt_tokens + completion_tokens},
           {"prompt_tokens_details", {{"cached_tokens", m.cached_tokens}}}};
    if (m.speculative_usage) u["speculative"] = J(speculative_usage_json(m.speculative));
    return u;
}

// The one finish rule of every API: the engine's length limit, deadline or abort is
// "length" (max_tokens / incomplete); any other end is a stop.
bool ended_by_length(engine::FinishReason r) {
    return r == engine::FinishReason::kLength || r == engine::FinishReason::kDeadline ||
           r == engine::FinishReason::kAbort;
}

}  // namespace

const char* Renderer::completion_finish() const {
    return ended_by_length(reason_) ? "length" : "stop";
}

Renderer::Renderer(const Tokenizer& tokenizer, const SpecialTokens& special,
                   RenderOptions options)
    : tokenizer_(tokenizer), special_(special), options_(std::move(options)) {
    meta_.id = options_.id;
    meta_.model = options_.model;
    meta_.created_s = options_.created_s;
    meta_.prompt_tokens = options_.prompt_tokens;
    meta_.include_usage = options_.include_usage;
    meta_.speculative_usage = options_.speculative_usage;
    if (options_.api != ApiProtocol::kCompletions) {
        ParserOptions po;
        po.thinking = options_.thinking_prompt;
        po.tool_call_id_prefix = "call_" + options_.id + "_";
        po.ignore_eos = options_.ignore_eos;
        parser_ = std::make_unique<OutputParser>(tokenizer_, special_, po);
        if (options_.stream) {
            writer_ = std::make_unique<StreamWriter>(options_.api, meta_);
        }
        if (!options_.stop.empty()) stop_ = std::make_unique<StopMatcher>(options_.stop);
        logprobs_ = J::array();
    } else {
        logprobs_ = J{{"tokens", J::array()},
                      {"token_logprobs", J::array()},
                      {"top_logprobs", J::array()},
                      {"text_offset", J::array()}};
    }
}

Renderer::~Renderer() = default;

std::vector<Event> Renderer::consume(const OutputUpdate& u) {
    std::vector<Event> raw;
    meta_.cached_tokens = std::max(meta_.cached_tokens, u.cached_prompt_tokens);
    meta_.speculative = u.speculative;
    for (const OutputToken& t : u.tokens) {
        ++num_tokens_;
        if (options_.thinking_prompt && !saw_think_end_) {
            if (t.token == special_.think_end) {
                saw_think_end_ = true;
            } else {
                ++num_reasoning_tokens_;
            }
        }
        // Responses: logprobs belong to the output_text part (no reasoning tokens).
        const bool in_reasoning = options_.thinking_prompt &&
                                  (!saw_think_end_ || t.token == special_.think_end);
        if (options_.logprobs >= 0 &&
            !(options_.api == ApiProtocol::kResponses && in_reasoning)) {
            const Tokenizer& tk = tokenizer_;
            if (options_.api == ApiProtocol::kCompletions) {
                logprobs_["text_offset"].push_back(text_.size());
                logprobs_["tokens"].push_back(token_string(tk, t.token));
                logprobs_["token_logprobs"].push_back(t.logprob);
                J top = J::object();
                for (const auto& [id, lp] : t.top_logprobs) top[token_string(tk, id)] = lp;
                logprobs_["top_logprobs"].push_back(top);
            } else {
                J top = J::array();
                for (const auto& [id, lp] : t.top_logprobs) {
                    top.push_back(J{{"token", token_string(tk, id)},
                                    {"logprob", lp},
                                    {"bytes", token_bytes(tk, id)}});
                }
                logprobs_.push_back(J{{"token", token_string(tk, t.token)},
                                      {"logprob", t.logprob},
                                      {"bytes", token_bytes(tk, t.token)},
                                      {"top_logprobs", top}});
            }
        }
        if (parser_) {
            if (!parser_->done()) parser_->push(std::span<const int32_t>(&t.token, 1), &raw);
        } else if (t.token != tokenizer_.eos_id()) {  // EOS ends the text, not part of it
            text_ += t.text;
        }
    }
    if (u.finished) {
        finished_ = true;
        reason_ = u.reason;
        if (parser_ && !parser_->done()) {
            const bool length = ended_by_length(u.reason);
            parser_->finish(
                length ? StopReason::kLength : StopReason::kStop, &raw);
        }
    }
    if (!stop_) return raw;
    // Stop strings end the engine's sequence; cut the content text at the match too
    // (the parser reads ids, so it still sees the whole last token).
    std::vector<Event> out;
    for (Event& e : raw) {
        if (e.kind == EventKind::kContentDelta) {
            if (stop_->stopped()) continue;
            StopMatcher::Piece piece = stop_->push(e.text);
            if (piece.text.empty()) continue;
            e.text = std::move(piece.text);
        } else if (e.kind == EventKind::kFinish && !stop_->stopped()) {
            std::string held = stop_->flush();
            if (!held.empty()) {
                Event c;
                c.kind = EventKind::kContentDelta;
                c.text = std::move(held);
                out.push_back(std::move(c));
            }
        }
        out.push_back(std::move(e));
    }
    return out;
}

std::string Renderer::completion_chunk(std::string_view text, const char* finish) {
    J choice = {{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (finish != nullptr) choice["finish_reason"] = finish;
    if (options_.logprobs >= 0) {
        J lp = J{{"tokens", J::array()},
                 {"token_logprobs", J::array()},
                 {"top_logprobs", J::array()},
                 {"text_offset", J::array()}};
        const size_t n = logprobs_["tokens"].size();
        for (size_t i = logprobs_sent_; i < n; ++i) {
            for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
                lp[k].push_back(logprobs_[k][i]);
            }
        }
        logprobs_sent_ = n;
        choice["logprobs"] = lp;
    }
    J c = {{"id", options_.id},
           {"object", "text_completion"},
           {"created", options_.created_s},
           {"model", meta_.model},
           {"choices", J::array({choice})}};
    return "data: " + c.dump() + "\n\n";
}

std::string Renderer::chat_logprobs_chunk(std::string data) {
    if (options_.logprobs < 0 || logprobs_sent_ >= logprobs_.size()) return data;
    J c = J::parse(data, nullptr, false);
    if (c.is_discarded() || !c.contains("choices") || c["choices"].empty()) return data;
    J& choice = c["choices"][0];
    const J& delta = choice["delta"];
    const bool carries = delta.contains("content") || delta.contains("reasoning_content") ||
                         !choice["finish_reason"].is_null();
    if (!carries) return data;
    J content = J::array();
    for (size_t i = logprobs_sent_; i < logprobs_.size(); ++i) content.push_back(logprobs_[i]);
    logprobs_sent_ = logprobs_.size();
    choice["logprobs"] = J{{"content", content}};
    return c.dump();
}

std::string Renderer::responses_logprobs_event(const std::string& event, std::string data) {
    const bool delta = event == "response.output_text.delta";
    if (!delta && event != "response.output_text.done" && event != "response.completed") {
        return data;
    }
    J j = J::parse(data, nullptr, false);
    if (j.is_discarded()) return data;
    if (delta) {
        J part = J::array();
        for (size_t i = logprobs_sent_; i < logprobs_.size(); ++i) part.push_back(logprobs_[i]);
        logprobs_sent_ = logprobs_.size();
        j["logprobs"] = std::move(part);
    } else if (event == "response.output_text.done") {
        j["logprobs"] = logprobs_;
    } else if (j.contains("response")) {
        set_output_text_logprobs(j["response"], logprobs_);
    }
    return j.dump();
}

std::string Renderer::on_update_sse(const OutputUpdate& u) {
    std::string out;
    const size_t before = text_.size();
    std::vector<Event> events = consume(u);
    if (options_.api == ApiProtocol::kCompletions) {
        std::string_view piece = std::string_view(text_).substr(before);
        if (!piece.empty() || (options_.logprobs >= 0 && !u.tokens.empty())) {
            out += completion_chunk(piece, nullptr);
        }
        if (finished_) {
            out +=
                completion_chunk("", completion_finish());
            if (options_.include_usage) {
                J c = {{"id", options_.id},
                       {"object", "text_completion"},
                       {"created", options_.created_s},
                       {"model", meta_.model},
                       {"choices", J::array()},
                       {"usage", completions_usage(meta_, num_tokens_)}};
                out += "data: " + c.dump() + "\n\n";
            }
            out += "data: [DONE]\n\n";
        }
        return out;
    }
    writer_->set_cached_tokens(meta_.cached_tokens);
    writer_->set_speculative(meta_.speculative);
    if (!started_) {
        started_ = true;
        for (const SseEvent& s : writer_->start()) out += s.to_wire();
    }
    for (const Event& e : events) {
        if (e.kind == EventKind::kFinish) {
            writer_->set_usage(num_tokens_, num_reasoning_tokens_);
        }
        for (SseEvent& s : writer_->on_event(e)) {
            if (options_.api == ApiProtocol::kChatCompletions && s.data != "[DONE]") {
                s.data = chat_logprobs_chunk(std::move(s.data));
            }
            if (options_.api == ApiProtocol::kResponses && options_.logprobs >= 0) {
                s.data = responses_logprobs_event(s.event, std::move(s.data));
            }
            out += s.to_wire();
        }
    }
    return out;
}

void Renderer::on_update(const OutputUpdate& u) {
    std::vector<Event> events = consume(u);
    for (Event& e : events) events_.push_back(std::move(e));
}

std::string Renderer::reply_body() const {
    if (options_.api == ApiProtocol::kCompletions) {
        J choice = {{"index", 0},
                    {"text", text_},
                    {"logprobs", options_.logprobs >= 0 ? logprobs_ : J(nullptr)},
                    {"finish_reason", completion_finish()}};
        return J{{"id", options_.id},
                 {"object", "text_completion"},
                 {"created", options_.created_s},
                 {"model", meta_.model},
                 {"choices", J::array({choice})},
                 {"usage", completions_usage(meta_, num_tokens_)}}
            .dump();
    }
    ResponseMeta meta = meta_;
    meta.completion_tokens = num_tokens_;
    meta.reasoning_tokens = num_reasoning_tokens_;
    std::string body = build_response(options_.api, meta, fold_events(events_));
    if (options_.logprobs < 0 || options_.api == ApiProtocol::kMessages) {
        return body;
    }
    // Our own JSON: it parses.
    J j = J::parse(body);
    if (options_.api == ApiProtocol::kResponses) {
        set_output_text_logprobs(j, logprobs_);
    } else {
        j["choices"][0]["logprobs"] = J{{"content", logprobs_}};
    }
    return j.dump();
}

}  // namespace dsi::protocol
