// dsinfer bench kernels | model: kernel and model throughput, each with the machine
// limit or the llama.cpp figure measured in the same run (issue 3; bench/RESULTS.md).
//
// kernels: STREAM copy/triad/read bandwidth, GEMV GB/s per weight format vs that bandwidth,
//   GEMM (prefill, M = 512) GFLOP/s vs OpenBLAS sgemm and oneDNN bf16/s8 matmul
//   (bench_anchors.h).
// model: prefill (512-token prompt) and decode (128 tokens) tokens/s of dsinfer and of
//   llama.cpp (bench/llamacpp_bench.mjs) on the same GGUF, 1 and 2 threads; --repetitions
//   R alternating runs of each side (both warmed up), medians and spread; beside them the
//   roofline of the same run: decode weight bytes per token / time as a share of the
//   STREAM read figure, and prefill GEMM work / time as a share of oneDNN s8 on the
//   model's own GEMM shapes (issue 20); beside it dsinfer's own matmul vs oneDNN s8 on
//   exactly those shapes (gemm_same_shapes; --gemm-only runs only that).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include <map>
#include <optional>
#include <tuple>

#include "base/env.h"
#include "base/settings.h"
#include "bench_anchors.h"
#include "bench_stats.h"
#include "base/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/deepseek.h"
#include "model/gguf.h"
#include "model/gguf_names.h"
#include "support/build_paths.h"

namespace dsi {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best of `reps` runs of fn(), in seconds.
template <typename F>
double best_time(int reps, F fn) {
    double best = 1e30;
    for (int i = 0; i < reps; ++i) {
        auto t0 = Clock::now();
        fn();
        best = std::min(best, seconds_since(t0));
    }
    return best;
}

struct KernelFlags {
    bool json = false;
    int max_threads = 2;
    // Both far above the 300 MiB LLC of the machine bench/RESULTS.md was measured on.
    int64_t gemv_bytes = 1024ll << 20;    // GEMV: one pass over this many bytes of weights
    int64_t stream_bytes = 1024ll << 20;  // STREAM: bytes per array (three arrays)
};

// One thread, per ISA, DeepSeek-V3 MLA shapes (16 heads, kv_lora 512 + rope 64, ctx
// 2048): decode per KV dtype (kv_gb_s counts the dtype's bytes), and the prefill of the
// last 64 positions as one mla_attention_tokens call vs one call per token.
json bench_mla_kv_dtypes_and_prefill(const std::vector<kernels::Isa>& isas) {
    constexpr int64_t kLora = 512, kRope = 64, kRow = kLora + kRope, kHeads = 16;
    constexpr int64_t kCtx = 2048, kChunk = 64;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> rows(static_cast<size_t>(kCtx * kRow));
    for (float& v : rows) v = nd(rng);
    std::vector<float> q_lat(kChunk * kHeads * kLora), q_pe(kChunk * kHeads * kRope);
    std::vector<float> o(kChunk * kHeads * kLora);
    for (float& v : q_lat) v = nd(rng) * 0.05f;
    for (float& v : q_pe) v = nd(rng) * 0.05f;
    std::vector<int64_t> num_positions(kChunk);
    for (int64_t t = 0; t < kChunk; ++t) num_positions[t] = kCtx - kChunk + t + 1;
    json out;
    for (kernels::KvDtype dtype :
         {kernels::KvDtype::kF32, kernels::KvDtype::kBf16, kernels::KvDtype::kE4m3}) {
        const int64_t words = kernels::kv_row_words(dtype, kRow);
        std::vector<float> kv(static_cast<size_t>(kCtx * words));
        for (int64_t p = 0; p < kCtx; ++p) {
            kernels::kv_encode_row(dtype, rows.data() + p * kRow, kRow, kv.data() + p * words);
        }
        std::vector<const float*> blocks;
        for (int64_t b = 0; b < kCtx / kernels::kKvBlockTokens; ++b) {
            blocks.push_back(kv.data() + b * kernels::kKvBlockTokens * words);
        }
        const kernels::LatentKvView view{blocks.data(), words, dtype};
        const std::string dn(kernels::kv_dtype_name(dtype));
        for (kernels::Isa isa : isas) {
            const std::string in(kernels::isa_name(isa));
            const kernels::MlaHeads heads{kHeads, q_lat.data(), q_pe.data(), kRope, o.data()};
            const double t = best_time(isa == kernels::Isa::kScalar ? 1 : 5, [&] {
                kernels::mla_attention(isa, view, kCtx, kLora, kRope, 0.07f, heads);
            });
            out["mla_decode_16heads_ctx2048"][dn][in] = {
                {"us", t * 1e6}, {"kv_gb_s", 4.0 * words * kCtx / t / 1e9}};
            if (isa == kernels::Isa::kScalar) continue;
            const double per_token = best_time(2, [&] {
                for (int64_t i = 0; i < kChunk; ++i) {
                    const kernels::MlaHeads h{kHeads, q_lat.data() + i * kHeads * kLora,
                                              q_pe.data() + i * kHeads * kRope, kRope,
                                              o.data() + i * kHeads * kLora};
                    kernels::mla_attention(isa, view, num_positions[i], kLora, kRope, 0.07f, h);
                }
            });
            kernels::MlaTokens tk;
            tk.num_tokens = kChunk;
            tk.num_positions = num_positions.data();
            tk.num_heads = kHeads;
            tk.q_lat = q_lat.data();
            tk.q_lat_token_stride = kHeads * kLora;
            tk.q_pe = q_pe.data();
            tk.q_pe_token_stride = kHeads * kRope;
            tk.q_pe_stride = kRope;
            tk.o_lat = o.data();
            tk.o_lat_token_stride = kHeads * kLora;
            const double shared = best_time(2, [&] {
                kernels::mla_attention_tokens(isa, view, kLora, kRope, 0.07f, tk);
            });
            out["mla_prefill_64tokens_16heads_ctx2048"][dn][in] = {
                {"per_token_calls_ms", per_token * 1e3},
                {"tokens_call_ms", shared * 1e3},
                {"speedup", per_token / shared}};
        }
    }
    return out;
}

// One thread, per ISA: absorbed MLA decode (16 heads of DeepSeek-V3 shapes, kv_lora 512 +
// rope 64, over a paged f32 latent cache) at several contexts, and the small ops at
// model sizes. Attention GFLOP/s counts 2 * (576 + 512) flops per head and position.
json bench_attention_and_ops(const std::vector<kernels::Isa>& isas) {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    json out;
    constexpr int64_t kLora = 512, kRope = 64, kHeads = 16, kRow = kLora + kRope;
    for (int64_t ctx : {512, 2048, 8192}) {
        const int64_t nb = (ctx + kernels::kKvBlockTokens - 1) / kernels::kKvBlockTokens;
        std::vector<std::vector<float>> store(static_cast<size_t>(nb));
        std::vector<const float*> blocks;
        for (auto& b : store) {
            b.resize(static_cast<size_t>(kernels::kKvBlockTokens * kRow));
            for (float& v : b) v = nd(rng);
            blocks.push_back(b.data());
        }
        std::vector<float> q_lat(kHeads * kLora), q_pe(kHeads * kRope), o(kHeads * kLora);
        for (float& v : q_lat) v = nd(rng) * 0.05f;
        for (float& v : q_pe) v = nd(rng) * 0.05f;
        const kernels::MlaHeads heads{kHeads, q_lat.data(), q_pe.data(), kRope, o.data()};
        for (kernels::Isa isa : isas) {
            const double t = best_time(5, [&] {
                kernels::mla_attention(isa, {blocks.data(), kRow}, ctx, kLora, kRope, 0.07f,
                                       heads);
            });
            out["mla_decode_16heads"]["ctx" + std::to_string(ctx)]
               [std::string(kernels::isa_name(isa))] = {
                {"us", t * 1e6},
                {"gflop_s", 2.0 * (kRow + kLora) * kHeads * ctx / t / 1e9},
                {"kv_gb_s", 4.0 * kRow * ctx / t / 1e9}};
        }
    }
    const int64_t kHidden = 7168, kInter = 18432, kVocab = 129280;
    std::vector<float> a(kVocab), b(kVocab), y(kVocab);
    for (float& v : a) v = nd(rng);
    for (float& v : b) v = nd(rng);
    std::vector<double> inv_freq(kRope / 2);
    for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(10000.0, -2.0 * i / kRope);
    std::vector<float> cc(kRope), ss(kRope), qh(128 * 192);
    kernels::rope_table(1000, inv_freq.data(), kRope / 2, 1.0, cc.data(), ss.data());
    for (kernels::Isa isa : isas) {
        const std::string name(kernels::isa_name(isa));
        auto rec = [&](const char* op, int64_t bytes, double t) {
            out["ops"][op][name] = {{"us", t * 1e6}, {"gb_s", bytes / t / 1e9}};
        };
        rec("rms_norm_7168", 12 * kHidden, best_time(50, [&] {
                kernels::rms_norm(isa, a.data(), b.data(), kHidden, 1e-6f, y.data());
            }));
        rec("silu_mul_18432", 12 * kInter, best_time(50, [&] {
                kernels::silu_mul(isa, a.data(), b.data(), kInter, y.data());
            }));
        rec("rope_128heads_x64", 8 * 128 * kRope, best_time(50, [&] {
                kernels::rope_apply(isa, qh.data() + 128, 128, 192, cc.data(), ss.data(), kRope / 2);
            }));
        rec("softmax_129280", 8 * kVocab, best_time(20, [&] {
                std::copy(a.begin(), a.end(), y.begin());
                kernels::softmax(isa, y.data(), kVocab);
            }));
        volatile int64_t sink = 0;
        rec("argmax_129280", 4 * kVocab,
            best_time(20, [&] { sink = sink + kernels::argmax(isa, a.data(), kVocab); }));
    }
    out["mla_kv_dtypes_and_prefill"] = bench_mla_kv_dtypes_and_prefill(isas);
    return out;
}

// GEMV (m = 1) bandwidth per weight format and ISA, as a fraction of the STREAM figures
// of the same thread count: one pass over copies of a 4096 x 4096 matrix that together
// hold `gemv_bytes` (so the weights come from DRAM, not the LLC).
json bench_gemv(const KernelFlags& f, ThreadPool& pool, const bench::StreamBandwidth& bw,
                const std::vector<float>& wf, const std::vector<float>& x) {
    json out;
    const int64_t R = 4096, K = 4096;
    std::vector<float> y(static_cast<size_t>(R));
    for (auto format : {kernels::WeightFormat::kBF16, kernels::WeightFormat::kQ8_0,
                        kernels::WeightFormat::kF32, kernels::WeightFormat::kMXFP4,
                        kernels::WeightFormat::kI8C}) {
        kernels::SourceMatrix src{DType::kF32, R, K, reinterpret_cast<const uint8_t*>(wf.data()),
                                  nullptr, 128, 128};
        kernels::PackedMatrix one = kernels::pack_matrix(src, format).value();
        const int64_t copies = std::max<int64_t>(1, f.gemv_bytes / one.bytes());
        std::vector<kernels::PackedMatrix> mats(static_cast<size_t>(copies), one);
        const std::string name(kernels::weight_format_name(format));
        for (kernels::Isa isa : kernels::supported_isas()) {
            if (isa == kernels::Isa::kScalar && format != kernels::WeightFormat::kBF16) continue;
            const int64_t use = isa == kernels::Isa::kScalar ? 1 : copies;
            const double t = best_time(5, [&] {
                for (int64_t c = 0; c < use; ++c) {
                    kernels::matmul_isa(isa, mats[c], x.data(), 1, y.data(), &pool);
                }
            });
            const double gbs = static_cast<double>(use * one.bytes()) / t / 1e9;
            out[name][std::string(kernels::isa_name(isa))] = {
                {"gb_s", gbs},
                {"fraction_of_best_stream", gbs / bw.best_gb_s()},
                {"fraction_of_triad", gbs / bw.triad_gb_s},
                {"fraction_of_copy", gbs / bw.copy_gb_s}};
        }
    }
    return out;
}

// GEMM (prefill) C[512, 2048] = X[512, 2048] W^T per weight format, active ISA.
json bench_gemm(ThreadPool& pool, const std::vector<float>& wf, const std::vector<float>& x) {
    json out;
    constexpr int64_t kM = 512, kN = 2048, kK = 2048;
    std::vector<float> wsub(static_cast<size_t>(kN * kK));
    for (int64_t r = 0; r < kN; ++r) std::copy_n(wf.data() + r * 4096, kK, wsub.data() + r * kK);
    kernels::SourceMatrix sub{DType::kF32, kN, kK, reinterpret_cast<const uint8_t*>(wsub.data()),
                              nullptr, 128, 128};
    std::vector<float> y(static_cast<size_t>(kM * kN));
    for (auto format : {kernels::WeightFormat::kBF16, kernels::WeightFormat::kQ8_0,
                        kernels::WeightFormat::kF32, kernels::WeightFormat::kMXFP4,
                        kernels::WeightFormat::kI8C}) {
        kernels::PackedMatrix pm = kernels::pack_matrix(sub, format).value();
        const bool has_amx = format == kernels::WeightFormat::kQ8_0 ||
                             format == kernels::WeightFormat::kI8C;
        kernels::matmul(pm, x.data(), kM, y.data(), &pool);  // warm-up
        // i8c: best of 20 (one call is ~3 ms; the shared VM's noise needs more tries).
        const int reps = format == kernels::WeightFormat::kI8C ? 20 : 5;
        const double t =
            best_time(reps, [&] { kernels::matmul(pm, x.data(), kM, y.data(), &pool); });
        const std::string name(kernels::weight_format_name(format));
        out[name] = {{"gflop_s", 2.0 * kM * kN * kK / t / 1e9},
                     {"amx", kernels::amx_active() && has_amx}};
        if (kernels::amx_active() && has_amx) {
            // The same GEMM without AMX (AVX-512 VNNI), for comparison.
            const double tv = best_time(reps, [&] {
                kernels::matmul_isa(kernels::Isa::kAvx512, pm, x.data(), kM, y.data(), &pool);
            });
            out[name + "_vnni"] = {{"gflop_s", 2.0 * kM * kN * kK / tv / 1e9}, {"amx", false}};
        }
    }
    return out;
}

int run_bench_kernels(const KernelFlags& f) {
    json out = {{"isa_active", std::string(kernels::isa_name(kernels::active_isa()))}};
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> wf(static_cast<size_t>(4096 * 4096));
    for (float& v : wf) v = nd(rng) * 0.02f;
    std::vector<float> x(static_cast<size_t>(512 * 4096));
    for (float& v : x) v = nd(rng);
    for (int threads = 1; threads <= f.max_threads; ++threads) {
        json th;
        {
            ThreadPool pool(threads);
            const bench::StreamBandwidth bw = bench::measure_stream(pool, f.stream_bytes, 10);
            th["stream"] = {{"array_mib", f.stream_bytes >> 20},
                            {"copy_gb_s", bw.copy_gb_s},
                            {"triad_gb_s", bw.triad_gb_s},
                            {"read_8streams_gb_s", bw.read_gb_s}};
            th["gemv_4096x4096"] = bench_gemv(f, pool, bw, wf, x);
            th["gemm_m512_2048x2048"] = bench_gemm(pool, wf, x);
        }
        // Anchors after our pool is gone (its workers spin between calls), same shape.
        th["openblas_sgemm"] = bench::openblas_sgemm(threads, 512, 2048, 2048, 5);
        th["onednn_matmul"] = bench::onednn_matmul(threads, 512, 2048, 2048, 5);
        double best = 0;
        std::string best_name;
        auto consider = [&](const json& j, const std::string& name) {
            if (j.contains("gflop_s") && j["gflop_s"].get<double>() > best) {
                best = j["gflop_s"].get<double>();
                best_name = name;
            }
        };
        consider(th["openblas_sgemm"], "openblas_sgemm");
        if (th["onednn_matmul"].contains("bf16")) {
            consider(th["onednn_matmul"]["bf16"], "onednn_bf16");
            consider(th["onednn_matmul"]["s8"], "onednn_s8");
        }
        const json same = {{"f32", th["openblas_sgemm"]},
                           {"bf16", th["onednn_matmul"].value("bf16", json())},
                           {"q8_0", th["onednn_matmul"].value("s8", json())},
                           {"mxfp4", th["onednn_matmul"].value("s8", json())},
                           {"q8_0_vnni", th["onednn_matmul"].value("s8", json())},
                           {"i8c", th["onednn_matmul"].value("s8", json())},
                           {"i8c_vnni", th["onednn_matmul"].value("s8", json())}};
        th["best_anchor"] = {{"name", best_name}, {"gflop_s", best}};
        double ours = 0;
        std::string ours_name;
        for (auto& [name, v] : th["gemm_m512_2048x2048"].items()) {
            const double g = v["gflop_s"].get<double>();
            if (g > ours) {
                ours = g;
                ours_name = name;
            }
            if (best > 0) v["ratio_to_best_anchor"] = g / best;
            if (same[name].contains("gflop_s")) {
                v["ratio_to_same_type_anchor"] = g / same[name]["gflop_s"].get<double>();
            }
        }
        // The GEMM figure: our best format over the best anchor.
        th["best_ours"] = {{"name", ours_name},
                           {"gflop_s", ours},
                           {"ratio_to_best_anchor", best > 0 ? ours / best : 0.0}};
        out["threads"][std::to_string(threads)] = th;
        std::fprintf(stderr, "threads %d done\n", threads);
    }
    out["attention_and_ops_1thread"] = bench_attention_and_ops(kernels::supported_isas());
    std::printf("%s\n", out.dump(f.json ? 2 : -1).c_str());
    return 0;
}

struct ModelFlags {
    std::string model;
    bool json = false;
    int max_threads = 2;
    int prompt_tokens = 512;
    int gen_tokens = 128;
    std::string weight_format = "auto";
    std::string kv_dtype = "f32";
    // llama.cpp's AMX variant: "on" (ggml picks it only where the CPU has AMX-INT8; the
    // writer keeps attn_k_b out of AMX, docs/gguf_deepseek2.md) or "off" (hidden).
    std::string llamacpp_amx = "on";
    std::string llamacpp_flash_attn = "off";
    bool skip_llamacpp = false;
    // Only the per-shape GEMM comparison (reads the GGUF's header, loads no model).
    bool gemm_only = false;
    int repetitions = 3;
    bool roofline = true;
    int64_t stream_bytes = 512ll << 20;
    // When set: the prompt's logits (every position, one thread) under --weight-format vs
    // under this format: the accuracy cost of a format (e.g. i8c vs the file's q8_0).
    std::string compare_format;
};

// Logits of every prompt position under `weight_format` (one thread).
Result<std::vector<float>> prompt_logits(const ModelFlags& f, const std::string& weight_format,
                                         const std::vector<int32_t>& prompt) {
    DSI_ASSIGN_OR_RETURN(auto source, open_checkpoint(Env::default_env(), f.model));
    DeepseekModel::Options options;
    options.num_threads = 1;
    options.weight_format = weight_format;
    options.kv_dtype = f.kv_dtype;
    DSI_ASSIGN_OR_RETURN(auto model, DeepseekModel::load(std::move(source), options));
    auto cache = model->new_kv_cache(static_cast<int64_t>(prompt.size()) + 1);
    ForwardOutput fo;
    DSI_RETURN_IF_ERROR(model->forward(prompt, 0, *cache, true, fo));
    return std::move(fo.logits);
}

// Max |logit difference| over all prompt positions between --weight-format and
// --compare-format, the reference's logit standard deviation, and how many positions
// keep their argmax.
json compare_logits(const ModelFlags& f, const std::vector<int32_t>& prompt) {
    auto a = prompt_logits(f, f.weight_format, prompt);
    auto b = prompt_logits(f, f.compare_format, prompt);
    if (!a.is_ok() || !b.is_ok() || a->size() != b->size()) {
        return {{"error", !a.is_ok() ? a.status().to_string()
                          : !b.is_ok() ? b.status().to_string() : "size mismatch"}};
    }
    const int64_t n = static_cast<int64_t>(prompt.size());
    const int64_t vocab = static_cast<int64_t>(a->size()) / n;
    double max_diff = 0, sum = 0, sum2 = 0;
    int64_t same_argmax = 0;
    for (int64_t t = 0; t < n; ++t) {
        const float* pa = a->data() + t * vocab;
        const float* pb = b->data() + t * vocab;
        for (int64_t v = 0; v < vocab; ++v) {
            max_diff = std::max(max_diff, static_cast<double>(std::fabs(pa[v] - pb[v])));
            sum += pb[v];
            sum2 += static_cast<double>(pb[v]) * pb[v];
        }
        same_argmax += std::max_element(pa, pa + vocab) - pa == std::max_element(pb, pb + vocab) - pb;
    }
    const double count = static_cast<double>(n * vocab);
    const double mean = sum / count;
    return {{"format", f.weight_format},
            {"reference_format", f.compare_format},
            {"positions", n},
            {"max_abs_logit_diff", max_diff},
            {"reference_logit_std", std::sqrt(std::max(0.0, sum2 / count - mean * mean))},
            {"same_argmax_positions", same_argmax}};
}

// What a GGUF's weights cost a token: `decode_bytes_per_token` (every tensor a decode
// step reads, routed experts counted as experts_per_tok of n_routed_experts, the token
// embedding and V4's hash-routing tables (ffn_gate_tid2eid) as one row; for V4 also the
// KV a decode token at position prompt_tokens reads: window, compressed entries, keys) and the prefill GEMMs of a `prompt_tokens` prompt as (m, n, k) ->
// count (2-D matrices at m = prompt; routed experts at m = prompt * k / E on average;
// the per-head 3-D attn_k_b/attn_v_b products and the output layer, which prefill runs
// for the last token only, left out).
struct WeightCost {
    double decode_bytes_per_token = 0;
    double head_bytes = 0;
    // (m, n, k, stored dtype) -> count.
    std::map<std::tuple<int64_t, int64_t, int64_t, DType>, int64_t> prefill_gemms;
};

Result<WeightCost> weight_cost(const std::string& path, int64_t prompt_tokens) {
    DSI_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(Env::default_env(), path));
    DSI_ASSIGN_OR_RETURN(ModelConfig c, config_from_gguf(file));
    WeightCost w;
    const double expert_share =
        c.n_routed_experts > 0 ? static_cast<double>(c.num_experts_per_tok) / c.n_routed_experts : 0;
    for (const GgufTensorInfo& t : file.tensors()) {
        const bool expert = t.name.find("_exps.") != std::string::npos;
        if (t.name == "token_embd.weight" ||
            t.name.find("ffn_gate_tid2eid") != std::string::npos) {
            w.decode_bytes_per_token += static_cast<double>(t.nbytes) / static_cast<double>(t.shape[0]);
            continue;
        }
        w.decode_bytes_per_token += expert ? static_cast<double>(t.nbytes) * expert_share
                                           : static_cast<double>(t.nbytes);
        if (t.name == "output.weight") {
            w.head_bytes = static_cast<double>(t.nbytes);
            continue;
        }
        if (expert && t.shape.size() == 3) {
            const int64_t m = std::max<int64_t>(1, prompt_tokens * c.num_experts_per_tok / c.n_routed_experts);
            w.prefill_gemms[{m, t.shape[1], t.shape[2], t.dtype}] += t.shape[0];
        } else if (t.shape.size() == 2 && t.shape[0] > 64) {  // matrices, not the router
            w.prefill_gemms[{prompt_tokens, t.shape[0], t.shape[1], t.dtype}] += 1;
        }
    }
    if (c.is_v4()) {
        // KV a decode token at position prompt_tokens reads (f32): the window, and on
        // ratio-4 layers the top-k entries plus every indexer key, on ratio-128 layers
        // every entry.
        const int64_t pos = prompt_tokens;
        int64_t floats = 0;
        for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
            floats += std::min<int64_t>(pos + 1, c.sliding_window) * c.head_dim;
            if (c.compress_ratio(l) == 4) {
                floats += std::min<int64_t>(pos / 4, c.index_topk) * c.head_dim +
                          pos / 4 * c.index_head_dim;
            } else if (c.compress_ratio(l) == 128) {
                floats += pos / 128 * c.head_dim;
            }
        }
        w.decode_bytes_per_token += static_cast<double>(floats) * sizeof(float);
    }
    return w;
}

// Seconds oneDNN s8 (u8 x s8 -> s32) takes for all of `gemms` on `threads` threads, timed
// shape by shape (best of 3 after a warm-up call).
Result<double> onednn_prefill_seconds(const WeightCost& w, int threads) {
    double secs = 0;
    for (const auto& [shape, count] : w.prefill_gemms) {
        const auto [m, n, k, dtype] = shape;
        json r = bench::onednn_matmul(threads, m, n, k, 3);
        if (!r.contains("s8") || !r["s8"].contains("gflop_s")) {
            return unavailable("oneDNN s8 matmul not available: " + r.dump());
        }
        secs += static_cast<double>(count) * 2.0 * static_cast<double>(m * n * k) /
                (r["s8"]["gflop_s"].get<double>() * 1e9);
    }
    return secs;
}

// The packed format `--weight-format` gives a matrix stored as `dtype`: one format for
// every class when it names one, else the stored format (`auto`; class lists are not
// resolved here and count as `auto`).
kernels::WeightFormat bench_format(const std::string& weight_format, DType dtype) {
    kernels::WeightFormat f;
    if (weight_format != "auto" && kernels::parse_weight_format(weight_format, &f)) return f;
    return kernels::native_weight_format(dtype);
}

// Seconds per call of `fn` on this thread: one warm-up call, then the median of enough
// calls to fill ~0.2 s (at least 3, at most 50).
template <typename F>
double median_call_seconds(F fn) {
    auto t0 = Clock::now();
    fn();
    const double warm = std::max(seconds_since(t0), 1e-6);
    const int calls = static_cast<int>(std::clamp(0.2 / warm, 3.0, 50.0));
    std::vector<double> times;
    for (int i = 0; i < calls; ++i) {
        t0 = Clock::now();
        fn();
        times.push_back(seconds_since(t0));
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

// dsinfer's matmul against oneDNN s8 on exactly the shapes of `w.prefill_gemms` (issue
// 20: "dsinfer GEMM / oneDNN s8 on the same shapes"): per shape, random weights packed
// once as the model's default path packs that dtype (bench_format), then `reps`
// alternating repetitions of ours (a fresh pool, warm-up, median call) and oneDNN's (a
// fresh primitive, warm-up, median of 5 calls). Ours includes quantising the f32
// activations per call; oneDNN's starts from u8 activations and writes s32.
// Per shape and in total (weighted by count): seconds and the ratio oneDNN / ours,
// medians over the repetitions with min and max.
Result<json> gemm_same_shapes(const WeightCost& w, const std::string& weight_format, int threads,
                              int reps) {
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<double> ours_total(static_cast<size_t>(reps), 0.0);
    std::vector<double> dnn_total(static_cast<size_t>(reps), 0.0);
    json shapes = json::array();
    for (const auto& [shape, count] : w.prefill_gemms) {
        const auto [m, n, k, dtype] = shape;
        std::vector<float> wf(static_cast<size_t>(n * k));
        for (float& v : wf) v = nd(rng) * 0.02f;
        std::vector<float> x(static_cast<size_t>(m * k)), y(static_cast<size_t>(m * n));
        for (float& v : x) v = nd(rng);
        const kernels::WeightFormat fmt = bench_format(weight_format, dtype);
        const kernels::SourceMatrix src{DType::kF32, n, k,
                                        reinterpret_cast<const uint8_t*>(wf.data())};
        DSI_ASSIGN_OR_RETURN(kernels::PackedMatrix packed, kernels::pack_matrix(src, fmt));
        std::vector<double> ours, dnn, ratio;
        for (int rep = 0; rep < reps; ++rep) {
            {
                ThreadPool pool(threads);
                ours.push_back(median_call_seconds(
                    [&] { kernels::matmul(packed, x.data(), m, y.data(), &pool); }));
            }
            json r = bench::onednn_matmul(threads, m, n, k, 5, /*s8_only=*/true);
            if (!r.contains("s8") || !r["s8"].contains("median_s")) {
                return unavailable("oneDNN s8 matmul not available: " + r.dump());
            }
            dnn.push_back(r["s8"]["median_s"].get<double>());
            ratio.push_back(dnn.back() / ours.back());
            ours_total[rep] += static_cast<double>(count) * ours.back();
            dnn_total[rep] += static_cast<double>(count) * dnn.back();
        }
        const double ops = 2.0 * static_cast<double>(m * n * k);
        const json so = bench::summarize_runs(ours), sd = bench::summarize_runs(dnn);
        shapes.push_back({{"m", m},
                          {"n", n},
                          {"k", k},
                          {"count", count},
                          {"format", std::string(kernels::weight_format_name(fmt))},
                          {"dsinfer_s", so},
                          {"onednn_s8_s", sd},
                          {"dsinfer_gop_s", ops / so["median"].get<double>() / 1e9},
                          {"onednn_s8_gop_s", ops / sd["median"].get<double>() / 1e9},
                          {"onednn_over_dsinfer", bench::summarize_runs(ratio)}});
        std::fprintf(stderr, "gemm %lldx%lldx%lld x%lld: %s\n", static_cast<long long>(m),
                     static_cast<long long>(n), static_cast<long long>(k),
                     static_cast<long long>(count), shapes.back().dump().c_str());
    }
    std::vector<double> total_ratio;
    for (int rep = 0; rep < reps; ++rep) total_ratio.push_back(dnn_total[rep] / ours_total[rep]);
    return json{{"shapes", shapes},
                {"dsinfer_total_s", bench::summarize_runs(ours_total)},
                {"onednn_s8_total_s", bench::summarize_runs(dnn_total)},
                {"onednn_over_dsinfer", bench::summarize_runs(total_ratio)}};
}

// One dsinfer repetition at `threads`: load (any family, through the engine's model seam
// CausalLm), warm up (a short prompt and two decode steps), then the timed prompt and
// decode.
Result<json> run_dsinfer_model_once(const ModelFlags& f, int threads) {
    Env* env = Env::default_env();
    DSI_ASSIGN_OR_RETURN(auto source, open_checkpoint(env, f.model));
    ModelOptions options;
    options.num_threads = threads;
    options.weight_format = f.weight_format;
    options.kv_dtype = f.kv_dtype;
    auto t_load = Clock::now();
    DSI_ASSIGN_OR_RETURN(std::unique_ptr<CausalLm> model, load_causal_lm(std::move(source), options));
    json r = {{"load_s", seconds_since(t_load)}};
    CausalLm& m = *model;
    BatchOutput out;
    auto forward = [&](std::span<const int32_t> tokens, int64_t pos, KvCache& cache) {
        const SequenceStep step{tokens, pos, &cache, false};
        return m.forward_batch(std::span<const SequenceStep>(&step, 1), out);
    };
    auto argmax = [&] {
        return static_cast<int32_t>(std::max_element(out.logits.begin(), out.logits.end()) -
                                    out.logits.begin());
    };
    {
        auto warm = m.new_kv_cache(8);
        std::vector<int32_t> p = {1000, 1001, 1002, 1003};
        DSI_RETURN_IF_ERROR(forward(p, 0, *warm));
        std::vector<int32_t> one = {1004};
        DSI_RETURN_IF_ERROR(forward(one, 4, *warm));
        DSI_RETURN_IF_ERROR(forward(one, 5, *warm));
    }
    auto cache = m.new_kv_cache(f.prompt_tokens + f.gen_tokens + 1);
    std::vector<int32_t> prompt(static_cast<size_t>(f.prompt_tokens));
    for (int i = 0; i < f.prompt_tokens; ++i) prompt[i] = 1000 + i;
    auto t0 = Clock::now();
    DSI_RETURN_IF_ERROR(forward(prompt, 0, *cache));
    const double pp_s = seconds_since(t0);
    int32_t tok = argmax();
    t0 = Clock::now();
    for (int i = 0; i < f.gen_tokens; ++i) {
        std::vector<int32_t> one = {tok};
        DSI_RETURN_IF_ERROR(forward(one, f.prompt_tokens + i, *cache));
        tok = argmax();
    }
    const double tg_s = seconds_since(t0);
    r["pp_tokens_per_s"] = f.prompt_tokens / pp_s;
    r["tg_tokens_per_s"] = f.gen_tokens / tg_s;
    return r;
}

// One llama.cpp repetition at `threads` (a fresh node process, warmed up inside).
Result<json> run_llamacpp_model_once(const ModelFlags& f, int threads) {
    const std::string tmp = "/tmp/dsinfer_bench_llamacpp_" + std::to_string(::getpid()) + ".json";
    const std::string cmd = "node " + std::string(DSINFER_SOURCE_DIR) +
                            "/bench/llamacpp_bench.mjs --model " + f.model + " --threads " +
                            std::to_string(threads) + " --prompt-tokens " +
                            std::to_string(f.prompt_tokens) + " --gen-tokens " +
                            std::to_string(f.gen_tokens) + " --amx " + f.llamacpp_amx +
                            " --flash-attn " + f.llamacpp_flash_attn + " --out " + tmp;
    if (std::system(cmd.c_str()) != 0) return internal_error("llama.cpp side failed: " + cmd);
    DSI_ASSIGN_OR_RETURN(std::string text, Env::default_env()->read_file(tmp));
    std::remove(tmp.c_str());
    return json::parse(text);
}

int run_bench_model(const ModelFlags& f) {
    if (f.repetitions < 1) {
        std::fprintf(stderr, "dsinfer: --repetitions must be >= 1\n");
        return 1;
    }
    json out = {{"model", f.model}, {"weight_format", f.weight_format},
                {"kv_dtype", f.kv_dtype},
                {"isa", std::string(kernels::isa_name(kernels::active_isa()))},
                {"amx", kernels::amx_active() ? "on" : "off (CPU without AMX-INT8)"},
                {"prompt_tokens", f.prompt_tokens}, {"gen_tokens", f.gen_tokens},
                {"repetitions", f.repetitions}};
    if (!f.compare_format.empty()) {
        std::vector<int32_t> prompt(static_cast<size_t>(f.prompt_tokens));
        for (int i = 0; i < f.prompt_tokens; ++i) prompt[i] = 1000 + i;
        out["logits_vs_compare_format"] = compare_logits(f, prompt);
        std::fprintf(stderr, "logits: %s\n", out["logits_vs_compare_format"].dump().c_str());
    }
    std::optional<WeightCost> cost;
    if (f.roofline) {
        Result<WeightCost> w = weight_cost(f.model, f.prompt_tokens);
        if (w.is_ok()) {
            cost = *w;
            out["decode_weight_bytes_per_token"] = cost->decode_bytes_per_token;
            out["output_layer_share_of_decode_bytes"] =
                cost->head_bytes / cost->decode_bytes_per_token;
        } else {
            out["roofline"] = "unavailable: " + w.status().to_string();
        }
    }
    auto cell = [](const json& s) {
        char b[64];
        std::snprintf(b, sizeof b, "%.2f (%.2f-%.2f)", s["median"].get<double>(),
                      s["min"].get<double>(), s["max"].get<double>());
        return std::string(b);
    };
    if (f.gemm_only) {
        if (!cost) {
            std::fprintf(stderr, "dsinfer: --gemm-only needs the GGUF's shapes: %s\n",
                         out["roofline"].dump().c_str());
            return 1;
        }
        std::string table =
            "| threads | dsinfer GEMM s | oneDNN s8 s | dsinfer GEMM / oneDNN s8 (same shapes) |\n"
            "|---:|---:|---:|---:|\n";
        for (int threads = 1; threads <= f.max_threads; ++threads) {
            Result<json> g = gemm_same_shapes(*cost, f.weight_format, threads, f.repetitions);
            if (!g.is_ok()) {
                std::fprintf(stderr, "dsinfer: %s\n", g.status().to_string().c_str());
                return 1;
            }
            table += "| " + std::to_string(threads) + " | " + cell((*g)["dsinfer_total_s"]) +
                     " | " + cell((*g)["onednn_s8_total_s"]) + " | " +
                     cell((*g)["onednn_over_dsinfer"]) + " |\n";
            out["threads"][std::to_string(threads)]["gemm_same_shapes"] = *g;
        }
        out["table"] = table;
        std::fprintf(stderr, "%s", table.c_str());
        std::printf("%s\n", out.dump(f.json ? 2 : -1).c_str());
        return 0;
    }
    std::string table =
        "| threads | dsinfer pp tok/s | llama.cpp pp | pp ratio | pp GEMM work / oneDNN s8 | "
        "dsinfer GEMM / oneDNN s8 (same shapes) | dsinfer tg tok/s | llama.cpp tg | tg ratio | "
        "tg bytes / STREAM |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (int threads = 1; threads <= f.max_threads; ++threads) {
        json r;
        std::map<std::string, std::vector<double>> runs;
        for (int rep = 0; rep < f.repetitions; ++rep) {
            Result<json> d = run_dsinfer_model_once(f, threads);
            if (!d.is_ok()) {
                std::fprintf(stderr, "dsinfer: %s\n", d.status().to_string().c_str());
                return 1;
            }
            r["dsinfer_runs"].push_back(*d);
            runs["dsinfer_pp"].push_back((*d)["pp_tokens_per_s"].get<double>());
            runs["dsinfer_tg"].push_back((*d)["tg_tokens_per_s"].get<double>());
            if (f.skip_llamacpp) continue;
            Result<json> l = run_llamacpp_model_once(f, threads);
            if (!l.is_ok()) {
                std::fprintf(stderr, "dsinfer: %s\n", l.status().to_string().c_str());
                return 1;
            }
            r["llama_cpp_runs"].push_back(*l);
            runs["llama_cpp_pp"].push_back((*l)["pp_tokens_per_s"].get<double>());
            runs["llama_cpp_tg"].push_back((*l)["tg_tokens_per_s"].get<double>());
        }
        for (const auto& [k, v] : runs) r["summary"][k] = bench::summarize_runs(v);
        const json& s = r["summary"];
        std::string pp_roof = "-", tg_roof = "-", gemm_roof = "-";
        if (cost) {
            // Same run: STREAM read and oneDNN on this thread count, right after the reps.
            ThreadPool pool(threads);
            const bench::StreamBandwidth bw = bench::measure_stream(pool, f.stream_bytes, 5);
            const double tg_gb_s =
                cost->decode_bytes_per_token * s["dsinfer_tg"]["median"].get<double>() / 1e9;
            r["roofline"]["stream_read_gb_s"] = bw.read_gb_s;
            r["roofline"]["decode_gb_s"] = tg_gb_s;
            r["roofline"]["decode_share_of_stream"] = tg_gb_s / bw.read_gb_s;
            char b[32];
            std::snprintf(b, sizeof b, "%.2f", tg_gb_s / bw.read_gb_s);
            tg_roof = b;
            Result<double> dnn = onednn_prefill_seconds(*cost, threads);
            if (dnn.is_ok()) {
                const double pp_s = f.prompt_tokens / s["dsinfer_pp"]["median"].get<double>();
                r["roofline"]["onednn_s8_prefill_gemm_s"] = *dnn;
                r["roofline"]["prefill_share_of_onednn_s8"] = *dnn / pp_s;
                std::snprintf(b, sizeof b, "%.2f", *dnn / pp_s);
                pp_roof = b;
            } else {
                r["roofline"]["onednn"] = dnn.status().to_string();
            }
            Result<json> g = gemm_same_shapes(*cost, f.weight_format, threads, f.repetitions);
            if (g.is_ok()) {
                r["roofline"]["gemm_same_shapes"] = *g;
                gemm_roof = cell((*g)["onednn_over_dsinfer"]);
            } else {
                r["roofline"]["gemm_same_shapes"] = g.status().to_string();
            }
        }
        const bool have_l = s.contains("llama_cpp_pp");
        auto ratio = [&](const char* a, const char* b) {
            if (!have_l) return std::string("-");
            char buf[32];
            std::snprintf(buf, sizeof buf, "%.2f", s[a]["median"].get<double>() / s[b]["median"].get<double>());
            return std::string(buf);
        };
        table += "| " + std::to_string(threads) + " | " + cell(s["dsinfer_pp"]) + " | " +
                 (have_l ? cell(s["llama_cpp_pp"]) : "-") + " | " +
                 ratio("dsinfer_pp", "llama_cpp_pp") + " | " + pp_roof + " | " + gemm_roof + " | " +
                 cell(s["dsinfer_tg"]) + " | " + (have_l ? cell(s["llama_cpp_tg"]) : "-") + " | " +
                 ratio("dsinfer_tg", "llama_cpp_tg") + " | " + tg_roof + " |\n";
        out["threads"][std::to_string(threads)] = r;
        std::fprintf(stderr, "threads %d: %s\n", threads, r["summary"].dump().c_str());
    }
    out["table"] = table;
    std::fprintf(stderr, "%s", table.c_str());
    std::printf("%s\n", out.dump(f.json ? 2 : -1).c_str());
    return 0;
}

}  // namespace

void register_bench_commands(CLI::App& app) {
    CLI::App* bench = app.add_subcommand("bench", "kernel and model benchmarks (bench/RESULTS.md)");
    bench->require_subcommand(1);
    auto kf = std::make_shared<KernelFlags>();
    CLI::App* k = bench->add_subcommand("kernels", "GEMV/GEMM vs STREAM bandwidth, OpenBLAS and oneDNN");
    k->add_flag("--json", kf->json, "pretty JSON");
    add_setting(*k, "--max-threads", kf->max_threads, "runs 1..N threads");
    add_setting(*k, "--gemv-bytes", kf->gemv_bytes, "GEMV pass size (bytes)");
    add_setting(*k, "--stream-bytes", kf->stream_bytes, "STREAM array size (bytes)");
    k->callback([kf] {
        if (int rc = run_bench_kernels(*kf); rc != 0) throw CLI::RuntimeError(rc);
    });
    auto mf = std::make_shared<ModelFlags>();
    CLI::App* m = bench->add_subcommand("model", "prefill/decode tokens/s vs llama.cpp, same GGUF");
    add_setting(*m, "--model", mf->model, "GGUF (or HF directory with --skip-llamacpp)")->required();
    m->add_flag("--json", mf->json, "pretty JSON");
    add_setting(*m, "--max-threads", mf->max_threads, "runs 1..N threads");
    add_setting(*m, "--prompt-tokens", mf->prompt_tokens, "prompt length");
    add_setting(*m, "--gen-tokens", mf->gen_tokens, "generated tokens");
    add_setting(*m, "--weight-format", mf->weight_format, "see DeepseekModel::Options");
    add_setting(*m, "--kv-dtype", mf->kv_dtype, "f32 | bf16 | e4m3 (DeepseekModel::Options)");
    add_setting(*m, "--llamacpp-amx", mf->llamacpp_amx, "on | off (llama.cpp's AMX variant)");
    add_setting(*m, "--llamacpp-flash-attn", mf->llamacpp_flash_attn, "on | off");
    add_setting(*m, "--repetitions", mf->repetitions, "alternating repetitions (median, spread)");
    add_switch(*m, "--roofline", mf->roofline, "STREAM and oneDNN shares beside tokens/s");
    add_setting(*m, "--stream-bytes", mf->stream_bytes, "STREAM array size of the roofline");
    m->add_flag("--skip-llamacpp", mf->skip_llamacpp, "dsinfer only");
    m->add_flag("--gemm-only", mf->gemm_only,
                "only dsinfer's matmul vs oneDNN s8 on the GGUF's prefill GEMM shapes");
    add_setting(*m, "--compare-format", mf->compare_format,
                "also report the prompt logits' max |diff| vs this weight format");
    m->callback([mf] {
        if (int rc = run_bench_model(*mf); rc != 0) throw CLI::RuntimeError(rc);
    });
}

}  // namespace dsi
