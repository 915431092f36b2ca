// `dsinfer kvstore`: a KV store node (S-KV-3). Opens a store by URI, runs its GC worker
// (LRU under the watermarks, TTL per traffic class) and prints stats as JSON lines.
// `dsinfer kvfetch`: the S-KV-5 fetch process of one host (kvstore/fetch_service.h).
// Flag parsing only; the work is in kvstore/.
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "base/env.h"
#include "base/settings.h"
#include "kvstore/block_store.h"
#include "kvstore/fetch_service.h"
#include "kvstore/gc_policy.h"
#include "kvstore/gc_worker.h"
#include "kvstore/shm_store.h"

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

struct KvfetchFlags {
    std::string store;   // "shm://NAME?slots=N&slot_bytes=B|<store uri>"
    std::string socket;  // where engines connect (fetcher= in their store URI)
    int max_connections = 64;
    double stats_interval_s = 10;
    double duration_s = 0;
};

int run_kvfetch(const KvfetchFlags& f) {
    auto opened = kvstore::open_block_store(f.store);
    if (!opened.is_ok()) {
        std::fprintf(stderr, "kvfetch: %s\n", opened.status().to_string().c_str());
        return 2;
    }
    auto* tiered = dynamic_cast<kvstore::TieredBlockStore*>(opened->get());
    if (tiered == nullptr || dynamic_cast<kvstore::FetchProcessStore*>(tiered) != nullptr) {
        std::fprintf(stderr, "kvfetch: --store must be 'shm://NAME?slots=N&slot_bytes=B|<store "
                             "uri>' (without fetcher=)\n");
        return 2;
    }
    kvstore::FetchServiceOptions o;
    o.socket_path = f.socket;
    o.max_connections = f.max_connections;
    auto service = kvstore::FetchService::start(&tiered->shm(), &tiered->lower(), o);
    if (!service.is_ok()) {
        std::fprintf(stderr, "kvfetch: %s\n", service.status().to_string().c_str());
        return 2;
    }
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::printf("dsinfer kvfetch: serving %s on %s\n", tiered->uri().c_str(), f.socket.c_str());
    std::fflush(stdout);
    Env* env = Env::default_env();
    const int64_t start = env->now_ns();
    int64_t next_stats = start + static_cast<int64_t>(f.stats_interval_s * 1e9);
    auto print = [&] {
        const kvstore::FetchServiceStats s = (*service)->stats();
        nlohmann::json j = {{"requests", s.requests}, {"keys", s.keys},
                            {"fetched", s.fetched}, {"already_in_shm", s.already_in_shm},
                            {"misses", s.misses}, {"shm_full", s.shm_full},
                            {"errors", s.errors}, {"deadline", s.deadline},
                            {"bad_requests", s.bad_requests}, {"connections", s.connections},
                            {"bytes_fetched", s.bytes_fetched}};
        std::printf("%s\n", j.dump().c_str());
        std::fflush(stdout);
    };
    while (g_kvstore_stop == 0 &&
           (f.duration_s <= 0 || env->now_ns() - start < static_cast<int64_t>(f.duration_s * 1e9))) {
        if (env->now_ns() >= next_stats) {
            print();
            next_stats += static_cast<int64_t>(f.stats_interval_s * 1e9);
        }
        env->sleep_ns(50'000'000);
    }
    (*service)->stop();
    print();
    return 0;
}

void register_kvfetch(CLI::App& app) {
    auto flags = std::make_shared<KvfetchFlags>();
    CLI::App* cmd = app.add_subcommand(
        "kvfetch", "KV fetch process (S-KV-5): moves blocks store -> host shm pool for engines");
    add_setting(*cmd, "--store", flags->store,
                "shm://NAME?slots=N&slot_bytes=B|<store uri> (the pool engines attach to)")
        ->required();
    add_setting(*cmd, "--socket", flags->socket,
                "Unix socket engines connect to (their store URI: ...&fetcher=SOCKET|...)")
        ->required();
    add_setting(*cmd, "--max-connections", flags->max_connections, "engine connections at once");
    add_setting(*cmd, "--stats-interval-s", flags->stats_interval_s, "seconds between stats lines");
    add_setting(*cmd, "--duration-s", flags->duration_s, "stop after this long (0: until SIGINT/SIGTERM)");
    cmd->callback([flags] {
        int rc = run_kvfetch(*flags);
        if (rc != 0) {
            throw CLI::RuntimeError(rc);
        }
    });
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
    register_kvfetch(app);
}

}  // namespace dsi
