#include "model/memory_plan.h"

#include <cinttypes>
#include <cstdio>
#include <map>

#include "kernels/attention.h"
#include "model/internal/v4_kv_format.h"
#include "model/weights.h"

namespace dsi {
namespace {

constexpr int64_t kF32 = 4;

void add_weight(std::map<std::string, MemoryPlan::WeightFormat>& by, const std::string& format,
                int64_t bytes) {
    MemoryPlan::WeightFormat& w = by[format];
    w.format = format;
    w.tensors += 1;
    w.bytes += bytes;
}

int64_t blocks(int64_t n, int64_t b) { return (n + b - 1) / b; }

void plan_weights(const ModelConfig& c, MemoryPlan& p) {
    std::map<std::string, MemoryPlan::WeightFormat> by;
    const int64_t scale_bytes = c.fp8_scale_ue8m0 || c.is_v4() ? 1 : 4;
    const std::string fp8 = std::string("fp8-e4m3 (+") + (scale_bytes == 1 ? "ue8m0" : "f32") +
                            " scales per " + std::to_string(c.fp8_block_rows) + "x" +
                            std::to_string(c.fp8_block_cols) + ")";
    auto fp8_bytes = [&](int64_t rows, int64_t cols) {
        return rows * cols +
               blocks(rows, c.fp8_block_rows) * blocks(cols, c.fp8_block_cols) * scale_bytes;
    };
    if (c.is_v4()) {
        for (const V4TensorSpec& s : deepseek_v4_tensor_specs(c)) {
            const int64_t n = shape_numel(s.shape);
            V4Storage st = s.storage;
            if (st == V4Storage::kFp4 && !c.expert_fp4) st = V4Storage::kFp8;
            if (st == V4Storage::kFp8 && !c.fp8) st = V4Storage::kBF16;
            switch (st) {
                case V4Storage::kBF16: add_weight(by, "bf16", 2 * n); break;
                case V4Storage::kF32: add_weight(by, "f32", 4 * n); break;
                case V4Storage::kI64: add_weight(by, "i64", 8 * n); break;
                case V4Storage::kFp8: add_weight(by, fp8, fp8_bytes(s.shape[0], s.shape[1])); break;
                case V4Storage::kFp4:
                    add_weight(by, "fp4-e2m1 (+ue8m0 scale per 32)", n / 2 + n / 32);
                    break;
            }
        }
    } else {
        for (const TensorSpec& s : deepseek_tensor_specs(c)) {
            const int64_t n = shape_numel(s.shape);
            if (c.fp8 && s.quantizable) {
                add_weight(by, fp8, fp8_bytes(s.shape[0], s.shape[1]));
            } else {
                add_weight(by, "bf16", 2 * n);
            }
        }
    }
    for (auto& [name, w] : by) {
        p.weights.push_back(w);
        p.weight_bytes += w.bytes;
    }
}

void plan_v4_kv(const ModelConfig& c, MemoryPlan& p) {
    const int64_t hd = c.head_dim;
    const int64_t ihd = c.index_head_dim;
    const int64_t W = c.sliding_window;
    const int64_t N = p.context;
    // --kv-dtype e4m3 (deepseek_v4.md §4.2): 584-byte main rows at head_dim 512 (448
    // e4m3 + 64 bf16 + 7 ue8m0 scales + 1 pad), 68-byte MXFP4 indexer keys at 128.
    const int64_t entry = internal::v4_main_row_bytes(hd, c.qk_rope_head_dim);
    const int64_t key = ihd > 0 && ihd % 32 == 0 ? internal::v4_index_row_bytes(ihd) : ihd * kF32;
    MemoryPlan::LayerKind window{"window (ratio 0)"}, c4{"ratio 4 + indexer"}, c128{"ratio 128"};
    p.compact_window_row_bytes = entry;
    for (int64_t l = 0; l < c.num_hidden_layers + c.num_nextn_predict_layers; ++l) {
        const int64_t r = c.compress_ratio(l);
        MemoryPlan::LayerKind& k = r == 0 ? window : r == 4 ? c4 : c128;
        k.layers += 1;
        // Every layer keeps a window ring of raw rows.
        k.dsinfer_state_bytes += W * hd * kF32;
        k.compact_state_bytes += W * entry;
        if (r == 0) continue;
        const int64_t coff = r == 4 ? 2 : 1;
        // Compressor accumulators: kv + score rows [coff * r, coff * D] in f32.
        const int64_t acc = 2 * coff * r * coff * hd * kF32 +
                            (r == 4 ? 2 * 2 * r * 2 * ihd * kF32 : 0);
        k.dsinfer_state_bytes += acc;
        k.compact_state_bytes += acc;
        p.accumulator_bytes += acc;
        k.dsinfer_bytes_per_token += static_cast<double>(hd * kF32) / static_cast<double>(r);
        k.compact_bytes_per_token += static_cast<double>(entry) / static_cast<double>(r);
        p.dsinfer_kv_bytes += N / r * hd * kF32;
        p.compact_kv_bytes += N / r * entry;
        if (r == 4) {
            k.dsinfer_bytes_per_token += static_cast<double>(ihd * kF32) / 4.0;
            k.compact_bytes_per_token += static_cast<double>(key) / 4.0;
            p.dsinfer_kv_bytes += N / 4 * ihd * kF32;
            p.compact_kv_bytes += N / 4 * key;
        }
    }
    for (MemoryPlan::LayerKind* k : {&window, &c4, &c128}) {
        if (k->layers == 0) continue;
        p.dsinfer_kv_bytes += k->dsinfer_state_bytes;
        p.compact_kv_bytes += k->compact_state_bytes;
        p.kinds.push_back(*k);
    }
}

void plan_mla_kv(const ModelConfig& c, MemoryPlan& p) {
    MemoryPlan::LayerKind k{"mla (latent + rope key)"};
    k.layers = c.num_hidden_layers + c.num_nextn_predict_layers;
    const int64_t n = c.kv_lora_rank + c.qk_rope_head_dim;
    const int64_t f32 = kernels::kv_row_words(kernels::KvDtype::kF32, n) * 4;
    const int64_t e4m3 = n % 16 == 0 ? kernels::kv_row_words(kernels::KvDtype::kE4m3, n) * 4 : f32;
    k.dsinfer_bytes_per_token = static_cast<double>(k.layers * f32);
    k.compact_bytes_per_token = static_cast<double>(k.layers * e4m3);
    p.dsinfer_kv_bytes = p.context * k.layers * f32;
    p.compact_kv_bytes = p.context * k.layers * e4m3;
    p.kinds.push_back(k);
}

std::string human(double bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        ++u;
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
    return buf;
}

}  // namespace

MemoryPlan plan_memory(const ModelConfig& c, int64_t context) {
    MemoryPlan p;
    p.architecture = c.architecture;
    p.context = context;
    plan_weights(c, p);
    if (c.is_v4()) {
        plan_v4_kv(c, p);
    } else {
        plan_mla_kv(c, p);
    }
    return p;
}

std::string format_memory_plan(const MemoryPlan& p, int64_t available_bytes) {
    std::string out;
    char line[512];
    std::snprintf(line, sizeof line, "%s, context %" PRId64 " tokens\n\nweights\n",
                  p.architecture.c_str(), p.context);
    out += line;
    for (const auto& w : p.weights) {
        std::snprintf(line, sizeof line, "  %-44s %8" PRId64 " tensors  %14" PRId64 " B  %s\n",
                      w.format.c_str(), w.tensors, w.bytes, human(static_cast<double>(w.bytes)).c_str());
        out += line;
    }
    std::snprintf(line, sizeof line, "  %-44s %8s          %14" PRId64 " B  %s\n", "total", "",
                  p.weight_bytes, human(static_cast<double>(p.weight_bytes)).c_str());
    out += line;
    out += "\nKV per layer kind (--kv-dtype f32 | --kv-dtype e4m3)\n";
    for (const auto& k : p.kinds) {
        std::snprintf(line, sizeof line,
                      "  %-24s %3" PRId64 " layers  per token %10.2f | %9.2f B   state per "
                      "sequence %s | %s\n",
                      k.kind.c_str(), k.layers, k.dsinfer_bytes_per_token, k.compact_bytes_per_token,
                      human(static_cast<double>(k.dsinfer_state_bytes)).c_str(),
                      human(static_cast<double>(k.compact_state_bytes)).c_str());
        out += line;
    }
    std::snprintf(line, sizeof line, "  one sequence at %" PRId64 " tokens: %s | %s\n", p.context,
                  human(static_cast<double>(p.dsinfer_kv_bytes)).c_str(),
                  human(static_cast<double>(p.compact_kv_bytes)).c_str());
    out += line;
    const int64_t need = p.weight_bytes + p.dsinfer_kv_bytes;
    const int64_t need_e4m3 = p.weight_bytes + p.compact_kv_bytes;
    if (available_bytes > 0) {
        std::snprintf(line, sizeof line,
                      "\nweights + one sequence: %s (f32 KV) | %s (e4m3 KV); available memory %s: "
                      "%s | %s\n",
                      human(static_cast<double>(need)).c_str(),
                      human(static_cast<double>(need_e4m3)).c_str(),
                      human(static_cast<double>(available_bytes)).c_str(),
                      need <= available_bytes ? "fits" : "does NOT fit",
                      need_e4m3 <= available_bytes ? "fits" : "does NOT fit");
        out += line;
    }
    return out;
}

}  // namespace dsi
