// engine_rpc.h: the router -> engine wire format (requests and update lines), its
// errors, and the route's head rules. The route end to end (an engine answering a
// router) is in router/'s tests.
#include "server/engine_rpc.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/http_rules.h"
#include "server/structured_output.h"
#include "server/swa_announce.h"
#include "server/test_support.h"

namespace dsi::server {
namespace {

ApiContext context() {
    ApiContext ctx;  // no tokenizer: ids are checked against no vocabulary
    ctx.limits.max_prompt_tokens = 100;
    ctx.limits.max_tokens = 50;
    return ctx;
}

Generation sample_generation() {
    Generation g;
    engine::GenerateRequest& r = g.request;
    r.prompt = {0, 5, 128803, 42};
    r.cache_salt = std::string("\x01key\x00tenant", 11);
    r.agent_traffic = true;
    r.resume_output = {9, 8, 7};
    SamplingParams& s = r.sampling;
    s.temperature = 0.7;
    s.top_k = 40;
    s.top_p = 0.9;
    s.min_p = 0.05;
    s.repetition_penalty = 1.1;
    s.frequency_penalty = 0.5;
    s.presence_penalty = -0.5;
    s.logit_bias = {{7, -100.0f}, {9, 2.5f}};
    s.stop_token_ids = {1, 2};
    s.stop = {"\n\n", "END"};
    s.ignore_eos = true;
    s.max_tokens = 33;
    s.min_tokens = 3;
    s.logprobs = 2;
    s.n = 1;
    s.seed = 18'446'744'073'709'551'557ULL;  // needs all 64 bits
    return g;
}

TEST(EngineRpc, GenerationRoundTrip) {
    const ApiContext ctx = context();
    const Generation g = sample_generation();
    auto back = decode_generation(ctx, encode_generation(g, 1500));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    const engine::GenerateRequest& r = back->request;
    EXPECT_EQ(r.prompt, g.request.prompt);
    EXPECT_EQ(r.resume_output, g.request.resume_output);
    EXPECT_EQ(r.cache_salt, g.request.cache_salt);
    EXPECT_TRUE(r.agent_traffic);
    EXPECT_GT(r.deadline_ns, 0);
    const SamplingParams& a = r.sampling;
    const SamplingParams& b = g.request.sampling;
    EXPECT_EQ(a.temperature, b.temperature);
    EXPECT_EQ(a.top_k, b.top_k);
    EXPECT_EQ(a.top_p, b.top_p);
    EXPECT_EQ(a.min_p, b.min_p);
    EXPECT_EQ(a.repetition_penalty, b.repetition_penalty);
    EXPECT_EQ(a.frequency_penalty, b.frequency_penalty);
    EXPECT_EQ(a.presence_penalty, b.presence_penalty);
    EXPECT_EQ(a.logit_bias, b.logit_bias);
    EXPECT_EQ(a.stop_token_ids, b.stop_token_ids);
    EXPECT_EQ(a.stop, b.stop);
    EXPECT_EQ(a.ignore_eos, b.ignore_eos);
    EXPECT_EQ(a.max_tokens, b.max_tokens);
    EXPECT_EQ(a.min_tokens, b.min_tokens);
    EXPECT_EQ(a.logprobs, b.logprobs);
    EXPECT_EQ(a.n, b.n);
    EXPECT_EQ(a.seed, b.seed);
    EXPECT_FALSE(back->structured);
    EXPECT_FALSE(back->handoff);
    // No timeout: no deadline.
    back = decode_generation(ctx, encode_generation(g, 0));
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ(back->request.deadline_ns, 0);
}

TEST(EngineRpc, TheHandOffTargetAndResultTravel) {
    Generation g = sample_generation();
    g.handoff =
        serving::HandoffTarget{"decode-1.local:9100", {0x0123456789abcdefULL, 0xfedcba98ULL}};
    auto back = decode_generation(context(), encode_generation(g, 0));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    ASSERT_TRUE(back->handoff);
    EXPECT_EQ(back->handoff->address, "decode-1.local:9100");
    EXPECT_EQ(back->handoff->id, g.handoff->id);

    Update last;
    last.finished = true;
    last.reason = engine::FinishReason::kLength;
    last.handoff = HandoffResult{false, 3, 4096, 1234, "UNAVAILABLE: refused"};
    auto u = decode_update(encode_update(last));
    ASSERT_TRUE(u.is_ok()) << u.status().to_string();
    ASSERT_TRUE(u->handoff);
    EXPECT_FALSE(u->handoff->ok);
    EXPECT_EQ(u->handoff->blocks, 3);
    EXPECT_EQ(u->handoff->bytes, 4096);
    EXPECT_EQ(u->handoff->micros, 1234);
    EXPECT_EQ(u->handoff->error, "UNAVAILABLE: refused");
    EXPECT_FALSE(decode_update(encode_update(Update{})).value().handoff);
}

// S-KV-8: where to pull an SWA state travels with the generation; malformed ones are
// refused naming the field.
TEST(EngineRpc, TheSwaPullTargetTravels) {
    Generation g = sample_generation();
    g.swa_pull = serving::SwaPullTarget{"engine-b.local:9200",
                                        {kv::BlockKey{0x0123456789abcdefULL, 0xfULL}, 384}};
    auto back = decode_generation(context(), encode_generation(g, 0));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    ASSERT_TRUE(back->swa_pull);
    EXPECT_EQ(back->swa_pull->address, "engine-b.local:9200");
    EXPECT_EQ(back->swa_pull->key, g.swa_pull->key);
    EXPECT_FALSE(decode_generation(context(), encode_generation(sample_generation(), 0))->swa_pull);
    for (const char* bad :
         {R"({"address":"a:1","lo":"12","hi":"0000000000000000","position":128})",
          R"({"address":"a:1","lo":"000000000000000g","hi":"0000000000000000","position":128})",
          R"({"address":"a:1","lo":"0000000000000000","hi":"0000000000000000","position":100})",
          R"({"address":"","lo":"0000000000000000","hi":"0000000000000000","position":128})",
          R"({"lo":"0000000000000000","hi":"0000000000000000","position":128})", R"("a:1")"}) {
        nlohmann::json j = nlohmann::json::parse(encode_generation(sample_generation(), 0));
        j["swa_pull"] = nlohmann::json::parse(bad);
        auto r = decode_generation(context(), j.dump());
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
        EXPECT_NE(r.status().message().find("swa_pull"), std::string::npos) << r.status().message();
    }
}

// The engines' SWA announcements (swa_announce.h) and their route.
TEST(EngineRpc, SwaAnnouncementsRoundTripAndTheirRouteIsAnEnginesOnly) {
    SwaAnnouncementReply r;
    r.incarnation = 18446744073709551615ULL;
    r.fetch_address = "10.0.0.2:9300";
    r.changes.next = 42;
    r.changes.added = {{kv::BlockKey{1, 2}, 128}, {kv::BlockKey{~0ULL, 3}, 256}};
    r.changes.removed = {{kv::BlockKey{4, 5}, 384}};
    auto back = decode_swa_announcement(encode_swa_announcement(r));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(back->incarnation, r.incarnation);
    EXPECT_EQ(back->fetch_address, r.fetch_address);
    EXPECT_EQ(back->changes.next, 42u);
    EXPECT_FALSE(back->changes.snapshot);
    EXPECT_EQ(back->changes.added, r.changes.added);
    EXPECT_EQ(back->changes.removed, r.changes.removed);
    for (const char* bad :
         {"[]", R"({"incarnation":1,"next":"1","snapshot":false})",
          R"({"incarnation":"1","next":"1"})",
          R"({"incarnation":"1","next":"1","snapshot":true,"added":[["12",128]]})",
          R"({"incarnation":"1","next":"1","snapshot":true,"added":{}})"}) {
        EXPECT_EQ(decode_swa_announcement(bad).status().code(), StatusCode::kInvalidArgument)
            << bad;
    }
    EXPECT_EQ(swa_announcement_since("/internal/v1/swa_states?since=17"), 17u);
    EXPECT_EQ(swa_announcement_since("/internal/v1/swa_states?x=1&since=9"), 9u);
    EXPECT_EQ(swa_announcement_since("/internal/v1/swa_states"), 0u);
    EXPECT_EQ(swa_announcement_since("/internal/v1/swa_states?since=x"), 0u);

    // Router to router: the lookup's query and answer.
    const std::vector<kv::SwaStateKey> asked = {{kv::BlockKey{1, 2}, 128},
                                                {kv::BlockKey{~0ULL, 7}, 256}};
    auto q = decode_swa_lookup_target(encode_swa_lookup_target(asked));
    ASSERT_TRUE(q.is_ok()) << q.status().to_string();
    EXPECT_EQ(*q, asked);
    for (const char* bad : {"/internal/v1/swa_lookup", "/internal/v1/swa_lookup?q=12.128",
                            "/internal/v1/swa_lookup?q=00000000000000000000000000000001.0"}) {
        EXPECT_EQ(decode_swa_lookup_target(bad).status().code(), StatusCode::kInvalidArgument)
            << bad;
    }
    std::vector<kv::SwaStateKey> many(kMaxSwaLookupStates + 1, asked[0]);
    EXPECT_FALSE(decode_swa_lookup_target(encode_swa_lookup_target(many)).is_ok());
    auto held = decode_swa_lookup_answer(encode_swa_lookup_answer({{asked[1], {"e1", "e2"}}}));
    ASSERT_TRUE(held.is_ok()) << held.status().to_string();
    ASSERT_EQ(held->size(), 1u);
    EXPECT_EQ((*held)[0].key, asked[1]);
    EXPECT_EQ((*held)[0].engines, (std::vector<std::string>{"e1", "e2"}));
    EXPECT_FALSE(decode_swa_lookup_answer(R"({"held":[["1",128,[]]]})").is_ok());

    RequestHead h;
    h.method = "GET";
    h.target = std::string(kSwaStatesPath) + "?since=3";
    h.version = 11;
    h.fields = {{"Host", "x"}};
    HeadPolicy p;
    EXPECT_EQ(check_head(h, p).status, 404);  // not an engine of a cluster
    p.engine_rpc = true;
    EXPECT_EQ(check_head(h, p).route, RouteKind::kSwaStates);
    std::vector<ApiKey> keys = {{"sekrit", ""}};
    p.api_keys = &keys;
    EXPECT_EQ(check_head(h, p).status, 401);
    h.fields.emplace_back("Authorization", "Bearer sekrit");
    EXPECT_EQ(check_head(h, p).status, 0);
    // A router's lookup route, behind its keys too.
    h.target = encode_swa_lookup_target(asked);
    EXPECT_EQ(check_head(h, p).status, 404);
    p.swa_lookup = true;
    EXPECT_EQ(check_head(h, p).route, RouteKind::kSwaLookup);
    h.fields.pop_back();
    EXPECT_EQ(check_head(h, p).status, 401);
}

TEST(EngineRpc, GrammarTravelsAsSourceAndNeedsACompiler) {
    Generation g = sample_generation();
    g.structured =
        protocol::StructuredRequest{{grammar::GrammarKind::kRegex, "[0-9]+"}, "guided_regex"};
    const std::string body = encode_generation(g, 0);
    EXPECT_NE(body.find(R"("kind":"regex")"), std::string::npos) << body;
    EXPECT_NE(body.find(R"("text":"[0-9]+")"), std::string::npos) << body;
    auto back = decode_generation(context(), body);
    ASSERT_FALSE(back.is_ok());
    EXPECT_EQ(back.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(back.status().message().find("guided_regex"), std::string::npos);
}

// Every field of the spec travels (a field added to grammar::GrammarSpec must be set
// here), and the engine compiles what the router's caller asked for: the options are
// part of the compile service's cache key, so four settings are four compiles.
TEST(EngineRpc, TheWholeGrammarSpecTravels) {
    StructuredOutput so(testing::tokenizer());
    ApiContext ctx = testing::api_context();
    ctx.structured_output = &so;
    Generation g = sample_generation();
    for (bool flexible : {false, true}) {
        for (bool any_order : {false, true}) {
            grammar::GrammarSpec spec;
            spec.kind = grammar::GrammarKind::kJsonSchema;
            spec.text = R"({"type":"object","properties":{"a":{"type":"integer"},)"
                        R"("b":{"type":"integer"}},"required":["a","b"]})";
            spec.flexible_whitespace = flexible;
            spec.any_property_order = any_order;
            g.structured = protocol::StructuredRequest{spec, "response_format"};
            auto back = decode_generation(ctx, encode_generation(g, 0));
            ASSERT_TRUE(back.is_ok()) << back.status().to_string();
            ASSERT_TRUE(back->structured);
            const grammar::GrammarSpec& got = back->structured->spec;
            EXPECT_EQ(got.kind, spec.kind);
            EXPECT_EQ(got.text, spec.text);
            EXPECT_EQ(got.flexible_whitespace, flexible);
            EXPECT_EQ(got.any_property_order, any_order);
            EXPECT_EQ(back->structured->field, "response_format");
            EXPECT_NE(back->request.mask, nullptr);
        }
    }
    EXPECT_EQ(so.stats().compiled, 4);
    EXPECT_EQ(so.stats().failed, 0);
}

TEST(EngineRpc, MalformedGenerationsNameTheField) {
    const ApiContext ctx = context();
    const std::string ok_sampling = R"("sampling":{"max_tokens":5,"seed":"1"})";
    const std::pair<std::string, std::string> cases[] = {
        {"", "not a JSON object"},
        {"[]", "not a JSON object"},
        {"{" + ok_sampling + "}", "prompt"},
        {R"({"prompt":[],)" + ok_sampling + "}", "prompt"},
        {R"({"prompt":[1,"x"],)" + ok_sampling + "}", "prompt"},
        {R"({"prompt":[-1],)" + ok_sampling + "}", "prompt"},
        {R"({"prompt":[1,99999999999],)" + ok_sampling + "}", "prompt"},
        {R"({"prompt":[1]})", "sampling"},
        {R"({"prompt":[1],"resume":[-3],)" + ok_sampling + "}", "resume"},
        {R"({"prompt":[1],"resume":"x",)" + ok_sampling + "}", "resume"},
        {R"({"prompt":[1],"sampling":{"seed":"1"}})", "sampling.max_tokens"},
        {R"({"prompt":[1],"sampling":{"max_tokens":5,"seed":1}})", "sampling.seed"},
        {R"({"prompt":[1],"sampling":{"max_tokens":5,"seed":"-1"}})", "sampling.seed"},
        {R"({"prompt":[1],"sampling":{"max_tokens":5,"seed":"99999999999999999999"}})",
         "sampling.seed"},
        {R"({"prompt":[1],"sampling":{"max_tokens":51,"seed":"1"}})", "sampling.max_tokens"},
        {R"({"prompt":[1],"sampling":{"max_tokens":5,"seed":"1","top_p":"x"}})", "sampling.top_p"},
        {R"({"prompt":[1],"sampling":{"max_tokens":5,"seed":"1","logit_bias":[[1]]}})",
         "sampling.logit_bias"},
        {R"({"prompt":[1],"sampling":{"max_tokens":5,"seed":"1","stop":[1]}})", "sampling.stop"},
        {R"({"prompt":[1],"timeout_ms":-5,)" + ok_sampling + "}", "timeout_ms"},
        {R"({"prompt":[1],"grammar":{"kind":"yaml"},)" + ok_sampling + "}", "grammar.kind"},
        {R"({"prompt":[1],"grammar":"x",)" + ok_sampling + "}", "grammar"},
        {R"({"prompt":[1],"grammar":{"kind":"json_object","flexible_whitespace":"yes"},)" +
             ok_sampling + "}",
         "grammar.flexible_whitespace: wrong type"},
        {R"({"prompt":[1],"grammar":{"kind":"json_object","any_property_order":1},)" + ok_sampling +
             "}",
         "grammar.any_property_order: wrong type"},
        {R"({"prompt":[1],"handoff":"x",)" + ok_sampling + "}", "handoff"},
        {R"({"prompt":[1],"handoff":{"id":"00000000000000000000000000000001"},)" + ok_sampling +
             "}",
         "handoff.address"},
        {R"({"prompt":[1],"handoff":{"address":"h:1","id":"xyz"},)" + ok_sampling + "}",
         "handoff.id"},
        {R"({"prompt":[1],"handoff":{"address":"","id":"00000000000000000000000000000001"},)" +
             ok_sampling + "}",
         "handoff.address"},
    };
    for (const auto& [body, field] : cases) {
        auto g = decode_generation(ctx, body);
        ASSERT_FALSE(g.is_ok()) << body;
        EXPECT_NE(g.status().message().find(field), std::string::npos)
            << body << " -> " << g.status().message();
    }
    std::string long_prompt = R"({"prompt":[)";
    for (int i = 0; i < 101; ++i) long_prompt += i == 0 ? "1" : ",1";
    auto g = decode_generation(ctx, long_prompt + "]," + ok_sampling + "}");
    ASSERT_FALSE(g.is_ok());
    EXPECT_NE(g.status().message().find("over the limit"), std::string::npos);
}

TEST(EngineRpc, UpdateRoundTrip) {
    Update u;
    u.tokens.push_back({42, "héllo", -0.25f, {{42, -0.25f}, {7, -1.5f}}});
    u.tokens.push_back({43, "", 0.0f, {}});
    u.cached_prompt_tokens = 128;
    u.speculative = {5, 3, 2};
    auto back = decode_update(encode_update(u));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    ASSERT_EQ(back->tokens.size(), 2u);
    EXPECT_EQ(back->tokens[0].token, 42);
    EXPECT_EQ(back->tokens[0].text, "héllo");
    EXPECT_EQ(back->tokens[0].logprob, -0.25f);
    EXPECT_EQ(back->tokens[0].top_logprobs, u.tokens[0].top_logprobs);
    EXPECT_TRUE(back->tokens[1].top_logprobs.empty());
    EXPECT_FALSE(back->finished);
    EXPECT_EQ(back->cached_prompt_tokens, 128);
    EXPECT_EQ(back->speculative.draft_tokens, 5);
    EXPECT_EQ(back->speculative.accepted_tokens, 3);
    EXPECT_EQ(back->speculative.verify_steps, 2);
    EXPECT_TRUE(back->error.is_ok());

    Update last;
    last.finished = true;
    last.reason = engine::FinishReason::kDeadline;
    last.error = deadline_exceeded("too slow");
    const std::string line = encode_update(last);
    EXPECT_EQ(line.back(), '\n');
    EXPECT_EQ(line.find('\n'), line.size() - 1);  // one line
    back = decode_update(line);
    ASSERT_TRUE(back.is_ok());
    EXPECT_TRUE(back->finished);
    EXPECT_EQ(back->reason, engine::FinishReason::kDeadline);
    EXPECT_EQ(back->error.code(), StatusCode::kDeadlineExceeded);
    EXPECT_EQ(back->error.message(), "too slow");
}

TEST(EngineRpc, MalformedUpdatesAreRejected) {
    for (const char* line : {
             "",
             "{",
             "[]",
             R"({"finished":true})",
             R"({"finished":true,"reason":"bored",
             "tokens":[]})",
             R"({"finished":1,"reason":"stop","tokens":[]})",
             R"({"finished":false,"reason":"none"})",
             R"({"finished":false,"reason":"none","tokens":[{"text":"a"}]})",
             R"({"finished":false,"reason":"none","tokens":[7]})",
             R"({"finished":false,"reason":"none","tokens":[],"spec":[1,2]})",
             R"({"finished":true,"reason":"error","tokens":[],"error":{"code":"OK"}})",
             R"({"finished":true,"reason":"error","tokens":[],"error":{"code":"WAT"}})",
             R"({"finished":false,"reason":"none","tokens":[],"handoff":{"ok":true}})",
             R"({"finished":true,"reason":"length","tokens":[],"handoff":{"blocks":1}})",
             R"({"finished":true,"reason":"length","tokens":[],"handoff":[]})",
         }) {
        EXPECT_FALSE(decode_update(line).is_ok()) << line;
    }
}

TEST(EngineRpc, RouteOnlyWhenEnabledAndBehindTheKeys) {
    RequestHead h;
    h.method = "POST";
    h.target = std::string(kEngineRpcPath);
    h.version = 11;
    h.fields = {{"Host", "x"}, {"Content-Length", "10"}};
    h.content_length = 10;
    HeadPolicy p;
    EXPECT_EQ(check_head(h, p).status, 404);
    p.engine_rpc = true;
    HeadVerdict v = check_head(h, p);
    EXPECT_EQ(v.status, 0) << v.message;
    EXPECT_EQ(v.route, RouteKind::kEngineRpc);
    EXPECT_EQ(v.metric_name, "engine_rpc");
    std::vector<ApiKey> keys = {{"sekrit", ""}};
    p.api_keys = &keys;
    EXPECT_EQ(check_head(h, p).status, 401);
    h.fields.emplace_back("Authorization", "Bearer sekrit");
    EXPECT_EQ(check_head(h, p).status, 0);
    h.method = "GET";
    EXPECT_EQ(check_head(h, p).status, 405);
}

}  // namespace
}  // namespace dsi::server
