#include "engine/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "model/causal_lm.h"
#include "model/config.h"
#include "sampling/sampler.h"

namespace dsi::engine {
namespace {

constexpr int kNumTerms = 5;  // base, q, c, q*c, q*q
constexpr const char* kTermNames[kNumTerms] = {"base_ns", "per_q_ns", "per_c_ns", "per_qc_ns",
                                               "per_qq_ns"};

double term(int k, const CalibrationPoint& p) {
    const double q = static_cast<double>(p.q), c = static_cast<double>(p.c);
    switch (k) {
        case 0:
            return 1.0;
        case 1:
            return q;
        case 2:
            return c;
        case 3:
            return q * c;
        default:
            return q * q;
    }
}

// Least squares over the active terms by modified Gram-Schmidt on unit-scaled columns
// (the terms span 1 .. 1e9, normal equations would square that). False if the points
// cannot separate the active terms.
bool solve_active(std::span<const CalibrationPoint> pts, const bool active[kNumTerms],
                  double coef[kNumTerms]) {
    const size_t n = pts.size();
    std::vector<int> cols;
    for (int k = 0; k < kNumTerms; ++k) {
        coef[k] = 0;
        if (active[k]) cols.push_back(k);
    }
    const size_t m = cols.size();
    std::vector<std::vector<double>> a(m, std::vector<double>(n));
    std::vector<double> scale(m, 0), b(n);
    for (size_t j = 0; j < m; ++j) {
        for (size_t i = 0; i < n; ++i) {
            a[j][i] = term(cols[j], pts[i]);
            scale[j] = std::max(scale[j], std::abs(a[j][i]));
        }
        if (scale[j] == 0) return false;
        for (double& v : a[j]) v /= scale[j];
    }
    for (size_t i = 0; i < n; ++i) b[i] = pts[i].ns;
    // A = QR; R upper triangular m x m.
    std::vector<std::vector<double>> r(m, std::vector<double>(m, 0));
    for (size_t j = 0; j < m; ++j) {
        double norm0 = 0;
        for (double v : a[j]) norm0 += v * v;
        norm0 = std::sqrt(norm0);
        for (size_t k = 0; k < j; ++k) {
            double dot = 0;
            for (size_t i = 0; i < n; ++i) dot += a[k][i] * a[j][i];
            r[k][j] = dot;
            for (size_t i = 0; i < n; ++i) a[j][i] -= dot * a[k][i];
        }
        double norm = 0;
        for (double v : a[j]) norm += v * v;
        norm = std::sqrt(norm);
        if (norm <= 1e-9 * norm0) return false;  // dependent on the earlier terms
        r[j][j] = norm;
        for (double& v : a[j]) v /= norm;
    }
    std::vector<double> qtb(m, 0), x(m, 0);
    for (size_t j = 0; j < m; ++j) {
        for (size_t i = 0; i < n; ++i) qtb[j] += a[j][i] * b[i];
    }
    for (size_t j = m; j-- > 0;) {
        double s = qtb[j];
        for (size_t k = j + 1; k < m; ++k) s -= r[j][k] * x[k];
        x[j] = s / r[j][j];
    }
    for (size_t j = 0; j < m; ++j) coef[cols[j]] = x[j] / scale[j];
    return true;
}

}  // namespace

Result<PrefillCostModel> fit_prefill_cost_model(std::span<const CalibrationPoint> points) {
    if (points.size() < kNumTerms) {
        return invalid_argument("calibration needs at least 5 points, got " +
                                std::to_string(points.size()));
    }
    for (const CalibrationPoint& p : points) {
        if (p.q < 1 || p.c < 0 || !std::isfinite(p.ns) || p.ns < 0) {
            return invalid_argument("calibration point (q " + std::to_string(p.q) + ", c " +
                                    std::to_string(p.c) + ", " + std::to_string(p.ns) +
                                    " ns) is not valid: needs q >= 1, c >= 0, time >= 0");
        }
    }
    // Active-set non-negative least squares: drop the most negative term and refit
    // until every fitted coefficient is >= 0.
    bool active[kNumTerms] = {true, true, true, true, true};
    double coef[kNumTerms];
    for (int round = 0; round < kNumTerms; ++round) {
        if (!solve_active(points, active, coef)) {
            return invalid_argument(
                "calibration points cannot separate the cost terms (need several q and "
                "several c values)");
        }
        int worst = -1;
        for (int k = 0; k < kNumTerms; ++k) {
            if (coef[k] < 0 && (worst < 0 || coef[k] < coef[worst])) worst = k;
        }
        if (worst < 0) break;
        active[worst] = false;
    }
    PrefillCostModel m;
    m.base_ns = std::max(0.0, coef[0]);
    m.per_q_ns = std::max(0.0, coef[1]);
    m.per_c_ns = std::max(0.0, coef[2]);
    m.per_qc_ns = std::max(0.0, coef[3]);
    m.per_qq_ns = std::max(0.0, coef[4]);
    DSI_RETURN_IF_ERROR(m.validate().with_context("fitted cost model"));
    return m;
}

Result<std::vector<CalibrationPoint>> profile_prefill(CausalLm* model,
                                                      std::span<const int64_t> q_values,
                                                      std::span<const int64_t> c_values, int reps) {
    if (q_values.empty() || c_values.empty() || reps < 1) {
        return invalid_argument("calibration needs q values, c values and reps >= 1");
    }
    std::vector<int64_t> cs(c_values.begin(), c_values.end());
    std::sort(cs.begin(), cs.end());
    const int64_t max_q = *std::max_element(q_values.begin(), q_values.end());
    if (*std::min_element(q_values.begin(), q_values.end()) < 1 || cs.front() < 0) {
        return invalid_argument("calibration: q must be >= 1 and c >= 0");
    }
    const int64_t len = cs.back() + max_q;
    if (len > model->config().max_position_embeddings) {
        return invalid_argument("calibration: c + q = " + std::to_string(len) +
                                " exceeds the model length");
    }
    const int64_t vocab = model->config().vocab_size;
    std::vector<int32_t> tokens(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) tokens[i] = static_cast<int32_t>((1000 + i * 31) % vocab);
    // Two sequences with the same tokens: a step with one chunk and a step with two.
    std::unique_ptr<KvCache> caches[2] = {model->new_kv_cache(len), model->new_kv_cache(len)};
    BatchOutput out;
    auto run = [&](int num_seqs, int64_t pos, int64_t q) -> Status {
        std::vector<SequenceStep> steps;
        for (int i = 0; i < num_seqs; ++i) {
            steps.push_back(
                {std::span<const int32_t>(tokens).subspan(pos, q), pos, caches[i].get(), false});
        }
        return model->forward_batch(steps, out);
    };
    // Rows [0, c) computed for both sequences, in chunks of at most 512.
    auto prefill = [&](int64_t from, int64_t c) -> Status {
        for (int64_t p = from; p < c; p += 512) {
            DSI_RETURN_IF_ERROR(run(2, p, std::min<int64_t>(512, c - p)));
        }
        return Status::ok();
    };
    const bool stateful = model->kv_layout().state_floats > 0;
    auto best_ns = [&](int num_seqs, int64_t c, int64_t q) -> Result<double> {
        double best = 1e300;
        for (int r = 0; r < reps; ++r) {
            if (stateful) DSI_RETURN_IF_ERROR(prefill(0, c));  // the state must continue at c
            const auto t0 = std::chrono::steady_clock::now();
            DSI_RETURN_IF_ERROR(run(num_seqs, c, q));
            const auto t1 = std::chrono::steady_clock::now();
            best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count());
        }
        return best;
    };
    std::vector<CalibrationPoint> points;
    int64_t done = 0;  // prefix rows computed (a timed chunk rewrites rows >= c identically)
    for (int64_t c : cs) {
        if (!stateful) DSI_RETURN_IF_ERROR(prefill(done, c));
        done = std::max(done, c);
        for (int64_t q : q_values) {
            // S-LB charges cost(q, c) per sequence in a step, so the point is the
            // marginal cost of one more chunk: (two chunks) - (one chunk). The per-step
            // part (reading every weight once) is paid by any step and is left out.
            DSI_ASSIGN_OR_RETURN(double one, best_ns(1, c, q));
            DSI_ASSIGN_OR_RETURN(double two, best_ns(2, c, q));
            points.push_back({q, c, std::max(0.0, two - one)});
        }
    }
    return points;
}

namespace {

// A file kept beside a checkpoint: DIR/name, or FILE.gguf.name for a GGUF file.
std::string beside_checkpoint(const std::string& model_path, std::string_view name) {
    const bool is_gguf =
        model_path.size() > 5 && model_path.compare(model_path.size() - 5, 5, ".gguf") == 0;
    if (is_gguf) return model_path + "." + std::string(name);
    std::string dir = model_path;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    return dir + "/" + std::string(name);
}

}  // namespace

std::string cost_model_path_for(const std::string& model_path) {
    return beside_checkpoint(model_path, "dsinfer_prefill_cost.json");
}

std::string verify_cost_path_for(const std::string& model_path) {
    return beside_checkpoint(model_path, "dsinfer_verify_cost.json");
}

Result<spec::VerifyCostCurve> profile_verify_cost(CausalLm* model, const VerifyCalibration& grid) {
    const std::vector<int64_t>& ns = grid.tokens;
    if (ns.empty() || ns.front() < 1 || !std::is_sorted(ns.begin(), ns.end()) ||
        std::adjacent_find(ns.begin(), ns.end()) != ns.end() || grid.tokens_per_seq < 1 ||
        grid.context < 0 || grid.reps < 1) {
        return invalid_argument(
            "verify-cost calibration needs increasing token counts >= 1, tokens per sequence "
            ">= 1, context >= 0 and reps >= 1");
    }
    if (model->kv_layout().state_floats > 0) {
        return failed_precondition("verify-cost calibration: " + model->config().architecture +
                                   " keeps per-sequence state (speculation is not supported)");
    }
    const int64_t len = grid.context + grid.tokens_per_seq;
    if (len > model->config().max_position_embeddings) {
        return invalid_argument("verify-cost calibration: context + tokens per sequence = " +
                                std::to_string(len) + " exceeds the model length");
    }
    const int64_t vocab = model->config().vocab_size;
    std::vector<int32_t> tokens(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) tokens[i] = static_cast<int32_t>((1000 + i * 31) % vocab);
    const int64_t num_seqs = (ns.back() + grid.tokens_per_seq - 1) / grid.tokens_per_seq;
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<SequenceStep> steps;
    BatchOutput out;
    for (int64_t i = 0; i < num_seqs; ++i) {
        caches.push_back(model->new_kv_cache(len));
        for (int64_t p = 0; p < grid.context; p += 512) {
            const int64_t q = std::min<int64_t>(512, grid.context - p);
            steps.assign(
                1, {std::span<const int32_t>(tokens).subspan(p, q), p, caches.back().get(), false});
            DSI_RETURN_IF_ERROR(model->forward_batch(steps, out));
        }
    }
    std::vector<spec::VerifyCostPoint> points;
    for (int64_t n : ns) {
        steps.clear();
        for (int64_t i = 0, left = n; left > 0; ++i, left -= grid.tokens_per_seq) {
            const int64_t q = std::min(left, grid.tokens_per_seq);
            steps.push_back({std::span<const int32_t>(tokens).subspan(grid.context, q),
                             grid.context, caches[i].get(), true});
        }
        double best = 1e300;
        for (int r = 0; r < grid.reps; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            DSI_RETURN_IF_ERROR(model->forward_batch(steps, out));
            int64_t sink = 0;
            for (size_t row = 0; row * vocab < out.logits.size(); ++row) {
                sink += argmax(std::span<const float>(out.logits).subspan(row * vocab, vocab));
            }
            const auto t1 = std::chrono::steady_clock::now();
            if (sink < 0) return internal_error("verify-cost calibration: bad argmax");
            best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count());
        }
        points.push_back({n, std::max(best, 1.0)});
    }
    return spec::VerifyCostCurve::create(std::move(points));
}

Result<std::optional<spec::VerifyCostCurve>> load_verify_cost(Env* env, const std::string& path) {
    if (!env->file_exists(path)) return std::optional<spec::VerifyCostCurve>();
    Result<std::string> text = env->read_file(path);
    if (!text.is_ok()) return text.status().with_context("verify cost curve " + path);
    Result<spec::VerifyCostCurve> c = spec::VerifyCostCurve::from_json(*text);
    if (!c.is_ok()) return c.status().with_context("verify cost curve " + path);
    return std::optional<spec::VerifyCostCurve>(std::move(c).value());
}

Result<spec::VerifyCostCurve> ensure_verify_cost(Env* env, CausalLm* model, const std::string& path,
                                                 const VerifyCalibration& grid) {
    if (!path.empty()) {
        DSI_ASSIGN_OR_RETURN(std::optional<spec::VerifyCostCurve> existing,
                             load_verify_cost(env, path));
        if (existing) return std::move(*existing);
    }
    const auto t0 = std::chrono::steady_clock::now();
    DSI_ASSIGN_OR_RETURN(spec::VerifyCostCurve curve, profile_verify_cost(model, grid));
    if (!path.empty()) {
        nlohmann::ordered_json info;
        info["source"] = "engine::ensure_verify_cost";
        info["tokens_per_seq"] = grid.tokens_per_seq;
        info["context"] = grid.context;
        info["reps"] = grid.reps;
        info["seconds"] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        DSI_RETURN_IF_ERROR(env->write_file(path, curve.to_json(info.dump())));
    }
    return curve;
}

std::string cost_model_to_json(const PrefillCostModel& model, std::string_view fit_info) {
    nlohmann::ordered_json j;
    j["format"] = kCostModelFormat;
    j["base_ns"] = model.base_ns;
    j["per_q_ns"] = model.per_q_ns;
    j["per_c_ns"] = model.per_c_ns;
    j["per_qc_ns"] = model.per_qc_ns;
    j["per_qq_ns"] = model.per_qq_ns;
    if (!fit_info.empty()) j["fit"] = nlohmann::ordered_json::parse(fit_info);
    return j.dump(2) + "\n";
}

Result<PrefillCostModel> cost_model_from_json(std::string_view text) {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return invalid_argument("not a JSON object");
    if (!j.contains("format") || j["format"] != kCostModelFormat) {
        return invalid_argument(std::string("\"format\" must be \"") + kCostModelFormat + "\"");
    }
    PrefillCostModel m;
    double* fields[kNumTerms] = {&m.base_ns, &m.per_q_ns, &m.per_c_ns, &m.per_qc_ns, &m.per_qq_ns};
    for (int k = 0; k < kNumTerms; ++k) {
        auto it = j.find(kTermNames[k]);
        if (it == j.end())
            return invalid_argument(std::string("missing \"") + kTermNames[k] + "\"");
        if (!it->is_number()) {
            return invalid_argument(std::string("\"") + kTermNames[k] + "\" is not a number");
        }
        *fields[k] = it->get<double>();
    }
    DSI_RETURN_IF_ERROR(m.validate());
    return m;
}

namespace {

// DeepSeek V4 (reference deepseek_v4.md §2): per layer wq_a, wq_b, wkv, wo_a, wo_b, the
// mHC mixes of both sub-layers, the compressors (ratio 4: kv + gate of 2 x head_dim and
// the indexer's of 2 x index_head_dim, its wq_b and weights_proj; ratio 128: kv + gate
// of head_dim), the window of sliding_window keys, and the MoE (all layers).
PrefillShape prefill_shape_v4(const ModelConfig& c) {
    const double hidden = static_cast<double>(c.hidden_size);
    const double heads = static_cast<double>(c.num_attention_heads);
    const double hd = static_cast<double>(c.head_dim);
    const double qlr = static_cast<double>(c.q_lora_rank);
    const double ih = static_cast<double>(c.index_n_heads);
    const double ihd = static_cast<double>(c.index_head_dim);
    const double hcd = static_cast<double>(c.hc_mult) * hidden;
    const double mix = static_cast<double>((2 + c.hc_mult) * c.hc_mult);
    double weights = 0;
    double pair_flops = 0;  // per (new token, prefix token)
    double kv_bytes = 0;    // per prefix token
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        const int64_t r = c.compress_ratio(l);
        weights += hidden * qlr + qlr * heads * hd + hidden * hd +
                   heads * hd * static_cast<double>(c.o_lora_rank) +
                   static_cast<double>(c.o_groups * c.o_lora_rank) * hidden + 2 * mix * hcd;
        // The window: 128 keys of head_dim, scores and values, per head.
        weights += heads * 2 * hd * static_cast<double>(c.sliding_window);
        if (r == 4) {
            weights += 2 * hidden * 2 * hd + 2 * hidden * 2 * ihd + qlr * ih * ihd + hidden * ih;
            weights += heads * 2 * hd * static_cast<double>(c.index_topk);  // top-k entries
            pair_flops += 2 * ih * ihd / 4.0;  // the indexer scores every entry
            kv_bytes += (hd + ihd) / 4.0 * sizeof(float);
        } else if (r == 128) {
            weights += 2 * hidden * hd;
            pair_flops += heads * 2 * hd / 128.0;
            kv_bytes += hd / 128.0 * sizeof(float);
        } else if (r == 1 || r == 2) {
            // V4.1 CSA2 (docs/models_v41.md): every compressed layer attends to top-k
            // entries; Full layers also compress, project index keys and score every entry.
            weights += heads * 2 * hd * static_cast<double>(c.index_topk) + qlr * ih * ihd;
            if (v41_attn_kind(c, l) == V41AttnKind::kFull) {
                weights += static_cast<double>(r) * hidden * hd + hd * ihd;
                pair_flops += 2 * ih * ihd / static_cast<double>(r);
                kv_bytes += (hd + ihd) / static_cast<double>(r) * sizeof(float);
            }
        }
        const double active = static_cast<double>(c.num_experts_per_tok + c.n_shared_experts);
        weights += active * 3 * hidden * static_cast<double>(c.moe_intermediate_size) +
                   hidden * static_cast<double>(c.n_routed_experts);
    }
    PrefillShape s;
    s.dense_flops_per_token = 2 * weights;
    s.attention_flops_per_pair = pair_flops;
    s.kv_bytes_per_token = kv_bytes;
    s.head_flops =
        2 * hidden * static_cast<double>(c.vocab_size) + 2 * static_cast<double>(c.hc_mult) * hcd;
    return s;
}

}  // namespace

PrefillShape prefill_shape(const ModelConfig& c) {
    if (c.v4_layout()) return prefill_shape_v4(c);  // V4 and V4.1
    const double hidden = static_cast<double>(c.hidden_size);
    const double heads = static_cast<double>(c.num_attention_heads);
    const double lora = static_cast<double>(c.kv_lora_rank);
    const double rope = static_cast<double>(c.qk_rope_head_dim);
    const double nope = static_cast<double>(c.qk_nope_head_dim);
    const double v = static_cast<double>(c.v_head_dim);
    const double q_dim = heads * static_cast<double>(c.qk_head_dim());
    // MLA in the absorbed form: q (through q_lora when present), kv_a, the two halves of
    // kv_b folded into the query and the output, o_proj.
    const double q_weights = c.q_lora_rank > 0 ? hidden * static_cast<double>(c.q_lora_rank) +
                                                     static_cast<double>(c.q_lora_rank) * q_dim
                                               : hidden * q_dim;
    const double attn_weights = q_weights + hidden * (lora + rope) + heads * nope * lora +
                                heads * lora * v + heads * v * hidden;
    double weights = 0;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        weights += attn_weights;
        if (c.is_moe_layer(l)) {
            const double active = static_cast<double>(c.num_experts_per_tok + c.n_shared_experts);
            weights += active * 3 * hidden * static_cast<double>(c.moe_intermediate_size) +
                       hidden * static_cast<double>(c.n_routed_experts);
        } else {
            weights += 3 * hidden * static_cast<double>(c.intermediate_size);
        }
    }
    const double layers = static_cast<double>(c.num_hidden_layers);
    PrefillShape s;
    s.dense_flops_per_token = 2 * weights;
    // Per head: scores over lora + rope, then the weighted sum of lora values.
    s.attention_flops_per_pair = layers * heads * 2 * (2 * lora + rope);
    s.kv_bytes_per_token = layers * (lora + rope) * static_cast<double>(sizeof(float));
    s.head_flops = 2 * hidden * static_cast<double>(c.vocab_size);
    return s;
}

CpuRateScale conservative_rate_scale(kernels::Isa isa) {
    switch (isa) {
        case kernels::Isa::kScalar: return {1, 1};
        case kernels::Isa::kAvx2: return {4, 2};
        case kernels::Isa::kAvx512: return {8, 2};
    }
    return {1, 1};
}

PrefillCostModel conservative_cpu_cost_model(const PrefillShape& shape, kernels::Isa isa) {
    const CpuRateScale scale = conservative_rate_scale(isa);
    const double gemm = kCpuGemmFlopsPerNs * scale.gemm;
    PrefillCostModel m;
    m.base_ns = kCpuSequenceOverheadNs + shape.head_flops / gemm;
    m.per_q_ns = shape.dense_flops_per_token / gemm;
    m.per_c_ns = shape.kv_bytes_per_token / kCpuKvBytesPerNs;
    m.per_qc_ns = shape.attention_flops_per_pair / (kCpuAttentionFlopsPerNs * scale.attention);
    m.per_qq_ns = m.per_qc_ns / 2;  // causal: half of the chunk's q x q pairs
    return m;
}

Result<PrefillCostModel> ensure_cost_model(Env* env, CausalLm* model, const std::string& path,
                                           const QuickCalibration& grid) {
    DSI_ASSIGN_OR_RETURN(std::optional<PrefillCostModel> existing, load_cost_model(env, path));
    if (existing) return *existing;
    const auto t0 = std::chrono::steady_clock::now();
    DSI_ASSIGN_OR_RETURN(std::vector<CalibrationPoint> pts,
                         profile_prefill(model, grid.q_values, grid.c_values, grid.reps));
    Result<PrefillCostModel> fit = fit_prefill_cost_model(pts);
    if (!fit.is_ok()) return fit.status().with_context("calibrating " + path);
    // A quick fit on a busy machine is noisy (a marginal time can come out 0 or several
    // times too large). The conservative estimate is an upper bound on a CPU's cost, so
    // a coefficient above it is noise: cap each term there (the fit may only be less
    // pessimistic than the default it replaces).
    const PrefillCostModel bound = conservative_cpu_cost_model(prefill_shape(model->config()));
    fit->base_ns = std::min(fit->base_ns, bound.base_ns);
    fit->per_q_ns = std::min(fit->per_q_ns, bound.per_q_ns);
    fit->per_c_ns = std::min(fit->per_c_ns, bound.per_c_ns);
    fit->per_qc_ns = std::min(fit->per_qc_ns, bound.per_qc_ns);
    fit->per_qq_ns = std::min(fit->per_qq_ns, bound.per_qq_ns);
    nlohmann::ordered_json info;
    info["source"] = "first start (engine::ensure_cost_model)";
    info["reps"] = grid.reps;
    for (const CalibrationPoint& p : pts) {
        info["points"].push_back(
            {{"q", p.q}, {"c", p.c}, {"ns", p.ns}, {"fit_ns", fit->cost_ns(p.q, p.c)}});
    }
    info["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    DSI_RETURN_IF_ERROR(env->write_file(path, cost_model_to_json(*fit, info.dump())));
    return *fit;
}

Result<std::optional<PrefillCostModel>> load_cost_model(Env* env, const std::string& path) {
    if (!env->file_exists(path)) return std::optional<PrefillCostModel>();
    Result<std::string> text = env->read_file(path);
    if (!text.is_ok()) return text.status().with_context("prefill cost model " + path);
    Result<PrefillCostModel> m = cost_model_from_json(*text);
    if (!m.is_ok()) return m.status().with_context("prefill cost model " + path);
    return std::optional<PrefillCostModel>(*m);
}

}  // namespace dsi::engine
