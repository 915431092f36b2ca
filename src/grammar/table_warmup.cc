#include "grammar/table_warmup.h"

#include <string>
#include <string_view>
#include <utility>

#include "base/check.h"
#include "grammar/json_schema.h"

namespace dsi::grammar {
namespace {

// Small schemas in the shapes real-world schemas are made of, each with an instance
// that visits their positions: any JSON value, declared and undeclared keys (the
// refined key tables are built per first byte, for every byte of the class), scalar
// types and bounds, each asserted format, patterns (search semantics and `.*$`).
constexpr std::pair<std::string_view, std::string_view> kWarmup[] = {
    {R"({"type":"object"})",
     R"({"a":"b c\n\u00e9\"","n":-1.5e3,"i":0,"t":true,"f":false,"z":null,"l":[1,{"k":[]}],"o":{}})"},
    {R"({"type":"object","properties":{"name":{"type":"string"},"id":{"type":"integer"},)"
     R"("ok":{"type":"boolean"},"v":{"type":["number","null"]},"s":{"type":["string","null"]}}})",
     R"({"name":"x","id":12,"ok":true,"v":null,"s":"q","extra":"y","Zed":[1],"_q":{},"é":0})"},
    {R"({"type":"object","properties":{"a":{"type":"integer","minimum":0},)"
     R"("b":{"type":"integer","minimum":1,"maximum":100},"c":{"type":"number","minimum":0},)"
     R"("d":{"enum":["one","two",null]},"e":{"type":"array","items":{"type":"string"}},)"
     R"("f":{"type":"array","items":{"type":"integer"}},"g":{"type":"string","maxLength":100},)"
     R"("h":{"type":"string","minLength":1}},"additionalProperties":false})",
     R"({"a":7,"b":42,"c":0.5,"d":"two","e":["x","y z"],"f":[1,-2],"g":"short","h":"long enough"})"},
    {R"({"type":"object","properties":{"dt":{"type":"string","format":"date-time"},)"
     R"("d":{"type":"string","format":"date"},"t":{"type":"string","format":"time"},)"
     R"("du":{"type":"string","format":"duration"},"e":{"type":"string","format":"email"},)"
     R"("h":{"type":"string","format":"hostname"},"u":{"type":"string","format":"uri"},)"
     R"("ut":{"type":"string","format":"uri-template"},"id":{"type":"string","format":"uuid"},)"
     R"("v4":{"type":"string","format":"ipv4"},"v6":{"type":"string","format":"ipv6"}}})",
     R"({"dt":"2024-01-02T03:04:05Z","d":"2024-01-02","t":"03:04:05+01:00","du":"P1DT2H",)"
     R"("e":"a.b@example.com","h":"api.example.com","u":"https://x.example.com:8080/a/b?c=d#e",)"
     R"("ut":"https://api.github.com/users{/user}","id":"123e4567-e89b-12d3-a456-426614174000",)"
     R"("v4":"192.168.0.1","v6":"2001:0db8:0000:0000:0000:ff00:0042:8329"})"},
    {R"({"type":"array","items":{"type":"string","pattern":"^ab.*$"}})", R"(["abc","ab"])"},
    {R"({"type":"object","properties":{"s":{"type":"string","maxLength":1024},)"
     R"("t":{"type":["string","null"],"maxLength":255}}})",
     R"({"s":"a short, plain text summary","t":"x"})"},
    {R"({"type":"array","items":{"type":"string","pattern":"b"}})", R"(["xbx","b"])"},
};

}  // namespace

WarmupStats warm_table_cache(const std::shared_ptr<const Vocabulary>& vocab,
                             const MatcherOptions& options) {
    DSI_CHECK(options.table_cache != nullptr);
    WarmupStats st;
    const int64_t entries_before = options.table_cache->stats().entries;
    TokenBitmask mask(vocab->size());
    auto feed = [&](std::string_view schema, std::string_view instance) {
        auto g = compile_json_schema(schema);
        DSI_CHECK(g.is_ok(), g.status().to_string());
        auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), vocab, options);
        ++st.num_grammars;
        GrammarMatcher m(cg);
        for (size_t i = 0; i <= instance.size(); ++i) {
            m.fill_mask_uncached(&mask);
            ++st.num_masks;
            if (i == instance.size()) break;
            DSI_CHECK(m.advance_bytes(instance.substr(i, 1)), std::string(instance));
        }
        DSI_CHECK(m.is_accepted(), std::string(instance));
    };
    for (const auto& [schema, instance] : kWarmup) feed(schema, instance);
    st.tables_added = options.table_cache->stats().entries - entries_before;
    return st;
}

}  // namespace dsi::grammar
