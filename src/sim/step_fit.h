// Fitting the simulator's step costs to a live engine's own step records (issue 18, the
// simulator checked against the live cluster): `dsinfer serve --step-log` writes one
// engine::StepRecord a line; fit_step_costs turns a prefill and a decode engine's records
// into the ClusterDescription coefficients that replay them (`dsinfer sim --fit-steps`
// writes them as a cluster-description overlay, `dsinfer sim --step-fit` applies it).
//
// What a step costs, live: the worker's wall time from start to end, plus the host's gap
// before it when the gap is short enough to be the host planning back-to-back steps
// (StepFitOptions::max_gap_ns) or when a sequence of the step before runs on in it (an
// item [q', c + q] after [q, c]: the engine had work, its host was late); any other
// longer gap is an engine with nothing to do.
//  - Prefill: step = overhead + sum over its items of cost(q, c), cost a PrefillCostModel
//    whose base (per sequence), per-token and q^2 terms are fitted to the steps and whose
//    context terms (per_c, per_qc) are the calibration's (`dsinfer calibrate`): the live
//    steps run from a few tokens to whole prompts of thousands, past the calibration's
//    points, and small steps carry a fixed cost the calibration does not see. The
//    simulator still sizes chunks by the calibration, as the engines do
//    (ClusterDescription::prefill_time_cost).
//  - Decode: step = base + per_request x items + per_kv_token x sum of (c + q), after
//    taking the calibrated prefill cost of any item with q > 1 (a joining request's
//    recomputed partial block, ClusterDescription::decode_join_recompute_block) out.
// Coefficients are relative least squares (each step's error over its own measured time,
// so short steps weigh as much as long ones; not over the time left after the parts taken
// out, which is near 0 for a join step the calibration overprices), a decode step's
// squared error counted once per token it makes (TPOT is a per-token figure: the full
// batches where most tokens are made set the decode costs, not the many small steps of a
// lightly loaded stretch), with every
// coefficient >= 0 (the best of the column subsets whose solution is non-negative), so a
// collinear record set gives a usable model rather than a negative slope.
//
// Thread model: pure functions of their inputs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"
#include "engine/prefill_cost_model.h"

namespace dsi::sim {

struct StepFitOptions {
    // A gap between a step's start and the previous step's end up to this long is the
    // host's per-step work and counts as step time; longer gaps are idle time unless a
    // sequence runs on across them.
    int64_t max_gap_ns = 1'000'000;
};

struct StepCostFit {
    // Prefill: step = prefill_step_overhead_ns + sum prefill_time_cost.cost_ns(q, c).
    engine::PrefillCostModel prefill_time_cost;
    double prefill_step_overhead_ns = 0;
    int64_t num_prefill_steps = 0;
    // Diagnostics: the steps' wall time and the worker thread's CPU time over the
    // calibrated cost of their items, and wall over CPU (> 1: the worker waited for its
    // core, e.g. for the engine's other threads on a pinned core). CPU: 0 when the
    // records carry none.
    double prefill_wall_over_calibration = 0;
    double prefill_cpu_over_calibration = 0;
    double prefill_wall_over_cpu = 0;
    double prefill_mean_rel_error = 0;  // mean |fit - step| / step over the records
    // Decode: step = decode_base_ns + decode_per_request_ns x items +
    // decode_per_kv_token_ns x sum (c + q).
    double decode_base_ns = 0;
    double decode_per_request_ns = 0;
    double decode_per_kv_token_ns = 0;
    int64_t num_decode_steps = 0;
    double decode_wall_over_cpu = 0;
    double decode_mean_rel_error = 0;
};

// One engine::StepRecord a line: {"start_ns", "end_ns", "cpu_ns", "items": [[q, c], ...]}
// (blank lines skipped). INVALID_ARGUMENT names the line of a malformed record.
Result<std::vector<engine::StepRecord>> parse_step_log(std::string_view jsonl);

// REQUIRES: `calibrated` is valid. INVALID_ARGUMENT when either side has fewer than 3
// steps with items.
Result<StepCostFit> fit_step_costs(std::span<const engine::StepRecord> prefill,
                                   std::span<const engine::StepRecord> decode,
                                   const engine::PrefillCostModel& calibrated,
                                   const StepFitOptions& options = {});

// The fit as a cluster-description overlay (the keys parse_cluster_description reads:
// prefill_time_cost, prefill_step_overhead_ns, decode_base_ns, decode_per_request_ns,
// decode_per_kv_token_ns).
std::string step_fit_overlay_json(const StepCostFit& fit);

}  // namespace dsi::sim
