// Cluster description (JSON) and policy names of the simulator (sim/simulator.h).
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "sim/simulator.h"

namespace dsi::sim {

namespace {

template <typename T>
Status num(const nlohmann::json& v, const std::string& key, T& out) {
    if (!v.is_number()) {
        return invalid_argument("cluster description: \"" + key + "\" must be a number");
    }
    if constexpr (std::is_integral_v<T>) {
        if (!v.is_number_integer()) {
            return invalid_argument("cluster description: \"" + key + "\" must be an integer");
        }
        const double d = v.get<double>();
        if (d < static_cast<double>(std::numeric_limits<T>::min()) ||
            d > static_cast<double>(std::numeric_limits<T>::max())) {
            return invalid_argument("cluster description: \"" + key + "\" is out of range");
        }
        out = v.get<T>();
    } else {
        out = v.get<T>();
    }
    return Status::ok();
}

Status boolean(const nlohmann::json& v, const std::string& key, bool& out) {
    if (!v.is_boolean()) {
        return invalid_argument("cluster description: \"" + key + "\" must be true or false");
    }
    out = v.get<bool>();
    return Status::ok();
}

Status seconds_to_ns(const nlohmann::json& v, const std::string& key, int64_t& out_ns) {
    double s = 0;
    DSI_RETURN_IF_ERROR(num(v, key, s));
    if (!(s >= 0) || s > 1e9) {
        return invalid_argument("cluster description: \"" + key + "\" must be in 0..1e9 s");
    }
    out_ns = static_cast<int64_t>(s * 1e9);
    return Status::ok();
}

// {"base_ns", "per_q_ns", "per_c_ns", "per_qc_ns", "per_qq_ns"}, any of them, over `m`.
Status parse_cost_model(const nlohmann::json& v, const std::string& name,
                        engine::PrefillCostModel& m) {
    if (!v.is_object()) {
        return invalid_argument("cluster description: \"" + name + "\" must be an object");
    }
    for (const auto& [k, v2] : v.items()) {
        double* dst = k == "base_ns"     ? &m.base_ns
                      : k == "per_q_ns"  ? &m.per_q_ns
                      : k == "per_c_ns"  ? &m.per_c_ns
                      : k == "per_qc_ns" ? &m.per_qc_ns
                      : k == "per_qq_ns" ? &m.per_qq_ns
                                         : nullptr;
        if (dst == nullptr) {
            return invalid_argument("cluster description: unknown key " + name + "." + k);
        }
        DSI_RETURN_IF_ERROR(num(v2, name + "." + k, *dst));
    }
    return Status::ok();
}

Status parse_autoscaler(const nlohmann::json& j, cluster::AutoscalerSettings& a) {
    if (!j.is_object()) {
        return invalid_argument("cluster description: \"operations.autoscaler\" must be an object");
    }
    for (const auto& [k, v] : j.items()) {
        const std::string key = "operations.autoscaler." + k;
        if (k == "prefill_missed_tokens_per_s_per_instance") {
            DSI_RETURN_IF_ERROR(num(v, key, a.prefill_missed_tokens_per_s_per_instance));
        } else if (k == "decode_requests_per_instance") {
            DSI_RETURN_IF_ERROR(num(v, key, a.decode_requests_per_instance));
        } else if (k == "headroom") {
            DSI_RETURN_IF_ERROR(num(v, key, a.headroom));
        } else if (k == "min_prefill") {
            DSI_RETURN_IF_ERROR(num(v, key, a.min_prefill));
        } else if (k == "max_prefill") {
            DSI_RETURN_IF_ERROR(num(v, key, a.max_prefill));
        } else if (k == "min_decode") {
            DSI_RETURN_IF_ERROR(num(v, key, a.min_decode));
        } else if (k == "max_decode") {
            DSI_RETURN_IF_ERROR(num(v, key, a.max_decode));
        } else if (k == "max_step_instances") {
            DSI_RETURN_IF_ERROR(num(v, key, a.max_step_instances));
        } else if (k == "scale_out_interval_s") {
            DSI_RETURN_IF_ERROR(seconds_to_ns(v, key, a.scale_out_interval_ns));
        } else if (k == "scale_in_interval_s") {
            DSI_RETURN_IF_ERROR(seconds_to_ns(v, key, a.scale_in_interval_ns));
        } else if (k == "scale_in_max_utilisation") {
            DSI_RETURN_IF_ERROR(num(v, key, a.scale_in_max_utilisation));
        } else if (k == "spare_pool_target") {
            DSI_RETURN_IF_ERROR(num(v, key, a.spare_pool_target));
        } else {
            return invalid_argument("cluster description: unknown key " + key);
        }
    }
    return Status::ok();
}

// [{"at_s": T, "instance": I, ...}, ...]; `extra` reads further keys of one entry.
template <typename Entry, typename Extra>
Status parse_events(const nlohmann::json& j, const std::string& name, std::vector<Entry>& out,
                    Extra extra) {
    if (!j.is_array()) {
        return invalid_argument("cluster description: \"operations." + name + "\" must be an array");
    }
    for (const auto& item : j) {
        if (!item.is_object()) {
            return invalid_argument("cluster description: operations." + name +
                                    " entries must be objects");
        }
        Entry e;
        for (const auto& [k, v] : item.items()) {
            const std::string key = "operations." + name + "." + k;
            if (k == "at_s") {
                DSI_RETURN_IF_ERROR(num(v, key, e.at_s));
            } else if (k == "instance") {
                DSI_RETURN_IF_ERROR(num(v, key, e.instance));
            } else {
                DSI_RETURN_IF_ERROR(extra(k, v, key, e));
            }
        }
        out.push_back(e);
    }
    return Status::ok();
}

Status parse_operations(const nlohmann::json& j, OperationsSettings& o) {
    if (!j.is_object()) {
        return invalid_argument("cluster description: \"operations\" must be an object");
    }
    for (const auto& [k, v] : j.items()) {
        const std::string key = "operations." + k;
        if (k == "decode_ep_size") {
            DSI_RETURN_IF_ERROR(num(v, key, o.decode_ep_size));
        } else if (k == "drain_grace_s") {
            DSI_RETURN_IF_ERROR(num(v, key, o.drain_grace_s));
        } else if (k == "restart_s") {
            DSI_RETURN_IF_ERROR(num(v, key, o.restart_s));
        } else if (k == "min_ep_size") {
            DSI_RETURN_IF_ERROR(num(v, key, o.min_ep_size));
        } else if (k == "num_logical_experts") {
            DSI_RETURN_IF_ERROR(num(v, key, o.num_logical_experts));
        } else if (k == "redundant_experts_per_rank") {
            DSI_RETURN_IF_ERROR(num(v, key, o.redundant_experts_per_rank));
        } else if (k == "decision_interval_s") {
            DSI_RETURN_IF_ERROR(num(v, key, o.decision_interval_s));
        } else if (k == "provision_s") {
            DSI_RETURN_IF_ERROR(num(v, key, o.provision_s));
        } else if (k == "initial_prefill") {
            DSI_RETURN_IF_ERROR(num(v, key, o.initial_prefill));
        } else if (k == "initial_decode_instances") {
            DSI_RETURN_IF_ERROR(num(v, key, o.initial_decode_instances));
        } else if (k == "initial_spare") {
            DSI_RETURN_IF_ERROR(num(v, key, o.initial_spare));
        } else if (k == "autoscale") {
            DSI_RETURN_IF_ERROR(boolean(v, key, o.autoscale));
        } else if (k == "autoscaler") {
            DSI_RETURN_IF_ERROR(parse_autoscaler(v, o.autoscaler));
        } else if (k == "drains") {
            DSI_RETURN_IF_ERROR(parse_events(
                v, k, o.drains,
                [](const std::string&, const nlohmann::json&, const std::string& what,
                   DecodeDrainAt&) -> Status {
                    return invalid_argument("cluster description: unknown key " + what);
                }));
        } else if (k == "failures") {
            DSI_RETURN_IF_ERROR(parse_events(
                v, k, o.failures,
                [](const std::string& name, const nlohmann::json& val, const std::string& what,
                   DeviceFailureAt& e) -> Status {
                    if (name == "devices") {
                        return num(val, what, e.devices);
                    }
                    return invalid_argument("cluster description: unknown key " + what);
                }));
        } else {
            return invalid_argument("cluster description: unknown key " + key);
        }
    }
    return Status::ok();
}

}  // namespace

Status OperationsSettings::validate(int num_prefill, int num_decode) const {
    if (decode_ep_size < 0 || (decode_ep_size > 0 && num_decode % decode_ep_size != 0)) {
        return invalid_argument("operations: decode_ep_size must divide num_decode");
    }
    const int ep = decode_ep_size > 0 ? decode_ep_size : num_decode;
    const int instances = num_decode / ep;
    if (!(drain_grace_s >= 0) || !(restart_s >= 0) || !(provision_s >= 0) ||
        drain_grace_s > 1e7 || restart_s > 1e7 || provision_s > 1e7 ||
        !(decision_interval_s >= 0.001) || decision_interval_s > 1e7) {
        return invalid_argument("operations: grace, restart and provision times must be in "
                                "0..1e7 s, decision_interval_s in 0.001..1e7 s");
    }
    if (min_ep_size < 1 || num_logical_experts < 1 || redundant_experts_per_rank < 0) {
        return invalid_argument("operations: min_ep_size and num_logical_experts must be >= 1");
    }
    if (initial_prefill < 0 || initial_prefill > num_prefill || initial_decode_instances < 0 ||
        initial_decode_instances > instances || initial_spare < 0 || initial_spare > 100000) {
        return invalid_argument("operations: initial counts must be within the cluster");
    }
    for (const DecodeDrainAt& d : drains) {
        if (!(d.at_s >= 0) || d.at_s > 1e9 || d.instance < 0 || d.instance >= instances) {
            return invalid_argument("operations: drain needs at_s >= 0 and an instance in 0.." +
                                    std::to_string(instances - 1));
        }
    }
    for (const DeviceFailureAt& f : failures) {
        if (!(f.at_s >= 0) || f.at_s > 1e9 || f.instance < 0 || f.instance >= instances ||
            f.devices < 1 || f.devices > ep) {
            return invalid_argument("operations: failure needs at_s >= 0, an instance in 0.." +
                                    std::to_string(instances - 1) + " and devices in 1.." +
                                    std::to_string(ep));
        }
    }
    if (autoscale) {
        DSI_RETURN_IF_ERROR(autoscaler.validate());
    }
    return Status::ok();
}

Status ClusterDescription::validate() const {
    DSI_RETURN_IF_ERROR(prefill_cost.validate());
    if (num_prefill < 1 || num_decode < 1 || num_prefill > 100000 || num_decode > 100000) {
        return invalid_argument("cluster: num_prefill and num_decode must be in 1..100000");
    }
    const double positive[] = {decode_base_ns + decode_per_request_ns, kv_bytes_per_token,
                               p2d_bytes_per_s, store_read_bytes_per_s};
    for (double v : positive) {
        if (!(v > 0) || !std::isfinite(v)) {
            return invalid_argument("cluster: decode step cost, KV bytes and bandwidths must be > 0");
        }
    }
    if (prefill_step_overhead_ns < 0 || decode_base_ns < 0 || decode_per_request_ns < 0 ||
        decode_per_kv_token_ns < 0 || price_per_device_hour < 0) {
        return invalid_argument("cluster: costs and price must be >= 0");
    }
    if (decode_max_batch < 1 || decode_kv_capacity_tokens < 1) {
        return invalid_argument("cluster: decode_max_batch and KV capacity must be >= 1");
    }
    if (store_capacity_tokens < 0 || store_ttl_ns < 0) {
        return invalid_argument("cluster: store capacity and TTL must be >= 0");
    }
    if (prefill_time_cost.has_value()) {
        DSI_RETURN_IF_ERROR(prefill_time_cost->validate());
    }
    if (decode_join_recompute_block < 0) {
        return invalid_argument("cluster: decode_join_recompute_block must be >= 0");
    }
    if (prefill_lb_cost.has_value()) {
        DSI_RETURN_IF_ERROR(prefill_lb_cost->validate());
    }
    for (double v : {prefill_dispatch_ns, prefill_release_ns, p2d_latency_ns}) {
        if (!(v >= 0) || v > 1e12) {
            return invalid_argument(
                "cluster: prefill_dispatch_ns, prefill_release_ns and p2d_latency_ns must be in "
                "0..1e12");
        }
    }
    return operations.validate(num_prefill, num_decode);
}

Result<ClusterDescription> parse_cluster_description(std::string_view json) {
    return apply_cluster_description(json, ClusterDescription{});
}

Result<ClusterDescription> apply_cluster_description(std::string_view json, ClusterDescription c) {
    nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
        return invalid_argument("cluster description: not a JSON object");
    }
    for (const auto& [key, v] : j.items()) {
        if (key == "device") {
            if (!v.is_string()) {
                return invalid_argument("cluster description: \"device\" must be a string");
            }
            c.device = v.get<std::string>();
        } else if (key == "num_prefill") {
            DSI_RETURN_IF_ERROR(num(v, key, c.num_prefill));
        } else if (key == "num_decode") {
            DSI_RETURN_IF_ERROR(num(v, key, c.num_decode));
        } else if (key == "prefill_step_overhead_ns") {
            DSI_RETURN_IF_ERROR(num(v, key, c.prefill_step_overhead_ns));
        } else if (key == "decode_base_ns") {
            DSI_RETURN_IF_ERROR(num(v, key, c.decode_base_ns));
        } else if (key == "decode_per_request_ns") {
            DSI_RETURN_IF_ERROR(num(v, key, c.decode_per_request_ns));
        } else if (key == "decode_per_kv_token_ns") {
            DSI_RETURN_IF_ERROR(num(v, key, c.decode_per_kv_token_ns));
        } else if (key == "decode_max_batch") {
            DSI_RETURN_IF_ERROR(num(v, key, c.decode_max_batch));
        } else if (key == "decode_join_recompute_block") {
            DSI_RETURN_IF_ERROR(num(v, key, c.decode_join_recompute_block));
        } else if (key == "decode_kv_capacity_tokens") {
            DSI_RETURN_IF_ERROR(num(v, key, c.decode_kv_capacity_tokens));
        } else if (key == "kv_bytes_per_token") {
            DSI_RETURN_IF_ERROR(num(v, key, c.kv_bytes_per_token));
        } else if (key == "p2d_bytes_per_s") {
            DSI_RETURN_IF_ERROR(num(v, key, c.p2d_bytes_per_s));
        } else if (key == "store_read_bytes_per_s") {
            DSI_RETURN_IF_ERROR(num(v, key, c.store_read_bytes_per_s));
        } else if (key == "store_capacity_tokens") {
            DSI_RETURN_IF_ERROR(num(v, key, c.store_capacity_tokens));
        } else if (key == "store_ttl_ns") {
            DSI_RETURN_IF_ERROR(num(v, key, c.store_ttl_ns));
        } else if (key == "price_per_device_hour") {
            DSI_RETURN_IF_ERROR(num(v, key, c.price_per_device_hour));
        } else if (key == "prefill_cost") {
            DSI_RETURN_IF_ERROR(parse_cost_model(v, key, c.prefill_cost));
        } else if (key == "prefill_time_cost") {
            // Over the chunking model's coefficients: an overlay may give some only.
            engine::PrefillCostModel m = c.prefill_time_cost.value_or(c.prefill_cost);
            DSI_RETURN_IF_ERROR(parse_cost_model(v, key, m));
            c.prefill_time_cost = m;
        } else if (key == "prefill_lb_cost") {
            engine::PrefillCostModel m = c.prefill_lb_cost.value_or(c.prefill_cost);
            DSI_RETURN_IF_ERROR(parse_cost_model(v, key, m));
            c.prefill_lb_cost = m;
        } else if (key == "prefill_dispatch_ns") {
            DSI_RETURN_IF_ERROR(num(v, key, c.prefill_dispatch_ns));
        } else if (key == "prefill_release_ns") {
            DSI_RETURN_IF_ERROR(num(v, key, c.prefill_release_ns));
        } else if (key == "p2d_latency_ns") {
            DSI_RETURN_IF_ERROR(num(v, key, c.p2d_latency_ns));
        } else if (key == "decode_async_join") {
            DSI_RETURN_IF_ERROR(boolean(v, key, c.decode_async_join));
        } else if (key == "operations") {
            DSI_RETURN_IF_ERROR(parse_operations(v, c.operations));
        } else {
            return invalid_argument("cluster description: unknown key \"" + key + "\"");
        }
    }
    DSI_RETURN_IF_ERROR(c.validate());
    return c;
}

Result<PrefillRouting> parse_prefill_routing(std::string_view n) {
    if (n == "deepseek") return PrefillRouting::kDeepSeek;
    if (n == "round-robin") return PrefillRouting::kRoundRobin;
    if (n == "least-loaded") return PrefillRouting::kLeastLoaded;
    if (n == "prefix-affinity") return PrefillRouting::kPrefixAffinity;
    return invalid_argument("prefill routing: want deepseek|round-robin|least-loaded|prefix-affinity");
}

Result<DecodeRouting> parse_decode_routing(std::string_view n) {
    if (n == "deepseek") return DecodeRouting::kDeepSeek;
    if (n == "round-robin") return DecodeRouting::kRoundRobin;
    if (n == "least-loaded") return DecodeRouting::kLeastLoaded;
    return invalid_argument("decode routing: want deepseek|round-robin|least-loaded");
}

std::string_view prefill_routing_name(PrefillRouting r) {
    switch (r) {
        case PrefillRouting::kDeepSeek: return "deepseek";
        case PrefillRouting::kRoundRobin: return "round-robin";
        case PrefillRouting::kLeastLoaded: return "least-loaded";
        case PrefillRouting::kPrefixAffinity: return "prefix-affinity";
    }
    return "?";
}

std::string_view decode_routing_name(DecodeRouting r) {
    switch (r) {
        case DecodeRouting::kDeepSeek: return "deepseek";
        case DecodeRouting::kRoundRobin: return "round-robin";
        case DecodeRouting::kLeastLoaded: return "least-loaded";
    }
    return "?";
}

}  // namespace dsi::sim
