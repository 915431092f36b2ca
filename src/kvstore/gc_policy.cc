#include "kvstore/gc_policy.h"

#include <algorithm>

namespace dsi::kvstore {

Status RetentionSettings::validate() const {
    if (!(low_watermark > 0 && low_watermark <= high_watermark && high_watermark <= 1)) {
        return invalid_argument("retention: need 0 < low_watermark <= high_watermark <= 1");
    }
    return Status::ok();
}

GcPolicy::GcPolicy(RetentionSettings settings, Env* env) : settings_(settings), env_(env) {
    DSI_CHECK(settings_.validate().is_ok(), settings_.validate().to_string());
    DSI_CHECK(env_ != nullptr);
}

GcPlan GcPolicy::plan(std::span<const GcEntry> blocks, int64_t capacity_bytes) const {
    const int64_t now = env_->wall_ns();
    GcPlan plan;
    std::vector<const GcEntry*> kept;
    kept.reserve(blocks.size());
    for (const GcEntry& b : blocks) {
        plan.used_bytes_before += b.size_bytes;
        // S-KV-3: TTL is per traffic class (agent 3 d, chatbot 7 d by default).
        int64_t ttl = settings_.ttl_ns[static_cast<size_t>(b.traffic_class)];
        if (ttl > 0 && now - b.last_access_ns > ttl) {
            plan.expired.push_back(b.key);
            plan.expired_bytes += b.size_bytes;
        } else {
            kept.push_back(&b);
        }
    }
    int64_t used = plan.used_bytes_before - plan.expired_bytes;
    const double cap = static_cast<double>(std::max<int64_t>(capacity_bytes, 0));
    if (static_cast<double>(used) > settings_.high_watermark * cap) {
        // S-KV-3: LRU eviction keeps disk under the watermark; evict down to the low mark
        // so the worker does not run on every new block.
        std::sort(kept.begin(), kept.end(), [](const GcEntry* a, const GcEntry* b) {
            if (a->last_access_ns != b->last_access_ns) {
                return a->last_access_ns < b->last_access_ns;
            }
            return a->key < b->key;
        });
        const double target = settings_.low_watermark * cap;
        for (const GcEntry* b : kept) {
            if (static_cast<double>(used) <= target) {
                break;
            }
            plan.evicted.push_back(b->key);
            plan.evicted_bytes += b->size_bytes;
            used -= b->size_bytes;
        }
    }
    plan.used_bytes_after = used;
    return plan;
}

}  // namespace dsi::kvstore
