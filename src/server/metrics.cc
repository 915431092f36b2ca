#include "server/metrics.h"

#include <cstdio>
#include <string>
#include <tuple>

#include "kv/swa_pool.h"
#include "kvstore/store_key.h"

namespace dsi::server {
namespace {

void line(std::string* out, const std::string& name, double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), " %.17g\n", v);
    *out += name;
    *out += buf;
}

void header(std::string* out, const std::string& name, const char* type, const std::string& help) {
    *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void gauge(std::string* out, const std::string& name, const std::string& help, double v) {
    header(out, name, "gauge", help);
    line(out, name, v);
}

void counter(std::string* out, const std::string& name, const std::string& help, double v) {
    header(out, name, "counter", help);
    line(out, name, v);
}

}  // namespace

void Histogram::observe(double seconds) {
    size_t i = 0;
    while (i < kBounds.size() && seconds > kBounds[i]) ++i;
    ++counts_[i];
    sum_ += seconds;
    ++count_;
}

void Histogram::render(const std::string& name, const std::string& help, std::string* out) const {
    header(out, name, "histogram", help);
    int64_t cum = 0;
    for (size_t i = 0; i < kBounds.size(); ++i) {
        cum += counts_[i];
        char le[32];
        std::snprintf(le, sizeof(le), "%g", kBounds[i]);
        line(out, name + "_bucket{le=\"" + le + "\"}", static_cast<double>(cum));
    }
    cum += counts_[kBounds.size()];
    line(out, name + "_bucket{le=\"+Inf\"}", static_cast<double>(cum));
    line(out, name + "_sum", sum_);
    line(out, name + "_count", static_cast<double>(count_));
}

void Metrics::on_request(std::string_view endpoint, int http_status) {
    MutexLock lock(&mu_);
    ++requests_[{std::string(endpoint), http_status}];
}

void Metrics::on_first_token(double seconds) {
    MutexLock lock(&mu_);
    ttft_.observe(seconds);
}

void Metrics::on_inter_token(double seconds) {
    MutexLock lock(&mu_);
    tpot_.observe(seconds);
}

void Metrics::on_finish(double e2e_seconds, int64_t prompt_tokens, int64_t output_tokens) {
    MutexLock lock(&mu_);
    e2e_.observe(e2e_seconds);
    prompt_tokens_ += prompt_tokens;
    output_tokens_ += output_tokens;
}

void Metrics::on_disconnect() {
    MutexLock lock(&mu_);
    ++disconnects_;
}

void Metrics::on_timeout(std::string_view what) {
    MutexLock lock(&mu_);
    ++timeouts_[std::string(what)];
}

std::string Metrics::render(const ServiceStats& s, int64_t num_in_flight, bool ready) const {
    std::string out;
    MutexLock lock(&mu_);
    header(&out, "dsinfer_requests_total", "counter", "HTTP requests by endpoint and status");
    for (const auto& [key, n] : requests_) {
        line(&out,
             "dsinfer_requests_total{endpoint=\"" + key.first + "\",status=\"" +
                 std::to_string(key.second) + "\"}",
             static_cast<double>(n));
    }
    ttft_.render("dsinfer_time_to_first_token_seconds", "time to first token", &out);
    tpot_.render("dsinfer_time_per_output_token_seconds", "time between output tokens", &out);
    e2e_.render("dsinfer_e2e_request_latency_seconds", "request latency, end to end", &out);
    counter(&out, "dsinfer_prompt_tokens_total", "prompt tokens of finished requests",
            static_cast<double>(prompt_tokens_));
    counter(&out, "dsinfer_generation_tokens_total", "output tokens of finished requests",
            static_cast<double>(output_tokens_));
    counter(&out, "dsinfer_client_disconnects_total", "requests aborted by a client disconnect",
            static_cast<double>(disconnects_));
    // A service's own figures: cumulative ones end in _total (counters); the others are
    // levels (engines listed, requests waiting, blocks held now): gauges.
    for (const ServiceStats::Counter& c : s.extra_counters) {
        const std::string name = "dsinfer_" + c.name;
        if (name.ends_with("_total")) {
            counter(&out, name, c.help, static_cast<double>(c.value));
        } else {
            gauge(&out, name, c.help, static_cast<double>(c.value));
        }
    }
    header(&out, "dsinfer_connection_timeouts_total", "counter",
           "connection deadlines fired, by kind (idle, header, body, write)");
    for (const char* kind : {"idle", "header", "body", "write"}) {
        auto it = timeouts_.find(kind);
        line(&out, std::string("dsinfer_connection_timeouts_total{kind=\"") + kind + "\"}",
             it == timeouts_.end() ? 0.0 : static_cast<double>(it->second));
    }
    gauge(&out, "dsinfer_ready", "1 when the model is loaded and the server is not draining",
          ready ? 1 : 0);
    gauge(&out, "dsinfer_requests_in_flight", "generation requests the HTTP layer holds",
          static_cast<double>(num_in_flight));
    gauge(&out, "dsinfer_queue_depth", "commands waiting for the engine thread",
          static_cast<double>(s.queue_depth));
    gauge(&out, "dsinfer_requests_running", "generations admitted by the engine, not finished",
          static_cast<double>(s.num_running));
    const kv::BlockPoolStats& p = s.engine.pool;
    gauge(&out, "dsinfer_kv_blocks_total", "KV blocks in the pool",
          static_cast<double>(p.num_blocks));
    gauge(&out, "dsinfer_kv_blocks_used", "KV blocks held by running sequences",
          static_cast<double>(p.num_used));
    gauge(&out, "dsinfer_kv_blocks_free", "KV blocks free (never cached or evicted)",
          static_cast<double>(p.num_free));
    gauge(&out, "dsinfer_kv_blocks_cached", "KV blocks unreferenced but kept for prefix hits",
          static_cast<double>(p.num_cached));
    counter(&out, "dsinfer_engine_prompt_tokens_total", "prompt tokens admitted by the engine",
            static_cast<double>(s.engine.prompt_tokens));
    counter(&out, "dsinfer_prefix_hit_tokens_total", "prompt tokens served from the prefix cache",
            static_cast<double>(s.engine.cached_prompt_tokens));
    gauge(&out, "dsinfer_prefix_hit_rate", "prefix hit tokens / admitted prompt tokens",
          s.engine.prompt_tokens > 0 ? static_cast<double>(s.engine.cached_prompt_tokens) /
                                           static_cast<double>(s.engine.prompt_tokens)
                                     : 0.0);
    counter(&out, "dsinfer_engine_output_tokens_total", "tokens sampled by the engine",
            static_cast<double>(s.engine.output_tokens));
    counter(&out, "dsinfer_engine_steps_total", "engine steps",
            static_cast<double>(s.engine.steps));
    counter(&out, "dsinfer_engine_preemptions_total", "sequences preempted",
            static_cast<double>(s.engine.preemptions));
    counter(&out, "dsinfer_swapped_out_blocks_total", "KV blocks swapped out to host memory",
            static_cast<double>(s.engine.swapped_out_blocks));
    counter(&out, "dsinfer_engine_forward_seconds_total", "time the worker spent in steps",
            static_cast<double>(s.engine.forward_ns) * 1e-9);
    counter(&out, "dsinfer_engine_step_errors_total", "engine steps that failed",
            static_cast<double>(s.num_step_errors));
    // Speculative decoding (issue 24): acceptance = accepted / draft tokens; per draft
    // position j, accepted_at{j} / drafted_at{j}.
    counter(&out, "dsinfer_spec_verify_steps_total", "decode steps that verified drafts",
            static_cast<double>(s.engine.spec_verify_steps));
    counter(&out, "dsinfer_spec_draft_tokens_total", "drafted tokens verified",
            static_cast<double>(s.engine.spec_draft_tokens));
    counter(&out, "dsinfer_spec_accepted_tokens_total", "drafted tokens accepted",
            static_cast<double>(s.engine.spec_accepted_tokens));
    counter(&out, "dsinfer_spec_steps_total",
            "engine steps that verified drafts (verified per step = draft tokens / steps)",
            static_cast<double>(s.engine.spec_steps));
    counter(&out, "dsinfer_spec_varlen_cut_tokens_total",
            "drafts not verified: variable-length verification judged them not worth it",
            static_cast<double>(s.engine.spec_varlen_cut_tokens));
    // The DSpark gate (docs/engine.md "Whether to speculate at all"): decode-only steps
    // per loop mode, probes, switches, and the MTP catch-up it costs.
    header(&out, "dsinfer_spec_gate_steps_total", "counter",
           "decode-only steps by loop mode (plain: asynchronous, no drafts)");
    header(&out, "dsinfer_spec_gate_probe_steps_total", "counter",
           "steps planned as probes of a loop mode");
    for (size_t m = 0; m < 2; ++m) {
        const std::string mode = m == 0 ? "{mode=\"plain\"}" : "{mode=\"speculating\"}";
        line(&out, "dsinfer_spec_gate_steps_total" + mode,
             static_cast<double>(s.engine.spec_gate_steps[m]));
        line(&out, "dsinfer_spec_gate_probe_steps_total" + mode,
             static_cast<double>(s.engine.spec_gate_probe_steps[m]));
    }
    const engine::EngineStats& e = s.engine;
    for (const auto& [name, help, value] :
         {std::tuple{"dsinfer_spec_gate_switches_total", "switches between the loop modes",
                     static_cast<double>(e.spec_gate_switches)},
          std::tuple{"dsinfer_spec_gate_priced_out_total",
                     "switches on not made: the MTP catch-up would cost more than the "
                     "remaining output could gain",
                     static_cast<double>(e.spec_gate_priced_out)},
          std::tuple{"dsinfer_spec_catchup_rows_total",
                     "target hidden rows run through the MTP layer (catch-up)",
                     static_cast<double>(e.spec_catchup_rows)},
          std::tuple{"dsinfer_spec_deferred_catchup_rows_total",
                     "catch-up rows deferred by plain steps, run when the sequence drafted",
                     static_cast<double>(e.spec_deferred_catchup_rows)},
          std::tuple{"dsinfer_spec_deferred_catchup_seconds_total", "time of the deferred catch-up",
                     static_cast<double>(e.spec_deferred_catchup_ns) * 1e-9},
          std::tuple{"dsinfer_spec_drafter_seconds_total", "time in the drafter",
                     static_cast<double>(e.spec_draft_ns) * 1e-9}}) {
        counter(&out, name, help, value);
    }
    for (const auto& [name, help, values] :
         {std::tuple{"dsinfer_spec_drafted_at_position_total",
                     "verify steps with a draft at position", &s.engine.spec_drafted_at},
          std::tuple{"dsinfer_spec_accepted_at_position_total", "drafts accepted at position",
                     &s.engine.spec_accepted_at}}) {
        header(&out, name, "counter", help);
        for (size_t j = 0; j < values->size(); ++j) {
            line(&out, std::string(name) + "{position=\"" + std::to_string(j) + "\"}",
                 static_cast<double>((*values)[j]));
        }
    }
    if (s.engine.expert_parallel) {
        // Issue 19: expert parallelism with live EPLB (S-EPLB). Rank 0 sees every rank's
        // load (the all-to-all's layout counts are the whole group's).
        const ExpertParallelStats& ep = *s.engine.expert_parallel;
        header(
            &out, "dsinfer_ep_expert_rows_total", "counter",
            "rows the routed experts of each --ep rank computed, all MoE layers (since the group "
            "last (re)started)");
        for (size_t r = 0; r < ep.rank_rows.size(); ++r) {
            line(&out, "dsinfer_ep_expert_rows_total{rank=\"" + std::to_string(r) + "\"}",
                 static_cast<double>(ep.rank_rows[r]));
        }
        gauge(&out, "dsinfer_ep_moe_lb",
              "busiest rank's expert rows / mean rank's over the last EPLB window (0: none yet)",
              ep.windows.empty() ? 0.0 : ep.windows.back().moe_lb);
        gauge(&out, "dsinfer_ep_placed_moe_lb",
              "the latest placement's moe_lb on the window it was computed from", ep.placed_moe_lb);
        counter(&out, "dsinfer_ep_placement_changes_total",
                "expert placement changes (live EPLB, all ranks at once)",
                static_cast<double>(ep.placement_changes));
        counter(&out, "dsinfer_ep_steps_total", "forward passes of the --ep group",
                static_cast<double>(ep.steps));
        gauge(&out, "dsinfer_ep_ranks", "ranks of the --ep group now (fewer after a failover)",
              ep.num_ranks);
        counter(&out, "dsinfer_ep_failovers_total",
                "--ep group restarts with the healthy ranks after a rank died (S-DEPLOY)",
                static_cast<double>(ep.failovers));
        gauge(&out, "dsinfer_ep_restarting",
              "1 while the --ep front restarts its group (the old ranks' reap, the new start)",
              ep.restarting ? 1 : 0);
    }
    if (!s.engine.dp_ranks.empty()) {
        // Issue 19: attention data parallelism over the --ep ranks (engine/dp_front.h):
        // each rank's own sequences and KV; rank 0 relays the others' load reports.
        const auto& ranks = s.engine.dp_ranks;
        using Field = int64_t engine::EngineStats::DpRank::*;
        for (const auto& [name, type, help, field] :
             {std::tuple{"dsinfer_dp_rank_running_sequences", "gauge",
                         "sequences waiting or running on each --ep rank now",
                         Field{&engine::EngineStats::DpRank::running_seqs}},
              std::tuple{"dsinfer_dp_rank_kv_blocks_used", "gauge",
                         "KV blocks in use on each --ep rank now",
                         Field{&engine::EngineStats::DpRank::kv_blocks_used}},
              std::tuple{"dsinfer_dp_rank_kv_blocks", "gauge", "KV blocks of each --ep rank's pool",
                         Field{&engine::EngineStats::DpRank::kv_blocks}},
              std::tuple{"dsinfer_dp_rank_requests_total", "counter",
                         "requests sent to each --ep rank (since the group last (re)started)",
                         Field{&engine::EngineStats::DpRank::requests}},
              std::tuple{"dsinfer_dp_rank_prefix_blocks", "gauge",
                         "prefix chain keys the front holds for each --ep rank (prefix "
                         "routing: the blocks it expects the rank's prefix cache to hold)",
                         Field{&engine::EngineStats::DpRank::prefix_blocks}}}) {
            header(&out, name, type, help);
            for (size_t r = 0; r < ranks.size(); ++r) {
                line(&out, std::string(name) + "{rank=\"" + std::to_string(r) + "\"}",
                     static_cast<double>(ranks[r].*field));
            }
        }
        for (const auto& [name, help, value] :
             {std::tuple{"dsinfer_dp_reruns_total",
                         "requests re-run on the healthy ranks after their rank died (S-DEPLOY)",
                         s.engine.dp_reruns},
              std::tuple{"dsinfer_dp_prefix_routed_total",
                         "requests sent to the --ep rank holding the longest prefix of the "
                         "prompt rather than the least-loaded one (--ep-dp-routing prefix)",
                         s.engine.dp_prefix_routed},
              std::tuple{"dsinfer_dp_prefix_matched_tokens_total",
                         "prompt tokens in full blocks the front expected the chosen --ep rank's "
                         "prefix cache to hold (dsinfer_prefix_hit_tokens_total: what the ranks "
                         "took)",
                         s.engine.dp_prefix_matched_tokens},
              std::tuple{"dsinfer_dp_prefix_overloaded_total",
                         "requests whose longest-prefix --ep rank was too loaded "
                         "(--ep-dp-balance-abs/-rel): sent to the least-loaded rank",
                         s.engine.dp_prefix_overloaded}}) {
            counter(&out, name, help, static_cast<double>(value));
        }
    }
    counter(&out, "dsinfer_store_hit_tokens_total", "prompt tokens taken from the KV store",
            static_cast<double>(s.engine.store_hit_tokens));
    counter(&out, "dsinfer_store_hit_blocks_total", "blocks fetched from the KV store and used",
            static_cast<double>(s.engine.store_hit_blocks));
    counter(&out, "dsinfer_store_miss_blocks_total",
            "blocks matched in the store's metadata but not usable (damaged, late)",
            static_cast<double>(s.engine.store_miss_blocks));
    counter(&out, "dsinfer_store_blocks_written_total", "blocks written behind to the KV store",
            static_cast<double>(s.engine.store_blocks_written));
    // SWA state cache (issue 16, docs/swa_cache.md): the hit rule per traffic class.
    using C = kv::SwaCacheClassCounters;
    const std::tuple<const char*, const char*, const char*, int64_t C::*> swa[] = {
        {"dsinfer_swa_requests_total", "counter", "admissions the SWA hit rule planned",
         &C::requests},
        {"dsinfer_swa_block_hits_total", "counter", "admissions with block KV reused (L1 > 0)",
         &C::block_hits},
        {"dsinfer_swa_block_hit_tokens_total", "counter", "block-KV hit tokens (L1)",
         &C::block_hit_tokens},
        {"dsinfer_swa_hit_tokens_total", "counter", "S-KV-10 hit tokens", &C::hit_tokens},
        {"dsinfer_swa_hits_total", "counter", "hits with an SWA state in [L1 - 128, L1]",
         &C::swa_hits},
        {"dsinfer_swa_exact_hits_total", "counter", "hits with an SWA state at L1",
         &C::swa_exact_hits},
        {"dsinfer_swa_catch_up_tokens_total", "counter",
         "tokens re-run exactly from the state at L1 - 128", &C::catch_up_tokens},
        {"dsinfer_swa_replays_total", "counter", "hits without an SWA state (replay)", &C::replays},
        {"dsinfer_swa_replay_tokens_total", "counter", "tokens of the replayed units",
         &C::replay_tokens},
        {"dsinfer_swa_pool_bytes", "gauge", "bytes of stored SWA states", &C::pool_bytes},
        {"dsinfer_swa_pool_evictions_total", "counter", "SWA states evicted (LRU)",
         &C::pool_evictions},
    };
    for (const auto& [name, type, help, field] : swa) {
        header(&out, name, type, help);
        for (int c = 0; c < kvstore::kNumTrafficClasses; ++c) {
            const auto tc = static_cast<kvstore::TrafficClass>(c);
            line(&out,
                 std::string(name) + "{traffic_class=\"" +
                     std::string(kvstore::traffic_class_name(tc)) + "\"}",
                 static_cast<double>(s.engine.swa.by_class[static_cast<size_t>(c)].*field));
        }
    }
    counter(&out, "dsinfer_swa_fallback_tokens_total",
            "tokens computed past the SWA hit rule's plan (exact replay from an older state)",
            static_cast<double>(s.engine.swa_fallback_tokens));
    counter(&out, "dsinfer_swa_states_stored_total", "SWA states put in the pool",
            static_cast<double>(s.engine.swa_states_stored));
    counter(&out, "dsinfer_swa_states_rejected_total",
            "SWA states refused at admission (damaged or gone: a miss)",
            static_cast<double>(s.engine.swa_states_rejected));
    // CED compact prefill per traffic class (the totals are their sums).
    using Y = engine::EngineStats::YocoClass;
    const std::tuple<const char*, const char*, int64_t Y::*> yoco[] = {
        {"dsinfer_yoco_decoder_tokens_total",
         "prompt tokens the decoder layers ran for (CED compact prefill: the kept tail)",
         &Y::decoder_tokens},
        {"dsinfer_yoco_decoder_skipped_tokens_total",
         "prompt tokens the decoder layers skipped (CED compact prefill)",
         &Y::decoder_skipped_tokens},
    };
    for (const auto& [name, help, field] : yoco) {
        header(&out, name, "counter", help);
        for (int c = 0; c < kvstore::kNumTrafficClasses; ++c) {
            const auto tc = static_cast<kvstore::TrafficClass>(c);
            line(&out,
                 std::string(name) + "{traffic_class=\"" +
                     std::string(kvstore::traffic_class_name(tc)) + "\"}",
                 static_cast<double>(s.engine.yoco_by_class[static_cast<size_t>(c)].*field));
        }
    }
    return out;
}

}  // namespace dsi::server
