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
// Without a fit (issue 22 D3), the engine does not use PrefillCostModel's built-in
// H800-class coefficients (about 40x too optimistic on a CPU, so the step budget bounded
// nothing): it uses conservative_cpu_cost_model() of the model's sizes, which
// overestimates a CPU's prefill cost, so chunks stay within the budget at some cost in
// prefill throughput. The embedded default model calibrates itself on first start
// (ensure_cost_model: a quick grid, seconds, written beside the model).
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
#include "kernels/cpu_features.h"
#include "spec/varlen.h"

namespace dsi {
class CausalLm;
struct ModelConfig;
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
// A model with per-sequence state (V4: a step must continue its sequence) has its
// prefix of c tokens recomputed, untimed, before every timed repetition.
// INVALID_ARGUMENT on q < 1, c < 0, reps < 1 or q + c past the model length.
Result<std::vector<CalibrationPoint>> profile_prefill(CausalLm* model,
                                                      std::span<const int64_t> q_values,
                                                      std::span<const int64_t> c_values, int reps);

// The plain sizes that set a model's prefill cost (all layers, MTP left out: prefill
// does not run it). V4: the dense term includes the compressors, the indexer and the
// mHC mixes; a prefix token costs the compressed entries it adds (1/4 attended and
// scored by the indexer on ratio-4 layers, 1/128 attended on ratio-128 layers); the
// window (a fixed 128 keys) is charged per new token.
struct PrefillShape {
    double dense_flops_per_token = 0;     // 2 x weights one token multiplies (active experts)
    double attention_flops_per_pair = 0;  // one new token against one prefix token (absorbed MLA)
    double kv_bytes_per_token = 0;        // one prefix token's KV rows (f32)
    double head_flops = 0;                // the LM head of one sampled row
};
PrefillShape prefill_shape(const ModelConfig& config);

// Throughputs any CPU the engine runs on reaches at least: the divisor of each term of
// conservative_cpu_cost_model, at the portable (scalar) kernel level. On the 2-core
// development machine (AVX-512) the latent attention of a 16k-token prefill ran at >= 15
// GFLOP/s per thread (engine_hol_test's model: 2.1e10 FLOP in 1.4 s of CPU), so these are
// ~4x below one thread and further below a server CPU; lower = more conservative (smaller
// chunks, more steps, a tighter decode gap, less prefill throughput).
inline constexpr double kCpuGemmFlopsPerNs = 4.0;       // dense / MoE matmuls
inline constexpr double kCpuAttentionFlopsPerNs = 4.0;  // latent attention
inline constexpr double kCpuKvBytesPerNs = 4.0;         // reading prefix KV
inline constexpr double kCpuSequenceOverheadNs = 50'000;  // gather + sampling per chunk

// How much faster than the scalar rates above the vector kernels are at least, one
// thread: {GEMM, attention}. AVX2: x4 / x2, AVX-512: x8 / x2 (32 GFLOP/s GEMM: the
// slowest weight format, f32, ran at 80-100 GFLOP/s a thread here, int8 VNNI at ~190;
// the medium preset's prefill does ~390 GFLOP/s on 2 threads; attention measured 15
// GFLOP/s a thread). At 4 GFLOP/s a 30-layer checkpoint (medium, 5 GFLOP a token)
// prefilled one token a step without a fit.
struct CpuRateScale {
    double gemm = 1;
    double attention = 1;
};
CpuRateScale conservative_rate_scale(kernels::Isa isa);

// S-LB cost model for a checkpoint without a fit: each term of cost(q, c) from the
// model's sizes at the conservative rates above for `isa` (per_qq = per_qc / 2: causal).
// The default, kScalar, is the slowest CPU (the router prices with it: it has no CPU of
// the engines to go by).
PrefillCostModel conservative_cpu_cost_model(const PrefillShape& shape,
                                             kernels::Isa isa = kernels::Isa::kScalar);

// The quick grid of ensure_cost_model (a few seconds on the embedded default model).
struct QuickCalibration {
    std::vector<int64_t> q_values = {16, 64, 256};
    std::vector<int64_t> c_values = {0, 512, 2048};
    int reps = 2;
};

// The fit at `path` if it exists (malformed: an error naming the file); else profiles
// `model` on the quick grid, fits, writes the fit to `path` (so the next start reads it)
// and returns it. For the embedded default model on first start; larger checkpoints
// are calibrated explicitly with `dsinfer calibrate`.
Result<PrefillCostModel> ensure_cost_model(Env* env, CausalLm* model, const std::string& path,
                                           const QuickCalibration& grid = {});

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

// Variable-length verification's step-cost curve (spec/varlen.h, issue 24): the time
// of a decode step that runs n tokens — sequences of up to tokens_per_seq tokens (a
// decode and its drafts) each, after `context` computed tokens, logits for every row
// and each row's argmax (verification samples every row) — best of `reps`, per n.
// File: {"format": "dsinfer-verify-cost-v1", "points": [...]} at
// verify_cost_path_for(model path), written by `dsinfer calibrate` and, on first use
// of --spec-varlen, by ensure_verify_cost.
struct VerifyCalibration {
    std::vector<int64_t> tokens = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192};
    int64_t tokens_per_seq = 6;
    int64_t context = 256;
    int reps = 3;
};
// INVALID_ARGUMENT on an empty or non-increasing token list, values < 1, reps < 1 or
// context + tokens_per_seq past the model length; FAILED_PRECONDITION for a model with
// per-sequence state (speculation is refused there).
Result<spec::VerifyCostCurve> profile_verify_cost(CausalLm* model, const VerifyCalibration& grid);
// DIR/dsinfer_verify_cost.json, or FILE.gguf.dsinfer_verify_cost.json.
std::string verify_cost_path_for(const std::string& model_path);
// nullopt when the file does not exist; an error naming the file when it is malformed.
Result<std::optional<spec::VerifyCostCurve>> load_verify_cost(Env* env, const std::string& path);
// The curve at `path` if it exists; else profiles `model` on `grid`, writes the curve to
// `path` (when not "") and returns it.
Result<spec::VerifyCostCurve> ensure_verify_cost(Env* env, CausalLm* model, const std::string& path,
                                                 const VerifyCalibration& grid = {});

}  // namespace dsi::engine
