#include "engine/ep_rank.h"

namespace dsi::engine {

Status run_ep_rank(Engine& engine, CausalLm& model, const std::function<bool()>& finished,
                   Env* env) {
    // Every rank idle: poll again after this long (the collective itself is the wait for a
    // busy peer; this only spaces out rounds in which nobody has work).
    constexpr int64_t kAllIdlePauseNs = 200'000;
    for (;;) {
        if (engine.has_work()) {
            DSI_RETURN_IF_ERROR(engine.step());
            continue;
        }
        DSI_ASSIGN_OR_RETURN(CausalLm::GroupStep step, model.group_idle_step(finished()));
        switch (step) {
            case CausalLm::GroupStep::kNotGrouped:
                return engine.run();
            case CausalLm::GroupStep::kStopped:
                return Status::ok();
            case CausalLm::GroupStep::kAllIdle:
                env->sleep_ns(kAllIdlePauseNs);
                break;
            case CausalLm::GroupStep::kJoinedPeers:
                break;
        }
    }
}

}  // namespace dsi::engine
