// The step loop of one rank of an expert-parallel group (issue 19; docs/comm.md
// "Expert parallelism in the engine"): N engine processes run one model instance, each
// with its own requests, sequences and KV (attention data parallelism), the model's MoE
// layers exchanging rows between them (model/expert_parallel.h).
//
// Every forward pass of the group's model is a collective, so the ranks step in lockstep:
// at the start of each forward pass all ranks agree, through the group's shared memory,
// on who brings how many tokens; a rank with work steps its engine as usual; a rank
// without work runs the model's group_idle_step, which joins a peer's step as an empty one
// (no tokens, every MoE exchange) or, when no rank has work, returns at once. The group
// ends when every rank is idle and `finished` (no more requests will come to this rank).
// A dead or silent peer fails the collective (UNAVAILABLE / DEADLINE_EXCEEDED) and the
// loop returns that error: never a hang.
//
// Limit: the group's model is used only between this rank's steps (the engine's worker is
// idle when has_work() is false); a rank whose requests all wait on something else (KV
// store fetches) joins its peers' steps only once they resolve (their fetch deadline is far
// below the group's step deadline).
//
// Thread model: the engine's owner thread (engine/engine.h); callbacks run inside.
#pragma once

#include <functional>

#include "base/env.h"
#include "base/status.h"
#include "engine/engine.h"
#include "model/causal_lm.h"

namespace dsi::engine {

// Steps `engine` (over `model`, the group's rank) until the whole group has finished.
// `finished()` is asked while this rank is idle. Without a group (model not expert
// parallel) it is engine.run(). REQUIRES: `engine` runs over `model`.
Status run_ep_rank(Engine& engine, CausalLm& model, const std::function<bool()>& finished,
                   Env* env);

}  // namespace dsi::engine
