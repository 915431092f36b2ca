// Streaming parser (S-REC-4) from case files (tests/cases/protocol/parser/*.json):
// each case is rendered to token ids, parsed one-shot and under random chunkings
// (one token at a time, random splits, and a byte-token spelling that splits every
// marker and UTF-8 sequence); all must agree, and the argument fragments must
// concatenate to JSON equal to the expected arguments.
#include "protocol/output_parser.h"

#include <filesystem>
#include <random>

#include <gtest/gtest.h>

#include "protocol/adapters.h"
#include "protocol/encoder.h"
#include "protocol/internal/test_util.h"
#include "support/build_paths.h"

namespace dsi::protocol {
namespace {

using internal::read_file_or_empty;
using internal::reference_tokenizer;
using J = nlohmann::ordered_json;

struct Case {
    std::string name;
    ParserOptions options;
    std::vector<int32_t> ids;
    J expect;
};

// GPT-2 byte-level alphabet: the vocabulary spelling of a single byte.
std::string byte_token_spelling(uint8_t b) {
    uint32_t cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
        int n = 0;
        for (int x = 0; x < b; ++x) {
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) {
                ++n;
            }
        }
        cp = 256 + static_cast<uint32_t>(n);
    }
    std::string s;
    if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
    } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    return s;
}

// Every text byte as its own single-byte token: a legal but pathological
// tokenisation that cuts each marker and each UTF-8 sequence.
std::vector<int32_t> byte_ids(const Tokenizer& tok, const SpecialTokens& st,
                              const std::vector<int32_t>& ids) {
    std::vector<int32_t> out;
    for (int32_t id : ids) {
        if (id == st.eos || id == st.think_end || tok.is_special(id)) {
            out.push_back(id);
            continue;
        }
        for (char c : tok.token_bytes(id)) {
            auto b = tok.token_id(byte_token_spelling(static_cast<uint8_t>(c)));
            EXPECT_TRUE(b.has_value());
            out.push_back(*b);
        }
    }
    return out;
}

std::vector<Case> load_cases(const Tokenizer& tok, const SpecialTokens& st) {
    std::vector<Case> cases;
    const std::string dir = std::string(DSINFER_SOURCE_DIR) + "/tests/cases/protocol/parser";
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        const J all = J::parse(read_file_or_empty(entry.path().string()));
        for (const J& k : all) {
            Case c;
            c.name = k["name"].get<std::string>();
            c.options.dialect = k["dialect"] == "v4" ? DsmlDialect::kV4 : DsmlDialect::kV32;
            c.options.thinking = k["thinking"].get<bool>();
            c.expect = k["expect"];
            if (k.contains("message")) {
                Message m;
                m.role = Role::kAssistant;
                const J& jm = k["message"];
                if (jm.contains("reasoning")) {
                    m.reasoning = jm["reasoning"].get<std::string>();
                }
                m.content = jm.value("content", "");
                for (const J& tc : jm.value("tool_calls", J::array())) {
                    m.tool_calls.push_back(
                        ToolCall{"", tc["name"].get<std::string>(), tc["arguments"].dump()});
                }
                auto p = encode_completion(c.options.dialect == DsmlDialect::kV4
                                               ? ChatEncoding::kDeepSeekV4
                                               : ChatEncoding::kDeepSeekV32,
                                           m, c.options.thinking, st);
                EXPECT_TRUE(p.is_ok()) << c.name;
                c.ids = p->encode(tok);
            } else {
                Prompt p;
                for (const J& piece : k["pieces"]) {
                    if (piece.is_string()) {
                        p.text(piece.get<std::string>());
                    } else if (piece["token"] == "eos") {
                        p.token(st.eos, kEosToken);
                    } else {
                        p.token(st.think_end, kThinkEndToken);
                    }
                }
                c.ids = p.encode(tok);
            }
            cases.push_back(std::move(c));
        }
    }
    return cases;
}

// Adjacent deltas of one kind merged: the normal form chunkings are compared in.
std::vector<Event> normalize(const std::vector<Event>& in) {
    std::vector<Event> out;
    for (const Event& e : in) {
        const bool delta = e.kind == EventKind::kReasoningDelta ||
                           e.kind == EventKind::kContentDelta || e.kind == EventKind::kToolCallArgs;
        if (delta && !out.empty() && out.back().kind == e.kind &&
            out.back().tool_index == e.tool_index) {
            out.back().text += e.text;
        } else {
            out.push_back(e);
        }
    }
    return out;
}

std::vector<Event> parse_chunked(const Tokenizer& tok, const SpecialTokens& st,
                                 const ParserOptions& opt, const std::vector<int32_t>& ids,
                                 const std::vector<size_t>& cuts) {
    OutputParser parser(tok, st, opt);
    std::vector<Event> out;
    size_t prev = 0;
    for (size_t cut : cuts) {
        std::vector<Event> step;
        parser.push(std::span<const int32_t>(ids.data() + prev, cut - prev), &step);
        for (const Event& e : step) {
            // Every delta is valid UTF-8 on its own (held back until complete).
            EXPECT_EQ(utf8_lossy(e.text), e.text);
        }
        out.insert(out.end(), step.begin(), step.end());
        prev = cut;
    }
    parser.push(std::span<const int32_t>(ids.data() + prev, ids.size() - prev), &out);
    parser.finish(StopReason::kLength, &out);
    return out;
}

void check_expectation(const Case& c, const std::vector<Event>& events) {
    const Completion got = fold_events(events);
    EXPECT_EQ(got.reasoning, c.expect.value("reasoning", "")) << c.name;
    EXPECT_EQ(got.content, c.expect.value("content", "")) << c.name;
    EXPECT_EQ(finish_reason_name(got.finish), c.expect.value("finish", "stop")) << c.name;
    EXPECT_EQ(got.malformed, c.expect.value("malformed", false)) << c.name;
    const J want_calls = c.expect.value("tool_calls", J::array());
    ASSERT_EQ(got.tool_calls.size(), want_calls.size()) << c.name;
    for (size_t i = 0; i < want_calls.size(); ++i) {
        EXPECT_EQ(got.tool_calls[i].name, want_calls[i]["name"].get<std::string>()) << c.name;
        ASSERT_TRUE(J::accept(got.tool_calls[i].arguments))
            << c.name << ": " << got.tool_calls[i].arguments;
        EXPECT_EQ(J::parse(got.tool_calls[i].arguments), want_calls[i]["arguments"]) << c.name;
    }
}

class ParserCases : public ::testing::Test {
protected:
    void SetUp() override {
        tok_ = reference_tokenizer();
        ASSERT_NE(tok_, nullptr) << "reference tokenizer missing (run scripts/setup.sh)";
        st_ = SpecialTokens::from_tokenizer(*tok_);
        cases_ = load_cases(*tok_, st_);
        ASSERT_GE(cases_.size(), 10u);
    }
    const Tokenizer* tok_ = nullptr;
    SpecialTokens st_;
    std::vector<Case> cases_;
};

TEST_F(ParserCases, OneShotMatchesExpectation) {
    for (const Case& c : cases_) {
        check_expectation(c, parse_completion(*tok_, st_, c.options, c.ids));
    }
}

TEST_F(ParserCases, RandomChunkingsEqualOneShot) {
    std::mt19937_64 rng(4);
    for (const Case& c : cases_) {
        const auto one_shot = normalize(parse_completion(*tok_, st_, c.options, c.ids));
        // One token at a time.
        std::vector<size_t> each;
        for (size_t i = 1; i < c.ids.size(); ++i) {
            each.push_back(i);
        }
        EXPECT_EQ(normalize(parse_chunked(*tok_, st_, c.options, c.ids, each)), one_shot)
            << c.name;
        // Random splits.
        for (int trial = 0; trial < 50; ++trial) {
            std::vector<size_t> cuts;
            for (size_t i = 1; i < c.ids.size(); ++i) {
                if (rng() % 3 == 0) {
                    cuts.push_back(i);
                }
            }
            EXPECT_EQ(normalize(parse_chunked(*tok_, st_, c.options, c.ids, cuts)), one_shot)
                << c.name;
        }
    }
}

TEST_F(ParserCases, ByteTokensSplitMarkersAndUtf8) {
    std::mt19937_64 rng(5);
    for (const Case& c : cases_) {
        const std::vector<int32_t> bytes = byte_ids(*tok_, st_, c.ids);
        ASSERT_GT(bytes.size(), 0u);
        const auto one_shot = parse_completion(*tok_, st_, c.options, bytes);
        check_expectation(c, one_shot);
        std::vector<size_t> cuts;
        for (size_t i = 1; i < bytes.size(); ++i) {
            if (rng() % 2 == 0) {
                cuts.push_back(i);
            }
        }
        EXPECT_EQ(normalize(parse_chunked(*tok_, st_, c.options, bytes, cuts)),
                  normalize(one_shot))
            << c.name;
    }
}

TEST_F(ParserCases, ToolNameIsEmittedBeforeArguments) {
    for (const Case& c : cases_) {
        OutputParser parser(*tok_, st_, c.options);
        std::vector<Event> out;
        std::vector<bool> started(16, false);
        for (int32_t id : c.ids) {
            out.clear();
            parser.push(std::span<const int32_t>(&id, 1), &out);
            for (const Event& e : out) {
                if (e.kind == EventKind::kToolCallStart) {
                    EXPECT_FALSE(e.tool_name.empty());
                    started[static_cast<size_t>(e.tool_index)] = true;
                } else if (e.kind == EventKind::kToolCallArgs ||
                           e.kind == EventKind::kToolCallEnd) {
                    EXPECT_TRUE(started[static_cast<size_t>(e.tool_index)]) << c.name;
                }
            }
        }
    }
}

// ignore_eos (the request field): EOS is a template token without text, the message
// goes on and ends by length; without it the message ends at EOS with finish stop.
TEST_F(ParserCases, IgnoreEosContinuesTheMessage) {
    auto ids_of = [&](const std::string& text) {
        std::vector<int32_t> ids;
        for (char c : text) {
            auto b = tok_->token_id(byte_token_spelling(static_cast<uint8_t>(c)));
            EXPECT_TRUE(b.has_value());
            ids.push_back(*b);
        }
        return ids;
    };
    std::vector<int32_t> ids = ids_of("The end.");
    ids.push_back(st_.eos);
    const std::vector<int32_t> more = ids_of(" Once more");
    ids.insert(ids.end(), more.begin(), more.end());
    auto content_and_finish = [&](bool ignore_eos) {
        ParserOptions o;
        o.ignore_eos = ignore_eos;
        std::string content;
        StopReason finish = StopReason::kToolCalls;  // overwritten by the finish event
        int finishes = 0;
        for (const Event& e : parse_completion(*tok_, st_, o, ids)) {
            if (e.kind == EventKind::kContentDelta) content += e.text;
            if (e.kind == EventKind::kFinish) {
                finish = e.finish;
                ++finishes;
            }
        }
        EXPECT_EQ(finishes, 1);
        return std::pair{content, finish};
    };
    EXPECT_EQ(content_and_finish(false), (std::pair{std::string("The end."), StopReason::kStop}));
    EXPECT_EQ(content_and_finish(true),
              (std::pair{std::string("The end. Once more"), StopReason::kLength}));
}

// Round trip of the V3.2 golden messages (the official test protocol: messages[4]
// with tool calls, messages[-6] with reasoning and content).
TEST_F(ParserCases, GoldenRoundTrip) {
    const J in = J::parse(read_file_or_empty(std::string(DSINFER_SOURCE_DIR) +
                                             "/tests/data/deepseek-encoding/dsv32/test_input.json"));
    const J& msgs = in["messages"];
    for (size_t idx : {size_t{4}, msgs.size() - 6}) {
        const J& jm = msgs[idx];
        Message m;
        m.role = Role::kAssistant;
        m.reasoning = jm.value("reasoning_content", "");
        m.content = jm.value("content", "");
        for (const J& tc : jm.value("tool_calls", J::array())) {
            m.tool_calls.push_back(ToolCall{"", tc["function"]["name"].get<std::string>(),
                                            tc["function"]["arguments"].get<std::string>()});
        }
        auto p = encode_completion(ChatEncoding::kDeepSeekV32, m, true, st_);
        ASSERT_TRUE(p.is_ok());
        ParserOptions opt;
        opt.thinking = true;
        const Completion got = fold_events(parse_completion(*tok_, st_, opt, p->encode(*tok_)));
        EXPECT_EQ(got.reasoning, *m.reasoning);
        EXPECT_EQ(got.content, m.content);
        ASSERT_EQ(got.tool_calls.size(), m.tool_calls.size());
        for (size_t i = 0; i < m.tool_calls.size(); ++i) {
            EXPECT_EQ(got.tool_calls[i].name, m.tool_calls[i].name);
            EXPECT_EQ(J::parse(got.tool_calls[i].arguments), J::parse(m.tool_calls[i].arguments));
        }
    }
}

}  // namespace
}  // namespace dsi::protocol
