// Grammar front ends from case files (tests/cases/grammar/*.json), masks against
// brute force on the real DeepSeek V3 vocabulary, rollback / draft masks against a
// fresh matcher, limits and pathological inputs.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "grammar/ebnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "grammar/test_json.h"
#include "grammar/test_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "support/build_paths.h"

namespace dsi::grammar {
namespace {

using ojson = nlohmann::ordered_json;

ojson read_cases(const std::string& name) {
    std::ifstream f(std::string(DSINFER_SOURCE_DIR) + "/tests/cases/grammar/" + name);
    EXPECT_TRUE(f.good()) << name;
    return ojson::parse(f);
}

std::shared_ptr<const Vocabulary> byte_vocab() {
    // 256 single-byte tokens + stop id 256: masks over bytes, no tokenizer needed.
    std::vector<std::string> toks;
    for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, static_cast<char>(b)));
    toks.push_back("");
    return Vocabulary::from_tokens(std::move(toks), {256});
}

const Tokenizer& real_tokenizer() { return test_util::real_tokenizer(); }

std::shared_ptr<const Vocabulary> real_vocab() {
    static auto v = Vocabulary::from_tokenizer(real_tokenizer());
    return v;
}

bool full_match(const std::shared_ptr<const CompiledGrammar>& g, const std::string& s) {
    GrammarMatcher m(g);
    return m.advance_bytes(s) && m.is_accepted();
}

void run_cases(const ojson& cases, const std::string& key,
               const std::function<Result<Grammar>(const ojson&)>& compile) {
    for (const auto& c : cases["cases"]) {
        std::string label = c[key].dump();
        auto g = compile(c[key]);
        if (c.contains("error")) {
            ASSERT_FALSE(g.is_ok()) << label;
            EXPECT_NE(g.status().message().find(c["error"].get<std::string>()), std::string::npos)
                << label << " -> " << g.status().to_string();
            continue;
        }
        ASSERT_TRUE(g.is_ok()) << label << " -> " << g.status().to_string();
        auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), byte_vocab());
        for (const auto& s : c["accept"]) {
            EXPECT_TRUE(full_match(cg, s.get<std::string>())) << label << " should accept " << s;
        }
        for (const auto& s : c["reject"]) {
            EXPECT_FALSE(full_match(cg, s.get<std::string>())) << label << " should reject " << s;
        }
    }
}

TEST(GrammarCases, Regex) {
    run_cases(read_cases("regex.json"), "pattern", [](const ojson& p) -> Result<Grammar> {
        auto e = compile_regex(p.get<std::string>(), RegexMatch::kFull, CharEncoding::kUtf8, {});
        if (!e.is_ok()) return e.status();
        GrammarBuilder b;
        uint32_t root = b.declare("root");
        b.define(root, *e);
        return b.build(root);
    });
}

TEST(GrammarCases, Ebnf) {
    run_cases(read_cases("ebnf.json"), "grammar",
              [](const ojson& g) { return compile_ebnf(g.get<std::string>()); });
}

TEST(GrammarCases, JsonSchema) {
    run_cases(read_cases("json_schema.json"), "schema",
              [](const ojson& s) { return compile_json_schema(s); });
}

// Every case of json_schema.json, token by token with the real DeepSeek V3 vocabulary
// (as the tokenizer splits the text): an accepted text's every token is in the mask
// and EOS is allowed at its end; a rejected text meets a masked token or a mask
// without EOS at its end. Covers the issue-21 keywords (dependentRequired,
// dependentSchemas, dependencies, if / then / else, uniqueItems, not of enum) with the
// tables the server would build.
TEST(GrammarCases, JsonSchemaTokenByTokenOnRealVocabulary) {
    auto vocab = real_vocab();
    MatcherOptions options;
    options.table_cache = std::make_shared<PositionTableCache>();
    const ojson cases = read_cases("json_schema.json");
    const int32_t eos = real_tokenizer().eos_id();
    int checked = 0;
    for (const auto& c : cases["cases"]) {
        if (c.contains("error")) continue;
        const std::string label = c["schema"].dump();
        auto g = compile_json_schema(c["schema"]);
        ASSERT_TRUE(g.is_ok()) << label << " -> " << g.status().to_string();
        auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), vocab, options);
        for (const char* verdict : {"accept", "reject"}) {
            const bool accept = std::string(verdict) == "accept";
            for (const auto& text : c[verdict]) {
                const std::string t = text.get<std::string>();
                GrammarMatcher m(cg);
                TokenBitmask mask(vocab->size());
                bool ok = true;
                for (int32_t id : real_tokenizer().encode(t)) {
                    m.fill_mask(&mask);
                    if (!mask.test(id)) {
                        ok = false;
                        break;
                    }
                    ASSERT_TRUE(m.advance(id)) << label << " " << t << " token " << id;
                }
                if (ok) {
                    m.fill_mask(&mask);
                    ok = mask.test(eos) && m.is_accepted();
                }
                EXPECT_EQ(ok, accept) << label << " " << verdict << " " << t;
                ++checked;
            }
        }
    }
    EXPECT_GT(checked, 400);
}

// Issue 21: JsonSchemaOptions::flexible_whitespace. Every case of json_schema.json
// keeps its verdict with the option, compact and re-serialised with whitespace
// everywhere JSON allows it (nlohmann's indented dump, plus spaces around the root);
// objects / arrays under a schema with enum / const are skipped for the indented form
// (enum and const values are matched compactly only; the header says so).
TEST(GrammarCases, JsonSchemaFlexibleWhitespace) {
    JsonSchemaOptions flexible;
    flexible.flexible_whitespace = true;
    int checked = 0;
    const ojson cases = read_cases("json_schema.json");  // named: a temporary's ["cases"] dangles
    for (const auto& c : cases["cases"]) {
        if (c.contains("error")) continue;
        const std::string label = c["schema"].dump();
        auto g = compile_json_schema(c["schema"], flexible);
        ASSERT_TRUE(g.is_ok()) << label << " -> " << g.status().to_string();
        auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), byte_vocab());
        const bool has_enum = label.find("\"enum\"") != std::string::npos ||
                              label.find("\"const\"") != std::string::npos;
        for (const char* verdict : {"accept", "reject"}) {
            const bool accept = std::string(verdict) == "accept";
            for (const auto& text : c[verdict]) {
                const std::string compact = text.get<std::string>();
                EXPECT_EQ(full_match(cg, compact), accept) << label << " " << verdict << " " << compact;
                auto v = ojson::parse(compact, nullptr, /*allow_exceptions=*/false);
                if (v.is_discarded() || v.dump() != compact) continue;
                if (has_enum && v.is_structured()) continue;
                const std::string spaced = " \n" + v.dump(1, '\t') + "\r\n ";
                EXPECT_EQ(full_match(cg, spaced), accept) << label << " " << verdict << " " << spaced;
                ++checked;
            }
        }
    }
    EXPECT_GT(checked, 100);
}

TEST(JsonSchema, FlexibleWhitespaceIsAnOptionAndOnlyBetweenTokens) {
    const std::string_view schema =
        R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"array","items":{"type":"boolean"}}}})";
    JsonSchemaOptions flexible;
    flexible.flexible_whitespace = true;
    auto strict_g = compile_json_schema(schema);
    auto flex_g = compile_json_schema(schema, flexible);
    ASSERT_TRUE(strict_g.is_ok() && flex_g.is_ok());
    auto strict_cg = std::make_shared<CompiledGrammar>(std::move(strict_g).value(), byte_vocab());
    auto flex_cg = std::make_shared<CompiledGrammar>(std::move(flex_g).value(), byte_vocab());
    for (const char* ok : {R"({"a": 1, "b": [true, false]})", "{ }", R"({"b":[ ]})",
                           "\t{\n  \"a\" :12 ,\"b\":[\r\ntrue ] }\n", R"({"a":1,"b":[true]})",
                           R"({ "a": 1, "zz": { "x" : [ 1 , null ] } })"}) {
        EXPECT_TRUE(full_match(flex_cg, ok)) << ok;
    }
    for (const char* bad : {R"({"a": 1 2})", R"({"b": [tr ue]})", R"({"a": - 1})", R"({"a": 1,})",
                            R"({"a" 1})", R"({"b": [true,, false]})", "{\f}", R"({"a": "1"})"}) {
        EXPECT_FALSE(full_match(flex_cg, bad)) << bad;
    }
    // Generation (the default) stays on one line: one optional space after ',' and ':'
    // only (the spellings models are trained on, bounded).
    for (const char* ok : {R"({"a":1})", R"({"a": 1})", R"({"a": 1, "b": [true, false]})",
                           R"({"a":1, "b":[true,false]})"}) {
        EXPECT_TRUE(full_match(strict_cg, ok)) << ok;
    }
    for (const char* bad : {R"({"a":  1})", R"({"a" :1})", R"({ "a":1})", R"({"a":1 })",
                            R"({"b": [ true]})", "{\"a\":\n1}", "{\"a\":\t1}", R"( {"a":1})"}) {
        EXPECT_FALSE(full_match(strict_cg, bad)) << bad;
    }
    // space_after_separators off: compact only.
    JsonSchemaOptions compact;
    compact.space_after_separators = false;
    auto compact_g = compile_json_schema(schema, compact);
    ASSERT_TRUE(compact_g.is_ok());
    auto compact_cg = std::make_shared<CompiledGrammar>(std::move(compact_g).value(), byte_vocab());
    EXPECT_FALSE(full_match(compact_cg, R"({"a": 1})"));
    EXPECT_FALSE(full_match(compact_cg, R"({"a":1, "b":[true]})"));
    EXPECT_TRUE(full_match(compact_cg, R"({"a":1,"b":[true]})"));
}

// Issue 21: JsonSchemaOptions::any_property_order against a brute-force oracle. Every
// sequence of up to four members drawn from the declared keys a (required), b, c and
// the undeclared z: accepted exactly when no declared key repeats, a is present and z
// is allowed (additional properties on); values checked per key.
TEST(JsonSchema, AnyPropertyOrderMatchesOracle) {
    const std::vector<std::string> keys = {"a", "b", "c", "z"};
    const std::vector<std::string> values = {"1", "\"s\"", "true", "null"};  // a, b, c, z
    for (bool additional : {false, true}) {
        for (bool flexible : {false, true}) {
            ojson schema = {{"type", "object"},
                            {"properties",
                             {{"a", {{"type", "integer"}}},
                              {"b", {{"type", "string"}}},
                              {"c", {{"type", "boolean"}}}}},
                            {"required", {"a"}}};
            if (!additional) schema["additionalProperties"] = false;
            JsonSchemaOptions opts;
            opts.any_property_order = true;
            opts.flexible_whitespace = flexible;
            auto g = compile_json_schema(schema, opts);
            ASSERT_TRUE(g.is_ok()) << g.status().to_string();
            auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), byte_vocab());
            int accepted = 0, checked = 0;
            // Sequences as base-5 numbers (digit 4 = end), lengths 0..4.
            for (int code = 0; code < 4 * 4 * 4 * 4; ++code) {
                for (int len = 0; len <= 4; ++len) {
                    std::vector<int> seq;
                    for (int k = 0, c = code; k < len; ++k, c /= 4) seq.push_back(c % 4);
                    if (len < 4 && code >= (1 << (2 * len))) continue;  // each sequence once
                    std::string text = flexible ? "{ " : "{";
                    std::set<int> seen;
                    bool dup = false, has_z = false;
                    for (size_t k = 0; k < seq.size(); ++k) {
                        if (k > 0) text += flexible ? " , " : ",";
                        text +=
                            "\"" + keys[seq[k]] + "\"" + (flexible ? ": " : ":") + values[seq[k]];
                        dup = dup || (seq[k] != 3 && !seen.insert(seq[k]).second);
                        has_z = has_z || seq[k] == 3;
                    }
                    text += flexible ? " }" : "}";
                    const bool expect = !dup && seen.count(0) > 0 && (additional || !has_z);
                    EXPECT_EQ(full_match(cg, text), expect) << schema.dump() << " " << text;
                    accepted += expect;
                    ++checked;
                }
            }
            EXPECT_EQ(checked, 1 + 4 + 16 + 64 + 256);
            EXPECT_GT(accepted, 10);
            // A wrong value for a key is rejected in any position.
            EXPECT_FALSE(full_match(cg, R"({"b":"s","a":"1"})"));
            EXPECT_FALSE(full_match(cg, R"({"c":1,"a":1})"));
        }
    }
    // One declared property: undeclared members may come before it too.
    JsonSchemaOptions opts;
    opts.any_property_order = true;
    auto one =
        compile_json_schema(std::string_view(R"({"properties":{"a":{"type":"integer"}}})"), opts);
    ASSERT_TRUE(one.is_ok());
    auto one_cg = std::make_shared<CompiledGrammar>(std::move(one).value(), byte_vocab());
    EXPECT_TRUE(full_match(one_cg, R"({"z":[],"a":1,"y":2})"));
    EXPECT_FALSE(full_match(one_cg, R"({"z":[],"a":1,"a":2})"));
    EXPECT_FALSE(full_match(one_cg, R"({"z":[],"a":"1"})"));
}

// Every case of json_schema.json with any_property_order: the verdicts of the cases
// hold, and so for the instances with every object's members reversed (JSON Schema
// does not read member order, so a reversed valid instance is valid and a reversed
// invalid one invalid; no case rejects an instance for its order alone).
// The default (declaration order) rejects a reversed object of two declared members.
TEST(GrammarCases, JsonSchemaAnyPropertyOrder) {
    JsonSchemaOptions any_order;
    any_order.any_property_order = true;
    int reversed_differs = 0;
    const ojson cases = read_cases("json_schema.json");
    for (const auto& c : cases["cases"]) {
        if (c.contains("error")) continue;
        const std::string label = c["schema"].dump();
        auto g = compile_json_schema(c["schema"], any_order);
        ASSERT_TRUE(g.is_ok()) << label << " -> " << g.status().to_string();
        auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), byte_vocab());
        const bool counted =
            label.find("Properties\"") != std::string::npos;  // min/max: fixed order
        for (const char* verdict : {"accept", "reject"}) {
            const bool accept = std::string(verdict) == "accept";
            for (const auto& text : c[verdict]) {
                const std::string compact = text.get<std::string>();
                auto v = ojson::parse(compact, nullptr, /*allow_exceptions=*/false);
                EXPECT_EQ(full_match(cg, compact), accept)
                    << label << " " << verdict << " " << compact;
                if (v.is_discarded() || v.dump() != compact) continue;
                const std::string rev = test_util::reversed_keys(v).dump();
                if (rev == compact) continue;
                ++reversed_differs;
                if (accept && counted) continue;
                EXPECT_EQ(full_match(cg, rev), accept)
                    << label << " " << verdict << " reversed " << rev;
            }
        }
    }
    EXPECT_GT(reversed_differs, 20);
    auto fixed = compile_json_schema(std::string_view(
        R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}}})"));
    ASSERT_TRUE(fixed.is_ok());
    auto fixed_cg = std::make_shared<CompiledGrammar>(std::move(fixed).value(), byte_vocab());
    EXPECT_TRUE(full_match(fixed_cg, R"({"a":1,"b":2})"));
    EXPECT_FALSE(full_match(fixed_cg, R"({"b":2,"a":1})"));
}

// Past max_any_order_properties an object keeps declaration order (sound), and the
// cap is what decides it.
TEST(JsonSchema, AnyPropertyOrderCap) {
    ojson props = ojson::object();
    std::string in_order = "{", reversed = "{";
    for (int i = 0; i < 5; ++i) {
        const std::string k = "k" + std::to_string(i);
        props[k] = {{"type", "integer"}};
        in_order += std::string(i ? "," : "") + "\"" + k + "\":" + std::to_string(i);
        reversed += std::string(i ? "," : "") + "\"k" + std::to_string(4 - i) +
                    "\":" + std::to_string(4 - i);
    }
    in_order += "}";
    reversed += "}";
    ASSERT_EQ(reversed.substr(0, 7), "{\"k4\":4");
    const ojson schema = {{"type", "object"}, {"properties", props}, {"required", {"k0", "k4"}}};
    for (size_t cap : {4, 5}) {
        JsonSchemaOptions opts;
        opts.any_property_order = true;
        opts.max_any_order_properties = cap;
        auto g = compile_json_schema(schema, opts);
        ASSERT_TRUE(g.is_ok());
        auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), byte_vocab());
        EXPECT_TRUE(full_match(cg, in_order)) << cap;
        EXPECT_EQ(full_match(cg, reversed), cap == 5) << cap << " " << reversed;
        EXPECT_FALSE(full_match(cg, R"({"k1":1,"k0":0})")) << cap;  // k4 required
    }
}

TEST(Grammar, SerializeRoundTrip) {
    auto g = compile_json_schema(read_cases("json_schema.json")["cases"][0]["schema"]);
    ASSERT_TRUE(g.is_ok());
    std::string bytes = g->serialize();
    auto back = Grammar::deserialize(bytes);
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(back->to_string(), g->to_string());
    EXPECT_FALSE(Grammar::deserialize(bytes.substr(0, bytes.size() - 3)).is_ok());
    std::string bad = bytes;
    bad[bad.size() / 2] ^= 0x7F;
    (void)Grammar::deserialize(bad);  // must not crash
}

// Mask == brute force: every token whose bytes the matcher accepts, and stop ids
// only when accepted.
void expect_mask_exact(GrammarMatcher& m, const Vocabulary& v) {
    TokenBitmask mask(v.size());
    m.fill_mask(&mask);
    TokenBitmask uncached(v.size());
    m.fill_mask_uncached(&uncached);
    ASSERT_EQ(mask, uncached);
    TokenBitmask walked(v.size());
    m.plain_walk_mask(&walked);
    ASSERT_EQ(walked, uncached);
    for (int32_t t = 0; t < v.size(); ++t) {
        bool ok = m.advance(t);
        if (ok) {
            ASSERT_TRUE(m.rollback(1).is_ok());
        }
        ASSERT_EQ(mask.test(t), ok) << "token " << t << " '" << v.token_bytes(t) << "'";
    }
}

TEST(Matcher, MaskEqualsBruteForceOnRealVocabulary) {
    auto v = real_vocab();
    auto g = compile_json_schema(std::string_view(
        R"({"type":"object","properties":{"id":{"type":"integer"},"tags":{"type":"array","items":{"type":"string","maxLength":4}}},"required":["id"],"additionalProperties":false})"));
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), v);
    GrammarMatcher m(cg);
    for (std::string prefix : {"", "{\"id\":1", "{\"id\":12,\"tags\":[\"ab", "{\"id\":0}"}) {
        GrammarMatcher fresh(cg);
        ASSERT_TRUE(fresh.advance_bytes(prefix)) << prefix;
        expect_mask_exact(fresh, *v);
    }
}

TEST(Matcher, RollbackAndDraftMasksEqualFreshMatcher) {
    auto v = real_vocab();
    auto g = compile_json_schema(std::string_view(
        R"({"type":"object","properties":{"name":{"type":"string"},"n":{"type":"number"}},"required":["name","n"]})"));
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), v);
    std::string text = R"({"name":"Ada Lovelace","n":-12.5e3})";
    std::vector<int32_t> ids = real_tokenizer().encode(text);
    ASSERT_GT(ids.size(), 5u);
    GrammarMatcher m(cg);
    for (int32_t id : ids) ASSERT_TRUE(m.advance(id)) << id;
    EXPECT_TRUE(m.is_accepted());
    // Roll back 4 tokens: masks equal a fresh matcher fed the same prefix.
    ASSERT_TRUE(m.rollback(4).is_ok());
    GrammarMatcher fresh(cg);
    for (size_t i = 0; i + 4 < ids.size(); ++i) ASSERT_TRUE(fresh.advance(ids[i]));
    TokenBitmask a(v->size()), b(v->size());
    m.fill_mask_uncached(&a);
    fresh.fill_mask_uncached(&b);
    EXPECT_EQ(a, b);
    EXPECT_FALSE(m.rollback(1000).is_ok());
    // Draft masks for the last 4 tokens.
    std::vector<int32_t> draft(ids.end() - 4, ids.end());
    std::vector<TokenBitmask> masks(draft.size() + 1, TokenBitmask(v->size()));
    EXPECT_EQ(m.fill_draft_masks(draft, masks), 4);
    for (size_t i = 0; i <= draft.size(); ++i) {
        GrammarMatcher f(cg);
        for (size_t k = 0; k + 4 < ids.size() + i; ++k) ASSERT_TRUE(f.advance(ids[k]));
        TokenBitmask expect(v->size());
        f.fill_mask_uncached(&expect);
        EXPECT_EQ(masks[i], expect) << "draft position " << i;
    }
    // The state is unchanged by the draft check.
    m.fill_mask_uncached(&b);
    EXPECT_EQ(a, b);
    // EOS only at the end.
    int32_t eos = real_tokenizer().eos_id();
    EXPECT_FALSE(m.advance(eos));
    for (size_t i = ids.size() - 4; i < ids.size(); ++i) ASSERT_TRUE(m.advance(ids[i]));
    EXPECT_TRUE(m.advance(eos));
    EXPECT_TRUE(m.is_terminated());
}

TEST(Matcher, PathologicalInputsAreBounded) {
    // Ambiguous regex: hash-consed stacks keep the state small.
    auto e = compile_regex("(a|a|aa)*(a|aa)*b", RegexMatch::kFull, CharEncoding::kUtf8, {});
    ASSERT_TRUE(e.is_ok());
    GrammarBuilder b;
    uint32_t root = b.declare("root");
    b.define(root, *e);
    auto g = b.build(root);
    ASSERT_TRUE(g.is_ok());
    auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), byte_vocab());
    EXPECT_TRUE(full_match(cg, std::string(2000, 'a') + "b"));
    // Deep nesting in a schema: a clear error, not a stack overflow.
    std::string deep = "true";
    for (int i = 0; i < 1000; ++i) deep = R"({"items":)" + deep + "}";
    auto d = compile_json_schema(std::string_view(deep));
    ASSERT_FALSE(d.is_ok());
    EXPECT_EQ(d.status().code(), StatusCode::kResourceExhausted) << d.status().to_string();
    // Huge enum: over the limit is an error; at the limit it compiles.
    ojson big = {{"enum", ojson::array()}};
    for (int i = 0; i < 10001; ++i) big["enum"].push_back("v" + std::to_string(i));
    EXPECT_EQ(compile_json_schema(big).status().code(), StatusCode::kResourceExhausted);
    big["enum"].erase(big["enum"].begin());
    EXPECT_TRUE(compile_json_schema(big).is_ok());
    // Nested bounded repetition past the grammar size limit.
    auto r = compile_regex("((a{20000}){20000}){20000}", RegexMatch::kFull, CharEncoding::kUtf8, {});
    ASSERT_TRUE(r.is_ok());
    Limits small;
    small.max_elements = 30000;
    GrammarBuilder b2(small);
    uint32_t root2 = b2.declare("root");
    b2.define(root2, *r);
    auto g2 = b2.build(root2);
    EXPECT_FALSE(g2.is_ok());
    // Deeply nested groups.
    EXPECT_EQ(compile_regex(std::string(5000, '(') + std::string(5000, ')'), RegexMatch::kFull,
                            CharEncoding::kUtf8, {})
                  .status()
                  .code(),
              StatusCode::kResourceExhausted);
    // No wall-clock bound here (speed is not asserted in tests): the limits above bound the
    // work, and the ctest timeout catches a hang.
}

// A grammar whose root derives nothing is an error; alternatives that can never finish
// are dropped, so a matcher never takes a byte into a dead end (issue 22 D5).
TEST(GrammarBuilder, UnproductiveRulesAreDroppedOrRejected) {
    GrammarBuilder b;
    uint32_t root = b.declare("root");
    uint32_t loop = b.declare("loop");
    b.define(loop, e_seq({e_byte('x'), e_rule(loop)}));  // no finite string
    b.define(root, e_alt({e_seq({e_byte('a'), e_rule(loop)}), e_byte('b')}));
    auto g = b.build(root);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), byte_vocab());
    EXPECT_TRUE(full_match(cg, "b"));
    GrammarMatcher m(cg);
    EXPECT_FALSE(m.advance_bytes("a"));  // the dead branch is gone, not entered
    GrammarBuilder b2;
    uint32_t root2 = b2.declare("root");
    uint32_t loop2 = b2.declare("loop");
    b2.define(loop2, e_seq({e_byte('x'), e_rule(loop2)}));
    b2.define(root2, e_seq({e_byte('a'), e_rule(loop2)}));
    auto g2 = b2.build(root2);
    ASSERT_FALSE(g2.is_ok());
    EXPECT_EQ(g2.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(g2.status().message().find("accepts no input"), std::string::npos);
    // A schema that requires itself forever has no finite instance.
    auto s = compile_json_schema(std::string_view(
        R"({"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]})"));
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.status().message().find("accepts no input"), std::string::npos);
}

// Integer spellings (1.0, 1E1) only for validation; generation stays canonical.
TEST(JsonSchema, IntegerSpellingsOption) {
    JsonSchemaOptions validate;
    validate.integer_spellings = true;
    for (const char* schema : {R"({"type":"integer"})", R"({"type":"integer","minimum":1,"maximum":50})",
                               R"({"type":"integer","multipleOf":5})"}) {
        auto gen = compile_json_schema(std::string_view(schema));
        auto val = compile_json_schema(std::string_view(schema), validate);
        ASSERT_TRUE(gen.is_ok() && val.is_ok()) << schema;
        auto g = std::make_shared<CompiledGrammar>(std::move(gen).value(), byte_vocab());
        auto v = std::make_shared<CompiledGrammar>(std::move(val).value(), byte_vocab());
        EXPECT_TRUE(full_match(g, "10")) << schema;
        EXPECT_FALSE(full_match(g, "10.0")) << schema;
        EXPECT_TRUE(full_match(v, "10.0")) << schema;
        EXPECT_TRUE(full_match(v, "10")) << schema;
        EXPECT_FALSE(full_match(v, "10.5")) << schema;
    }
    auto val = compile_json_schema(std::string_view(R"({"type":"integer"})"), validate);
    auto v = std::make_shared<CompiledGrammar>(std::move(val).value(), byte_vocab());
    for (const char* ok : {"1E1", "2e+10", "1.0e2", "-0"}) EXPECT_TRUE(full_match(v, ok)) << ok;
    for (const char* no : {"1e-1", "1.5", "1e"}) EXPECT_FALSE(full_match(v, no)) << no;
}

// issue 21's reproducers: maxItems 20,001 had become unbounded and maxLength above
// 20,000 was ignored. At the limit both hold exactly; above it the schema is rejected
// naming the keyword and the limit.
TEST(JsonSchema, CountingLimitsHoldExactlyAtTheBound) {
    const size_t limit = JsonSchemaOptions().limits.max_repeat;
    ASSERT_EQ(limit, 20000u);
    auto items = compile_json_schema(
        std::string_view(R"({"type":"array","items":{"type":"integer"},"maxItems":20000})"));
    auto chars = compile_json_schema(std::string_view(R"({"type":"string","maxLength":20000})"));
    ASSERT_TRUE(items.is_ok() && chars.is_ok());
    auto a = std::make_shared<CompiledGrammar>(std::move(items).value(), byte_vocab());
    auto c = std::make_shared<CompiledGrammar>(std::move(chars).value(), byte_vocab());
    auto array_of = [](size_t n) {
        std::string t = "[";
        for (size_t i = 0; i < n; ++i) t += i == 0 ? "1" : ",1";
        return t + "]";
    };
    EXPECT_TRUE(full_match(a, array_of(limit)));
    EXPECT_FALSE(full_match(a, array_of(limit + 1)));
    EXPECT_TRUE(full_match(c, "\"" + std::string(limit, 'x') + "\""));
    EXPECT_FALSE(full_match(c, "\"" + std::string(limit + 1, 'x') + "\""));
    for (const char* schema : {R"({"type":"array","items":{"type":"integer"},"maxItems":20001})",
                               R"({"type":"string","maxLength":20001})"}) {
        auto g = compile_json_schema(std::string_view(schema));
        ASSERT_FALSE(g.is_ok()) << schema;
        EXPECT_EQ(g.status().code(), StatusCode::kResourceExhausted) << schema;
        EXPECT_NE(g.status().message().find("20001 above the limit of 20000"), std::string::npos)
            << g.status().message();
    }
}

// Formats are assertions by default; format_assertion = false makes them annotations.
TEST(JsonSchema, FormatAssertionOption) {
    const std::string_view schema = R"({"type":"string","format":"hostname"})";
    auto strict = compile_json_schema(schema);
    ASSERT_TRUE(strict.is_ok());
    JsonSchemaOptions loose_options;
    loose_options.format_assertion = false;
    auto loose = compile_json_schema(schema, loose_options);
    ASSERT_TRUE(loose.is_ok());
    auto a = std::make_shared<CompiledGrammar>(std::move(strict).value(), byte_vocab());
    auto b = std::make_shared<CompiledGrammar>(std::move(loose).value(), byte_vocab());
    EXPECT_FALSE(full_match(a, R"("Invalid Hostname")"));
    EXPECT_TRUE(full_match(b, R"("Invalid Hostname")"));
    EXPECT_TRUE(full_match(a, R"("example.org")"));
}

// Undeclared keys leave the declared names' trie at any other character: plain ASCII
// (the node's byte class), an escape, a control escape or non-ASCII (the grammar's one
// shared rule), at every depth; a declared name (or, at the end, a prefix of one that
// is declared too) takes its own schema, and optional members may be skipped.
TEST(JsonSchema, UndeclaredKeysAreEveryOtherString) {
    auto g = compile_json_schema(std::string_view(
        R"({"type":"object","properties":{"ab":{"type":"integer"},"a":{"type":"boolean"},"é":{"type":"null"}},)"
        R"("additionalProperties":{"type":"string"}})"));
    ASSERT_TRUE(g.is_ok());
    auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), byte_vocab());
    for (const char* ok :
         {R"({"ab":1,"a":true})", R"({"a":false,"ac":"x"})", R"({"abc":"x"})", R"({"b":"x","\"":"y"})",
          R"({"a\n":"x"})", R"({"a\\":"x"})", R"({"aé":"x","a\u001f":"y"})", R"({"":"x"})",
          R"({"é":null,"éé":"x","e":"y"})", R"({"ab":2,"A":"x","a~":"y"})", "{}"}) {
        EXPECT_TRUE(full_match(cg, ok)) << ok;
    }
    for (const char* no : {R"({"ab":"x"})", R"({"a":"x"})", R"({"é":"x"})", R"({"ac":1})",
                           R"({"a":true,"ab":1})", R"({"ab":1,"ab":2})"}) {
        EXPECT_FALSE(full_match(cg, no)) << no;
    }
}

}  // namespace
}  // namespace dsi::grammar
