// `dsinfer serve`: the HTTP API server (server/) on one replica (serving/replica.h);
// with --role it is an engine of a cluster (serves the engine RPC and joins
// --membership). `dsinfer router`: the same HTTP APIs over the engines membership
// lists (router/remote_service.h). Flags only; the libraries do the work. With no
// --model both use the embedded default model (serving/default_model.h).
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/logging.h"
#include "base/settings.h"
#include "engine/calibrate.h"
#include "engine/dp_front.h"
#include "ep_launch.h"
#include "kv/block_key.h"
#include "kv/swa_pool.h"
#include "kvstore/block_store.h"
#include "membership/registry.h"
#include "protocol/encoder.h"
#include "replica_flags.h"
#include "router/remote_service.h"
#include "server/api.h"
#include "server/engine_service.h"
#include "server/handoff_service.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/structured_output.h"
#include "server/swa_announce.h"
#include "server/swa_pull_service.h"
#include "serving/kv_handoff.h"
#include "serving/replica.h"
#include "serving/swa_fetch.h"

namespace dsi {
namespace {

struct ServeFlags {
    ReplicaFlags replica;  // model, engine, scheduler and KV store settings
    std::string host = "127.0.0.1";
    int port = 8000;
    std::string api_key;        // KEY or KEY:SALT
    std::string api_keys_file;  // one KEY or KEY:SALT per line
    std::string chat_encoding = "auto";
    int io_threads = 2;
    int64_t drain_grace_ms = 30000;
    int64_t max_connections = server::ServerOptions{}.max_connections;
    int64_t max_body_budget_bytes = server::ServerOptions{}.max_body_budget_bytes;
    server::ServerLimits limits;
    // Cluster (issue 18). serve: --role makes it an engine; router: required.
    std::string role;        // "" | both | prefill | decode
    std::string membership;  // etcd://host:port[/prefix] | file:///path.json
    std::string node_id;     // "" = <role>-<port>
    std::string advertise;   // host:port others reach it at; "" = host:port
    int64_t lease_ttl_s = membership::RegistryOptions{}.lease_ttl_s;
    std::string engine_api_key;  // router: the key engines require
    // router: S-LB prefill quota cap of the shortest-prompt bucket, ms of the cost model
    // (the longer buckets get 2x, 4x, 5x, the landed ratios).
    double prefill_quota_ms = 250;
    // router: how long a generation waits for an engine when none can take it.
    int64_t no_engine_wait_ms = router::RemoteServiceOptions{}.no_engine_wait_ms;
    // KV hand-over (decode / both engines): the inbox's TCP port (0: any free one;
    // -1: no inbox) and the bytes of its shm tier.
    int kv_transfer_port = 0;
    std::string kv_transfer_advertise;  // host:port prefill engines reach the inbox at
    int64_t kv_inbox_mb = 256;
    int kv_inbox_threads = serving::KvInboxOptions{}.num_threads;
    int64_t kv_landing_ttl_ms = serving::ReplicaOptions{}.kv_landing_ttl.count();
    int64_t kv_inbox_transfer_timeout_ms = serving::KvInboxOptions{}.max_transfer_time.count();
    std::string kv_transport = "tcp";  // tcp | ucx: KV hand-over (sender and inbox)
    EpFlags ep;                        // serve: expert parallelism (issue 19, ep_launch.h)
    std::string step_log;              // serve: one JSON line per engine step ("" = none)
};

int fail(const Status& s, const char* cmd = "serve") {
    std::fprintf(stderr, "dsinfer %s: %s\n", cmd, s.to_string().c_str());
    return 1;
}

// --step-log: each engine step as one JSON line, {"start_ns", "end_ns", "cpu_ns",
// "items": [[q, c], ...]} (engine::StepRecord; read by sim/step_fit.h). Written on the
// engine thread and flushed per line (a line is ~100 bytes, a step milliseconds), so a
// process killed mid-run leaves every finished step.
struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
};
using StepLog = std::unique_ptr<std::FILE, FileCloser>;

void write_step(std::FILE* out, const engine::StepRecord& r) {
    std::string line = "{\"start_ns\":" + std::to_string(r.start_ns) +
                       ",\"end_ns\":" + std::to_string(r.end_ns) +
                       ",\"cpu_ns\":" + std::to_string(r.cpu_ns) + ",\"items\":[";
    for (size_t i = 0; i < r.items.size(); ++i) {
        if (i > 0) line += ',';
        line += "[" + std::to_string(r.items[i].q) + "," + std::to_string(r.items[i].c) + "]";
    }
    line += "]}\n";
    std::fwrite(line.data(), 1, line.size(), out);
    std::fflush(out);
}

// The server's own record for --membership.
membership::Member self_record(const ServeFlags& f, membership::Role role, int port) {
    membership::Member m;
    m.role = role;
    m.id = f.node_id.empty() ? std::string(membership::role_name(role)) + "-" + std::to_string(port)
                             : f.node_id;
    m.address = f.advertise.empty() ? f.host + ":" + std::to_string(port) : f.advertise;
    m.capacity = f.limits.max_concurrent;
    m.incarnation = membership::new_incarnation(Env::default_env()->wall_ns());
    return m;
}

Result<std::unique_ptr<membership::Registry>> open_membership(const ServeFlags& f) {
    membership::RegistryOptions ro;
    ro.lease_ttl_s = f.lease_ttl_s;
    return membership::open_registry(f.membership, ro);
}

server::ServerOptions server_options(const ServeFlags& f, std::vector<server::ApiKey> keys) {
    server::ServerOptions so;
    so.host = f.host;
    so.port = f.port;
    so.api_keys = std::move(keys);
    so.num_io_threads = f.io_threads;
    so.drain_grace_ms = f.drain_grace_ms;
    so.max_connections = f.max_connections;
    so.max_body_budget_bytes = f.max_body_budget_bytes;
    return so;
}

// The API context of a replica (with or without its model).
server::ApiContext api_context(const ServeFlags& f, serving::Replica& rep,
                               protocol::ChatEncoding encoding) {
    server::ApiContext ctx;
    ctx.tokenizer = rep.tokenizer();
    ctx.special = protocol::SpecialTokens::from_tokenizer(*rep.tokenizer());
    ctx.encoding = encoding;
    ctx.model_id = rep.served_model_name();
    ctx.max_model_len = f.replica.max_model_len > 0 ? f.replica.max_model_len
                                                    : rep.config().max_position_embeddings;
    ctx.limits = f.limits;
    return ctx;
}

// "auto": the V4 encoding for a DeepSeek V4 or V4.1 checkpoint (V4.1 is assumed to keep
// V4's encoding, docs/models_v41.md), else V3.2's (DSML).
Result<protocol::ChatEncoding> parse_encoding(const std::string& s, const ModelConfig& config) {
    if (s == "auto") {
        return config.v4_layout() ? protocol::ChatEncoding::kDeepSeekV4
                                  : protocol::ChatEncoding::kDeepSeekV32;
    }
    if (s == "v32") return protocol::ChatEncoding::kDeepSeekV32;
    if (s == "v4") return protocol::ChatEncoding::kDeepSeekV4;
    if (s == "v3") return protocol::ChatEncoding::kDeepSeekV3Template;
    return invalid_argument("--chat-encoding must be auto, v32, v4 or v3, got '" + s + "'");
}

// --api-key and the lines of --api-keys-file (blank lines and # comments skipped).
Result<std::vector<server::ApiKey>> read_api_keys(Env* env, const ServeFlags& f) {
    std::vector<server::ApiKey> keys;
    if (!f.api_key.empty()) {
        DSI_ASSIGN_OR_RETURN(server::ApiKey k, server::parse_api_key(f.api_key));
        keys.push_back(std::move(k));
    }
    if (!f.api_keys_file.empty()) {
        DSI_ASSIGN_OR_RETURN(std::string text, env->read_file(f.api_keys_file));
        size_t pos = 0;
        for (int line = 1; pos < text.size(); ++line) {
            size_t end = text.find('\n', pos);
            if (end == std::string::npos) end = text.size();
            std::string_view l = std::string_view(text).substr(pos, end - pos);
            pos = end + 1;
            while (!l.empty() && (l.back() == '\r' || l.back() == ' ')) l.remove_suffix(1);
            while (!l.empty() && l.front() == ' ') l.remove_prefix(1);
            if (l.empty() || l.front() == '#') continue;
            Result<server::ApiKey> k = server::parse_api_key(l);
            if (!k.is_ok()) {
                return k.status().with_context(f.api_keys_file + ":" + std::to_string(line));
            }
            keys.push_back(std::move(k).value());
        }
    }
    return keys;
}

int run_serve(const ServeFlags& f) {
    Env* env = Env::default_env();
    if (!f.membership.empty() && f.role.empty()) {
        return fail(invalid_argument("--membership needs --role (an engine of a cluster)"));
    }
    // Checked before the model loads (a typo fails fast); "auto" is resolved after.
    if (Result<protocol::ChatEncoding> e = parse_encoding(f.chat_encoding, ModelConfig{});
        !e.is_ok()) {
        return fail(e.status());
    }
    Result<std::vector<server::ApiKey>> keys = read_api_keys(env, f);
    if (!keys.is_ok()) return fail(keys.status());
    Result<serving::ReplicaOptions> options = to_replica_options(f.replica);
    if (!options.is_ok()) return fail(options.status());
    StepLog step_log;  // outlives the replica, whose engine writes it
    if (!f.step_log.empty()) {
        step_log.reset(std::fopen(f.step_log.c_str(), "w"));
        if (step_log == nullptr) {
            return fail(unavailable("--step-log: cannot open " + f.step_log));
        }
        options->engine.on_step = [out = step_log.get()](const engine::StepRecord& r) {
            write_step(out, r);
        };
    }
    const bool receives_kv = (f.role == "decode" || f.role == "both") && f.kv_transfer_port >= 0;
    if (receives_kv) {
        options->kv_inbox_bytes = f.kv_inbox_mb << 20;
        options->kv_landing_ttl = std::chrono::milliseconds(f.kv_landing_ttl_ms);
    }
    // V4 / V4.1 engines of a cluster announce their SWA states to the routers' directory.
    options->own_swa_pool = !f.role.empty();
    // The KV hand-over's transports (sender, inbox), made before the model loads: a
    // build without UCX refuses --kv-transport ucx at once.
    std::unique_ptr<transfer::Transport> handoff_transport;
    std::unique_ptr<transfer::Transport> inbox_transport;
    if (!f.role.empty()) {
        Result<std::unique_ptr<transfer::Transport>> t = transfer::make_transport(f.kv_transport);
        if (!t.is_ok()) return fail(t.status().with_context("--kv-transport"));
        handoff_transport = std::move(t).value();
        if (receives_kv) {
            t = transfer::make_transport(f.kv_transport);
            if (!t.is_ok()) return fail(t.status().with_context("--kv-transport"));
            inbox_transport = std::move(t).value();
        }
    }
    // --ep N: this process serves HTTP as a front with no model; the N ranks it starts run
    // the requests (ep_launch.h).
    // A prefill engine's KV export comes back from its rank with the finishing event and
    // is sent from here; received blocks would have to reach the ranks' pools, which
    // the front does not hold (docs/comm.md "KV hand-over under --ep").
    if (f.ep.ep > 1 && f.ep.group.empty() && receives_kv && f.ep.front == "on") {
        return fail(invalid_argument(
            "--ep with --ep-front on does not receive KV hand-overs (--role " + f.role +
            " with --kv-transfer-port): use --role prefill, or --ep-front off"));
    }
    Result<EpLaunch> ep = EpLaunch::start(f.ep, env, *options, /*long_idle=*/true,
                                          /*front=*/true);
    if (!ep.is_ok()) return fail(ep.status());
    Result<std::unique_ptr<serving::Replica>> replica =
        serving::open_replica(std::move(options).value(), env);
    if (!replica.is_ok()) {
        // A started rank whose group never formed (a peer lost before it attached) is
        // healthy: its exit status says so to the failover.
        const int code = fail(replica.status());
        return ep->started_rank() ? EpLaunch::started_rank_exit_code(replica.status()) : code;
    }
    serving::Replica& rep = **replica;
    if (ep->started_rank()) {
        Status s = ep->run_started_rank(rep, env, /*grammars=*/true);
        if (!s.is_ok()) (void)fail(s);
        return EpLaunch::started_rank_exit_code(s);
    }
    const std::string& model_id = rep.served_model_name();
    Result<protocol::ChatEncoding> encoding = parse_encoding(f.chat_encoding, rep.config());
    if (!encoding.is_ok()) return fail(encoding.status());

    server::ApiContext ctx = api_context(f, rep, *encoding);
    // One grammar compile service per server, over the served tokenizer's vocabulary.
    server::StructuredOutput structured(*rep.tokenizer());
    ctx.structured_output = &structured;
    if (ep->front()) {
        // --ep front: it only compiles (a bad grammar is a 400 here) and sends the grammar
        // serialised; each rank rebuilds it over its own tokenizer (PortableMaskBuilder)
        // and builds the token tables it masks with. Tables warmed here would go unused.
        DSI_LOG(kInfo) << "grammar table cache not warmed: the --ep ranks build the masks";
    } else {
        // Issue 21: the common grammar tables now, not in the first requests' steps.
        const int64_t start_ns = env->now_ns();
        const grammar::WarmupStats ws = structured.warm_table_cache();
        DSI_LOG(kInfo) << "grammar table cache warmed: " << ws.tables_added << " tables in "
                       << (env->now_ns() - start_ns) / 1000000 << " ms";
    }
    ctx.env = env;  // the engine's clock: request deadlines (timeout_ms)
    server::Metrics metrics;
    // The service borrows the replica's engine; it stops (joining the engine thread)
    // before the replica goes.
    // --ep-attention dp: requests spread over the --ep ranks (engine/dp_front.h); the
    // front goes after the service that steps it.
    std::unique_ptr<engine::DpFront> front;
    engine::StepEngine* stepped = rep.engine();
    if (ep->front()) {
        front = std::make_unique<engine::DpFront>(
            ep->dp_link(), ep->front_limits(rep), ep->spread(), env,
            dp_routing(f.ep, rep.cache_identity(), f.replica.prefix_cache));
        stepped = front.get();
    } else if (engine::DpRankLink* link = ep->dp_link()) {
        // --ep-front off with --ep-attention dp: rank 0 (this process) spreads the requests.
        front = std::make_unique<engine::DpFront>(
            rep.engine(), rep.model(), link, env,
            dp_routing(f.ep, rep.cache_identity(), f.replica.prefix_cache));
        stepped = front.get();
    }
    auto engine_service = std::make_unique<server::EngineService>(stepped);
    server::GenerationService* service = engine_service.get();
    // Issue 18 KV hand-over: a cluster engine sends a prefill's KV where the router
    // says (HandoffService); a decode / both engine receives it (KvInbox, started
    // once the node id is known).
    const uint64_t incarnation = static_cast<uint64_t>(env->wall_ns());
    std::unique_ptr<serving::KvInbox> inbox;
    std::unique_ptr<server::HandoffService> handoff;
    if (!f.role.empty()) {
        server::HandoffServiceOptions ho;
        // The peer id its inbox keeps incarnations under: unique per process.
        ho.self = {f.node_id.empty() ? "serve-" + std::to_string(incarnation) : f.node_id,
                   transfer::PeerRole::kPrefill, incarnation};
        ho.extra_counters = [&inbox, landing = rep.kv_landing()] {
            std::vector<server::ServiceStats::Counter> c;
            if (inbox == nullptr) return c;
            const serving::KvInboxStats s = inbox->stats();
            c.push_back({"kv_inbox_landed_total", "KV hand-overs received into the engine's pool",
                         s.num_landed});
            c.push_back({"kv_inbox_landed_blocks_total", "full KV blocks received into the pool",
                         s.blocks_landed});
            c.push_back({"kv_inbox_landed_tail_tokens_total",
                         "prompt tail rows received into the pool", s.tail_tokens_landed});
            c.push_back({"kv_inbox_landing_fallbacks_total",
                         "hand-overs stored in the store tier: the pool had no room",
                         s.num_landing_fallbacks});
            if (landing != nullptr) {
                const engine::KvLandingStats l = landing->stats();
                c.push_back({"kv_landing_attached_total",
                             "continuations admitted onto a landed hand-over", l.attached});
                c.push_back({"kv_landing_tail_tokens_total",
                             "prompt tail tokens a continuation did not recompute", l.tail_tokens});
                c.push_back({"kv_landing_expired_total",
                             "landed hand-overs whose continuation never came (TTL)", l.expired});
                c.push_back({"kv_landing_dropped_total",
                             "pool reservations released by failed or aborted hand-overs",
                             l.dropped});
                c.push_back({"kv_landing_refused_total",
                             "pool reservations refused (no room: store-tier path)", l.refused});
                c.push_back({"kv_landing_blocks_held", "pool blocks held by hand-overs now",
                             l.blocks_held});
            }
            c.push_back({"kv_inbox_received_total", "KV hand-overs stored", s.num_received});
            c.push_back({"kv_inbox_failed_total", "KV hand-overs refused or broken", s.num_failed});
            c.push_back({"kv_inbox_rejected_total", "hand-over connections refused (busy)",
                         s.num_rejected});
            c.push_back(
                {"kv_inbox_blocks_total", "KV blocks stored by hand-overs", s.blocks_stored});
            c.push_back({"kv_inbox_swa_states_total", "SWA states (V4) put into the pool",
                         s.states_stored});
            c.push_back(
                {"kv_inbox_bytes_total", "KV bytes stored by hand-overs", s.bytes_received});
            return c;
        };
        handoff = std::make_unique<server::HandoffService>(service, std::move(ho),
                                                           std::move(handoff_transport));
        service = handoff.get();
    }
    server::ServerOptions so = server_options(f, std::move(keys).value());
    so.engine_rpc = !f.role.empty();
    // The membership record's incarnation, once known: announcements carry it so a
    // router never mixes the change logs of two processes at one address.
    std::atomic<uint64_t> announce_incarnation{0};
    // S-KV-8: other engines pull this engine's SWA states from its fetch server, and it
    // pulls states the router names before a prefill (SwaPullService, outermost).
    std::unique_ptr<serving::SwaFetchServer> swa_fetch;
    std::unique_ptr<server::SwaPullService> swa_pull;
    std::string swa_fetch_address;
    if (kv::SwaStatePool* pool = rep.swa_pool(); pool != nullptr && so.engine_rpc) {
        Result<std::unique_ptr<transfer::Transport>> t = transfer::make_transport(f.kv_transport);
        if (!t.is_ok()) return fail(t.status().with_context("--kv-transport"));
        serving::SwaFetchServerOptions fo;
        fo.host = f.host;
        fo.incarnation = incarnation;
        fo.pool = pool;
        Result<std::unique_ptr<serving::SwaFetchServer>> fs =
            serving::SwaFetchServer::start(std::move(fo), std::move(t).value());
        if (!fs.is_ok()) return fail(fs.status().with_context("SWA state fetch server"));
        swa_fetch = std::move(fs).value();
        t = transfer::make_transport(f.kv_transport);
        if (!t.is_ok()) return fail(t.status().with_context("--kv-transport"));
        server::SwaPullServiceOptions po;
        po.pool = pool;
        po.fetch.incarnation = incarnation;
        po.fetch.state_bytes = rep.kv_block_shape()->swa_state_bytes;
        swa_pull = std::make_unique<server::SwaPullService>(service, po, std::move(t).value());
        service = swa_pull.get();
        so.swa_states = [pool, &announce_incarnation, &swa_fetch_address](std::string_view target) {
            server::SwaAnnouncementReply r;
            r.incarnation = announce_incarnation.load();
            r.fetch_address = swa_fetch_address;
            r.changes = pool->changes_since(server::swa_announcement_since(target));
            return server::encode_swa_announcement(r);
        };
    }
    std::unique_ptr<membership::Registry> registry;
    if (!f.membership.empty()) {
        Result<std::unique_ptr<membership::Registry>> r = open_membership(f);
        if (!r.is_ok()) return fail(r.status());
        registry = std::move(r).value();
        // S-DEPLOY drain: leave the directory first, so routers send nothing new while
        // the running generations finish (those the grace cuts fail over there).
        so.on_drain_start = [reg = registry.get()] { (void)reg->leave(); };
    }
    Result<std::unique_ptr<server::HttpServer>> srv =
        server::HttpServer::create(&ctx, service, &metrics, so);
    if (!srv.is_ok()) return fail(srv.status());
    if (registry) {
        membership::Member self =
            self_record(f, membership::parse_role(f.role).value(), (*srv)->port());
        if (swa_fetch) {
            const std::string& a = self.address;
            swa_fetch_address = a.substr(0, a.rfind(':') + 1) + std::to_string(swa_fetch->port());
            std::printf("dsinfer serve: SWA state fetch on %s\n", swa_fetch_address.c_str());
        }
        announce_incarnation.store(self.incarnation);
        if (receives_kv && rep.kv_inbox() != nullptr) {
            serving::KvInboxOptions io;
            io.host = f.host;
            io.port = static_cast<uint16_t>(f.kv_transfer_port);
            io.self = {self.id, transfer::PeerRole::kDecode, incarnation};
            io.model_id = rep.cache_identity();
            io.dtype = rep.kv_block_shape()->dtype;
            io.layer_block_bytes = rep.kv_block_shape()->layer_block_bytes;
            io.swa_state_bytes = rep.kv_block_shape()->swa_state_bytes;
            io.swa_pool = rep.swa_pool();
            io.num_threads = f.kv_inbox_threads;
            io.max_transfer_time = transfer::Timeout(f.kv_inbox_transfer_timeout_ms);
            io.landing = rep.kv_landing();
            if (front != nullptr && !ep->front()) {
                // --ep-front off with attention DP: the hand-over is rank 0's (this
                // process's pool or store tier); the continuation follows it there.
                io.on_stored = [fr = front.get()](std::vector<kv::BlockKey> chain) {
                    fr->learn_local(std::move(chain));
                };
            }
            if (io.landing != nullptr) {
                io.landing->set_waker([svc = engine_service.get()] { svc->wake(); });
            }
            Result<std::unique_ptr<serving::KvInbox>> in =
                serving::KvInbox::start(std::move(io), rep.kv_inbox(), std::move(inbox_transport));
            if (!in.is_ok()) return fail(in.status().with_context("--kv-transfer-port"));
            inbox = std::move(in).value();
            const std::string& a = self.address;
            self.transfer_address =
                !f.kv_transfer_advertise.empty()
                    ? f.kv_transfer_advertise
                    : a.substr(0, a.rfind(':') + 1) + std::to_string(inbox->port());
            std::printf("dsinfer serve: KV hand-over inbox on %s\n", self.transfer_address.c_str());
        }
        if (Status s = registry->join(self); !s.is_ok()) return fail(s);
        std::printf("dsinfer serve: joined %s as %s (role %s)\n", registry->describe().c_str(),
                    self.id.c_str(), f.role.c_str());
    }
    std::printf("dsinfer serve: chat encoding %s\n",
                std::string(protocol::chat_encoding_name(*encoding)).c_str());
    std::printf("dsinfer serve: listening on http://%s:%d (model %s)\n", f.host.c_str(),
                (*srv)->port(), model_id.c_str());
    std::printf(
        "  curl http://%s:%d/v1/chat/completions -H 'Content-Type: application/json' "
        "-d '{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}'\n",
        f.host.c_str(), (*srv)->port(), model_id.c_str());
    std::fflush(stdout);
    Status s = (*srv)->run();
    // Routers stop sending here before the engine goes (the drain is over by now).
    if (registry) (void)registry->leave();
    // The engine thread first (its last updates run through the hand-over service),
    // then the sends in progress, then the inbox; the server object outlives them all.
    engine_service->stop();
    swa_pull.reset();
    swa_fetch.reset();
    handoff.reset();
    inbox.reset();
    engine_service.reset();  // the engine goes before the replica
    front.reset();
    if (s.is_ok()) s = ep->finish(rep);  // --ep: end the group, reap the ranks
    if (!s.is_ok()) return fail(s);
    DSI_LOG(kInfo) << "drained; exiting";
    return 0;
}

int run_router(const ServeFlags& f) {
    Env* env = Env::default_env();
    if (f.membership.empty()) return fail(invalid_argument("--membership is required"), "router");
    if (Result<protocol::ChatEncoding> e = parse_encoding(f.chat_encoding, ModelConfig{});
        !e.is_ok()) {
        return fail(e.status(), "router");
    }
    Result<std::vector<server::ApiKey>> keys = read_api_keys(env, f);
    if (!keys.is_ok()) return fail(keys.status(), "router");
    Result<std::unique_ptr<membership::Registry>> registry = open_membership(f);
    if (!registry.is_ok()) return fail(registry.status(), "router");
    // The model's tokenizer and config only: the router encodes and renders.
    Result<serving::ReplicaOptions> options = to_replica_options(f.replica);
    if (!options.is_ok()) return fail(options.status(), "router");
    options->load_model = false;
    options->create_engine = false;
    const std::string cost_flag = options->engine.cost_model_path;  // --cost-model
    Result<std::unique_ptr<serving::Replica>> replica =
        serving::open_replica(std::move(options).value(), env);
    if (!replica.is_ok()) return fail(replica.status(), "router");
    serving::Replica& rep = **replica;
    Result<protocol::ChatEncoding> encoding = parse_encoding(f.chat_encoding, rep.config());
    if (!encoding.is_ok()) return fail(encoding.status(), "router");
    server::ApiContext ctx = api_context(f, rep, *encoding);
    // The router compiles grammars too: a bad schema is a 400 before any engine.
    server::StructuredOutput structured(*rep.tokenizer());
    ctx.structured_output = &structured;
    ctx.env = env;

    router::RemoteServiceOptions ro;
    ro.engine_api_key = f.engine_api_key;
    ro.no_engine_wait_ms = f.no_engine_wait_ms;
    // S-LB prices a prefill by the engines' cost model: --cost-model (a `dsinfer calibrate`
    // fit of the engines' machine and threads), else the fit beside the checkpoint when this
    // host has one (what engines started here from the same checkpoint read), else the
    // conservative CPU model of the checkpoint's sizes (what an engine without a fit uses:
    // it prices a prompt several times too high, so each prefill engine pulls one at a time).
    const std::string cost_path =
        cost_flag.empty() ? engine::cost_model_path_for(rep.model_path()) : cost_flag;
    Result<std::optional<engine::PrefillCostModel>> fitted =
        engine::load_cost_model(env, cost_path);
    if (!fitted.is_ok()) return fail(fitted.status(), "router");
    if (!cost_flag.empty() && !*fitted) {
        return fail(not_found("--cost-model " + cost_flag + " does not exist"), "router");
    }
    const engine::PrefillCostModel cost =
        *fitted ? **fitted : engine::conservative_cpu_cost_model(engine::prefill_shape(rep.config()));
    ro.prefill_cost_ns = [cost](int64_t miss, int64_t hit) { return cost.cost_ns(miss, hit); };
    // bench/sim_vs_live.sh gives the simulator the same pricing (prefill_lb_cost).
    std::printf(
        "dsinfer router: prefill quota priced by base_ns %.9g per_q_ns %.9g per_c_ns %.9g "
        "per_qc_ns %.9g per_qq_ns %.9g (%s)\n",
        cost.base_ns, cost.per_q_ns, cost.per_c_ns, cost.per_qc_ns, cost.per_qq_ns,
        *fitted ? cost_path.c_str() : "conservative CPU estimate");
    const double quota_ns = f.prefill_quota_ms * 1e6;
    ro.prefill_lb.bucket_quota_ns = {quota_ns, 2 * quota_ns, 4 * quota_ns, 5 * quota_ns};
    if (kvstore::BlockStore* store = rep.kv_store()) {
        // S-KV-4: the hit length before routing, from the store's metadata (the chain of
        // the prompt's full blocks, keyed as the engines key them; 50 ms at most).
        ro.prefix_hit = [store, id = rep.cache_identity()](const engine::GenerateRequest& r) {
            const std::vector<kv::BlockKey> block_keys =
                kv::chain_keys(r.prompt, kv::make_salt(id, r.cache_salt));
            std::vector<kvstore::StoreKey> chain;
            for (const auto& k : block_keys) chain.push_back({k.lo, k.hi});
            Result<int64_t> n =
                store->match_prefix(chain, Env::default_env()->now_ns() + 50'000'000);
            return n.is_ok() ? *n * kv::kBlockTokens : int64_t{-1};
        };
    }
    if (rep.config().v4_layout()) {
        // S-KV-8..10: the router's part of the SWA-state directory, keyed as the engines
        // key their states.
        ro.swa_chain_keys = [id = rep.cache_identity()](const engine::GenerateRequest& r) {
            return kv::chain_keys(r.prompt, kv::make_salt(id, r.cache_salt));
        };
        // Routers of one cluster share their API keys: a lookup at another router carries
        // this router's first one.
        if (!keys->empty()) ro.swa_directory.router_api_key = keys->front().key;
    }
    router::RemoteService remote(ro);
    Result<std::vector<membership::Member>> engines =
        (*registry)->watch([&remote](const membership::MemberChange& c) { remote.apply(c); });
    if (!engines.is_ok()) return fail(engines.status(), "router");  // (they came as joins)
    server::Metrics metrics;
    server::ServerOptions router_so = server_options(f, std::move(keys).value());
    if (router::SwaDirectoryService* d = remote.swa_directory()) {
        // Other routers ask this one about the SWA states in its part of the directory.
        router_so.swa_lookup = [d](std::string_view target) { return d->answer_lookup(target); };
    }
    Result<std::unique_ptr<server::HttpServer>> srv =
        server::HttpServer::create(&ctx, &remote, &metrics, std::move(router_so));
    if (!srv.is_ok()) return fail(srv.status(), "router");
    membership::Member self = self_record(f, membership::Role::kRouter, (*srv)->port());
    if (router::SwaDirectoryService* d = remote.swa_directory()) d->set_self_id(self.id);
    if (Status s = (*registry)->join(self); !s.is_ok()) return fail(s, "router");
    std::printf("dsinfer router: %zu engine(s) in %s\n", engines->size(),
                (*registry)->describe().c_str());
    std::printf("dsinfer router: listening on http://%s:%d (model %s)\n", f.host.c_str(),
                (*srv)->port(), ctx.model_id.c_str());
    std::fflush(stdout);
    Status s = (*srv)->run();
    (void)(*registry)->leave();
    const router::RouterStats st = remote.router_stats();
    DSI_LOG(kInfo) << "router: " << st.num_routed << " routed, " << st.num_failovers
                   << " failovers, " << st.num_failed << " failed";
    if (!s.is_ok()) return fail(s, "router");
    return 0;
}

// Flags `serve` and `router` share: listening, keys, encoding, limits, membership.
void add_http_flags(CLI::App* cmd, ServeFlags* f) {
    add_setting(*cmd, "--host", f->host, "listen address");
    add_setting(*cmd, "--port", f->port, "listen port (0: any free port, printed)");
    add_setting(*cmd, "--api-key", f->api_key,
                "require this key (Bearer or x-api-key); KEY:SALT gives its tenant a prefix-cache "
                "salt");
    add_setting(*cmd, "--api-keys-file", f->api_keys_file,
                "more keys, one KEY or KEY:SALT per line (# comments)");
    add_setting(*cmd, "--chat-encoding", f->chat_encoding,
                "auto (v4 for a V4 checkpoint, else v32) | v32 | v4 | v3 (Jinja template)");
    add_setting(*cmd, "--io-threads", f->io_threads, "HTTP threads");
    add_setting(*cmd, "--drain-grace-ms", f->drain_grace_ms, "SIGTERM: wait this long, then abort");
    add_setting(*cmd, "--max-body-bytes", f->limits.max_body_bytes, "413 above");
    add_setting(*cmd, "--max-body-budget-bytes", f->max_body_budget_bytes,
                "request bodies held at once over all connections; 503 + Retry-After above");
    add_setting(*cmd, "--max-connections", f->max_connections,
                "open connections; 503 + Retry-After and close above");
    add_setting(*cmd, "--max-prompt-tokens", f->limits.max_prompt_tokens, "400 above");
    add_setting(*cmd, "--max-tokens-limit", f->limits.max_tokens, "400 for a larger max_tokens");
    add_setting(*cmd, "--default-max-tokens", f->limits.default_max_tokens,
                "max_tokens when a request gives none");
    add_setting(*cmd, "--max-concurrent", f->limits.max_concurrent,
                "generations in flight; 429 above");
    add_setting(*cmd, "--header-timeout-ms", f->limits.header_timeout_ms,
                "deadline for a request's head once it started; 408 after it");
    add_setting(
        *cmd, "--idle-timeout-ms", f->limits.idle_timeout_ms,
        "deadline for a connection with no request byte yet (new or kept alive); closed quietly");
    add_setting(*cmd, "--body-timeout-ms", f->limits.body_timeout_ms,
                "deadline for the body; 408 after it");
    add_setting(*cmd, "--write-timeout-ms", f->limits.write_timeout_ms,
                "deadline for the client to take one write of a reply; the connection (and "
                "its generation) ends after it");
    add_setting(*cmd, "--max-json-depth", f->limits.max_json_depth,
                "nesting levels a request's JSON may hold; 400 above");
    add_setting(*cmd, "--membership", f->membership,
                "cluster directory: etcd://host:port[/prefix] or file:///path.json");
    add_setting(*cmd, "--node-id", f->node_id,
                "this process's id in the directory ('' = role-port)");
    add_setting(*cmd, "--advertise-address", f->advertise,
                "host:port others reach this process at ('' = --host:port)");
    add_setting(*cmd, "--lease-ttl-s", f->lease_ttl_s,
                "etcd lease: a process that dies leaves the directory after this long")
        ->check(CLI::Range(2, 3600));
}

}  // namespace

void register_bench_serve_command(CLI::App& bench);  // cmd_bench_serve.cc

void register_serve_commands(CLI::App& app) {
    // `dsinfer bench serve` hangs under `bench` (registered before this in main()).
    for (CLI::App* bench :
         app.get_subcommands([](CLI::App* a) { return a->get_name() == "bench"; })) {
        register_bench_serve_command(*bench);
    }
    auto f = std::make_shared<ServeFlags>();
    CLI::App* cmd = app.add_subcommand("serve", "HTTP API server (OpenAI + Anthropic APIs, SSE)");
    add_replica_flags(*cmd, &f->replica);
    add_setting(*cmd, "--kv-cache-bytes", f->replica.kv_cache_bytes,
                "deprecated: KV block pool size in bytes (use --kv-cache-mb)")
        ->check(CLI::PositiveNumber);
    add_http_flags(cmd, f.get());
    add_setting(*cmd, "--role", f->role,
                "engine of a cluster (serves the engine RPC to routers): both | prefill (first "
                "tokens; the router hands the rest to a decode engine) | decode")
        ->check(CLI::IsMember({"", "both", "prefill", "decode"}));
    add_setting(*cmd, "--kv-transfer-port", f->kv_transfer_port,
                "decode / both engines: TCP port of the KV hand-over inbox (0: any free port, "
                "advertised in membership; -1: none, prefills are computed again)")
        ->check(CLI::Range(-1, 65535));
    add_setting(*cmd, "--kv-transfer-advertise", f->kv_transfer_advertise,
                "decode / both engines: host:port prefill engines reach the inbox at (behind "
                "NAT or a proxy; '' = the advertise host and the inbox's port)");
    add_setting(*cmd, "--kv-transport", f->kv_transport,
                "--role engines: transport of the KV hand-over, tcp (framed TCP) | ucx (UCX "
                "stream API; UCX_TLS defaults to tcp; every engine of a cluster uses the same)")
        ->check(CLI::IsMember({"tcp", "ucx"}));
    add_setting(*cmd, "--kv-inbox-mb", f->kv_inbox_mb,
                "decode / both engines: MiB of the in-process shm tier handed-over KV lands in")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
    add_setting(*cmd, "--kv-landing-ttl-ms", f->kv_landing_ttl_ms,
                "decode / both engines: how long a hand-over received into the engine's pool "
                "is held for its continuation (then its blocks go back to the pool)")
        ->check(CLI::Range(int64_t{100}, int64_t{3'600'000}));
    add_setting(*cmd, "--kv-inbox-threads", f->kv_inbox_threads,
                "decode / both engines: hand-overs the inbox receives at once (more wait, up "
                "to 16, then are refused)")
        ->check(CLI::Range(1, 64));
    add_setting(*cmd, "--kv-inbox-transfer-timeout-ms", f->kv_inbox_transfer_timeout_ms,
                "decode / both engines: the longest one hand-over may take from its first byte "
                "to the Ack (a sender that trickles bytes cannot hold a receiving thread longer)")
        ->check(CLI::Range(int64_t{100}, int64_t{3'600'000}));
    add_setting(*cmd, "--step-log", f->step_log,
                "write each engine step as a JSON line to this file: wall and worker CPU ns, "
                "[new tokens, context] per sequence (`dsinfer sim --fit-prefill-steps` reads it)");
    add_ep_flags(*cmd, &f->ep);
    cmd->callback([f] { throw CLI::RuntimeError(run_serve(*f)); });

    auto rf = std::make_shared<ServeFlags>();
    rf->port = 8080;
    CLI::App* rcmd = app.add_subcommand(
        "router", "cluster entrypoint: the same HTTP APIs, routed to the engines of --membership");
    add_replica_flags(*rcmd, &rf->replica);
    add_http_flags(rcmd, rf.get());
    add_setting(*rcmd, "--engine-api-key", rf->engine_api_key,
                "the API key the engines require ('' = none)");
    add_setting(*rcmd, "--prefill-quota-ms", rf->prefill_quota_ms,
                "S-LB: prefill cost (ms of the cost model) a prefill engine may hold in the "
                "shortest-prompt bucket (x2, x4, x5 for the longer ones); an empty engine "
                "always takes one")
        ->check(CLI::Range(1.0, 1e7));
    add_setting(*rcmd, "--no-engine-wait-ms", rf->no_engine_wait_ms,
                "a generation no engine can take (none listed, all tried) waits this long "
                "for one to join, then fails with 503 (0: fails at once)")
        ->check(CLI::Range(int64_t{0}, int64_t{3600000}));
    rcmd->callback([rf] { throw CLI::RuntimeError(run_router(*rf)); });
}

}  // namespace dsi
