// Streaming DSML output parser (S-REC-4; S-REC-2 for matching by token id).
#include "protocol/output_parser.h"

#include <algorithm>

#include "protocol/internal/python_json.h"

namespace dsi::protocol {

std::string_view finish_reason_name(StopReason reason) {
    switch (reason) {
        case StopReason::kStop: return "stop";
        case StopReason::kLength: return "length";
        case StopReason::kToolCalls: return "tool_calls";
    }
    return "stop";
}

namespace {

constexpr int32_t kIdBase = 256;  // symbols >= 256 are token ids (256 + id)

// One delimiter as an incremental KMP automaton over symbols (S-REC-4: the state
// survives chunk boundaries, nothing is rescanned).
struct Kmp {
    std::vector<int32_t> pattern;
    std::vector<int> fail;
    int state = 0;

    explicit Kmp(std::vector<int32_t> p) : pattern(std::move(p)), fail(pattern.size(), 0) {
        for (size_t i = 1, k = 0; i < pattern.size(); ++i) {
            while (k > 0 && pattern[i] != pattern[k]) {
                k = static_cast<size_t>(fail[k - 1]);
            }
            if (pattern[i] == pattern[k]) {
                ++k;
            }
            fail[i] = static_cast<int>(k);
        }
    }
    // Returns true on a full match (state then resets to 0).
    bool step(int32_t s) {
        while (state > 0 && pattern[static_cast<size_t>(state)] != s) {
            state = fail[static_cast<size_t>(state) - 1];
        }
        if (pattern[static_cast<size_t>(state)] == s) {
            ++state;
        }
        if (static_cast<size_t>(state) == pattern.size()) {
            state = 0;
            return true;
        }
        return false;
    }
};

enum class State {
    kReasoning,
    kContent,
    kBlock,       // inside <DSML function_calls>, between invokes
    kInvokeHead,  // after "<DSML invoke", before '">'
    kInvokeBody,  // between parameters
    kParamHead,
    kParamValue,
    kTrailer,     // after the closing block tag
    kRaw,         // malformed DSML: everything is content
};

enum Marker { kThinkEndM, kCalls, kCallsEnd, kInvoke, kInvokeEnd, kParam, kParamEnd, kHeadEnd,
              kNumMarkers };

// Length of the longest prefix of `s` that does not end inside a UTF-8 sequence
// that more bytes could still complete.
size_t complete_utf8_prefix(std::string_view s) {
    const size_t n = s.size();
    for (size_t back = 1; back <= 3 && back <= n; ++back) {
        const auto c = static_cast<unsigned char>(s[n - back]);
        if ((c & 0xC0) == 0x80) {
            continue;  // continuation byte: look further back
        }
        size_t need = 1;
        if ((c & 0xE0) == 0xC0) {
            need = 2;
        } else if ((c & 0xF0) == 0xE0) {
            need = 3;
        } else if ((c & 0xF8) == 0xF0) {
            need = 4;
        }
        return need > back ? n - back : n;
    }
    return n;
}

bool is_space(std::string_view s) {
    return std::all_of(s.begin(), s.end(),
                       [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; });
}

}  // namespace

struct OutputParser::Impl {
    const Tokenizer& tok;
    SpecialTokens st;
    ParserOptions opt;
    std::vector<Kmp> markers;
    std::vector<int32_t> pending;  // symbols that may still start a marker
    State state;
    bool finished = false;
    bool malformed = false;
    std::vector<Event>* out = nullptr;

    std::string utf8_hold;  // incomplete UTF-8 tail of the current channel
    std::string head;       // invoke / parameter head text
    std::string raw;        // spelled text since the DSML block began
    int num_calls = 0;      // tool calls started
    bool call_open = false;
    int num_params = 0;
    bool param_is_string = false;

    Impl(const Tokenizer& t, const SpecialTokens& s, ParserOptions o)
        : tok(t), st(s), opt(std::move(o)),
          state(opt.thinking ? State::kReasoning : State::kContent) {
        const std::string block =
            opt.dialect == DsmlDialect::kV4 ? "tool_calls>" : "function_calls>";
        auto sym = [&](std::string_view text) {
            // "｜DSML｜" is one id symbol when the vocabulary has the token.
            std::vector<int32_t> v;
            size_t pos = 0;
            while (pos < text.size()) {
                if (st.dsml >= 0 && text.substr(pos, kDsmlToken.size()) == kDsmlToken) {
                    v.push_back(kIdBase + st.dsml);
                    pos += kDsmlToken.size();
                } else {
                    v.push_back(static_cast<unsigned char>(text[pos++]));
                }
            }
            return v;
        };
        markers.reserve(kNumMarkers);
        markers.emplace_back(st.think_end >= 0 ? std::vector<int32_t>{kIdBase + st.think_end}
                                               : sym(kThinkEndToken));
        markers.emplace_back(sym("\n\n<｜DSML｜" + block));
        markers.emplace_back(sym("</｜DSML｜" + block));
        markers.emplace_back(sym("<｜DSML｜invoke"));
        markers.emplace_back(sym("</｜DSML｜invoke>"));
        markers.emplace_back(sym("<｜DSML｜parameter"));
        markers.emplace_back(sym("</｜DSML｜parameter>"));
        markers.emplace_back(sym("\">"));
    }

    // The markers each state watches for.
    static std::span<const Marker> active(State s) {
        static constexpr Marker kR[] = {kThinkEndM};
        static constexpr Marker kC[] = {kCalls};
        static constexpr Marker kB[] = {kInvoke, kCallsEnd};
        static constexpr Marker kH[] = {kHeadEnd};
        static constexpr Marker kIb[] = {kParam, kInvokeEnd};
        static constexpr Marker kPv[] = {kParamEnd};
        switch (s) {
            case State::kReasoning: return kR;
            case State::kContent: return kC;
            case State::kBlock: return kB;
            case State::kInvokeHead:
            case State::kParamHead: return kH;
            case State::kInvokeBody: return kIb;
            case State::kParamValue: return kPv;
            case State::kTrailer:
            case State::kRaw: return {};
        }
        return {};
    }

    bool in_block() const {
        return state != State::kReasoning && state != State::kContent && state != State::kRaw;
    }

    std::string spell(int32_t sym) const {
        if (sym < kIdBase) {
            return std::string(1, static_cast<char>(sym));
        }
        const int32_t id = sym - kIdBase;
        std::string_view s = st.spelling(id);
        return std::string(s.empty() ? tok.token_bytes(id) : s);
    }

    // ---- output

    void emit(EventKind kind, std::string text, int index = -1) {
        if (text.empty()) {
            return;
        }
        if (!out->empty() && out->back().kind == kind && out->back().tool_index == index &&
            (kind == EventKind::kReasoningDelta || kind == EventKind::kContentDelta ||
             kind == EventKind::kToolCallArgs)) {
            out->back().text.append(text);
            return;
        }
        Event e;
        e.kind = kind;
        e.text = std::move(text);
        e.tool_index = index;
        out->push_back(std::move(e));
    }

    // Payload text of the current channel; the incomplete UTF-8 tail is held.
    void channel_text(std::string_view bytes, bool final_flush) {
        utf8_hold.append(bytes);
        size_t n = final_flush ? utf8_hold.size() : complete_utf8_prefix(utf8_hold);
        if (n == 0) {
            return;
        }
        std::string text = utf8_lossy(std::string_view(utf8_hold).substr(0, n));
        utf8_hold.erase(0, n);
        switch (state) {
            case State::kReasoning: emit(EventKind::kReasoningDelta, std::move(text)); break;
            case State::kContent:
            case State::kRaw: emit(EventKind::kContentDelta, std::move(text)); break;
            case State::kParamValue:
                if (param_is_string) {
                    std::string esc;
                    internal::append_json_escaped(text, &esc);
                    emit(EventKind::kToolCallArgs, std::move(esc), num_calls - 1);
                } else {
                    emit(EventKind::kToolCallArgs, std::move(text), num_calls - 1);
                }
                break;
            default: break;
        }
    }
    void flush_channel() { channel_text({}, true); }

    // ---- payload (symbols that are not part of a marker)

    void payload(std::span<const int32_t> syms) {
        if (syms.empty()) {
            return;
        }
        std::string bytes;
        for (int32_t s : syms) {
            bytes += spell(s);
        }
        if (in_block()) {
            raw += bytes;
        }
        switch (state) {
            case State::kReasoning:
            case State::kContent:
            case State::kRaw:
            case State::kParamValue: {
                channel_text(bytes, false);
                return;
            }
            case State::kInvokeHead:
            case State::kParamHead:
                head += bytes;
                if (head.size() > 4096) {
                    degrade(bytes);
                }
                return;
            case State::kBlock:
            case State::kInvokeBody:
            case State::kTrailer:
                if (!is_space(bytes)) {
                    degrade(bytes);
                }
                return;
        }
    }

    // Malformed DSML: close what is open, then everything is content (S-REC-4:
    // never a crash). With no call started the whole block becomes content.
    void degrade(std::string_view offending) {
        malformed = true;
        std::string text;
        if (num_calls == 0 || !call_open) {
            text = num_calls == 0 ? raw : std::string(offending);
        } else {
            text = std::string(offending);
        }
        close_call();
        flush_channel();
        state = State::kRaw;
        emit(EventKind::kContentDelta, utf8_lossy(text));
    }

    void close_call() {
        if (!call_open) {
            return;
        }
        if (state == State::kParamValue) {
            flush_channel();
            if (param_is_string) {
                emit(EventKind::kToolCallArgs, "\"", num_calls - 1);
            }
        }
        emit(EventKind::kToolCallArgs, num_params == 0 ? "{}" : "}", num_calls - 1);
        Event e;
        e.kind = EventKind::kToolCallEnd;
        e.tool_index = num_calls - 1;
        out->push_back(std::move(e));
        call_open = false;
    }

    // ---- transitions

    void on_marker(Marker m) {
        flush_channel();
        if (in_block() || m == kCalls) {
            raw += spell_marker(m);
        }
        switch (m) {
            case kThinkEndM: state = State::kContent; return;
            case kCalls:
                raw = spell_marker(m);
                state = State::kBlock;
                return;
            case kCallsEnd: state = State::kTrailer; return;
            case kInvoke:
                head.clear();
                state = State::kInvokeHead;
                return;
            case kHeadEnd:
                if (state == State::kInvokeHead) {
                    start_call();
                } else {
                    start_param();
                }
                return;
            case kParam:
                head.clear();
                state = State::kParamHead;
                return;
            case kParamEnd:
                if (param_is_string) {
                    emit(EventKind::kToolCallArgs, "\"", num_calls - 1);
                }
                state = State::kInvokeBody;
                return;
            case kInvokeEnd:
                close_call();
                state = State::kBlock;
                return;
            case kNumMarkers: return;
        }
    }

    std::string spell_marker(Marker m) const {
        std::string s;
        for (int32_t sym : markers[m].pattern) {
            s += spell(sym);
        }
        return s;
    }

    void start_call() {
        // Head is ` name="NAME` (the reference: ^\s*name="(.*?)">\n$).
        std::string_view h = head;
        while (!h.empty() && is_space(h.substr(0, 1))) {
            h.remove_prefix(1);
        }
        if (!h.starts_with("name=\"") || h.substr(6).find('"') != std::string_view::npos) {
            degrade(head + "\">");
            return;
        }
        Event e;
        e.kind = EventKind::kToolCallStart;
        e.tool_index = num_calls;
        e.tool_id = opt.tool_call_id_prefix + std::to_string(num_calls);
        e.tool_name = std::string(h.substr(6));
        out->push_back(std::move(e));
        ++num_calls;
        call_open = true;
        num_params = 0;
        state = State::kInvokeBody;
    }

    void start_param() {
        // Head is ` name="k" string="true|false` (^ name="(.*?)" string="(true|false)">).
        std::string_view h = head;
        const size_t sep = h.rfind("\" string=\"");
        if (!h.starts_with(" name=\"") || sep == std::string_view::npos || sep < 7) {
            degrade(head + "\">");
            return;
        }
        const std::string_view key = h.substr(7, sep - 7);
        const std::string_view flag = h.substr(sep + 10);
        if (flag != "true" && flag != "false") {
            degrade(head + "\">");
            return;
        }
        param_is_string = flag == "true";
        std::string frag = num_params == 0 ? "{\"" : ", \"";
        internal::append_json_escaped(key, &frag);
        frag += "\": ";
        if (param_is_string) {
            frag += "\"";
        }
        emit(EventKind::kToolCallArgs, std::move(frag), num_calls - 1);
        ++num_params;
        state = State::kParamValue;
    }

    // ---- symbols

    void symbol(int32_t s) {
        pending.push_back(s);
        int keep = 0;
        for (Marker m : active(state)) {
            Kmp& k = markers[m];
            if (k.step(s)) {
                const size_t len = k.pattern.size();
                payload(std::span<const int32_t>(pending.data(), pending.size() - len));
                pending.clear();
                for (auto& mk : markers) {
                    mk.state = 0;
                }
                if (state == State::kRaw) {
                    return;  // the payload before the marker was malformed
                }
                on_marker(m);
                return;
            }
            keep = std::max(keep, k.state);
        }
        const size_t release = pending.size() - static_cast<size_t>(keep);
        if (release > 0) {
            payload(std::span<const int32_t>(pending.data(), release));
            pending.erase(pending.begin(), pending.begin() + static_cast<ptrdiff_t>(release));
        }
    }

    bool marker_token(int32_t id) const {
        return id >= 0 && (id == st.think_end || id == st.dsml);
    }

    void push(std::span<const int32_t> ids) {
        for (int32_t id : ids) {
            if (finished) {
                return;
            }
            if (id == st.eos && !opt.ignore_eos) {
                finish(StopReason::kStop, true);
                return;
            }
            if (marker_token(id)) {
                symbol(kIdBase + id);
            } else if (tok.is_special(id) || (id >= 0 && !st.spelling(id).empty())) {
                continue;  // other template tokens carry no text of the answer
            } else {
                for (char c : tok.token_bytes(id)) {
                    symbol(static_cast<unsigned char>(c));
                }
            }
        }
    }

    void finish(StopReason reason, bool eos) {
        if (finished) {
            return;
        }
        std::vector<int32_t> rest;
        rest.swap(pending);
        payload(rest);
        flush_channel();
        if (state != State::kReasoning && state != State::kContent && state != State::kRaw &&
            state != State::kTrailer) {
            // Ended inside the DSML block.
            if (eos) {
                malformed = true;
            }
            if (!call_open && num_calls == 0 && eos) {
                state = State::kRaw;
                emit(EventKind::kContentDelta, utf8_lossy(raw));
            }
            close_call();
        }
        Event e;
        e.kind = EventKind::kFinish;
        e.finish = (reason == StopReason::kStop && num_calls > 0) ? StopReason::kToolCalls
                                                                    : reason;
        e.malformed = malformed;
        out->push_back(std::move(e));
        finished = true;
    }
};

OutputParser::OutputParser(const Tokenizer& tokenizer, const SpecialTokens& tokens,
                           ParserOptions options)
    : impl_(std::make_unique<Impl>(tokenizer, tokens, std::move(options))) {}

OutputParser::~OutputParser() = default;

void OutputParser::push(std::span<const int32_t> ids, std::vector<Event>* out) {
    impl_->out = out;
    impl_->push(ids);
}

void OutputParser::finish(StopReason reason, std::vector<Event>* out) {
    impl_->out = out;
    impl_->finish(reason, false);
}

bool OutputParser::done() const { return impl_->finished; }

std::vector<Event> parse_completion(const Tokenizer& tokenizer, const SpecialTokens& tokens,
                                    const ParserOptions& options, std::span<const int32_t> ids) {
    OutputParser parser(tokenizer, tokens, options);
    std::vector<Event> out;
    parser.push(ids, &out);
    parser.finish(StopReason::kLength, &out);
    return out;
}

}  // namespace dsi::protocol
