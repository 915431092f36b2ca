// Attention data parallelism over an --ep group (engine/dp_front.h): the balancer's
// choice, the wire format (every request field, bitwise floats, raw text bytes), and
// forked ranks where rank 0's DpFront spreads requests over every rank — each request's
// tokens and logprobs are bitwise those of one engine with the whole model, a request
// aborted on rank 1 frees its KV blocks there, and the group ends cleanly.
#include "engine/dp_front.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>

#include "comm/shm_group.h"
#include "comm/test_ranks.h"
#include "engine/engine_test_util.h"
#include "grammar/compile_service.h"
#include "grammar/mask_provider.h"

namespace dsi::engine {
namespace {

// The grammar tests' vocabulary over the synthetic models' 512 ids: token i is the letter
// 'a' + i % 26. The grammar: pairs of a first-half and a second-half letter, in either
// order, so which tokens a step allows depends on the tokens before it.
constexpr int kVocab = 512;
std::shared_ptr<const grammar::Vocabulary> letter_vocab() {
    static const std::shared_ptr<const grammar::Vocabulary> v = [] {
        std::vector<std::string> tokens;
        for (int i = 0; i < kVocab; ++i) {
            tokens.push_back(std::string(1, static_cast<char>('a' + i % 26)));
        }
        return grammar::Vocabulary::from_tokens(std::move(tokens), {});
    }();
    return v;
}
std::shared_ptr<TokenMaskProvider> pairs_mask() {
    grammar::GrammarSpec spec;
    spec.kind = grammar::GrammarKind::kRegex;
    spec.text = "([a-m][n-z]|[n-z][a-m])*";
    Result<grammar::Grammar> g = grammar::compile_grammar(spec);
    DSI_CHECK(g.is_ok(), g.status().to_string());
    return std::make_shared<grammar::GrammarMaskProvider>(
        std::make_shared<grammar::CompiledGrammar>(std::move(g).value(), letter_vocab()));
}
bool first_half(int32_t token) { return token % 26 < 13; }

TEST(DpBalancerTest, FewestSequencesThenFewestKvTokensThenLowestRank) {
    DpBalancer b(3);
    EXPECT_EQ(b.pick(true).rank, 0);  // all equal: the lowest rank
    b.on_start(0, 100);
    EXPECT_EQ(b.pick(true).rank, 1);
    b.on_start(1, 50);
    EXPECT_EQ(b.pick(true).rank, 2);
    b.on_start(2, 70);
    EXPECT_EQ(b.pick(true).rank, 1);             // one each: rank 1 holds the fewest KV tokens
    EXPECT_EQ(b.pick(false).rank, 0);            // a request that must stay on rank 0
    for (int i = 0; i < 30; ++i) b.on_token(1);  // rank 1: 80 tokens, rank 2: 70
    EXPECT_EQ(b.pick(true).rank, 2);
    b.on_finish(0, 100);
    EXPECT_EQ(b.pick(true).rank, 0);
    // Idle ranks: the one that got the fewest requests so far.
    DpBalancer turns(2);
    turns.on_start(0, 10);
    turns.on_finish(0, 10);
    EXPECT_EQ(turns.pick(true).rank, 1);
    EXPECT_EQ(b.loads()[1].requests, 1);
    EXPECT_EQ(b.loads()[1].kv_tokens, 80);
    b.resize(2);  // a failover: rank 0 keeps its load, the others start empty
    ASSERT_EQ(b.num_ranks(), 2);
    EXPECT_EQ(b.loads()[0].requests, 1);
    EXPECT_EQ(b.loads()[1].running_seqs, 0);
    // A front's failover: rank 0 is a lost process too; the ranks that stay keep their
    // requests count only.
    b.on_start(0, 30);
    b.resize(1, /*keep_rank0=*/false);
    ASSERT_EQ(b.num_ranks(), 1);
    EXPECT_EQ(b.loads()[0].requests, 2);
    EXPECT_EQ(b.loads()[0].running_seqs, 0);
    EXPECT_EQ(b.loads()[0].kv_tokens, 0);
}

// --- prefix routing (DpBalancer::Options::prefix) ---------------------------------------

// The chain keys a rank's prefix index would give `tokens` (model "m", no cache_salt).
std::vector<kv::BlockKey> keys_of(const std::vector<int32_t>& tokens,
                                  std::string_view cache_salt = "") {
    return kv::chain_keys(tokens, kv::make_salt("m", cache_salt));
}
// `blocks` full blocks of a conversation `seed` followed by a tail of `tail` tokens.
std::vector<int32_t> prompt_of(uint32_t seed, int64_t blocks, int64_t tail = 10) {
    std::vector<int32_t> p = random_prompt(blocks * kv::kBlockTokens, seed, 500);
    const std::vector<int32_t> t = random_prompt(tail, seed + 1000, 500);
    p.insert(p.end(), t.begin(), t.end());
    return p;
}

TEST(DpPrefixTest, TheLongestMatchWinsTiesGoByLoad) {
    DpBalancer b(3);
    const std::vector<int32_t> a = prompt_of(1, 3);
    b.learn(1, keys_of(a));
    // Rank 2 holds a's first block only (another prompt with the same opening).
    std::vector<int32_t> opening(a.begin(), a.begin() + kv::kBlockTokens);
    const std::vector<int32_t> other_tail = random_prompt(200, 77, 500);
    opening.insert(opening.end(), other_tail.begin(), other_tail.end());
    b.learn(2, keys_of(opening));
    EXPECT_EQ(b.num_blocks(2), 2);
    // A later turn of a: rank 1 holds its 3 blocks, though rank 0 is the least loaded.
    std::vector<int32_t> next = a;
    next.insert(next.end(), other_tail.begin(), other_tail.end());
    DpBalancer::Choice c = b.pick(true, keys_of(next));
    EXPECT_EQ(c.rank, 1);
    EXPECT_EQ(c.matched_blocks, 3);
    EXPECT_EQ(c.reason, DpBalancer::Reason::kPrefix);
    // One block in common with ranks 1 and 2: the load rule between those two (rank 1
    // runs one more sequence).
    b.on_start(1, 100);
    std::vector<int32_t> one(a.begin(), a.begin() + kv::kBlockTokens + 5);
    c = b.pick(true, keys_of(one));
    EXPECT_EQ(c.rank, 2);
    EXPECT_EQ(c.matched_blocks, 1);
    // Nothing in common: the load rule over every rank.
    c = b.pick(true, keys_of(prompt_of(9, 2)));
    EXPECT_EQ(c.rank, 0);
    EXPECT_EQ(c.matched_blocks, 0);
    EXPECT_EQ(c.reason, DpBalancer::Reason::kLoad);
    // Another tenant (cache_salt) shares no key, whatever its tokens.
    EXPECT_EQ(b.pick(true, keys_of(next, "tenant")).rank, 0);
    // A request that must stay on rank 0 does, match or not.
    c = b.pick(false, keys_of(next));
    EXPECT_EQ(c.rank, 0);
    EXPECT_EQ(c.reason, DpBalancer::Reason::kRankZero);
    // A prefix every rank holds decides nothing: the load rule.
    DpBalancer both(2);
    both.learn(0, keys_of(a));
    both.learn(1, keys_of(a));
    both.on_start(0, 10);
    c = both.pick(true, keys_of(next));
    EXPECT_EQ(c.rank, 1);
    EXPECT_EQ(c.matched_blocks, 3);
    EXPECT_EQ(c.reason, DpBalancer::Reason::kLoad);
    // --ep-dp-routing load: nothing is learned, the load rule only.
    DpBalancer load(2, {.prefix = false});
    load.on_start(0, 10);
    load.learn(0, keys_of(a));
    EXPECT_EQ(load.num_blocks(0), 0);
    EXPECT_EQ(load.pick(true, keys_of(a)).rank, 1);
}

TEST(DpPrefixTest, ATooLoadedRankFallsBackToTheLoadRule) {
    // Too loaded: more than 2 sequences above the least-loaded rank AND above 1.25 times it.
    DpBalancer b(2);
    const std::vector<int32_t> a = prompt_of(2, 2);
    b.learn(1, keys_of(a));
    for (int i = 0; i < 2; ++i) b.on_start(1, 10);
    EXPECT_EQ(b.pick(true, keys_of(a)).rank, 1);  // 2 - 0: not more than 2
    b.on_start(1, 10);
    DpBalancer::Choice c = b.pick(true, keys_of(a));
    EXPECT_EQ(c.rank, 0);
    EXPECT_EQ(c.reason, DpBalancer::Reason::kOverloaded);
    EXPECT_EQ(c.matched_blocks, 0);
    // Rank 0 runs 20: rank 1's 25 is 5 more but not above 1.25x; 26 is both.
    for (int i = 0; i < 20; ++i) b.on_start(0, 10);
    for (int i = 0; i < 22; ++i) b.on_start(1, 10);
    EXPECT_EQ(b.loads()[1].running_seqs, 25);
    EXPECT_EQ(b.pick(true, keys_of(a)).rank, 1);
    b.on_start(1, 10);
    EXPECT_EQ(b.pick(true, keys_of(a)).reason, DpBalancer::Reason::kOverloaded);
    // Other thresholds (--ep-dp-balance-abs 0 --ep-dp-balance-rel 1): any excess is too much.
    DpBalancer strict(2, {.balance_abs_seqs = 0, .balance_rel = 1.0});
    strict.learn(1, keys_of(a));
    strict.on_start(1, 10);
    EXPECT_EQ(strict.pick(true, keys_of(a)).rank, 0);
}

TEST(DpPrefixTest, MemoryIsBoundedTheOldestKeysGoFirst) {
    DpBalancer b(1, {.max_blocks_per_rank = 4});
    const std::vector<int32_t> a = prompt_of(3, 3), c = prompt_of(4, 3);
    b.learn(0, keys_of(a));
    b.learn(0, keys_of(c));
    EXPECT_EQ(b.num_blocks(0), 4);
    // a is older: its deepest blocks went, its first stays (a parent never before its
    // children, so a match is always a whole prefix).
    EXPECT_EQ(b.matched_blocks(0, keys_of(a)), 1);
    EXPECT_EQ(b.matched_blocks(0, keys_of(c)), 3);
    b.learn(0, keys_of(a));  // used again: now c is the older
    EXPECT_EQ(b.matched_blocks(0, keys_of(a)), 3);
    EXPECT_EQ(b.matched_blocks(0, keys_of(c)), 1);
    // A chain longer than the cap keeps its first blocks.
    const std::vector<int32_t> long_one = prompt_of(5, 10);
    b.learn(0, keys_of(long_one));
    EXPECT_EQ(b.matched_blocks(0, keys_of(long_one)), 4);
    EXPECT_EQ(b.matched_blocks(0, keys_of(a)), 0);
    // The rank's KV pool caps it too.
    b.set_pool_blocks(0, 2);
    EXPECT_EQ(b.num_blocks(0), 2);
    EXPECT_EQ(b.matched_blocks(0, keys_of(long_one)), 2);
}

TEST(DpPrefixTest, ARestartedRankForgetsMalformedPromptsMatchNothing) {
    DpBalancer b(3);
    const std::vector<int32_t> a = prompt_of(6, 2);
    for (int r = 0; r < 3; ++r) b.learn(r, keys_of(a));
    b.forget(2);  // a fresh engine (bench offline's reset)
    EXPECT_EQ(b.matched_blocks(2, keys_of(a)), 0);
    EXPECT_EQ(b.matched_blocks(1, keys_of(a)), 2);
    b.resize(2);  // a failover: rank 0 (this process) keeps its cache, the others are new
    EXPECT_EQ(b.matched_blocks(0, keys_of(a)), 2);
    EXPECT_EQ(b.matched_blocks(1, keys_of(a)), 0);
    b.resize(2, /*keep_rank0=*/false);  // a front's failover: every rank is new
    EXPECT_EQ(b.matched_blocks(0, keys_of(a)), 0);
    // Empty, short (no full block) and garbage prompts: no keys, the load rule.
    b.learn(1, keys_of(a));
    b.on_start(0, 5);
    for (const std::vector<int32_t>& p : {std::vector<int32_t>{}, std::vector<int32_t>(127, 7),
                                          std::vector<int32_t>{-5, 1 << 30}}) {
        const DpBalancer::Choice c = b.pick(true, keys_of(p));
        EXPECT_EQ(c.rank, 1);
        EXPECT_EQ(c.matched_blocks, 0);
        b.learn(0, keys_of(p));
    }
    EXPECT_EQ(b.num_blocks(0), 0);
    // Out-of-vocabulary ids hash like any other: only an equal chain matches.
    std::vector<int32_t> odd(kv::kBlockTokens, -1);
    b.learn(0, keys_of(odd));
    EXPECT_EQ(b.matched_blocks(0, keys_of(odd)), 1);
    EXPECT_EQ(b.matched_blocks(0, keys_of(a)), 0);
}

TEST(DpWireTest, ARequestWithEveryFieldRoundTrips) {
    GenerateRequest r;
    r.prompt = {1, 2, 300};
    SamplingParams& s = r.sampling;
    s.temperature = 0.7;
    s.top_k = 40;
    s.top_p = 0.9;
    s.min_p = 0.05;
    s.repetition_penalty = 1.1;
    s.frequency_penalty = 0.3;
    s.presence_penalty = -0.2;
    s.logit_bias = {{5, 1.5f}, {7, -100.0f}};
    s.stop_token_ids = {9, 10};
    s.stop = {"\n\n", "\xff\xfe raw"};
    s.ignore_eos = true;
    s.max_tokens = 77;
    s.min_tokens = 3;
    s.logprobs = 2;
    s.n = 1;
    s.seed = 0xfedcba9876543210ull;
    r.cache_salt = "tenant";
    r.deadline_ns = 123456789;
    r.agent_traffic = true;
    r.resume_output = {4, 5};
    r.mask = pairs_mask();  // travels as its portable form (the serialised grammar)
    Result<dp_wire::Message> m = dp_wire::decode(dp_wire::encode_request(42, r));
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    ASSERT_EQ(m->kind, dp_wire::Message::Kind::kRequest);
    EXPECT_EQ(m->id, 42);
    const GenerateRequest& g = m->request;
    EXPECT_EQ(g.prompt, r.prompt);
    EXPECT_EQ(g.sampling.temperature, s.temperature);
    EXPECT_EQ(g.sampling.top_k, s.top_k);
    EXPECT_EQ(g.sampling.top_p, s.top_p);
    EXPECT_EQ(g.sampling.min_p, s.min_p);
    EXPECT_EQ(g.sampling.repetition_penalty, s.repetition_penalty);
    EXPECT_EQ(g.sampling.frequency_penalty, s.frequency_penalty);
    EXPECT_EQ(g.sampling.presence_penalty, s.presence_penalty);
    EXPECT_EQ(g.sampling.logit_bias, s.logit_bias);
    EXPECT_EQ(g.sampling.stop_token_ids, s.stop_token_ids);
    EXPECT_EQ(g.sampling.stop, s.stop);
    EXPECT_EQ(g.sampling.ignore_eos, s.ignore_eos);
    EXPECT_EQ(g.sampling.max_tokens, s.max_tokens);
    EXPECT_EQ(g.sampling.min_tokens, s.min_tokens);
    EXPECT_EQ(g.sampling.logprobs, s.logprobs);
    EXPECT_EQ(g.sampling.n, s.n);
    EXPECT_EQ(g.sampling.seed, s.seed);
    EXPECT_EQ(g.cache_salt, r.cache_salt);
    EXPECT_EQ(g.deadline_ns, r.deadline_ns);
    EXPECT_EQ(g.agent_traffic, r.agent_traffic);
    EXPECT_EQ(g.resume_output, r.resume_output);
    ASSERT_TRUE(m->has_mask);
    EXPECT_EQ(g.mask, nullptr);
    EXPECT_EQ(m->mask_form, r.mask->portable_form());
    // The rank's rebuild is the same grammar.
    grammar::PortableMaskBuilder builder(letter_vocab());
    auto handle = builder.submit(m->mask_form);
    ASSERT_TRUE(handle.is_ok());
    grammar::CompileResult built = (*handle)->wait_for(int64_t{10} * 1000000000);
    ASSERT_TRUE(built.is_ok()) << built.status().to_string();
    EXPECT_EQ(grammar::PortableMaskBuilder::provider(*built)->portable_form(), m->mask_form);
    r.mask = nullptr;
    m = dp_wire::decode(dp_wire::encode_request(42, r));
    ASSERT_TRUE(m.is_ok());
    EXPECT_FALSE(m->has_mask);
}

// A rank's mask builder warms its table cache off the rank's steps, as `serve` does
// before it listens (the --ep ranks did not: their first grammars built the tables in
// their decode steps).
TEST(DpWireTest, ARanksMaskBuilderWarmsItsTablesOnItsOwnThread) {
    grammar::PortableMaskBuilder cold(letter_vocab());
    EXPECT_EQ(cold.wait_table_warmup().num_grammars, 0);
    grammar::PortableMaskBuilder builder(letter_vocab());
    builder.start_table_warmup();
    const grammar::WarmupStats ws = builder.wait_table_warmup();
    EXPECT_GT(ws.num_grammars, 0);
    EXPECT_GT(ws.num_masks, 0);
    EXPECT_GT(ws.tables_added, 0);
}

TEST(DpWireTest, EventsKeepTheirBitsAndTheOtherMessagesRoundTrip) {
    const std::vector<std::pair<int32_t, float>> top = {
        {3, -0.1234567f}, {8, -std::numeric_limits<float>::infinity()}};
    TokenEvent e;
    e.index = 0;
    e.token = 17;
    e.text = "caf\xc3";  // half a character: bytes travel as they are
    e.logprob = -1.0e-7f;
    e.top_logprobs = top;
    e.finished = true;
    e.reason = FinishReason::kStop;
    e.cached_prompt_tokens = 128;
    Result<dp_wire::Message> m = dp_wire::decode(dp_wire::encode_event(5, e));
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    EXPECT_EQ(m->kind, dp_wire::Message::Kind::kEvent);
    EXPECT_EQ(m->id, 5);
    EXPECT_EQ(m->event.token, 17);
    EXPECT_EQ(m->event.text, e.text);
    EXPECT_EQ(std::memcmp(&m->event.logprob, &e.logprob, sizeof(float)), 0);
    ASSERT_EQ(m->top_logprobs.size(), 2u);
    EXPECT_EQ(m->top_logprobs[0], top[0]);
    EXPECT_TRUE(std::isinf(m->top_logprobs[1].second));
    EXPECT_TRUE(m->event.finished);
    EXPECT_EQ(m->event.reason, FinishReason::kStop);
    EXPECT_EQ(m->event.cached_prompt_tokens, 128);

    m = dp_wire::decode(dp_wire::encode_error(6, resource_exhausted("pool too small")));
    ASSERT_TRUE(m.is_ok());
    EXPECT_EQ(m->kind, dp_wire::Message::Kind::kError);
    EXPECT_EQ(m->error.code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(m->error.message(), "pool too small");
    m = dp_wire::decode(dp_wire::encode_load({3, 12, 64}, {7, 9'000'000, 125'000}));
    ASSERT_TRUE(m.is_ok());
    EXPECT_EQ(m->load, (dp_wire::RankLoad{3, 12, 64}));
    EXPECT_EQ(m->counters, (dp_wire::RankCounters{7, 9'000'000, 125'000}));
    EXPECT_FALSE(m->ep.has_value());
    // A front's rank 0 adds the group's stats (the front has no model to ask).
    ExpertParallelStats ep;
    ep.num_ranks = 3;
    ep.failovers = 1;
    ep.steps = 41;
    ep.placement_changes = 2;
    ep.rank_rows = {10, 20, 30};
    ep.windows = {{40, 2, 1.25, 1.03125}};
    ep.placed_moe_lb = 1.03125;
    m = dp_wire::decode(dp_wire::encode_load({1, 2, 64}, {}, &ep));
    ASSERT_TRUE(m.is_ok());
    ASSERT_TRUE(m->ep.has_value());
    EXPECT_EQ(m->ep->num_ranks, 3);
    EXPECT_EQ(m->ep->failovers, 1);
    EXPECT_EQ(m->ep->steps, 41);
    EXPECT_EQ(m->ep->placement_changes, 2);
    EXPECT_EQ(m->ep->rank_rows, ep.rank_rows);
    ASSERT_EQ(m->ep->windows.size(), 1u);
    EXPECT_EQ(m->ep->windows[0].end_step, 40);
    EXPECT_EQ(m->ep->windows[0].placement, 2);
    EXPECT_EQ(m->ep->windows[0].moe_lb, 1.25);
    EXPECT_EQ(m->ep->windows[0].placed_moe_lb, 1.03125);
    EXPECT_EQ(m->ep->placed_moe_lb, 1.03125);
    EXPECT_EQ(dp_wire::decode(dp_wire::encode_abort(9))->id, 9);
    EXPECT_EQ(dp_wire::decode(dp_wire::encode_end())->kind, dp_wire::Message::Kind::kEnd);
    for (bool async : {false, true}) {
        m = dp_wire::decode(dp_wire::encode_reset(async));
        ASSERT_TRUE(m.is_ok());
        EXPECT_EQ(m->kind, dp_wire::Message::Kind::kReset);
        EXPECT_EQ(m->async, async);
    }
}

// A V4 export's SWA state travels with it (serve --ep N --role prefill on V4 / V4.1); a
// state that is not at the export's end (another key or position) is refused.
TEST(DpWireTest, AKvExportWithItsSwaStateRoundTrips) {
    auto x = std::make_shared<kv::KvExport>();
    x->model_id = "m";
    x->block_tokens = 4;
    x->layer_block_bytes = {8};
    x->keys = {{1, 2}, {3, 4}};
    x->token_hashes = {5, 6};
    x->layers = {std::vector<uint8_t>(16, 7)};
    auto st = std::make_shared<kv::SwaState>();
    st->key = {kv::BlockKey{3, 4}, 8};
    st->traffic_class = kvstore::TrafficClass::kAgent;
    st->bytes = {1, 2, 0, 255};
    x->swa_state = st;
    TokenEvent e;
    e.finished = true;
    e.reason = FinishReason::kLength;
    e.kv_export = x;
    Result<dp_wire::Message> m = dp_wire::decode(dp_wire::encode_event(9, e));
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    const std::shared_ptr<const kv::KvExport>& got = m->event.kv_export;
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(got->keys, x->keys);
    EXPECT_EQ(got->layers, x->layers);
    ASSERT_NE(got->swa_state, nullptr);
    EXPECT_EQ(got->swa_state->key, st->key);
    EXPECT_EQ(got->swa_state->traffic_class, st->traffic_class);
    EXPECT_EQ(got->swa_state->bytes, st->bytes);
    for (const kv::SwaStateKey& bad :
         {kv::SwaStateKey{kv::BlockKey{1, 2}, 8}, kv::SwaStateKey{kv::BlockKey{3, 4}, 4}}) {
        st->key = bad;
        EXPECT_EQ(dp_wire::decode(dp_wire::encode_event(9, e)).status().code(),
                  StatusCode::kInvalidArgument);
    }
}

TEST(DpWireTest, GarbageIsAnError) {
    EXPECT_EQ(dp_wire::decode("not msgpack at all").status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(dp_wire::decode(std::string("\x81\xa1t\xa3zzz", 7)).status().code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(dp_wire::decode("").status().code(), StatusCode::kInvalidArgument);
}

// --- forked ranks -------------------------------------------------------------------

constexpr int kRequests = 6;
constexpr int kMaxTokens = 14;
constexpr int kAborted = 1;  // the second request: rank 1's first (the balancer's order)
constexpr int kAbortedMaxTokens = 60;

std::string unique_group() {
    static std::atomic<int> counter{0};
    return "dsi_engine_dp_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
}

GenerateRequest request(int i) {
    GenerateRequest r;
    r.prompt = random_prompt(5 + 7 * i, 300 + static_cast<uint32_t>(i), 500);
    r.sampling.max_tokens = i == kAborted ? kAbortedMaxTokens : 5 + (i * 3) % (kMaxTokens - 4);
    r.sampling.temperature = i % 2 == 0 ? 0.0 : 0.9;
    r.sampling.seed = 70 + static_cast<uint64_t>(i);
    r.sampling.ignore_eos = true;
    r.sampling.logprobs = 2;
    return r;
}

EngineOptions rank_options() {
    EngineOptions o = base_options();
    o.record_logits = false;  // logits stay on their rank; the logprobs travel
    return o;
}

struct FixedLink final : DpRankLink {
    Ranks ranks;
    Ranks current() const override { return ranks; }
};

// What rank 0 saw, in memory shared with the test process.
struct Results {
    int32_t tokens[kRequests][kAbortedMaxTokens];
    uint32_t logprob_bits[kRequests][kAbortedMaxTokens];
    uint32_t top_bits[kRequests][kAbortedMaxTokens][2];
    int32_t num_tokens[kRequests];
    int32_t reason[kRequests];
    int32_t first_rank[kRequests];
    int64_t requests_per_rank[4];
    int64_t rank1_max_blocks_used;  // while the aborted request ran
    int64_t rank1_blocks_used_after;
    int64_t rank1_seqs_after;
};

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

// Records request i's tokens, logprob bits and finish reason into `res`.
StreamCallback recorder(Results* res, int i) {
    return [res, i](const TokenEvent& ev) {
        if (ev.token >= 0) {
            const int n = res->num_tokens[i]++;
            res->tokens[i][n] = ev.token;
            res->logprob_bits[i][n] = bits(ev.logprob);
            for (size_t k = 0; k < 2 && k < ev.top_logprobs.size(); ++k) {
                res->top_bits[i][n][k] = bits(ev.top_logprobs[k].second);
            }
        }
        if (ev.finished) res->reason[i] = static_cast<int32_t>(ev.reason);
    };
}

// Rank 0 sends the end and leaves the group once every rank is idle.
int leave_group(const std::vector<std::shared_ptr<comm::RankPipe>>& pipes, CausalLm& model) {
    for (const auto& pipe : pipes) {
        if (!pipe->send(dp_wire::encode_end()).is_ok()) return 16;
    }
    for (;;) {
        for (const auto& pipe : pipes) (void)pipe->flush();
        Result<CausalLm::GroupStep> g = model.group_idle_step(/*leaving=*/true);
        if (!g.is_ok()) return 17;
        if (*g == CausalLm::GroupStep::kStopped) return 0;
    }
}

int front_rank(const std::string& group, int ranks,
               std::vector<std::shared_ptr<comm::RankPipe>> pipes, Results* res) {
    auto model = ep_model(group, 0, ranks);
    if (model == nullptr) return 10;
    auto engine = Engine::create(model.get(), rank_options(), Env::default_env());
    if (!engine.is_ok()) return 11;
    FixedLink link;
    link.ranks.pipes = std::move(pipes);
    DpFront front(engine->get(), model.get(), &link, Env::default_env());
    std::vector<RequestId> ids;
    for (int i = 0; i < kRequests; ++i) {
        Result<RequestId> id = front.add_request(request(i), recorder(res, i));
        if (!id.is_ok()) return 12;
        ids.push_back(*id);
        res->first_rank[i] = front.rank_of(*id);
    }
    bool aborted = false;
    while (front.has_work()) {
        Status s = front.step();
        if (!s.is_ok()) {
            std::fprintf(stderr, "rank 0: %s\n", s.to_string().c_str());
            return 13;
        }
        const EngineStats st = front.stats();
        res->rank1_max_blocks_used =
            std::max(res->rank1_max_blocks_used, st.dp_ranks[1].kv_blocks_used);
        if (!aborted && res->num_tokens[kAborted] >= 3) {
            aborted = true;
            if (!front.abort(ids[kAborted]).is_ok()) return 14;
        }
    }
    // Rank 1's load report after the abort: its blocks are free again.
    const int64_t deadline = steady_clock_ns() + 10'000'000'000;
    EngineStats st = front.stats();
    while ((st.dp_ranks[1].kv_blocks_used != 0 || st.dp_ranks[1].running_seqs != 0) &&
           steady_clock_ns() < deadline) {
        if (!front.step().is_ok()) return 15;
        ::usleep(1000);
        st = front.stats();
    }
    res->rank1_blocks_used_after = st.dp_ranks[1].kv_blocks_used;
    res->rank1_seqs_after = st.dp_ranks[1].running_seqs;
    for (size_t r = 0; r < st.dp_ranks.size() && r < 4; ++r) {
        res->requests_per_rank[r] = st.dp_ranks[r].requests;
    }
    return leave_group(link.ranks.pipes, *model);
}

// A prefill's request whose finishing event brings its KV export (2 full blocks + 20).
GenerateRequest export_request() {
    GenerateRequest ex;
    ex.prompt = random_prompt(2 * 128 + 20, 900, 500);
    ex.sampling.max_tokens = 1;
    ex.sampling.ignore_eos = true;
    ex.export_kv = true;
    return ex;
}

// A callback that keeps the finishing event's export in *out.
StreamCallback keep_export(std::shared_ptr<const kv::KvExport>* out) {
    return [out](const TokenEvent& ev) {
        if (ev.finished) *out = ev.kv_export;
    };
}

int serving_rank(const std::string& group, int rank, int ranks, int fd,
                 const std::string& preset = "tiny-v3") {
    auto model = ep_model(group, rank, ranks, preset);
    if (model == nullptr) return 10;
    // V4: an SWA state pool, as a --role rank's replica owns (a KV export carries the state).
    kv::SwaStatePool swa_pool(int64_t{64} << 20);
    EngineOptions eo = rank_options();
    if (preset != "tiny-v3") eo.swa_pool = &swa_pool;
    auto engine = Engine::create(model.get(), eo, Env::default_env());
    if (!engine.is_ok()) return 11;
    auto pipe = comm::RankPipe::adopt(fd);
    if (!pipe.is_ok()) return 12;
    grammar::PortableMaskBuilder masks(letter_vocab());
    Status s = run_dp_rank(**engine, *model, **pipe, Env::default_env(), nullptr,
                           /*report_group_stats=*/false, &masks);
    if (!s.is_ok()) std::fprintf(stderr, "rank %d: %s\n", rank, s.to_string().c_str());
    return s.is_ok() ? 0 : 13;
}

class DpFrontTest : public ::testing::TestWithParam<int> {};

TEST_P(DpFrontTest, RequestsSpreadOverTheRanksGetOneEnginesTokensBitwise) {
    const int ranks = GetParam();
    comm::SharedArray<Results> shared(1);
    Results* res = shared.data();
    std::vector<std::shared_ptr<comm::RankPipe>> parents;
    std::vector<int> child_fds;
    for (int r = 1; r < ranks; ++r) {
        comm::RankPipe::Pair p = comm::RankPipe::create_pair().value();
        parents.push_back(std::move(p.parent));
        child_fds.push_back(p.child_fd);
    }
    const std::string group = unique_group();
    auto codes = comm::run_ranks(
        ranks,
        [&](int r) {
            if (r == 0) return front_rank(group, ranks, parents, res);
            parents.clear();  // this rank's end only
            return serving_rank(group, r, ranks, child_fds[static_cast<size_t>(r - 1)]);
        },
        120'000);
    (void)comm::ShmMoeCommunicator::unlink(group);
    for (int r = 0; r < ranks; ++r) ASSERT_EQ(codes[r], 0) << "rank " << r;

    // Every rank ran requests (6 over 2 or 4 ranks, one at a time by the balancer).
    for (int r = 0; r < ranks; ++r) EXPECT_GT(res->requests_per_rank[r], 0) << "rank " << r;
    EXPECT_EQ(res->first_rank[kAborted], 1);
    // The abort on rank 1 freed its blocks there (they were in use before).
    EXPECT_GT(res->rank1_max_blocks_used, 0);
    EXPECT_EQ(res->rank1_blocks_used_after, 0);
    EXPECT_EQ(res->rank1_seqs_after, 0);
    EXPECT_EQ(res->reason[kAborted], static_cast<int32_t>(FinishReason::kAbort));
    EXPECT_LT(res->num_tokens[kAborted], kAbortedMaxTokens);

    // One engine, the whole model, the same requests (the aborted one aside).
    comm::SharedArray<Results> ref_shared(1);
    Results* ref = ref_shared.data();
    auto one = Engine::create(&shared_model(), rank_options(), Env::default_env()).value();
    for (int i = 0; i < kRequests; ++i) {
        if (i == kAborted) continue;
        ASSERT_TRUE(one->add_request(request(i), recorder(ref, i)).is_ok());
    }
    ASSERT_TRUE(one->run().is_ok());
    for (int i = 0; i < kRequests; ++i) {
        if (i == kAborted) continue;
        ASSERT_EQ(res->num_tokens[i], ref->num_tokens[i]) << "request " << i;
        ASSERT_GT(ref->num_tokens[i], 0);
        for (int t = 0; t < ref->num_tokens[i]; ++t) {
            EXPECT_EQ(res->tokens[i][t], ref->tokens[i][t]) << "request " << i << " token " << t;
            EXPECT_EQ(res->logprob_bits[i][t], ref->logprob_bits[i][t]) << "request " << i;
            EXPECT_EQ(res->top_bits[i][t][0], ref->top_bits[i][t][0]) << "request " << i;
            EXPECT_EQ(res->top_bits[i][t][1], ref->top_bits[i][t][1]) << "request " << i;
        }
        EXPECT_EQ(res->reason[i], static_cast<int32_t>(FinishReason::kLength));
    }
}

INSTANTIATE_TEST_SUITE_P(Ranks, DpFrontTest, ::testing::Values(2, 4));

// Prefix routing with forked ranks: request 0 runs on rank 0, request 1 (a long prompt) on
// rank 1; once both finished, request 2 shares request 1's first 3 blocks. With prefix
// routing it goes to rank 1 and takes those 384 tokens from rank 1's prefix cache; with
// load routing to rank 0 (both idle, one request each: the lowest rank), computing them.
// Either way its tokens and logprobs are one engine's, bitwise.
constexpr int kPrefixRequests = 3;
constexpr int kPrefixMaxTokens = 8;
constexpr int64_t kSharedBlocks = 3;

GenerateRequest prefix_request(int i) {
    GenerateRequest r;
    r.prompt = i == 0 ? prompt_of(800, kSharedBlocks, 40) : prompt_of(801, kSharedBlocks, 0);
    if (i > 0) {
        const std::vector<int32_t> tail =
            random_prompt(20 + 9 * i, 810 + static_cast<uint32_t>(i), 500);
        r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
    }
    r.sampling.max_tokens = kPrefixMaxTokens;
    r.sampling.temperature = i == 2 ? 0.8 : 0.0;
    r.sampling.seed = 90 + static_cast<uint64_t>(i);
    r.sampling.ignore_eos = true;
    r.sampling.logprobs = 2;
    return r;
}

struct PrefixResults {
    int32_t tokens[kPrefixRequests][kPrefixMaxTokens];
    uint32_t logprob_bits[kPrefixRequests][kPrefixMaxTokens];
    int32_t num_tokens[kPrefixRequests];
    int64_t cached[kPrefixRequests];  // usage.cached_tokens: the finishing event's
    int32_t rank[kPrefixRequests];
    int64_t prefix_routed;
    int64_t matched_tokens;
    int64_t cached_total;  // EngineStats::cached_prompt_tokens over both ranks
};

StreamCallback prefix_recorder(PrefixResults* res, int i) {
    return [res, i](const TokenEvent& ev) {
        if (ev.token >= 0) {
            const int n = res->num_tokens[i]++;
            res->tokens[i][n] = ev.token;
            res->logprob_bits[i][n] = bits(ev.logprob);
        }
        if (ev.finished) res->cached[i] = ev.cached_prompt_tokens;
    };
}

// Rank 0 of two in this process: its model, its engine and its DpFront over rank 1's pipe,
// prefix routing on or off. 0, or 10 / 11 when the model / engine could not be made.
struct LocalFront {
    std::unique_ptr<CausalLm> model;
    std::unique_ptr<Engine> engine;
    FixedLink link;
    DpRouting routing;
    std::unique_ptr<DpFront> front;

    int start(const std::string& group, bool prefix,
              std::vector<std::shared_ptr<comm::RankPipe>> pipes) {
        model = ep_model(group, 0, 2);
        if (model == nullptr) return 10;
        auto e = Engine::create(model.get(), rank_options(), Env::default_env());
        if (!e.is_ok()) return 11;
        engine = std::move(e).value();
        link.ranks.pipes = std::move(pipes);
        routing.balance.prefix = prefix;
        routing.model_id = rank_options().model_id;
        front = std::make_unique<DpFront>(engine.get(), model.get(), &link, Env::default_env(),
                                          routing);
        return 0;
    }
};

int prefix_front_rank(const std::string& group, bool prefix,
                      std::vector<std::shared_ptr<comm::RankPipe>> pipes, PrefixResults* res) {
    LocalFront local;
    if (const int code = local.start(group, prefix, std::move(pipes)); code != 0) return code;
    DpFront& front = *local.front;
    FixedLink& link = local.link;
    CausalLm* model = local.model.get();
    for (int i = 0; i < kPrefixRequests; ++i) {
        Result<RequestId> id = front.add_request(prefix_request(i), prefix_recorder(res, i));
        if (!id.is_ok()) return 12;
        res->rank[i] = front.rank_of(*id);
        // Requests 0 and 1 run together; request 2 comes once they are done.
        if (i == 0) continue;
        while (front.has_work()) {
            if (!front.step().is_ok()) return 13;
        }
    }
    const EngineStats st = front.stats();
    res->prefix_routed = st.dp_prefix_routed;
    res->matched_tokens = st.dp_prefix_matched_tokens;
    res->cached_total = st.cached_prompt_tokens;
    return leave_group(link.ranks.pipes, *model);
}

using Pipes = std::vector<std::shared_ptr<comm::RankPipe>>;

// Two ranks as processes: rank 0 runs `front` (its DpFront over its own engine and rank 1's
// pipe), rank 1 serves behind the pipe; both must exit 0.
void run_front_and_rank1(const std::function<int(const std::string& group, Pipes pipes)>& front) {
    comm::RankPipe::Pair p = comm::RankPipe::create_pair().value();
    Pipes parents{std::move(p.parent)};
    const std::string group = unique_group();
    auto codes = comm::run_ranks(
        2,
        [&](int r) {
            if (r == 0) return front(group, parents);
            parents.clear();
            return serving_rank(group, r, 2, p.child_fd);
        },
        120'000);
    (void)comm::ShmMoeCommunicator::unlink(group);
    for (int r = 0; r < 2; ++r) ASSERT_EQ(codes[r], 0) << "rank " << r;
}

class DpPrefixRoutingTest : public ::testing::TestWithParam<bool> {};

TEST_P(DpPrefixRoutingTest, ASharedPrefixLandsWhereItIsCached) {
    const bool prefix = GetParam();
    comm::SharedArray<PrefixResults> shared(1);
    PrefixResults* res = shared.data();
    ASSERT_NO_FATAL_FAILURE(run_front_and_rank1([&](const std::string& group, Pipes pipes) {
        return prefix_front_rank(group, prefix, std::move(pipes), res);
    }));

    EXPECT_EQ(res->rank[0], 0);
    EXPECT_EQ(res->rank[1], 1);
    const int64_t shared_tokens = kSharedBlocks * kv::kBlockTokens;
    if (prefix) {
        EXPECT_EQ(res->rank[2], 1);
        EXPECT_EQ(res->cached[2], shared_tokens);  // rank 1's prefix cache, as usage says
        EXPECT_EQ(res->prefix_routed, 1);
        EXPECT_EQ(res->matched_tokens, shared_tokens);
    } else {
        EXPECT_EQ(res->rank[2], 0);
        EXPECT_EQ(res->cached[2], 0);
        EXPECT_EQ(res->prefix_routed, 0);
        EXPECT_EQ(res->matched_tokens, 0);
    }
    EXPECT_EQ(res->cached[0], 0);
    EXPECT_EQ(res->cached[1], 0);
    EXPECT_EQ(res->cached_total, res->cached[2]);

    // One engine, the same requests in the same order: the same tokens, bitwise.
    comm::SharedArray<PrefixResults> ref_shared(1);
    PrefixResults* ref = ref_shared.data();
    auto one = Engine::create(&shared_model(), rank_options(), Env::default_env()).value();
    for (int i = 0; i < kPrefixRequests; ++i) {
        ASSERT_TRUE(one->add_request(prefix_request(i), prefix_recorder(ref, i)).is_ok());
        if (i > 0) {
            ASSERT_TRUE(one->run().is_ok());
        }
    }
    EXPECT_EQ(ref->cached[2], shared_tokens);
    for (int i = 0; i < kPrefixRequests; ++i) {
        ASSERT_EQ(res->num_tokens[i], kPrefixMaxTokens) << "request " << i;
        ASSERT_EQ(ref->num_tokens[i], kPrefixMaxTokens);
        for (int t = 0; t < kPrefixMaxTokens; ++t) {
            EXPECT_EQ(res->tokens[i][t], ref->tokens[i][t]) << "request " << i << " token " << t;
            EXPECT_EQ(res->logprob_bits[i][t], ref->logprob_bits[i][t]) << "request " << i;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Routing, DpPrefixRoutingTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                             return p.param ? std::string("Prefix") : std::string("Load");
                         });

// `serve --ep 2 --ep-front off --role decode`: a KV hand-over lands in rank 0's pool (this
// process's inbox), and the front is told its chain keys (learn_local, from the inbox's
// on_stored): the continuation goes to rank 0 by prefix although rank 0 is busier (one
// request running there, none on rank 1) -- without the word, to rank 1 by load.
int landed_front_rank(const std::string& group, bool told,
                      std::vector<std::shared_ptr<comm::RankPipe>> pipes, PrefixResults* res) {
    LocalFront local;
    if (const int code = local.start(group, /*prefix=*/true, std::move(pipes)); code != 0) {
        return code;
    }
    DpFront& front = *local.front;
    const GenerateRequest continuation = prefix_request(1);
    if (told) {
        // From the inbox's thread, as serve does.
        std::thread inbox([&] {
            front.learn_local(
                kv::chain_keys(continuation.prompt, kv::make_salt(local.routing.model_id, "")));
        });
        inbox.join();
    }
    const GenerateRequest requests[2] = {prefix_request(0), continuation};
    for (int i = 0; i < 2; ++i) {
        Result<RequestId> id = front.add_request(requests[i], prefix_recorder(res, i));
        if (!id.is_ok()) return 12;
        res->rank[i] = front.rank_of(*id);
    }
    while (front.has_work()) {
        if (!front.step().is_ok()) return 13;
    }
    res->prefix_routed = front.stats().dp_prefix_routed;
    return leave_group(local.link.ranks.pipes, *local.model);
}

class DpLandedRoutingTest : public ::testing::TestWithParam<bool> {};

TEST_P(DpLandedRoutingTest, AHandOverOnRankZeroDrawsItsContinuation) {
    const bool told = GetParam();
    comm::SharedArray<PrefixResults> shared(1);
    PrefixResults* res = shared.data();
    ASSERT_NO_FATAL_FAILURE(run_front_and_rank1([&](const std::string& group, Pipes pipes) {
        return landed_front_rank(group, told, std::move(pipes), res);
    }));
    EXPECT_EQ(res->rank[0], 0);
    EXPECT_EQ(res->rank[1], told ? 0 : 1);
    EXPECT_EQ(res->prefix_routed, told ? 1 : 0);
    EXPECT_EQ(res->num_tokens[1], kPrefixMaxTokens);
}

INSTANTIATE_TEST_SUITE_P(Routing, DpLandedRoutingTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                             return p.param ? std::string("Told") : std::string("NotTold");
                         });

// A front with no model (serve / generate --ep): every rank, rank 0 included, is a forked
// process behind a pipe; the link restarts the group with the healthy ranks when one is
// lost, as apps/ ep_launch does (a rank whose group broke under it exits with 13 here).
struct ForkingLink final : DpRankLink {
    std::string preset = "tiny-v3";  // the ranks' model
    std::string name;
    std::vector<pid_t> pids;
    std::vector<std::shared_ptr<comm::RankPipe>> pipes;
    int64_t generation = 0;
    int restarts = 0;
    int last_healthy = 0;

    Ranks current() const override { return {generation, pipes}; }
    void start(int ranks, const std::string& group) {
        name = group;
        pids.clear();
        pipes.clear();
        for (int r = 0; r < ranks; ++r) {
            comm::RankPipe::Pair p = comm::RankPipe::create_pair().value();
            const pid_t pid = ::fork();
            DSI_CHECK(pid >= 0, "fork");
            if (pid == 0) ::_exit(serving_rank(group, r, ranks, p.child_fd, preset));
            ::close(p.child_fd);
            pids.push_back(pid);
            pipes.push_back(std::move(p.parent));
        }
    }
    Result<bool> check_ranks(bool pipe_ended) override {
        bool lost = pipe_ended;
        for (pid_t pid : pids) {
            siginfo_t info{};
            lost = lost || (::waitid(P_PID, static_cast<id_t>(pid), &info,
                                     WEXITED | WNOHANG | WNOWAIT) == 0 &&
                            info.si_pid == pid);
        }
        if (!lost) return false;
        last_healthy = 0;
        for (pid_t pid : pids) {
            int status = 0;
            if (::waitpid(pid, &status, 0) == pid && WIFEXITED(status)) ++last_healthy;
        }
        ++restarts;
        start(last_healthy, name + "-f" + std::to_string(restarts));
        ++generation;
        return true;
    }
    // The end: every rank leaves once idle and exits 0.
    bool finish() {
        for (const auto& pipe : pipes) (void)pipe->send(dp_wire::encode_end());
        for (const auto& pipe : pipes) {
            while (pipe->has_pending_output() && pipe->flush().is_ok()) ::usleep(1000);
        }
        bool ok = true;
        for (pid_t pid : pids) {
            int status = 0;
            ok = ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
                 WEXITSTATUS(status) == 0 && ok;
        }
        return ok;
    }
};

struct AllowAll : TokenMaskProvider {
    void fill(std::span<const int32_t>, TokenMask&) override {}
};

// Adds request_of(i) for i < n (request i lands on rank i), steps the front to the end and
// kills rank `victim` -9 once its request has `after` of its `tokens` tokens (mid-stream);
// then the restart with the healthy ranks is checked.
void run_killing_rank(DpFront& front, ForkingLink& link, int n,
                      const std::function<GenerateRequest(int)>& request_of, Results* res,
                      int victim, int after, int tokens) {
    for (int i = 0; i < n; ++i) {
        Result<RequestId> id = front.add_request(request_of(i), recorder(res, i));
        ASSERT_TRUE(id.is_ok()) << id.status().to_string();
        EXPECT_EQ(front.rank_of(*id), i);
    }
    const pid_t pid = link.pids[static_cast<size_t>(victim)];
    bool killed = false;
    while (front.has_work()) {
        Status s = front.step();
        ASSERT_TRUE(s.is_ok()) << s.to_string();
        if (!killed && res->num_tokens[victim] >= after) {
            ASSERT_LT(res->num_tokens[victim], tokens);  // killed mid-stream
            ::kill(pid, SIGKILL);
            killed = true;
        }
    }
    ASSERT_TRUE(killed);
    EXPECT_EQ(link.restarts, 1);
    EXPECT_EQ(link.last_healthy, n - 1);
}

// Requests 0..n-1 got `tokens` tokens each, bitwise `want`'s (tokens and logprobs).
void expect_same_tokens(const Results& got, const Results& want, int n, int tokens) {
    for (int i = 0; i < n; ++i) {
        ASSERT_EQ(got.num_tokens[i], tokens) << "request " << i;
        ASSERT_EQ(want.num_tokens[i], tokens);
        for (int t = 0; t < tokens; ++t) {
            EXPECT_EQ(got.tokens[i][t], want.tokens[i][t]) << "request " << i << " token " << t;
            EXPECT_EQ(got.logprob_bits[i][t], want.logprob_bits[i][t]) << "request " << i;
        }
        EXPECT_EQ(got.reason[i], static_cast<int32_t>(FinishReason::kLength));
    }
}

// Request 0 (on rank 0, the one killed) samples under a grammar mask: it travels as the
// serialised grammar, rank 0 rebuilds it, and its re-run on the new group replays the
// grammar over the tokens already delivered (a continuation).
TEST(DpFrontNoModelTest, RankZeroKilledMidStreamLosesNothing) {
    constexpr int kRanks = 3;
    constexpr int kFrontRequests = 3;  // one per rank
    auto request_of = [](int i) {
        GenerateRequest r = request(i);
        r.sampling.max_tokens = 30;
        if (i == 0) r.mask = pairs_mask();
        return r;
    };
    ModelConfig config = synthetic_preset("tiny-v3").value();
    const RequestLimits limits{512, config.max_position_embeddings, -1, false};
    ForkingLink link;
    link.start(kRanks, unique_group());
    DpFront front(&link, limits, /*spread=*/true, Env::default_env());
    // The ranks' checks, made by the front with no engine: at once, as one engine.
    GenerateRequest bad = request_of(0);
    bad.prompt.push_back(512);
    EXPECT_EQ(front.add_request(bad, nullptr).status().code(), StatusCode::kInvalidArgument);
    bad = request_of(0);
    bad.mask = std::make_shared<AllowAll>();  // a mask with no portable form cannot travel
    EXPECT_EQ(front.add_request(bad, nullptr).status().code(), StatusCode::kUnimplemented);

    auto res = std::make_unique<Results>();
    std::memset(res.get(), 0, sizeof(Results));
    static_assert(kFrontRequests == kRanks);
    run_killing_rank(front, link, kRanks, request_of, res.get(), 0, 5, 30);
    if (HasFatalFailure()) return;
    const EngineStats st = front.stats();
    ASSERT_TRUE(st.expert_parallel.has_value());
    EXPECT_EQ(st.expert_parallel->num_ranks, kRanks - 1);
    EXPECT_EQ(st.expert_parallel->failovers, 1);
    EXPECT_GE(st.dp_reruns, 1);
    EXPECT_EQ(st.num_finished, kFrontRequests);
    // The ranks' engine steps reach the front through their load reports (generate
    // --ep printed "0 steps" before).
    EXPECT_GT(st.steps, 0);
    EXPECT_GT(st.forward_ns, 0);
    // A KV export (`serve --ep N --role prefill`): the rank's finishing event brings the
    // prompt's full blocks back to the front, for its hand-over sender.
    const GenerateRequest ex = export_request();
    std::shared_ptr<const kv::KvExport> exported;
    ASSERT_TRUE(front.add_request(ex, keep_export(&exported)).is_ok());
    while (front.has_work()) ASSERT_TRUE(front.step().is_ok());
    EXPECT_TRUE(link.finish());

    // One engine, the whole model, the same requests: the same tokens, bitwise.
    auto ref = std::make_unique<Results>();
    std::memset(ref.get(), 0, sizeof(Results));
    auto one = Engine::create(&shared_model(), rank_options(), Env::default_env()).value();
    for (int i = 0; i < kFrontRequests; ++i) {
        ASSERT_TRUE(one->add_request(request_of(i), recorder(ref.get(), i)).is_ok());
    }
    ASSERT_TRUE(one->run().is_ok());
    expect_same_tokens(*res, *ref, kFrontRequests, 30);
    // The export is the one engine's, bit for bit.
    std::shared_ptr<const kv::KvExport> ref_export;
    ASSERT_TRUE(one->add_request(ex, keep_export(&ref_export)).is_ok());
    ASSERT_TRUE(one->run().is_ok());
    ASSERT_NE(exported, nullptr);
    ASSERT_NE(ref_export, nullptr);
    EXPECT_EQ(exported->num_blocks(), 2u);
    EXPECT_EQ(exported->model_id, ref_export->model_id);
    EXPECT_EQ(exported->dtype, ref_export->dtype);
    EXPECT_EQ(exported->block_tokens, ref_export->block_tokens);
    // Under EP the model leaves its MTP layer out (docs/comm.md), and so its KV: the
    // export holds the main layers, each equal to one engine's.
    ASSERT_EQ(exported->num_layers() + 1, ref_export->num_layers());
    for (size_t l = 0; l < exported->num_layers(); ++l) {
        EXPECT_EQ(exported->layer_block_bytes[l], ref_export->layer_block_bytes[l]);
        EXPECT_TRUE(exported->layers[l] == ref_export->layers[l]) << "layer " << l;
    }
    // The mask held on the rank: request 0's letters alternate halves pairwise.
    for (int t = 0; t + 1 < 30; t += 2) {
        EXPECT_NE(first_half(res->tokens[0][t]), first_half(res->tokens[0][t + 1])) << t;
    }
}

// DeepSeek V4 under EP (docs/comm.md "V4 and V4.1 under EP"): three requests over forked
// ranks 0..2 with no model in the front, each rank's engine with its own SWA state slots;
// rank 1 killed -9 mid-stream: the group restarts with 2 ranks, the requests re-run as
// continuations, every token and logprob bitwise one engine's.
TEST(DpFrontNoModelTest, V4RankKilledMidStreamLosesNothing) {
    constexpr int kRanks = 3;
    constexpr int kTokens = 20;
    auto request_of = [](int i) {
        GenerateRequest r = request(i);
        r.sampling.max_tokens = kTokens;
        return r;
    };
    ModelConfig config = synthetic_preset("tiny-v4").value();
    const RequestLimits limits{512, config.max_position_embeddings, -1, false};
    ForkingLink link;
    link.preset = "tiny-v4";
    link.start(kRanks, unique_group());
    DpFront front(&link, limits, /*spread=*/true, Env::default_env());
    auto res = std::make_unique<Results>();
    std::memset(res.get(), 0, sizeof(Results));
    run_killing_rank(front, link, kRanks, request_of, res.get(), 1, 4, kTokens);
    if (HasFatalFailure()) return;
    const EngineStats st = front.stats();
    ASSERT_TRUE(st.expert_parallel.has_value());
    EXPECT_EQ(st.expert_parallel->num_ranks, kRanks - 1);
    EXPECT_GE(st.dp_reruns, 1);
    // A V4 KV export (`serve --ep N --role prefill`) comes back with its SWA state.
    const GenerateRequest ex = export_request();
    std::shared_ptr<const kv::KvExport> exported;
    ASSERT_TRUE(front.add_request(ex, keep_export(&exported)).is_ok());
    while (front.has_work()) ASSERT_TRUE(front.step().is_ok());
    EXPECT_TRUE(link.finish());
    // One engine, the whole model, the same requests: the same tokens, bitwise.
    ModelOptions mo;
    mo.num_threads = 1;
    auto model = load_causal_lm(test_weights("tiny-v4"), mo);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    auto ref = std::make_unique<Results>();
    std::memset(ref.get(), 0, sizeof(Results));
    kv::SwaStatePool swa_pool(int64_t{64} << 20);
    EngineOptions eo = rank_options();
    eo.swa_pool = &swa_pool;
    auto one = Engine::create(model->get(), eo, Env::default_env()).value();
    for (int i = 0; i < kRanks; ++i) {
        ASSERT_TRUE(one->add_request(request_of(i), recorder(ref.get(), i)).is_ok());
    }
    ASSERT_TRUE(one->run().is_ok());
    expect_same_tokens(*res, *ref, kRanks, kTokens);
    // The export is one engine's: the same blocks and the same SWA state, bit for bit.
    std::shared_ptr<const kv::KvExport> ref_export;
    ASSERT_TRUE(one->add_request(ex, keep_export(&ref_export)).is_ok());
    ASSERT_TRUE(one->run().is_ok());
    ASSERT_NE(exported, nullptr);
    ASSERT_NE(ref_export, nullptr);
    EXPECT_EQ(exported->num_blocks(), 2u);
    EXPECT_EQ(exported->keys, ref_export->keys);
    ASSERT_EQ(exported->num_layers(), ref_export->num_layers());
    for (size_t l = 0; l < exported->num_layers(); ++l) {
        EXPECT_TRUE(exported->layers[l] == ref_export->layers[l]) << "layer " << l;
    }
    ASSERT_NE(exported->swa_state, nullptr);
    ASSERT_NE(ref_export->swa_state, nullptr);
    EXPECT_EQ(exported->swa_state->key, ref_export->swa_state->key);
    EXPECT_EQ(exported->swa_state->key.position, 256);
    EXPECT_TRUE(exported->swa_state->bytes == ref_export->swa_state->bytes);
}

}  // namespace
}  // namespace dsi::engine
