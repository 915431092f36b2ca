// CompileService: cache (LRU, canonical keys, vocabulary fingerprint), de-duplication
// of concurrent identical compiles, cancellation, deadlines on an injected clock,
// the bounded queue, shutdown. Real worker threads; the compile function is gated
// where a test needs a compile to be in flight. Every wait has a real-time bound.
#include "grammar/compile_service.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

namespace dsi::grammar {
namespace {

constexpr int64_t kWait = 10'000'000'000;  // 10 s: a hang guard, never reached when correct

std::shared_ptr<const Vocabulary> byte_vocab(int extra = 0) {
    std::vector<std::string> toks;
    for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, static_cast<char>(b)));
    for (int i = 0; i < extra; ++i) toks.push_back("xy" + std::to_string(i));
    toks.push_back("");
    const int32_t stop = static_cast<int32_t>(toks.size()) - 1;
    return Vocabulary::from_tokens(std::move(toks), {stop});
}

bool full_match(const std::shared_ptr<const CompiledGrammar>& g, const std::string& s) {
    GrammarMatcher m(g);
    return m.advance_bytes(s) && m.is_accepted();
}

// A compile function that blocks until opened, counting compiles by text.
struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
    int started = 0;
    std::vector<std::string> texts;

    Result<Grammar> compile(const GrammarSpec& spec) {
        {
            std::unique_lock<std::mutex> lock(mu);
            ++started;
            texts.push_back(spec.text);
            cv.notify_all();
            cv.wait_for(lock, std::chrono::nanoseconds(kWait), [&] { return open; });
        }
        return compile_grammar(spec);
    }
    void release() {
        std::lock_guard<std::mutex> lock(mu);
        open = true;
        cv.notify_all();
    }
    bool wait_started(int n) {
        std::unique_lock<std::mutex> lock(mu);
        return cv.wait_for(lock, std::chrono::nanoseconds(kWait), [&] { return started >= n; });
    }
    int count(const std::string& text) {
        std::lock_guard<std::mutex> lock(mu);
        return static_cast<int>(std::count(texts.begin(), texts.end(), text));
    }
};

CompileServiceOptions gated(Gate* gate, int workers = 1, size_t max_queue = 16) {
    CompileServiceOptions o;
    o.num_workers = workers;
    o.max_queue = max_queue;
    o.compile = [gate](const GrammarSpec& s) { return gate->compile(s); };
    return o;
}

GrammarSpec regex(std::string re) { return {GrammarKind::kRegex, std::move(re)}; }

TEST(CompileService, CompilesEveryKind) {
    CompileService svc;
    auto v = byte_vocab();
    struct Case {
        GrammarSpec spec;
        std::string accept, reject;
    };
    std::vector<Case> cases = {
        {{GrammarKind::kJsonSchema, R"({"type":"object","properties":{"a":{"type":"integer"}},
            "required":["a"],"additionalProperties":false})"},
         R"({"a":12})", R"({"a":"x"})"},
        {{GrammarKind::kJsonObject, ""}, R"({"k":[1,true,null]})", "[1]"},
        {regex("[a-c]{2}-\\d+"), "ab-42", "ab-"},
        {{GrammarKind::kEbnf, "root ::= \"yes\" | \"no\""}, "no", "maybe"},
    };
    for (const Case& c : cases) {
        auto h = svc.submit(c.spec, v);
        ASSERT_TRUE(h.is_ok()) << h.status().to_string();
        CompileResult r = (*h)->wait_for(kWait);
        ASSERT_TRUE(r.is_ok()) << grammar_kind_name(c.spec.kind) << r.status().to_string();
        EXPECT_TRUE(full_match(*r, c.accept)) << c.accept;
        EXPECT_FALSE(full_match(*r, c.reject)) << c.reject;
    }
    // Errors come back as the front end's status and are not cached.
    for (int i = 0; i < 2; ++i) {
        auto h = svc.submit({GrammarKind::kJsonSchema, R"({"contains":{}})"}, v);
        ASSERT_TRUE(h.is_ok());
        CompileResult r = (*h)->wait_for(kWait);
        EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented) << r.status().to_string();
    }
    EXPECT_EQ(svc.submit({GrammarKind::kJsonSchema, "{oops"}, v).status().code(),
              StatusCode::kInvalidArgument);
    CompileServiceStats st = svc.stats();
    EXPECT_EQ(st.compiled, 6);
    EXPECT_EQ(st.failed, 2);
    EXPECT_EQ(st.cache_entries, 4);
}

TEST(CompileService, CacheKeyedByCanonicalTextAndVocabularyWithLru) {
    CompileServiceOptions o;
    o.cache_entries = 2;
    CompileService svc(o);
    auto v1 = byte_vocab();
    auto v2 = byte_vocab(3);
    ASSERT_NE(v1->fingerprint(), v2->fingerprint());
    auto get = [&](const GrammarSpec& s, std::shared_ptr<const Vocabulary> v) {
        auto h = svc.submit(s, std::move(v));
        DSI_CHECK(h.is_ok(), h.status().to_string());
        CompileResult r = (*h)->wait_for(kWait);
        DSI_CHECK(r.is_ok(), r.status().to_string());
        return *r;
    };
    GrammarSpec a{GrammarKind::kJsonSchema, R"({"type": "integer"})"};
    GrammarSpec a_spaced{GrammarKind::kJsonSchema, "{ \"type\"  :\n\"integer\" }"};
    auto g1 = get(a, v1);
    auto g2 = get(a_spaced, v1);  // same canonical schema: a cache hit, same object
    EXPECT_EQ(g1.get(), g2.get());
    EXPECT_EQ(svc.stats().cache_hits, 1);
    auto g3 = get(a, v2);  // other vocabulary: a new compile
    EXPECT_NE(g1.get(), g3.get());
    EXPECT_EQ(&g3->vocab(), v2.get());
    // A hit completes inside submit(): ready without waiting, callback already run.
    bool called = false;
    auto h = svc.submit(a, v2, 0, [&](const CompileResult& r) { called = r.is_ok(); });
    ASSERT_TRUE(h.is_ok());
    EXPECT_TRUE(called);
    EXPECT_TRUE((*h)->ready());
    // LRU of 2: (a,v1) is now the oldest; adding a third key evicts it.
    get(regex("x+"), v1);
    EXPECT_EQ(svc.stats().cache_entries, 2);
    const int64_t compiled = svc.stats().compiled;
    get(a, v2);  // still cached
    EXPECT_EQ(svc.stats().compiled, compiled);
    get(a, v1);  // evicted: compiled again
    EXPECT_EQ(svc.stats().compiled, compiled + 1);
}

// The spec's JSON options (issue 21): applied to JSON Schema and json_object, part of
// the cache key (the same schema with and without them is two grammars), ignored for
// regex / EBNF (one cache entry either way).
TEST(CompileService, SpecJsonOptionsAppliedAndKeyed) {
    CompileService svc;
    auto v = byte_vocab();
    auto get = [&](const GrammarSpec& s) {
        auto h = svc.submit(s, v);
        DSI_CHECK(h.is_ok(), h.status().to_string());
        CompileResult r = (*h)->wait_for(kWait);
        DSI_CHECK(r.is_ok(), r.status().to_string());
        return *r;
    };
    const std::string schema =
        R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a"]})";
    GrammarSpec plain{GrammarKind::kJsonSchema, schema};
    GrammarSpec flexible = plain, any_order = plain, both = plain;
    flexible.flexible_whitespace = true;
    any_order.any_property_order = true;
    both.flexible_whitespace = both.any_property_order = true;
    struct Case {
        const GrammarSpec* spec;
        bool spaced, reordered, both;
    };
    for (const Case& c : {Case{&plain, false, false, false}, Case{&flexible, true, false, false},
                          Case{&any_order, false, true, false}, Case{&both, true, true, true}}) {
        auto g = get(*c.spec);
        EXPECT_TRUE(full_match(g, R"({"a":1,"b":2})"));
        EXPECT_TRUE(full_match(g, R"({"a": 1, "b": 2})"));  // one space after , and :
        EXPECT_EQ(full_match(g, R"({"a":  1})"), c.spaced);
        EXPECT_EQ(full_match(g, R"({ "a": 1, "b": 2 })"), c.spaced);
        EXPECT_EQ(full_match(g, R"({"b":2,"a":1})"), c.reordered);
        EXPECT_EQ(full_match(g, R"({ "b": 2, "a": 1})"), c.both);
        EXPECT_FALSE(full_match(g, R"({"b":2})"));
    }
    EXPECT_EQ(svc.stats().compiled, 4);
    EXPECT_EQ(get(any_order).get(), get(any_order).get());  // cached under its own key
    GrammarSpec object{GrammarKind::kJsonObject, ""};
    GrammarSpec object_flexible = object;
    object_flexible.flexible_whitespace = true;
    EXPECT_TRUE(full_match(get(object), R"({"k": 1})"));
    EXPECT_FALSE(full_match(get(object), R"({"k" : 1})"));
    EXPECT_TRUE(full_match(get(object_flexible), R"({"k" : 1})"));
    EXPECT_EQ(svc.stats().compiled, 6);
    GrammarSpec re = regex("a+"), re_flags = regex("a+");
    re_flags.flexible_whitespace = re_flags.any_property_order = true;
    EXPECT_EQ(get(re).get(), get(re_flags).get());
    EXPECT_EQ(svc.stats().compiled, 7);
}

TEST(CompileService, ConcurrentIdenticalCompilesRunOnce) {
    Gate gate;
    CompileService svc(gated(&gate, 2));
    auto v = byte_vocab();
    auto first = svc.submit(regex("a+b"), v);
    ASSERT_TRUE(first.is_ok());
    ASSERT_TRUE(gate.wait_started(1));  // the compile is running
    // Eight threads ask for the same grammar while it compiles.
    std::vector<std::thread> threads;
    std::vector<const CompiledGrammar*> got(8, nullptr);
    std::atomic<int> submitted{0};
    for (int i = 0; i < 8; ++i) {
        threads.emplace_back([&, i] {
            auto h = svc.submit(regex("a+b"), v);
            ++submitted;
            if (!h.is_ok()) return;
            CompileResult r = (*h)->wait_for(kWait);
            if (r.is_ok()) got[i] = r->get();
        });
    }
    for (int spins = 0; submitted.load() < 8 && spins < 10000; ++spins) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_EQ(submitted.load(), 8);
    gate.release();
    CompileResult r = (*first)->wait_for(kWait);
    for (std::thread& t : threads) t.join();
    ASSERT_TRUE(r.is_ok());
    for (const CompiledGrammar* g : got) EXPECT_EQ(g, r->get());
    EXPECT_EQ(gate.count("a+b"), 1);
    CompileServiceStats st = svc.stats();
    EXPECT_EQ(st.compiled, 1);
    EXPECT_EQ(st.joined, 8);
}

TEST(CompileService, DroppedRequestCancelsItsQueuedCompileUnlessOthersWait) {
    Gate gate;
    CompileService svc(gated(&gate, 1));
    auto v = byte_vocab();
    auto blocker = svc.submit(regex("busy"), v);
    ASSERT_TRUE(blocker.is_ok());
    ASSERT_TRUE(gate.wait_started(1));  // the only worker is busy
    {
        auto alone = svc.submit(regex("alone"), v);
        ASSERT_TRUE(alone.is_ok());
        EXPECT_EQ(svc.stats().queued, 1);
    }  // dropped: its compile leaves the queue
    EXPECT_EQ(svc.stats().queued, 0);
    EXPECT_EQ(svc.stats().cancelled, 1);
    auto shared1 = svc.submit(regex("shared"), v);
    auto shared2 = svc.submit(regex("shared"), v);
    ASSERT_TRUE(shared1.is_ok() && shared2.is_ok());
    (*shared1)->cancel();
    EXPECT_EQ((*shared1)->poll().status().code(), StatusCode::kCancelled);
    EXPECT_EQ(svc.stats().queued, 1);  // shared2 still waits
    gate.release();
    CompileResult r = (*shared2)->wait_for(kWait);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_TRUE(full_match(*r, "shared"));
    ASSERT_TRUE((*blocker)->wait_for(kWait).is_ok());
    EXPECT_EQ(gate.count("alone"), 0);
    EXPECT_EQ(gate.count("shared"), 1);
    EXPECT_EQ((*shared1)->poll().status().code(), StatusCode::kCancelled);  // never delivered
}

TEST(CompileService, DeadlinesOnTheInjectedClock) {
    Gate gate;
    FakeClockEnv env(1'000'000);
    CompileService svc(gated(&gate, 1), &env);
    auto v = byte_vocab();
    auto blocker = svc.submit(regex("busy"), v);
    ASSERT_TRUE(blocker.is_ok());
    ASSERT_TRUE(gate.wait_started(1));
    // Expired while queued: the holder sees DEADLINE_EXCEEDED when it polls / waits.
    auto polled = svc.submit(regex("polled"), v, env.now_ns() + 100);
    // Expired while queued, noticed by the worker: the callback gets it.
    std::mutex mu;
    std::condition_variable cv;
    std::optional<StatusCode> cb_code;
    auto cb = svc.submit(regex("callback"), v, env.now_ns() + 100, [&](const CompileResult& r) {
        std::lock_guard<std::mutex> lock(mu);
        cb_code = r.status().code();
        cv.notify_all();
    });
    // Not expired: compiled normally.
    auto in_time = svc.submit(regex("in_time"), v, env.now_ns() + 1'000'000);
    ASSERT_TRUE(polled.is_ok() && cb.is_ok() && in_time.is_ok());
    EXPECT_EQ((*polled)->poll().status().code(), StatusCode::kUnavailable);  // not yet
    env.advance_ns(500);
    EXPECT_EQ((*polled)->wait_for(kWait).status().code(), StatusCode::kDeadlineExceeded);
    gate.release();
    {
        std::unique_lock<std::mutex> lock(mu);
        ASSERT_TRUE(cv.wait_for(lock, std::chrono::nanoseconds(kWait),
                                [&] { return cb_code.has_value(); }));
        EXPECT_EQ(*cb_code, StatusCode::kDeadlineExceeded);
    }
    CompileResult r = (*in_time)->wait_for(kWait);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(gate.count("polled"), 0);
    EXPECT_EQ(gate.count("callback"), 0);
    EXPECT_EQ(gate.count("in_time"), 1);
    EXPECT_EQ(svc.stats().expired, 2);
    // wait_for's own bound: UNAVAILABLE when the real-time wait ends first.
    Gate gate2;
    CompileService svc2(gated(&gate2, 1), &env);
    auto slow = svc2.submit(regex("slow"), v);
    ASSERT_TRUE(slow.is_ok());
    EXPECT_EQ((*slow)->wait_for(2'000'000).status().code(), StatusCode::kUnavailable);
    gate2.release();
    EXPECT_TRUE((*slow)->wait_for(kWait).is_ok());
}

TEST(CompileService, FullQueueIsResourceExhausted) {
    Gate gate;
    CompileService svc(gated(&gate, 1, /*max_queue=*/2));
    auto v = byte_vocab();
    auto running = svc.submit(regex("r"), v);
    ASSERT_TRUE(running.is_ok());
    ASSERT_TRUE(gate.wait_started(1));
    auto q1 = svc.submit(regex("q1"), v);
    auto q2 = svc.submit(regex("q2"), v);
    ASSERT_TRUE(q1.is_ok() && q2.is_ok());
    auto q3 = svc.submit(regex("q3"), v);
    EXPECT_EQ(q3.status().code(), StatusCode::kResourceExhausted);
    auto join = svc.submit(regex("q1"), v);  // joining a queued compile needs no slot
    EXPECT_TRUE(join.is_ok());
    EXPECT_EQ(svc.stats().rejected, 1);
    gate.release();
    for (auto* h : {&running, &q1, &q2, &join}) EXPECT_TRUE((**h)->wait_for(kWait).is_ok());
    EXPECT_TRUE(svc.submit(regex("q3"), v).is_ok());  // room again
}

TEST(CompileService, ShutdownCancelsQueuedAndFinishesRunning) {
    Gate gate;
    auto v = byte_vocab();
    std::unique_ptr<CompileHandle> running, queued;
    std::thread opener;
    {
        CompileService svc(gated(&gate, 1));
        running = std::move(svc.submit(regex("run"), v)).value();
        ASSERT_TRUE(gate.wait_started(1));
        queued = std::move(svc.submit(regex("queued"), v)).value();
        opener = std::thread([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            gate.release();
        });
        // The destructor joins the worker, which finishes "run" once the gate opens.
    }
    opener.join();
    EXPECT_EQ(queued->poll().status().code(), StatusCode::kCancelled);
    EXPECT_TRUE(running->poll().is_ok());  // handles outlive the service
}

TEST(CompileService, ManyThreadsManySchemas) {
    CompileServiceOptions o;
    o.num_workers = 2;
    CompileService svc(o);
    auto v = byte_vocab();
    std::atomic<int> ok{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 6; ++t) {
        threads.emplace_back([&, t] {
            for (int i = 0; i < 40; ++i) {
                const int k = (t + i) % 5;
                std::string schema = R"({"type":"string","maxLength":)" + std::to_string(k + 1) +
                                     "}";
                auto h = svc.submit({GrammarKind::kJsonSchema, schema}, v);
                if (!h.is_ok()) continue;
                CompileResult r = (*h)->wait_for(kWait);
                if (r.is_ok() && full_match(*r, "\"" + std::string(k + 1, 'x') + "\"") &&
                    !full_match(*r, "\"" + std::string(k + 2, 'x') + "\"")) {
                    ++ok;
                }
            }
        });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(ok.load(), 240);
    CompileServiceStats st = svc.stats();
    EXPECT_EQ(st.compiled, 5);
    EXPECT_EQ(st.cache_hits + st.joined + st.compiled, 240);
}

}  // namespace
}  // namespace dsi::grammar
