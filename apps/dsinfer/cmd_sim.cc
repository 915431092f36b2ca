// `dsinfer sim` (trace-driven cluster simulator) and `dsinfer capacity` (capacity
// arithmetic as JSON). Flag parsing only; the work is in sim/ and cluster/.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/settings.h"
#include "cluster/capacity.h"
#include "sim/simulator.h"
#include "sim/step_fit.h"
#include "workload/trace.h"

namespace dsi {
namespace {

struct SimFlags {
    std::string trace;
    int64_t synthetic_requests = 0;
    double synthetic_rate = 100;
    double synthetic_long_fraction = 0.01;
    uint64_t seed = 1;
    std::string write_trace;
    std::string cluster;
    int num_prefill = 0;
    int num_decode = 0;
    std::string prefill_policy = "deepseek";
    std::string decode_policy = "deepseek";
    std::string store = "shared";
    int64_t store_capacity_tokens = -1;
    double store_ttl_s = -1;
    double load = 0;
    double time_scale = 1.0;
    double prefill_quota_ms = 0;  // 0: SimOptions' bucket quotas
    double price = -1;
    // Operations (S-DEPLOY); the cluster file's "operations" section says more.
    int decode_ep_size = 0;
    double drain_at_s = -1;
    int drain_instance = -1;
    double fail_at_s = -1;
    int fail_instance = 0;
    int fail_devices = 1;
    bool autoscale = false;
    // Step costs fitted to live engines' step records (sim/step_fit.h).
    std::string step_fit;           // overlay applied over --cluster
    std::string fit_prefill_steps;  // fit mode: a prefill engine's --step-log
    std::string fit_decode_steps;   // and a decode engine's
    std::string fit_out;            // where the fitted overlay goes
    // Per-request and per-decode-step records of the run (JSON lines).
    std::string records_out;
    std::string decode_steps_out;
};

// The run's per-request and per-decode-step records as JSON lines (SimOptions::keep_records).
Status write_sim_records(Env* env, const SimFlags& f, const sim::SimResult& r) {
    if (!f.records_out.empty()) {
        std::string text;
        for (const sim::SimRequestRecord& q : r.requests) {
            text += nlohmann::json{{"index", q.index},
                                   {"prompt_tokens", q.prompt_tokens},
                                   {"output_tokens", q.output_tokens},
                                   {"hit_tokens", q.hit_tokens},
                                   {"arrival_ns", q.arrival_ns},
                                   {"first_token_ns", q.first_token_ns},
                                   {"decode_arrive_ns", q.decode_arrive_ns},
                                   {"second_token_ns", q.second_token_ns},
                                   {"finish_ns", q.finish_ns},
                                   {"prefill_engine", q.prefill_engine},
                                   {"decode_engine", q.decode_engine}}
                        .dump();
            text += '\n';
        }
        DSI_RETURN_IF_ERROR(env->write_file(f.records_out, text));
    }
    if (!f.decode_steps_out.empty()) {
        std::string text;
        for (const sim::SimDecodeStep& d : r.decode_steps) {
            text += nlohmann::json{{"engine", d.engine},     {"start_ns", d.start_ns},
                                   {"end_ns", d.end_ns},     {"running", d.running},
                                   {"joining", d.joining},   {"kv_tokens", d.kv_tokens},
                                   {"join_ns", d.join_ns}}
                        .dump();
            text += '\n';
        }
        DSI_RETURN_IF_ERROR(env->write_file(f.decode_steps_out, text));
    }
    return Status::ok();
}

nlohmann::json dist_json(const sim::Distribution& d) {
    return {{"mean", d.mean}, {"p50", d.p50}, {"p90", d.p90}, {"p99", d.p99}, {"max", d.max}};
}

nlohmann::json result_json(const sim::SimResult& r) {
    double pu = 0;
    double du = 0;
    for (double u : r.prefill_utilisation) pu += u / r.prefill_utilisation.size();
    for (double u : r.decode_utilisation) du += u / r.decode_utilisation.size();
    return {{"requests", r.num_requests},
            {"finished", r.num_finished},
            {"time_scale", r.time_scale},
            {"makespan_s", r.makespan_s},
            {"ttft_ms", dist_json(r.ttft_ms)},
            {"tpot_ms", dist_json(r.tpot_ms)},
            {"input_tokens_per_s", r.input_tokens_per_s},
            {"output_tokens_per_s", r.output_tokens_per_s},
            {"hit_rate", r.hit_rate},
            {"prefill_utilisation", r.prefill_utilisation},
            {"decode_utilisation", r.decode_utilisation},
            {"prefill_utilisation_mean", pu},
            {"decode_utilisation_mean", du},
            {"lb_efficiency", r.lb_efficiency},
            {"prefill_lb_efficiency", r.prefill_lb_efficiency},
            {"decode_lb_efficiency", r.decode_lb_efficiency},
            {"cost_per_million_tokens_usd", r.cost_per_million_tokens},
            {"bucket_requests", r.bucket_requests},
            {"prefill_reassignments", r.prefill_reassignments},
            {"conservation_ok", r.conservation_ok},
            {"events", r.events},
            {"device_hours", r.device_hours},
            {"operations",
             {{"drains_completed", r.drains_completed},
              {"migrated_requests", r.migrated_requests},
              {"migrated_kv_tokens", r.migrated_kv_tokens},
              {"failures", r.failures},
              {"restart_ep_sizes", r.restart_ep_sizes},
              {"rerouted_requests", r.rerouted_requests},
              {"rerouted_context_tokens", r.rerouted_context_tokens},
              {"rerouted_hit_tokens", r.rerouted_hit_tokens},
              {"lost_step_tokens", r.lost_step_tokens},
              {"scale_out_decisions", r.scale_out_decisions},
              {"scale_in_decisions", r.scale_in_decisions},
              {"scale_in_blocked_by_utilisation", r.scale_in_blocked_by_utilisation},
              {"online_prefill_min_max", {r.min_online_prefill, r.max_online_prefill}},
              {"online_decode_instances_min_max",
               {r.min_online_decode_instances, r.max_online_decode_instances}}}}};
}

// Prints `s` to stderr; returns `rc`.
int report(const Status& s, int rc) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return rc;
}

// --cluster (defaults without), then the --step-fit overlay over it.
Result<sim::ClusterDescription> load_cluster(Env* env, const SimFlags& f) {
    sim::ClusterDescription c;
    for (const std::string& path : {f.cluster, f.step_fit}) {
        if (path.empty()) continue;
        Result<std::string> text = env->read_file(path);
        if (!text.is_ok()) return text.status();
        Result<sim::ClusterDescription> r = sim::apply_cluster_description(*text, c);
        if (!r.is_ok()) return r.status().with_context(path);
        c = std::move(r).value();
    }
    return c;
}

// Fit mode: the step costs of a live prefill and decode engine (their --step-log), with
// --cluster's prefill_cost as the calibration the prefill steps are scaled against.
int run_fit(Env* env, const SimFlags& f, const sim::ClusterDescription& cluster) {
    std::vector<engine::StepRecord> logs[2];
    const std::string* paths[2] = {&f.fit_prefill_steps, &f.fit_decode_steps};
    for (int i = 0; i < 2; ++i) {
        Result<std::string> text = env->read_file(*paths[i]);
        Result<std::vector<engine::StepRecord>> r =
            text.is_ok() ? sim::parse_step_log(*text)
                         : Result<std::vector<engine::StepRecord>>(text.status());
        if (!r.is_ok()) return report(r.status().with_context(*paths[i]), 2);
        logs[i] = std::move(r).value();
    }
    Result<sim::StepCostFit> fit = sim::fit_step_costs(logs[0], logs[1], cluster.prefill_cost);
    if (!fit.is_ok()) return report(fit.status(), 2);
    if (!f.fit_out.empty()) {
        Status st = env->write_file(f.fit_out, sim::step_fit_overlay_json(*fit));
        if (!st.is_ok()) return report(st, 1);
    }
    const nlohmann::json out = {{"prefill",
                                 {{"steps", fit->num_prefill_steps},
                                  {"step_overhead_ns", fit->prefill_step_overhead_ns},
                                  {"base_ns", fit->prefill_time_cost.base_ns},
                                  {"per_q_ns", fit->prefill_time_cost.per_q_ns},
                                  {"per_qq_ns", fit->prefill_time_cost.per_qq_ns},
                                  {"wall_over_calibration", fit->prefill_wall_over_calibration},
                                  {"cpu_over_calibration", fit->prefill_cpu_over_calibration},
                                  {"wall_over_cpu", fit->prefill_wall_over_cpu},
                                  {"mean_rel_error", fit->prefill_mean_rel_error}}},
                                {"decode",
                                 {{"steps", fit->num_decode_steps},
                                  {"base_ns", fit->decode_base_ns},
                                  {"per_request_ns", fit->decode_per_request_ns},
                                  {"per_kv_token_ns", fit->decode_per_kv_token_ns},
                                  {"wall_over_cpu", fit->decode_wall_over_cpu},
                                  {"mean_rel_error", fit->decode_mean_rel_error}}},
                                {"out", f.fit_out}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
}

int run_sim(const SimFlags& f) {
    Env* env = Env::default_env();
    Result<sim::ClusterDescription> loaded = load_cluster(env, f);
    if (!loaded.is_ok()) return report(loaded.status(), 2);
    sim::ClusterDescription cluster = std::move(loaded).value();
    if (!f.fit_prefill_steps.empty() || !f.fit_decode_steps.empty()) {
        return run_fit(env, f, cluster);
    }
    Result<workload::Trace> trace = invalid_argument("sim: give --trace PATH or --synthetic-requests N");
    if (!f.trace.empty()) {
        trace = workload::load_trace(env, f.trace);
    } else if (f.synthetic_requests > 0) {
        workload::SyntheticTraceSettings s;
        s.num_requests = f.synthetic_requests;
        s.rate_per_s = f.synthetic_rate;
        s.long_context_fraction = f.synthetic_long_fraction;
        s.seed = f.seed;
        trace = workload::generate_synthetic_trace(s);
    }
    if (!trace.is_ok()) {
        std::fprintf(stderr, "%s\n", trace.status().to_string().c_str());
        return 2;
    }
    if (!f.write_trace.empty()) {
        Status st = env->write_file(f.write_trace, workload::to_mooncake_jsonl(*trace));
        if (!st.is_ok()) {
            std::fprintf(stderr, "%s\n", st.to_string().c_str());
            return 1;
        }
    }
    if (f.num_prefill > 0) cluster.num_prefill = f.num_prefill;
    if (f.num_decode > 0) cluster.num_decode = f.num_decode;
    if (f.store_capacity_tokens >= 0) cluster.store_capacity_tokens = f.store_capacity_tokens;
    if (f.store_ttl_s >= 0) cluster.store_ttl_ns = static_cast<int64_t>(f.store_ttl_s * 1e9);
    if (f.price >= 0) cluster.price_per_device_hour = f.price;
    sim::OperationsSettings& ops = cluster.operations;
    if (f.decode_ep_size > 0) ops.decode_ep_size = f.decode_ep_size;
    const int instances = cluster.num_decode / std::max(1, cluster.decode_ep());
    if (f.drain_at_s >= 0) {
        ops.drains.push_back({f.drain_at_s, f.drain_instance >= 0 ? f.drain_instance : instances - 1});
    }
    if (f.fail_at_s >= 0) {
        ops.failures.push_back({f.fail_at_s, f.fail_instance, f.fail_devices});
    }
    ops.autoscale = ops.autoscale || f.autoscale;

    std::vector<std::string> prefill_policies = {f.prefill_policy};
    const bool want_records = !f.records_out.empty() || !f.decode_steps_out.empty();
    if (f.prefill_policy == "all") {
        if (want_records) {
            std::fprintf(stderr,
                         "INVALID_ARGUMENT: --records-out / --decode-steps-out record one run: "
                         "give one --prefill-policy, not all\n");
            return 2;
        }
        prefill_policies = {"deepseek", "round-robin", "least-loaded", "prefix-affinity"};
    }
    nlohmann::json runs = nlohmann::json::array();
    for (const std::string& pp : prefill_policies) {
        auto pr = sim::parse_prefill_routing(pp);
        const bool baseline_all = f.prefill_policy == "all";
        // With --prefill-policy all, each baseline pairs with its natural decode router
        // and store: DeepSeek with its own; the baselines with least loaded (round robin
        // with round robin); prefix affinity with per-engine caches.
        std::string dp = f.decode_policy;
        std::string store = f.store;
        if (baseline_all && pp != "deepseek") {
            dp = pp == "round-robin" ? "round-robin" : "least-loaded";
            store = pp == "prefix-affinity" ? "per-engine" : "shared";
        }
        auto dr = sim::parse_decode_routing(dp);
        if (!pr.is_ok() || !dr.is_ok() || (store != "shared" && store != "per-engine")) {
            std::fprintf(stderr, "%s\n",
                         !pr.is_ok()   ? pr.status().to_string().c_str()
                         : !dr.is_ok() ? dr.status().to_string().c_str()
                                       : "INVALID_ARGUMENT: --store shared|per-engine");
            return 2;
        }
        sim::SimOptions o;
        o.prefill_routing = *pr;
        o.decode_routing = *dr;
        o.store = store == "shared" ? sim::StoreKind::kShared : sim::StoreKind::kPerEngine;
        o.target_load = f.load;
        o.time_scale = f.time_scale;
        o.keep_records = want_records;
        if (f.prefill_quota_ms > 0) {
            // As `dsinfer router --prefill-quota-ms`: the buckets' quotas are q, 2q, 4q, 5q.
            const double q = f.prefill_quota_ms * 1e6;
            o.prefill_lb.bucket_quota_ns = {q, 2 * q, 4 * q, 5 * q};
        }
        const int64_t t0 = env->now_ns();
        auto r = sim::simulate(*trace, cluster, o);
        const double wall_s = (env->now_ns() - t0) / 1e9;
        if (!r.is_ok()) {
            std::fprintf(stderr, "%s\n", r.status().to_string().c_str());
            return 2;
        }
        if (Status st = write_sim_records(env, f, *r); !st.is_ok()) {
            std::fprintf(stderr, "%s\n", st.to_string().c_str());
            return 1;
        }
        nlohmann::json j = result_json(*r);
        j["prefill_policy"] = pp;
        j["decode_policy"] = dp;
        j["store"] = store;
        j["wall_s"] = wall_s;
        j["requests_per_wall_minute"] = wall_s > 0 ? r->num_requests / wall_s * 60 : 0.0;
        runs.push_back(j);
    }
    nlohmann::json out = {{"trace", trace->source},
                          {"cluster",
                           {{"device", cluster.device},
                            {"num_prefill", cluster.num_prefill},
                            {"num_decode", cluster.num_decode},
                            {"decode_ep_size", cluster.decode_ep()},
                            {"operations_enabled", cluster.operations.enabled()},
                            {"store_capacity_tokens", cluster.store_capacity_tokens},
                            {"store_ttl_ns", cluster.store_ttl_ns},
                            {"price_per_device_hour", cluster.price_per_device_hour}}},
                          {"runs", runs}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
}

struct CapacityFlags {
    int64_t devices = 128;
    int swa_layers = 20;
    double tokens_per_day = 155e12;  // S-SCALE
    double tokens_per_s_per_device = 0;
};

int run_capacity(const CapacityFlags& f) {
    cluster::CapacitySettings s;
    s.swa_stored_layers = f.swa_layers;
    auto store = cluster::store_servers_for_devices(s, f.devices);
    if (!store.is_ok()) {
        std::fprintf(stderr, "%s\n", store.status().to_string().c_str());
        return 2;
    }
    nlohmann::json out = {
        {"swa_state_bytes_per_sequence", cluster::swa_state_bytes_per_sequence(s)},
        {"swa_formula", std::to_string(s.swa_stored_layers) + " layers x " +
                            std::to_string(s.swa_tokens) + " tokens x " +
                            std::to_string(s.swa_bytes_per_token) + " B"},
        {"devices", f.devices},
        {"store",
         {{"logical_bytes", store->logical_bytes},
          {"raw_bytes_with_erasure_coding", store->raw_bytes},
          {"server_raw_bytes", store->server_raw_bytes},
          {"servers", store->servers},
          {"erasure_coding", std::to_string(s.ec_data) + "+" + std::to_string(s.ec_parity)}}}};
    if (f.tokens_per_s_per_device > 0) {
        auto need = cluster::devices_for_tokens_per_day(f.tokens_per_day, f.tokens_per_s_per_device);
        auto have = cluster::tokens_per_day_for_devices(f.devices, f.tokens_per_s_per_device);
        if (!need.is_ok() || !have.is_ok()) {
            std::fprintf(stderr, "%s\n", need.status().to_string().c_str());
            return 2;
        }
        out["tokens_per_day"] = f.tokens_per_day;
        out["tokens_per_s_per_device"] = f.tokens_per_s_per_device;
        out["devices_for_tokens_per_day"] = *need;
        out["tokens_per_day_of_devices"] = *have;
    }
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
}

}  // namespace

void register_sim_commands(CLI::App& app) {
    auto sf = std::make_shared<SimFlags>();
    CLI::App* sim = app.add_subcommand("sim", "trace-driven cluster simulator (JSON to stdout)");
    add_setting(*sim, "--trace", sf->trace, "trace file: Mooncake .jsonl or Azure .csv");
    add_setting(*sim, "--synthetic-requests", sf->synthetic_requests,
                "generate a synthetic trace of N requests instead");
    add_setting(*sim, "--synthetic-rate", sf->synthetic_rate, "synthetic arrivals per second");
    add_setting(*sim, "--synthetic-long-fraction", sf->synthetic_long_fraction,
                "share of synthetic requests with 256K..1M tokens");
    add_setting(*sim, "--seed", sf->seed, "synthetic trace seed");
    add_setting(*sim, "--write-trace", sf->write_trace, "also write the trace as Mooncake JSONL");
    add_setting(*sim, "--cluster", sf->cluster, "cluster description JSON (defaults: 64+64)");
    add_setting(*sim, "--num-prefill", sf->num_prefill, "override prefill engines");
    add_setting(*sim, "--num-decode", sf->num_decode, "override decode engines");
    add_setting(*sim, "--prefill-policy", sf->prefill_policy,
                "deepseek|round-robin|least-loaded|prefix-affinity|all");
    add_setting(*sim, "--decode-policy", sf->decode_policy, "deepseek|round-robin|least-loaded");
    add_setting(*sim, "--store", sf->store, "shared|per-engine KV store");
    add_setting(*sim, "--store-capacity-tokens", sf->store_capacity_tokens,
                "store capacity (0 = unlimited, -1 = from --cluster)");
    add_setting(*sim, "--store-ttl-s", sf->store_ttl_s, "store TTL seconds (0 = none, -1 = from --cluster)");
    add_setting(*sim, "--load", sf->load,
                "scale arrivals so the busier stage sees this share of ideal capacity (0 = off)");
    add_setting(*sim, "--time-scale", sf->time_scale, "multiply arrival times (when --load is 0)");
    add_setting(*sim, "--prefill-quota-ms", sf->prefill_quota_ms,
                "S-LB prefill quota of the shortest-prompt bucket, as `dsinfer router "
                "--prefill-quota-ms` (the others 2x, 4x, 5x; 0: the simulator's 1 / 2 / 4 / 5 s)");
    add_setting(*sim, "--price", sf->price, "USD per device-hour (-1 = from --cluster)");
    add_setting(*sim, "--decode-ep-size", sf->decode_ep_size,
                "decode ranks per EP instance (0 = from --cluster; default all in one)");
    add_setting(*sim, "--drain-at-s", sf->drain_at_s,
                "drain a decode instance at this simulated second (-1 = none)");
    add_setting(*sim, "--drain-instance", sf->drain_instance,
                "which decode instance --drain-at-s drains (-1 = the last)");
    add_setting(*sim, "--fail-at-s", sf->fail_at_s,
                "fail devices of a decode instance at this simulated second (-1 = none)");
    add_setting(*sim, "--fail-instance", sf->fail_instance, "decode instance --fail-at-s hits");
    add_setting(*sim, "--fail-devices", sf->fail_devices, "devices that fail at --fail-at-s");
    add_setting(*sim, "--step-fit", sf->step_fit,
                "step costs fitted to live engines (`--fit-out`), applied over --cluster");
    add_setting(*sim, "--fit-prefill-steps", sf->fit_prefill_steps,
                "fit mode: a live prefill engine's `serve --step-log`; the step costs are fitted "
                "against --cluster's prefill_cost and printed (no simulation)");
    add_setting(*sim, "--fit-decode-steps", sf->fit_decode_steps,
                "fit mode: a live decode engine's `serve --step-log`");
    add_setting(*sim, "--fit-out", sf->fit_out,
                "fit mode: write the fitted step costs here (a cluster-description overlay for "
                "--step-fit)");
    add_setting(*sim, "--records-out", sf->records_out,
                "write one JSON line per request (arrival, first token out of prefill, at the "
                "decode engine, second token, finish; ns from the first arrival)");
    add_setting(*sim, "--decode-steps-out", sf->decode_steps_out,
                "write one JSON line per decode step (engine, start, end, running, joining, "
                "KV tokens, the joiners' recompute ns)");
    add_switch(*sim, "--autoscale", sf->autoscale,
               "autoscale prefill engines and decode instances (settings: --cluster "
               "operations.autoscaler)");
    sim->callback([sf] {
        if (const int rc = run_sim(*sf); rc != 0) {
            throw CLI::RuntimeError(rc);
        }
    });

    auto cf = std::make_shared<CapacityFlags>();
    CLI::App* cap = app.add_subcommand("capacity", "capacity arithmetic of the deployment (JSON)");
    add_setting(*cap, "--devices", cf->devices, "online devices");
    add_setting(*cap, "--swa-layers", cf->swa_layers, "layers whose SWA state is stored");
    add_setting(*cap, "--tokens-per-day", cf->tokens_per_day, "tokens per day to serve");
    add_setting(*cap, "--tokens-per-s-per-device", cf->tokens_per_s_per_device,
                "throughput of one device (enables tokens/day <-> devices)");
    cap->callback([cf] {
        if (const int rc = run_capacity(*cf); rc != 0) {
            throw CLI::RuntimeError(rc);
        }
    });
}

}  // namespace dsi
