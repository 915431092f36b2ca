// `dsinfer kvstore`: a KV store node (S-KV-3). Opens a store by URI, runs its GC worker
// (LRU under the watermarks, TTL per traffic class) and prints stats as JSON lines.
// Flag parsing only; the work is in kvstore/.
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "base/env.h"
#include "base/settings.h"
#include "kvstore/block_store.h"
#include "kvstore/gc_policy.h"
#include "kvstore/gc_worker.h"

namespace dsi {
namespace {

volatile std::sig_atomic_t g_kvstore_stop = 0;

void on_signal(int) { g_kvstore_stop = 1; }

struct KvstoreFlags {
    std::string store;
    double high_watermark = 0.90;
    double low_watermark = 0.80;
    double ttl_agent_s = 3 * 86400.0;
    double ttl_chatbot_s = 7 * 86400.0;
    double gc_interval_s = 60;
    double stats_interval_s = 10;
    double duration_s = 0;
    bool once = false;
};

nlohmann::json gc_json(const kvstore::GcRunStats& s) {
    return {{"blocks", s.num_blocks},           {"used_bytes_before", s.used_bytes_before},
            {"used_bytes_after", s.used_bytes_after}, {"capacity_bytes", s.capacity_bytes},
            {"expired", s.expired},             {"evicted", s.evicted},
            {"remove_errors", s.remove_errors}};
}

void print_stats(kvstore::BlockStore& store, const kvstore::GcRunStats& gc) {
    nlohmann::json j = {{"store", store.uri()},
                        {"gc", gc_json(gc)},
                        {"metrics", nlohmann::json::parse(store.metrics().snapshot().to_json())}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
}

int run_kvstore(const KvstoreFlags& f) {
    kvstore::RetentionSettings r;
    r.high_watermark = f.high_watermark;
    r.low_watermark = f.low_watermark;
    r.ttl_ns[static_cast<int>(kvstore::TrafficClass::kAgent)] =
        static_cast<int64_t>(f.ttl_agent_s * 1e9);
    r.ttl_ns[static_cast<int>(kvstore::TrafficClass::kChatbot)] =
        static_cast<int64_t>(f.ttl_chatbot_s * 1e9);
    if (Status s = r.validate(); !s.is_ok()) {
        std::fprintf(stderr, "kvstore: %s\n", s.to_string().c_str());
        return 2;
    }
    auto store = kvstore::open_block_store(f.store);
    if (!store.is_ok()) {
        std::fprintf(stderr, "kvstore: %s\n", store.status().to_string().c_str());
        return 2;
    }
    kvstore::GcWorker worker(store->get(), kvstore::GcPolicy(r, Env::default_env()));
    if (f.once) {
        auto stats = worker.run_once();
        if (!stats.is_ok()) {
            std::fprintf(stderr, "kvstore: gc: %s\n", stats.status().to_string().c_str());
            return 1;
        }
        print_stats(**store, *stats);
        return 0;
    }
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    worker.start(static_cast<int64_t>(f.gc_interval_s * 1e9));
    Env* env = Env::default_env();
    const int64_t start = env->now_ns();
    int64_t next_stats = start;
    while (g_kvstore_stop == 0 &&
           (f.duration_s <= 0 || env->now_ns() - start < static_cast<int64_t>(f.duration_s * 1e9))) {
        if (env->now_ns() >= next_stats) {
            print_stats(**store, worker.last_stats());
            next_stats += static_cast<int64_t>(f.stats_interval_s * 1e9);
        }
        env->sleep_ns(50'000'000);
    }
    worker.stop();
    print_stats(**store, worker.last_stats());
    return 0;
}

}  // namespace

void register_kvstore_commands(CLI::App& app) {
    auto flags = std::make_shared<KvstoreFlags>();
    CLI::App* cmd = app.add_subcommand(
        "kvstore", "KV store node: GC worker (LRU watermarks, per-class TTL) and stats");
    add_setting(*cmd, "--store", flags->store,
                "store URI: file:///path[?capacity=BYTES] | redis://h:p,...[?k=&m=&capacity=]")
        ->required();
    add_setting(*cmd, "--high-watermark", flags->high_watermark, "evict above this share of capacity");
    add_setting(*cmd, "--low-watermark", flags->low_watermark, "evict down to this share");
    add_setting(*cmd, "--ttl-agent-s", flags->ttl_agent_s, "TTL of agent blocks (s, from last access; <=0: none)");
    add_setting(*cmd, "--ttl-chatbot-s", flags->ttl_chatbot_s, "TTL of chatbot blocks (s; <=0: none)");
    add_setting(*cmd, "--gc-interval-s", flags->gc_interval_s, "seconds between GC runs");
    add_setting(*cmd, "--stats-interval-s", flags->stats_interval_s, "seconds between stats lines");
    add_setting(*cmd, "--duration-s", flags->duration_s, "stop after this long (0: until SIGINT/SIGTERM)");
    add_switch(*cmd, "--once", flags->once, "run GC once, print stats, exit");
    cmd->callback([flags] {
        int rc = run_kvstore(*flags);
        if (rc != 0) {
            throw CLI::RuntimeError(rc);
        }
    });
}

}  // namespace dsi
