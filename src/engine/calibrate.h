// Calibration of the prefill cost model (S-LB, issue 5): profile prefill chunks of the
// loaded model at several (q, c) points, fit PrefillCostModel's five coefficients by
// least squares, and keep the fit beside the checkpoint as a small JSON file that
// Engine::create loads (EngineOptions::cost_model_path).
//
// File (`dsinfer calibrate` writes it; docs/engine.md, "Calibration"):
//   {"format": "dsinfer-prefill-cost-v1", "base_ns": x, "per_q_ns": x, "per_c_ns": x,
//    "per_qc_ns": x, "per_qq_ns": x, "fit": {...informational: points, threads, isa}}
// Location: cost_model_path_for(model path). A fit describes one machine, thread count
// and weight format; recalibrate when they change.
//
// Thread model: free functions; profile_prefill uses the model exclusively.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "engine/prefill_cost_model.h"

namespace dsi {
class DeepseekModel;
}

namespace dsi::engine {

inline constexpr const char* kCostModelFormat = "dsinfer-prefill-cost-v1";

// One measured prefill chunk: q new tokens after c computed ones took ns.
struct CalibrationPoint {
    int64_t q = 0;
    int64_t c = 0;
    double ns = 0;
};

// Least-squares fit of cost_ns(q, c) to the points with every coefficient >= 0 (a
// coefficient the unconstrained fit makes negative is fixed at 0 and the rest refitted).
// INVALID_ARGUMENT with fewer than 5 points, q < 1, c < 0, a non-finite or negative
// time, or points that cannot separate the terms (e.g. one c only).
Result<PrefillCostModel> fit_prefill_cost_model(std::span<const CalibrationPoint> points);

// For every q x c on `model`: the marginal time of one more prefill chunk of q tokens
// after c computed ones in a step (best of `reps` of a forward_batch with two such
// chunks minus best of one; >= 0). Why marginal: S-LB sums cost(q, c) over the
// sequences of a step, while the step's fixed part (reading every weight once, ~0.2 s
// for `small` on a CPU) is paid by any step, decode included; charging it per
// sequence would let a handful of decodes exhaust the step budget and stop admission.
// INVALID_ARGUMENT on q < 1, c < 0, reps < 1 or q + c past the model length.
Result<std::vector<CalibrationPoint>> profile_prefill(DeepseekModel* model,
                                                      std::span<const int64_t> q_values,
                                                      std::span<const int64_t> c_values, int reps);

// Where the fit of the checkpoint at model_path lives: DIR/dsinfer_prefill_cost.json
// for a checkpoint directory, FILE.gguf.dsinfer_prefill_cost.json for a GGUF file.
std::string cost_model_path_for(const std::string& model_path);

// JSON text of a fit; `fit_info` (a JSON object's text, may be "") is kept under "fit".
std::string cost_model_to_json(const PrefillCostModel& model, std::string_view fit_info);
// INVALID_ARGUMENT naming the problem (not JSON, wrong format tag, a coefficient
// missing, not a number, negative or not finite).
Result<PrefillCostModel> cost_model_from_json(std::string_view text);
// nullopt when the file does not exist; an error naming the file when it cannot be
// read or is malformed.
Result<std::optional<PrefillCostModel>> load_cost_model(Env* env, const std::string& path);

}  // namespace dsi::engine
