// Mooncake trace replay on one engine (issue 8): multi-turn conversations from
// tests/data/traces/mooncake_synthetic_trace.jsonl replayed with the KV store off,
// file://, redis://, shm|file:// and shm|file:// filled by a fetch process (S-KV-5,
// a forked child running kvstore::FetchService; the pool is kept small, 16 slots, so
// blocks leave it and the process has to bring them back); prefix hit rate against the trace's
// ideal (infinite-cache) rate for the same scaled requests, TTFT p50/p99, and the swap-in time
// hidden behind compute (counted by the engine).
//
// Scaling (a 2-core CPU runs a synthetic model, not a 40K-token prompt per request):
//   - conversations: requests are grouped by their shared prefix, not their first block
//     (on the real trace one first block is shared by nearly every request: a system
//     prompt). A request's conversation key is the first block of its chain that fewer
//     than a tenth of the requests hold but at least two do (hash ids are prefix-chained,
//     so equal ids = equal prefixes up to there); the `--groups` keys with the most
//     requests are replayed, in trace order;
//   - one trace block (512 tokens, a hash id) -> one engine block of 128 tokens whose
//     ids are a function of the hash id (equal id = equal tokens, so the prefix chains
//     are the trace's); the first `--max-blocks` blocks of each request, then a unique
//     suffix of 1 + (input_length % 512) / 16 tokens; 2 output tokens;
//   - time compressed: requests run one after another (TTFT = an idle engine's).
// The device pool is kept small (`--pool-blocks`), so a reused prefix has often left the
// pool and must come from the store. Ideal rate: sim::BlockIdCache (the simulator's cache
// model) with unlimited capacity over the same chains; "pool only" ideal uses
// capacity = pool blocks (LRU).
//
// V4 and V4.1 presets (`--preset tiny-v4`, `tiny-v41`; issue 16): the hit of a hybrid
// model follows S-KV-10 (at most L - 134, a stored SWA state in [L1 - 128, L1] or a
// replay), so the figure is the hit tokens the engine's rule counted
// (kv::SwaCacheCounters::hit_tokens) against the ideal under the same rule: infinite
// block and SWA-state caches, states where S-KV-9 stores them (after each prefill at
// floor((L - 1) / 128) * 128; the 2 output tokens cross no boundary), plan_swa_hit over
// each request's chain. Both are divided by the full-block tokens as above.
// Usage: kvstore_trace_bench [--groups 8] [--max-blocks 8] [--pool-blocks 24]
//                            [--preset tiny-v3] [--modes off,file,mmap,redis,shm,fetch]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/env.h"
#include "engine/engine.h"
#include "kv/swa_rules.h"
#include "kvstore/fetch_service.h"
#include "kvstore/redis_test_server.h"
#include "kvstore/shm_store.h"
#include "kvstore/test_util.h"
#include "model/causal_lm.h"
#include "model/deepseek.h"
#include "model/synthetic.h"
#include "sim/block_id_cache.h"
#include "support/build_paths.h"
#include "workload/trace.h"

using namespace dsi;

namespace {

constexpr int kBlockTokens = 128;
constexpr int kVocab = 512;

struct Flags {
    int groups = 8;
    int max_blocks = 8;
    int pool_blocks = 24;
    std::string preset = "tiny-v3";
    std::string modes = "off,file,mmap,redis,shm,fetch";
    std::string trace = std::string(DSINFER_SOURCE_DIR) +
                        "/tests/data/traces/mooncake_synthetic_trace.jsonl";
};

struct Replay {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::vector<uint64_t>> chains;  // trace hash ids per prompt (full blocks)
    int64_t full_blocks = 0;
};

// The conversation key of `r` (see the header), or nullopt for a request that shares no
// block below the trace-wide common prefix with any other request.
std::optional<uint64_t> conversation_key(const workload::Trace& trace, const workload::TraceRequest& r,
                                         const std::unordered_map<uint64_t, int>& holders) {
    const int common = std::max<int>(2, static_cast<int>(trace.requests.size() / 10));
    for (uint64_t id : trace.blocks_of(r)) {
        const int n = holders.at(id);
        if (n < 2) return std::nullopt;  // past the shared prefix
        if (n < common) return id;
    }
    return std::nullopt;
}

Replay build_replay(const workload::Trace& trace, const Flags& f) {
    std::unordered_map<uint64_t, int> holders;  // block id -> requests holding it
    for (const workload::TraceRequest& r : trace.requests) {
        for (uint64_t id : trace.blocks_of(r)) ++holders[id];
    }
    std::unordered_map<uint64_t, int> freq;
    std::vector<std::optional<uint64_t>> key(trace.requests.size());
    for (size_t i = 0; i < trace.requests.size(); ++i) {
        key[i] = conversation_key(trace, trace.requests[i], holders);
        if (key[i]) ++freq[*key[i]];
    }
    std::vector<std::pair<int, uint64_t>> roots;
    for (auto [id, n] : freq) roots.push_back({n, id});
    std::sort(roots.begin(), roots.end(), [](auto a, auto b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    std::unordered_map<uint64_t, bool> chosen;
    for (int i = 0; i < f.groups && i < static_cast<int>(roots.size()); ++i) {
        chosen[roots[i].second] = true;
    }
    Replay rep;
    for (size_t ri = 0; ri < trace.requests.size(); ++ri) {
        const workload::TraceRequest& r = trace.requests[ri];
        if (!key[ri] || !chosen.count(*key[ri])) continue;
        std::span<const uint64_t> ids = trace.blocks_of(r);
        ids = ids.first(std::min<size_t>(ids.size(), static_cast<size_t>(f.max_blocks)));
        std::vector<int32_t> p;
        for (uint64_t id : ids) {
            SplitMix64 rng(id * 0x9e3779b97f4a7c15ULL + 17);
            for (int t = 0; t < kBlockTokens; ++t) p.push_back(static_cast<int32_t>(rng.next() % kVocab));
        }
        SplitMix64 rng(ri + 0xabcdef);
        const int suffix = 1 + (r.input_tokens % 512) / 16;
        for (int t = 0; t < suffix; ++t) p.push_back(static_cast<int32_t>(rng.next() % kVocab));
        rep.prompts.push_back(std::move(p));
        rep.chains.emplace_back(ids.begin(), ids.end());
        rep.full_blocks += static_cast<int64_t>(ids.size());
    }
    return rep;
}

double ideal_rate(const Replay& rep, int64_t capacity_blocks) {
    sim::BlockIdCache cache(capacity_blocks, 0);
    int64_t hit = 0;
    for (size_t i = 0; i < rep.chains.size(); ++i) {
        hit += cache.match(rep.chains[i], static_cast<int64_t>(i));
        cache.insert(rep.chains[i], static_cast<int64_t>(i));
    }
    return static_cast<double>(hit) / static_cast<double>(rep.full_blocks);
}

// The ideal under S-KV-10 (see the header): the hit tokens the rule gives with
// infinite caches, how many of the requests it plans as a replay, and the prompt tokens
// whose block KV is reused (where the computation starts): L1 with a state at L1 or a
// bounded replay (V4.1), L1 - 128 with a state there (the catch-up re-runs one unit),
// and for a replay without bounded replay (V4) the newest state below L1 - 128, else 0
// (kv::TieredCache's exact fallback).
struct RuleIdeal {
    int64_t hit_tokens = 0;
    int64_t replays = 0;
    int64_t reused_tokens = 0;
};

RuleIdeal ideal_under_rule(const Replay& rep, bool bounded_replay) {
    // Trace hash ids are prefix-chained: an id names its prefix, so it keys both the
    // block and the state at the end of that block.
    std::unordered_set<uint64_t> blocks, states;
    RuleIdeal out;
    for (size_t i = 0; i < rep.chains.size(); ++i) {
        const std::vector<uint64_t>& chain = rep.chains[i];
        const int64_t L = static_cast<int64_t>(rep.prompts[i].size());
        int64_t k = 0;
        while (k < static_cast<int64_t>(chain.size()) &&
               blocks.count(chain[static_cast<size_t>(k)]) != 0) {
            ++k;
        }
        const auto has_state = [&](int64_t p) {
            return states.count(chain[static_cast<size_t>(p / kBlockTokens - 1)]) != 0;
        };
        const kv::SwaHitPlan plan = kv::plan_swa_hit(L, k * kBlockTokens, has_state).value();
        out.hit_tokens += plan.hit_tokens;
        int64_t start = plan.compute_begin;
        if (plan.kind == kv::SwaHitKind::kReplay) {
            ++out.replays;
            start = 0;
            if (bounded_replay) {
                start = plan.block_hit_tokens;
            } else {
                for (int64_t p = plan.hit_tokens - kBlockTokens; p > 0 && start == 0;
                     p -= kBlockTokens) {
                    if (has_state(p)) start = p;
                }
            }
        }
        out.reused_tokens += start;
        blocks.insert(chain.begin(), chain.end());
        const int64_t P = kv::prefill_store_position(L).value();
        if (P > 0) states.insert(chain[static_cast<size_t>(P / kBlockTokens - 1)]);
    }
    return out;
}

double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
    return v[std::min(i, v.size() - 1)];
}

struct ModeResult {
    double hit_rate = 0;
    double p50_ms = 0, p99_ms = 0, mean_ms = 0;
    engine::EngineStats stats;
};

volatile sig_atomic_t g_fetch_stop = 0;

// The fetch process of the "fetch" mode: serves `pool|store` on `socket` until SIGTERM,
// then prints its counters. Returns its pid (-1 on failure).
pid_t start_fetch_process(const std::string& pool_and_store, const std::string& socket) {
    const pid_t pid = ::fork();
    if (pid != 0) {
        for (int i = 0; i < 500 && pid > 0 && !std::filesystem::exists(socket); ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return pid;
    }
    ::signal(SIGTERM, [](int) { g_fetch_stop = 1; });
    auto store = kvstore::open_block_store(pool_and_store);
    auto* tiered = store.is_ok() ? dynamic_cast<kvstore::TieredBlockStore*>(store->get()) : nullptr;
    if (tiered == nullptr) ::_exit(2);
    kvstore::FetchServiceOptions o;
    o.socket_path = socket;
    auto service = kvstore::FetchService::start(&tiered->shm(), &tiered->lower(), o);
    if (!service.is_ok()) ::_exit(3);
    while (g_fetch_stop == 0) ::pause();
    (*service)->stop();
    const kvstore::FetchServiceStats st = (*service)->stats();
    std::printf("    fetch process: %lld requests, %lld keys, %lld fetched into shm (%.1f MB), "
                "%lld already there, %lld misses, %lld shm full\n",
                static_cast<long long>(st.requests), static_cast<long long>(st.keys),
                static_cast<long long>(st.fetched), st.bytes_fetched / 1e6,
                static_cast<long long>(st.already_in_shm), static_cast<long long>(st.misses),
                static_cast<long long>(st.shm_full));
    std::fflush(stdout);
    ::_exit(0);
}

ModeResult run_mode(CausalLm* model, const Replay& rep, const Flags& f, const std::string& uri,
                    engine::EngineOptions base) {
    engine::EngineOptions o = base;
    o.kv_store_uri = uri;
    std::unique_ptr<engine::Engine> e =
        engine::Engine::create(model, o, Env::default_env()).value();
    std::vector<double> ttft;
    for (const std::vector<int32_t>& prompt : rep.prompts) {
        engine::GenerateRequest r;
        r.prompt = prompt;
        r.sampling.max_tokens = 2;
        r.sampling.ignore_eos = true;
        const auto t0 = std::chrono::steady_clock::now();
        double ms = -1;
        Result<engine::RequestId> s = e->add_request(std::move(r), [&](const engine::TokenEvent& ev) {
            if (ev.token >= 0 && ms < 0) {
                ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                               t0)
                         .count();
            }
        });
        if (!s.is_ok() || !e->run().is_ok()) {
            std::fprintf(stderr, "request failed: %s\n", s.status().to_string().c_str());
            continue;
        }
        ttft.push_back(ms);
    }
    ModeResult m;
    m.stats = e->stats();
    // V4 / V4.1: S-KV-10's hit tokens; V2/V3: the reused prompt tokens.
    const bool hybrid = model->kv_layout().state_snapshot_resumes;
    m.hit_rate = static_cast<double>(hybrid ? m.stats.swa.total().hit_tokens
                                            : m.stats.cached_prompt_tokens) /
                 static_cast<double>(rep.full_blocks * kBlockTokens);
    m.p50_ms = percentile(ttft, 0.5);
    m.p99_ms = percentile(ttft, 0.99);
    for (double x : ttft) m.mean_ms += x / static_cast<double>(ttft.size());
    (void)f;
    return m;
}

}  // namespace

int main(int argc, char** argv) {
    Flags f;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string k = argv[i], v = argv[i + 1];
        if (k == "--groups") f.groups = std::stoi(v);
        else if (k == "--max-blocks") f.max_blocks = std::stoi(v);
        else if (k == "--pool-blocks") f.pool_blocks = std::stoi(v);
        else if (k == "--preset") f.preset = v;
        else if (k == "--modes") f.modes = v;
        else if (k == "--trace") f.trace = v;
        else {
            std::fprintf(stderr, "unknown flag %s\n", k.c_str());
            return 2;
        }
    }
    Result<workload::Trace> trace = workload::load_trace(Env::default_env(), f.trace);
    if (!trace.is_ok()) {
        std::fprintf(stderr, "%s\n", trace.status().to_string().c_str());
        return 1;
    }
    const Replay rep = build_replay(*trace, f);
    ModelConfig c = synthetic_preset(f.preset).value();
    c.vocab_size = kVocab;
    std::unique_ptr<CausalLm> model;
    if (c.v4_layout()) {  // V4 and V4.1
        c.v41.dspark_noise_token_id = kVocab - 12;
        c.v41.image_token_id = c.is_v41() ? kVocab - 11 : -1;
        ModelOptions o;
        o.num_threads = 2;
        model = load_causal_lm(synthetic_v4_memory_model(c, 7), o).value();
    } else {
        model = DeepseekModel::load(synthetic_memory_model(c, 7), {2}).value();
    }
    const bool hybrid = model->kv_layout().state_snapshot_resumes;
    int64_t tokens = 0;
    for (const auto& p : rep.prompts) tokens += static_cast<int64_t>(p.size());
    std::printf("trace %s: %d conversations (top root blocks), %zu requests, %lld full blocks, "
                "%lld prompt tokens; preset %s (vocab %d), pool %d blocks\n",
                f.trace.c_str(), f.groups, rep.prompts.size(),
                static_cast<long long>(rep.full_blocks), static_cast<long long>(tokens),
                f.preset.c_str(), kVocab, f.pool_blocks);
    const double ideal_inf = ideal_rate(rep, 0);
    const double ideal_pool = ideal_rate(rep, f.pool_blocks);
    std::printf("ideal hit rate: infinite cache %.3f; LRU cache of %d blocks %.3f\n", ideal_inf,
                f.pool_blocks, ideal_pool);
    const RuleIdeal rule = ideal_under_rule(rep, model->kv_layout().swa_bounded_replay);
    const double ideal_rule =
        static_cast<double>(rule.hit_tokens) / static_cast<double>(rep.full_blocks * kBlockTokens);
    if (hybrid) {
        std::printf(
            "ideal under S-KV-10 (infinite block and SWA-state caches): %.3f "
            "(%lld hit tokens, %lld of the requests planned as a replay; block KV "
            "reused for %lld prompt tokens)\n",
            ideal_rule, static_cast<long long>(rule.hit_tokens),
            static_cast<long long>(rule.replays), static_cast<long long>(rule.reused_tokens));
    }

    engine::EngineOptions base;
    base.num_kv_blocks = f.pool_blocks;
    base.scheduler.step_budget_ns = 1e12;
    base.model_id = "trace-bench-" + f.preset;

    kvstore::testing::TempDir dir;
    std::unique_ptr<kvstore::testing::RedisTestServer> redis;
    std::printf("| store | hit rate | vs ideal (pts) | from store | TTFT p50 ms | TTFT p99 ms | "
                "TTFT mean ms | swap-ins | swap-in hidden |\n|---|---|---|---|---|---|---|---|---|\n");
    for (const std::string mode : {"off", "file", "mmap", "redis", "shm", "fetch"}) {
        if (("," + f.modes + ",").find("," + mode + ",") == std::string::npos) continue;
        std::string uri;
        if (mode == "file") {
            uri = "file://" + dir.path() + "/file?fsync=0";
        } else if (mode == "mmap") {  // zero-copy reads: the Fetcher gets mapped blocks
            uri = "file://" + dir.path() + "/mmapfile?fsync=0&io=mmap";
        } else if (mode == "redis") {
            if (!kvstore::testing::have_redis_server()) continue;
            redis = std::make_unique<kvstore::testing::RedisTestServer>();
            uri = "redis://127.0.0.1:" + std::to_string(redis->port()) + "?timeout_ms=5000";
        } else if (mode == "shm") {
            const std::string name = "dsi_trace_bench_" + std::to_string(::getpid());
            uri = "shm://" + name + "?slots=256&slot_bytes=1048576&unlink=1|file://" +
                  dir.path() + "/shmfile?fsync=0";
        }
        pid_t fetch_pid = -1;
        if (mode == "fetch") {
            const std::string pool = "shm://dsi_trace_fetch_" + std::to_string(::getpid()) +
                                     "?slots=16&slot_bytes=1048576";
            const std::string store = "file://" + dir.path() + "/fetchfile?fsync=0";
            const std::string socket = dir.path() + "/fetch.sock";
            fetch_pid = start_fetch_process(pool + "&unlink=1|" + store, socket);
            if (fetch_pid < 0) continue;
            uri = pool + "&fetcher=" + socket + "|" + store;
        }
        ModeResult m = run_mode(model.get(), rep, f, uri, base);
        const double ideal = hybrid ? ideal_rule : mode == "off" ? ideal_pool : ideal_inf;
        const engine::EngineStats& s = m.stats;
        const double hidden =
            s.swap_in_sum_ns > 0
                ? 1.0 - static_cast<double>(s.swap_in_wait_ns) / static_cast<double>(s.swap_in_sum_ns)
                : 0.0;
        std::printf("| %s | %.3f | %+.1f | %lld blocks | %.1f | %.1f | %.1f | %lld | %.2f |\n",
                    mode == "off"     ? "off (pool only)"
                    : mode == "shm"   ? "shm|file:// (host shm pool over file)"
                    : mode == "fetch" ? "shm(16 slots)|file://, fetch process"
                    : mode == "mmap"  ? "file:// io=mmap (zero copy)"
                                      : uri.substr(0, uri.find('?')).c_str(),
                    m.hit_rate, 100.0 * (m.hit_rate - ideal),
                    static_cast<long long>(s.store_hit_blocks), m.p50_ms, m.p99_ms, m.mean_ms,
                    static_cast<long long>(s.swap_in_count), hidden);
        std::printf("    pool hits %lld blocks, store lookups %lld, misses %lld, fetch mean %.2f ms, "
                    "swap-in mean %.2f ms (waited %.2f ms total), written %lld, dropped %lld\n",
                    static_cast<long long>(s.pool.hit_blocks),
                    static_cast<long long>(s.store_lookups),
                    static_cast<long long>(s.store_miss_blocks),
                    s.fetch_count ? s.fetch_sum_ns / 1e6 / s.fetch_count : 0.0,
                    s.swap_in_count ? s.swap_in_sum_ns / 1e6 / s.swap_in_count : 0.0,
                    s.swap_in_wait_ns / 1e6, static_cast<long long>(s.store_blocks_written),
                    static_cast<long long>(s.store_blocks_dropped));
        if (hybrid) {
            const kv::SwaCacheClassCounters w = s.swa.total();
            std::printf(
                "    S-KV-10: %lld hit tokens (ideal %lld), block KV reused %lld tokens "
                "(ideal %lld), "
                "SWA hits %lld, replays %lld (%lld tokens), computed past the plan "
                "%lld tokens, states stored %lld / restored %lld\n",
                static_cast<long long>(w.hit_tokens), static_cast<long long>(rule.hit_tokens),
                static_cast<long long>(s.cached_prompt_tokens),
                static_cast<long long>(rule.reused_tokens), static_cast<long long>(w.swa_hits),
                static_cast<long long>(w.replays), static_cast<long long>(w.replay_tokens),
                static_cast<long long>(s.swa_fallback_tokens),
                static_cast<long long>(s.swa_states_stored),
                static_cast<long long>(s.swa_states_restored));
        }
        std::fflush(stdout);
        if (fetch_pid > 0) {
            ::kill(fetch_pid, SIGTERM);
            ::waitpid(fetch_pid, nullptr, 0);
        }
        redis.reset();
    }
    return 0;
}
