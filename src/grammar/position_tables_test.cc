// Per-position token tables (matcher.h) against the plain trie walk, on the real
// DeepSeek V3 vocabulary. Own binary, labelled no_asan: it walks the 129K-token trie
// hundreds of times (4 s in release, ~6 min under ASan; it passed there once when
// written, 2026-11-30).
#include <gtest/gtest.h>

#include <bit>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "grammar/table_warmup.h"
#include "grammar/test_json.h"
#include "grammar/test_tokenizer.h"
#include "support/build_paths.h"
#include "tokenizer/tokenizer.h"

namespace dsi::grammar {
namespace {

using ojson = nlohmann::ordered_json;

std::shared_ptr<const Vocabulary> real_vocab() {
    static auto v = Vocabulary::from_tokenizer(test_util::real_tokenizer());
    return v;
}

ojson read_schema_cases() {
    std::ifstream f(std::string(DSINFER_SOURCE_DIR) + "/tests/cases/grammar/json_schema.json");
    EXPECT_TRUE(f.good());
    return ojson::parse(f);
}

// Masks from the per-position tables (accepted | checked uncertain) equal the plain
// trie walk at every step of random walks over the case schemas and regexes, with the
// real vocabulary; tables built all up front for the small grammars, lazily otherwise.
TEST(Matcher, PositionTablesEqualPlainWalk) {
    auto v = real_vocab();
    std::vector<Grammar> grammars;
    const ojson cases = read_schema_cases();
    for (const auto& c : cases["cases"]) {
        if (c.contains("error")) continue;
        auto g = compile_json_schema(c["schema"]);
        if (g.is_ok()) grammars.push_back(std::move(g).value());
    }
    for (const char* re : {"[a-z]{2,5}(-[0-9]+)?", "(ab|a)*c", "\\d{3}-\\d{4}", ".{0,12}x"}) {
        auto e = compile_regex(re, RegexMatch::kFull, CharEncoding::kUtf8, {});
        ASSERT_TRUE(e.is_ok()) << re;
        GrammarBuilder b;
        uint32_t root = b.declare("root");
        b.define(root, *e);
        auto g = b.build(root);
        ASSERT_TRUE(g.is_ok()) << re;
        grammars.push_back(std::move(g).value());
    }
    ASSERT_GT(grammars.size(), 10u);
    std::mt19937_64 rng(7);
    int64_t num_uncertain = 0;
    for (size_t gi = 0; gi < grammars.size(); ++gi) {
        auto cg = std::make_shared<CompiledGrammar>(grammars[gi], v);
        GrammarMatcher m(cg);
        const bool eager = cg->class_positions().size() < 400;  // keep the test fast
        if (eager) m.precompute();
        TokenBitmask a(v->size()), b(v->size());
        for (int step = 0; step < 8 && !m.is_terminated(); ++step) {
            m.fill_mask_uncached(&a);
            m.plain_walk_mask(&b);
            ASSERT_EQ(a, b) << "grammar " << gi << " step " << step;
            std::vector<int32_t> allowed;
            for (int32_t t = 0; t < v->size(); ++t) {
                if (a.test(t)) allowed.push_back(t);
            }
            if (allowed.empty()) break;
            ASSERT_TRUE(m.advance(allowed[rng() % allowed.size()]));
        }
        auto st = cg->table_stats();
        EXPECT_GT(st.built, 0);
        if (eager) {
            EXPECT_EQ(st.built, st.positions);
        }
        num_uncertain += st.num_uncertain;
    }
    EXPECT_GT(num_uncertain, 0);  // the context-dependent path was exercised
}

// Random object schemas, each with and without additional properties: the masks from
// the tables (static continuations, subtree results shared between walks) equal the
// plain trie walk at every step, both on a schema-valid instance fed token by token
// (declared keys, undeclared keys sharing their prefixes) and on random walks.
class RandomSchemas {
public:
    explicit RandomSchemas(uint64_t seed) : rng_(seed) {}

    // A schema and a compact instance it accepts.
    std::pair<ojson, std::string> object(int depth, bool additional) {
        static const char* kNames[] = {"a", "ab", "abc", "name", "nam", "id", "type", "x_y", "é"};
        ojson props = ojson::object();
        std::string inst = "{";
        int n = 1 + static_cast<int>(rng_() % 3);
        for (int i = 0; i < n; ++i) {
            std::string key = kNames[rng_() % std::size(kNames)];
            if (props.contains(key)) continue;
            auto [sub, text] = value(depth + 1, additional);
            props[key] = sub;
            if (inst.size() > 1) inst += ",";
            inst += ojson(key).dump() + ":" + text;
        }
        ojson schema = {{"type", "object"}, {"properties", props}};
        if (!additional) {
            schema["additionalProperties"] = false;
        } else {
            if (rng_() % 2 == 0) schema["additionalProperties"] = {{"type", "integer"}};
            // An undeclared key that shares a declared key's prefix.
            inst += std::string(inst.size() > 1 ? "," : "") + "\"na\":7";
        }
        return {schema, inst + "}"};
    }

private:
    std::pair<ojson, std::string> value(int depth, bool additional) {
        switch (depth >= 3 ? rng_() % 4 : rng_() % 6) {
            case 0: return {{{"type", "string"}}, "\"q \\\"z\""};
            case 1: return {{{"type", "integer"}}, "-12"};
            case 2: return {{{"enum", {"red", "green", 3}}}, "\"green\""};
            case 3: return {{{"type", "boolean"}}, "true"};
            case 4: {
                auto [item, text] = value(depth + 1, additional);
                return {{{"type", "array"}, {"items", item}}, "[" + text + "," + text + "]"};
            }
            default: return object(depth, additional);
        }
    }
    std::mt19937_64 rng_;
};

// A random walk of up to num_steps tokens (uniform over the allowed ones, stop ids
// aside): the masks from the tables equal the plain walk at each step. Returns the
// steps taken.
int random_walk_masks_equal(const std::shared_ptr<const CompiledGrammar>& cg, std::mt19937_64* rng,
                            int num_steps, const std::string& label) {
    const Vocabulary& v = cg->vocab();
    GrammarMatcher w(cg);
    TokenBitmask a(v.size()), b(v.size());
    int step = 0;
    for (; step < num_steps; ++step) {
        w.fill_mask_uncached(&a);
        w.plain_walk_mask(&b);
        EXPECT_EQ(a, b) << label << " walk step " << step;
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < v.size(); ++t) {
            if (a.test(t) && !v.is_stop(t)) allowed.push_back(t);
        }
        if (allowed.empty() || a != b) break;
        EXPECT_TRUE(w.advance(allowed[(*rng)() % allowed.size()])) << label;
    }
    return step;
}

// `text` token by token (the tokenizer's encoding): the masks from the tables equal
// the plain walk before each token, each token is in its mask, and the text is
// accepted at the end. Returns the tokens fed.
int instance_masks_equal(const std::shared_ptr<const CompiledGrammar>& cg, const Tokenizer& tok,
                         const std::string& text, const std::string& label) {
    const Vocabulary& v = cg->vocab();
    GrammarMatcher m(cg);
    TokenBitmask a(v.size()), b(v.size());
    int steps = 0;
    for (int32_t id : tok.encode(text)) {
        m.fill_mask_uncached(&a);
        m.plain_walk_mask(&b);
        EXPECT_EQ(a, b) << label << " before token " << id << " of " << text;
        EXPECT_TRUE(a.test(id)) << label << " " << text;
        if (a != b || !m.advance(id)) return steps;
        ++steps;
    }
    EXPECT_TRUE(m.is_accepted()) << label << " " << text;
    return steps;
}

TEST(Matcher, PositionTablesEqualPlainWalkWithAndWithoutAdditionalProperties) {
    auto v = real_vocab();
    const Tokenizer& tok = test_util::real_tokenizer();
    RandomSchemas gen(11);
    int schemas = 0, steps = 0;
    for (int round = 0; round < 8; ++round) {
        for (bool additional : {false, true}) {
            auto [schema, inst] = gen.object(0, additional);
            auto g = compile_json_schema(schema);
            ASSERT_TRUE(g.is_ok()) << schema.dump() << ": " << g.status().to_string();
            auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), v);
            ++schemas;
            steps += instance_masks_equal(cg, tok, inst, schema.dump());
            std::mt19937_64 rng(static_cast<uint64_t>(round));
            steps += random_walk_masks_equal(cg, &rng, 6, schema.dump());
        }
    }
    EXPECT_EQ(schemas, 16);
    EXPECT_GT(steps, 150);
}

// JsonSchemaOptions::any_property_order (issue 21): the same random schemas, the
// instance with every object's members reversed (undeclared keys first) fed token by
// token and random walks: the masks from the tables (members as rules with many
// callers, one rule per subset of written properties) equal the plain trie walk.
TEST(Matcher, PositionTablesEqualPlainWalkAnyPropertyOrder) {
    auto v = real_vocab();
    const Tokenizer& tok = test_util::real_tokenizer();
    RandomSchemas gen(23);
    JsonSchemaOptions any_order;
    any_order.any_property_order = true;
    int schemas = 0, steps = 0, reordered = 0;
    for (int round = 0; round < 6; ++round) {
        for (bool additional : {false, true}) {
            auto [schema, inst] = gen.object(0, additional);
            auto g = compile_json_schema(schema, any_order);
            ASSERT_TRUE(g.is_ok()) << schema.dump() << ": " << g.status().to_string();
            MatcherOptions opts;
            opts.table_cache = std::make_shared<PositionTableCache>();
            auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), v, opts);
            ++schemas;
            const std::string rev = test_util::reversed_keys(ojson::parse(inst)).dump();
            reordered += rev != inst;
            steps += instance_masks_equal(cg, tok, rev, schema.dump());
            std::mt19937_64 rng(static_cast<uint64_t>(round) + 100);
            steps += random_walk_masks_equal(cg, &rng, 8, schema.dump());
        }
    }
    EXPECT_EQ(schemas, 12);
    EXPECT_GT(reordered, 6);
    EXPECT_GT(steps, 120);
}

// issue 21's reproducer: an object with one declared property and additional
// properties allowed; masks equal the walk and the instance passes.
TEST(Matcher, AdditionalPropertiesReproducerMasks) {
    auto v = real_vocab();
    const Tokenizer& tok = test_util::real_tokenizer();
    auto g = compile_json_schema(
        std::string_view(R"({"type":"object","properties":{"c":{"type":"number"}}})"));
    ASSERT_TRUE(g.is_ok());
    auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), v);
    for (const char* inst : {R"({"c":1})", R"({"c":1,"cc":{"c":[]}})", R"({"d":"c"})"}) {
        GrammarMatcher m(cg);
        TokenBitmask a(v->size()), b(v->size());
        for (int32_t id : tok.encode(inst)) {
            m.fill_mask(&a);
            m.plain_walk_mask(&b);
            ASSERT_EQ(a, b) << inst;
            ASSERT_TRUE(m.advance(id)) << inst;
        }
        EXPECT_TRUE(m.is_accepted()) << inst;
    }
    GrammarMatcher bad(cg);
    EXPECT_FALSE(bad.advance_bytes(R"({"c":"x"})") && bad.is_accepted());
}

// `schema` compiled with a table cache of its own; nullptr when it does not compile.
std::shared_ptr<const CompiledGrammar> compile_with_own_cache(
    std::string_view schema, const std::shared_ptr<const Vocabulary>& v) {
    auto g = compile_json_schema(schema);
    if (!g.is_ok()) return nullptr;
    MatcherOptions opts;
    opts.table_cache = std::make_shared<PositionTableCache>();
    return std::make_shared<CompiledGrammar>(std::move(g).value(), v, opts);
}

// issue 21's worst mask steps on the real-world corpus: a string with maxLength 1,024
// (each character moved to a new link O_k of the bounded repetition, and each link
// built a table of its own: ~10 ms per step) and the e-mail format's domain labels
// ({0,61} inlined into the label loop: ~60 tables per step, up to 150 ms). Masks
// equal the plain walk at every step; positions of links with more items left than a
// token has bytes share one table, and a label step builds a few tables, not dozens.
TEST(Matcher, BoundedRepetitionsShareTables) {
    auto v = real_vocab();
    const Tokenizer& tok = test_util::real_tokenizer();
    struct Case {
        const char* schema;
        std::string instance;
        bool constant_after_half;  // no new table in the second half of the steps
        bool few_tables = true;    // at most 4 tables built per token
    };
    std::string words;
    while (words.size() < 300) words += "lorem ipsum dolor sit amet, ";
    const std::vector<Case> cases = {
        {R"({"type":"string","maxLength":1024})", "\"" + words + "\"", true},
        {R"({"type":"string","format":"email"})", R"("XCsgyU4VpkR@zfsFftJyWkh.vcnc-Example.org")",
         false},
        // The last links of a bound in a context (deployment-status's description,
        // the corpus's slowest steps): each link's table is its own, narrowed from
        // the next longer link's (BoundedStringLinksAreNarrowed below).
        {R"({"type":"object","properties":{"d":{"type":"string","maxLength":140},"e":{"type":"integer"}}})",
         R"({"d":")" + words.substr(0, 134) + R"(","e":12})", false, false},
    };
    for (const auto& c : cases) {
        auto cg = compile_with_own_cache(c.schema, v);
        ASSERT_NE(cg, nullptr) << c.schema;
        GrammarMatcher m(cg);
        TokenBitmask a(v->size()), b(v->size());
        const std::vector<int32_t> ids = tok.encode(c.instance);
        ASSERT_GT(ids.size(), 10u);
        PositionTableCache::Stats at_half;
        for (size_t k = 0; k < ids.size(); ++k) {
            if (k == ids.size() / 2) at_half = cg->table_cache().stats();
            m.fill_mask_uncached(&a);
            if (k % 4 == 0) {  // the plain walk costs ~10 ms a step here
                m.plain_walk_mask(&b);
                ASSERT_EQ(a, b) << c.schema << " before token " << k;
            }
            ASSERT_TRUE(a.test(ids[k])) << c.schema << " token " << k;
            ASSERT_TRUE(m.advance(ids[k]));
        }
        // The closing quote's step builds the tables after the string.
        ASSERT_TRUE(m.is_accepted()) << c.schema;
        const PositionTableCache::Stats end = cg->table_cache().stats();
        if (c.constant_after_half) {
            // Each step's new positions found their tables in the cache.
            EXPECT_LE(end.entries, at_half.entries + 2) << c.schema;
            EXPECT_GE(end.hits - at_half.hits, static_cast<int64_t>(ids.size() / 2)) << c.schema;
        } else if (c.few_tables) {
            EXPECT_LE(cg->table_stats().built, 4 * static_cast<int64_t>(ids.size())) << c.schema;
        }
    }
}

// A bounded string's last links (O_k with k at most the longest token's bytes): the
// table of O_k is O_{k+1}'s narrowed by the tokens longer than k bytes, not a walk of
// the vocabulary per character (issue 21: deployment-status's maxLength 140, the
// corpus's slowest steps). Masks equal the plain walk at every step, on instances that
// end exactly at the bound or one character past it (rejected there), with long
// tokens (runs of spaces), escapes and multi-byte characters near the bound, in an
// object and alone, and on random walks.
TEST(Matcher, BoundedStringLinksAreNarrowed) {
    auto v = real_vocab();
    const Tokenizer& tok = test_util::real_tokenizer();
    const std::string spaces(40, ' ');
    struct Case {
        std::string schema;
        std::string prefix, suffix;  // around the string's characters
        size_t max_length;
    };
    const std::vector<Case> cases = {
        {R"({"type":"object","properties":{"d":{"type":"string","maxLength":140},"e":{"type":"integer"}}})",
         R"({"d":")", R"(","e":12})", 140},
        {R"({"type":"string","minLength":3,"maxLength":24})", "\"", "\"", 24},
        {R"({"type":"array","items":{"type":"string","maxLength":9}})", "[\"", "\"]", 9},
    };
    int narrowed_cases = 0;
    for (const auto& c : cases) {
        auto cg = compile_with_own_cache(c.schema, v);
        ASSERT_NE(cg, nullptr) << c.schema;
        // Strings of exactly max_length characters and one more: words, a run of
        // spaces (a single long token), then escapes and multi-byte characters last.
        for (const std::string& tail :
             {std::string("x\\u00e9\\\"é"), spaces.substr(0, 7), std::string("ab")}) {
            for (size_t extra : {0, 1}) {
                std::string body = "lorem ipsum" + spaces;
                while (body.size() < 200) body += " dolor sit amet";
                // Characters, not bytes: an escape or a UTF-8 character is one.
                auto num_chars = [](const std::string& t) {
                    size_t n = 0;
                    for (size_t i = 0; i < t.size(); ++i) {
                        if ((static_cast<uint8_t>(t[i]) & 0xC0) == 0x80) continue;
                        if (t[i] == '\\') i += t[i + 1] == 'u' ? 5 : 1;
                        ++n;
                    }
                    return n;
                };
                const size_t want = c.max_length + extra;
                const size_t tail_chars = num_chars(tail);
                if (tail_chars > want) continue;
                body = body.substr(0, want - tail_chars) + tail;
                ASSERT_EQ(num_chars(body), want);
                const std::string inst = c.prefix + body + c.suffix;
                GrammarMatcher m(cg);
                TokenBitmask a(v->size()), b(v->size());
                bool rejected = false;
                for (int32_t id : tok.encode(inst)) {
                    m.fill_mask_uncached(&a);
                    m.plain_walk_mask(&b);
                    ASSERT_EQ(a, b) << c.schema << " before token " << id << " of " << inst;
                    if (!a.test(id)) {
                        rejected = true;
                        break;
                    }
                    ASSERT_TRUE(m.advance(id));
                }
                EXPECT_EQ(rejected || !m.is_accepted(), extra == 1) << c.schema << ": " << inst;
            }
        }
        std::mt19937_64 rng(5);
        for (int walk = 0; walk < 3; ++walk) random_walk_masks_equal(cg, &rng, 12, c.schema);
        narrowed_cases += cg->table_stats().narrowed > 0;
    }
    EXPECT_EQ(narrowed_cases, 3);
}

// issue 21's slowest mask steps (12-22 ms): the first character of an undeclared key
// in an object with many declared properties. The grammar after that position (the
// object's later members) is too large to key a shared table, so each grammar walked
// the whole vocabulary for it (~7 ms per object). Now the table with an unknown caller
// is put together from per-first-byte tables shared by structure and refined with the
// real continuation. Masks equal the plain walk at every step, on instances with
// declared and undeclared keys and on random walks, for two grammars whose objects
// share those tables.
TEST(Matcher, UndeclaredKeysOfLargeObjectsEqualPlainWalk) {
    auto v = real_vocab();
    const Tokenizer& tok = test_util::real_tokenizer();
    auto make = [](int variant) {
        ojson props = ojson::object();
        for (int i = 0; i < 48; ++i) {
            const std::string name = std::string(1, static_cast<char>('a' + i % 20)) +
                                     "_long_property_name_" + std::to_string(i * 7 + variant);
            ojson sub = {{"type", i % 3 == 0 ? "string" : i % 3 == 1 ? "integer" : "boolean"}};
            if (i == 5) {
                sub = {{"type", "object"}, {"properties", {{"login", {{"type", "string"}}}}}};
            }
            props[name] = sub;
        }
        return ojson{{"type", "object"}, {"properties", props}};
    };
    int checked = 0;
    for (int variant : {0, 1}) {
        const ojson schema = make(variant);
        auto g = compile_json_schema(schema);
        ASSERT_TRUE(g.is_ok()) << g.status().to_string();
        MatcherOptions opts;
        opts.table_cache = std::make_shared<PositionTableCache>();
        auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), v, opts);
        // The path under test: a wide class whose table cannot be shared as is.
        bool unshared_wide = false;
        for (uint32_t pos : cg->class_positions()) {
            const ByteSet& c =
                cg->grammar().classes()[Grammar::payload(cg->grammar().elements()[pos])];
            int n = 0;
            for (uint64_t w : c.words) n += std::popcount(w);
            unshared_wide = unshared_wide || (n >= 8 && cg->position_key(pos, 1).empty());
        }
        EXPECT_TRUE(unshared_wide);
        auto names = schema["properties"].items().begin();
        const std::string k0 = names.key();
        const std::string k5 = std::next(names, 5).key();
        const std::string inst = "{" + ojson(k0).dump() + ":\"x\"," + ojson(k5).dump() +
                                 R"(:{"login":"q","extra":[1]},"zz":1,"a_long":null,"\"é":{}})";
        GrammarMatcher m(cg);
        TokenBitmask a(v->size()), b(v->size());
        for (int32_t id : tok.encode(inst)) {
            m.fill_mask_uncached(&a);
            m.plain_walk_mask(&b);
            ASSERT_EQ(a, b) << "variant " << variant << " before token " << id << " of " << inst;
            ASSERT_TRUE(m.advance(id)) << inst;
            ++checked;
        }
        EXPECT_TRUE(m.is_accepted()) << inst;
        std::mt19937_64 rng(static_cast<uint64_t>(variant) + 3);
        for (int walk = 0; walk < 3; ++walk) {
            checked += random_walk_masks_equal(cg, &rng, 8, "variant " + std::to_string(variant));
        }
    }
    EXPECT_GT(checked, 60);
}

// The table-cache warm-up (issue 21, table_warmup.h): it fills the shared cache, and
// a schema it has never seen -- other declared names, additional properties, a
// format, a bounded string -- then builds fewer tables than on a cold cache, with masks
// equal to the plain walk at every step.
TEST(Matcher, WarmedTableCacheServesNewSchemas) {
    auto v = real_vocab();
    const Tokenizer& tok = test_util::real_tokenizer();
    const std::string schema =
        R"({"type":"object","properties":{"title":{"type":"string","maxLength":300},)"
        R"("when":{"type":"string","format":"date-time"},"n":{"type":"number"}}})";
    const std::string inst =
        R"({"title":"a b","when":"2020-01-01T00:00:00Z","n":2.5,"x_y":[true]})";
    int64_t misses[2] = {0, 0};
    for (bool warm : {false, true}) {
        MatcherOptions opts;
        opts.table_cache = std::make_shared<PositionTableCache>();
        if (warm) {
            const WarmupStats ws = warm_table_cache(v, opts);
            EXPECT_GT(ws.num_grammars, 3);
            EXPECT_GT(ws.tables_added, 100);
            EXPECT_EQ(opts.table_cache->stats().entries, ws.tables_added);
        }
        const int64_t before = opts.table_cache->stats().misses;
        auto g = compile_json_schema(std::string_view(schema));
        ASSERT_TRUE(g.is_ok());
        auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), v, opts);
        EXPECT_GT(instance_masks_equal(cg, tok, inst, warm ? "warm" : "cold"), 10);
        misses[warm] = opts.table_cache->stats().misses - before;
    }
    EXPECT_LT(misses[1] * 2, misses[0]) << "cold " << misses[0] << ", warm " << misses[1];
}

// A table memory bound of zero: every position falls back to the plain walk.
TEST(Matcher, PositionTableMemoryBoundFallsBackToWalk) {
    auto v = real_vocab();
    auto g = compile_json_schema(std::string_view(R"({"type":"array","items":{"type":"string"}})"));
    ASSERT_TRUE(g.is_ok());
    MatcherOptions opts;
    opts.max_position_table_bytes = 0;
    auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), v, opts);
    GrammarMatcher m(cg);
    m.precompute();
    EXPECT_EQ(cg->table_stats().built, 0);
    ASSERT_TRUE(m.advance_bytes("[\"ab"));
    TokenBitmask a(v->size()), b(v->size());
    m.fill_mask_uncached(&a);
    m.plain_walk_mask(&b);
    EXPECT_EQ(a, b);
    EXPECT_GT(a.count(), 1000);
}

}  // namespace
}  // namespace dsi::grammar
