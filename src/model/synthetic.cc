#include "model/synthetic.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/env.h"
#include "tensor/dtype.h"

namespace dsi {
namespace {

uint64_t name_hash(std::string_view s) {
    uint64_t h = 1469598103934665603ULL;  // FNV-1a
    for (char c : s) {
        h ^= static_cast<uint8_t>(c);
        h *= 1099511628211ULL;
    }
    return h;
}

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The name whose values a tensor shares (MTP embed/head are copies of the main ones,
// as in DeepSeek V3's checkpoint).
std::string value_source_name(const ModelConfig& c, const std::string& name) {
    const std::string mtp = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
    if (name == mtp + "embed_tokens.weight") return "model.embed_tokens.weight";
    if (name == mtp + "shared_head.head.weight") return "lm_head.weight";
    return name;
}

// Standard deviation and mean of a tensor's raw values.
void tensor_distribution(const ModelConfig& c, const TensorSpec& spec, double& mean, double& std) {
    const std::string& n = spec.name;
    mean = 0.0;
    if (ends_with(n, "norm.weight") || ends_with(n, "layernorm.weight")) {
        mean = 1.0;
        std = 0.1;
    } else if (n == "model.embed_tokens.weight") {
        std = 1.0;
    } else if (n == "lm_head.weight") {
        std = kSyntheticLogitStd / std::sqrt(static_cast<double>(c.hidden_size));
    } else if (ends_with(n, "e_score_correction_bias")) {
        std = 0.05;
    } else {
        std = 1.0 / std::sqrt(static_cast<double>(spec.shape.back()));
    }
}

std::vector<float> raw_values(const ModelConfig& c, const TensorSpec& spec, uint64_t seed) {
    TensorSpec src = spec;
    src.name = value_source_name(c, spec.name);
    double mean, std;
    tensor_distribution(c, src, mean, std);
    SplitMix64 rng(seed ^ name_hash(src.name));
    std::vector<float> v(static_cast<size_t>(shape_numel(spec.shape)));
    for (float& x : v) x = static_cast<float>(mean + std * rng.next_normal());
    return v;
}

}  // namespace

std::vector<std::string> synthetic_preset_names() {
    return {"tiny",    "tiny-v3",  "small",    "medium",
            "tiny-v4", "small-v4", "tiny-v41", "v41-flash-4l"};
}

namespace {

// DeepSeek V4 presets (docs/models.md): the real tokenizer and V4-Flash's fixed
// choices (window 128, ratios 4 / 128, theta 10000 / 160000 + YaRN 16 at 65536,
// sqrtsoftplus + noaux_tc, FP8 ue8m0 128x128, FP4 experts, 4 hyper-connection
// streams, 20 Sinkhorn iterations), smaller widths.
ModelConfig v4_preset_base() {
    ModelConfig c;
    c.architecture = "DeepseekV4ForCausalLM";
    c.family = ModelFamily::kDeepseekV4;
    c.vocab_size = 129280;
    c.bos_token_id = 0;
    c.eos_token_id = 1;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 10000.0;
    c.compress_rope_theta = 160000.0;
    c.rope_scaling.yarn = true;
    c.rope_scaling.factor = 16.0;
    c.rope_scaling.beta_fast = 32.0;
    c.rope_scaling.beta_slow = 1.0;
    c.rope_scaling.original_max_position_embeddings = 65536;
    c.max_position_embeddings = 1048576;
    c.num_key_value_heads = 1;
    c.sliding_window = 128;
    c.scoring_func = ScoringFunc::kSqrtSoftplus;
    c.topk_method = TopkMethod::kNoauxTc;
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 1.5;
    c.hc_mult = 4;
    c.hc_sinkhorn_iters = 20;
    c.hc_eps = 1e-6;
    c.num_nextn_predict_layers = 1;
    c.fp8 = true;
    c.fp8_scale_ue8m0 = true;
    c.expert_fp4 = true;
    return c;
}

// tiny-v41 (docs/models_v41.md): every V4.1 layer kind on a small model. Layers 0-1
// window only, 2 Full + 3 Reuse at ratio 2 (the encoder), 4 Full (the decoder's kv and
// candidate source) + 5 Reuse + 6 Reindex + 7 Reuse at ratio 1; Engram before 1 and 3;
// two DSpark blocks. index_topk 8 and candidates 4 blocks x 4 so prompts over 16 tokens
// make every indexer choose; V4.1's FP8 32x32 ue8m0 blocks and FP4 experts.
ModelConfig v41_tiny_preset() {
    ModelConfig c = v4_preset_base();
    c.architecture = "DeepseekV41ForCausalLM";
    c.family = ModelFamily::kDeepseekV41;
    c.rms_norm_eps = 1e-20;  // V4.1's value
    c.hidden_size = 128;
    c.num_hidden_layers = 8;
    c.num_nextn_predict_layers = 2;
    c.compress_ratios = {0, 0, 2, 2, 1, 1, 1, 1, 0, 0};
    c.num_attention_heads = 4;
    c.head_dim = 128;
    c.qk_rope_head_dim = 32;
    c.q_lora_rank = 64;
    c.o_groups = 2;
    c.o_lora_rank = 64;
    c.index_n_heads = 8;
    c.index_head_dim = 64;
    c.index_topk = 8;
    c.n_routed_experts = 8;
    c.n_shared_experts = 1;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 64;
    c.num_hash_layers = 0;
    c.swiglu_limit = 1.5;
    c.fp8_block_rows = 32;
    c.fp8_block_cols = 32;
    V41Fields& f = c.v41;
    f.kv_source_layer_ids = {2, 4};
    f.index_source_layer_ids = {2, 4, 6};
    f.candidate_source_layer_id = 4;
    f.candidate_topk_blocks = 4;
    f.candidate_block_size = 4;
    f.engram_layer_ids = {1, 3};
    f.engram_max_ngram_size = 3;
    f.engram_vocab_size = 1000;
    f.engram_n_heads = 2;
    f.engram_head_dim = 32;
    f.engram_pad_token_id = 2;
    f.engram_compressed_vocab_size = 99092;
    for (int64_t e = 0; e < 2; ++e) {
        const std::vector<int64_t> m = v41_engram_moduli(c, e);
        f.engram_num_embeddings.push_back(std::accumulate(m.begin(), m.end(), int64_t{0}));
    }
    f.dspark_block_size = 5;
    f.dspark_noise_token_id = 128799;
    f.dspark_target_layer_ids = {5, 6, 7};
    f.dspark_markov_rank = 8;
    f.dspark_n_routed_experts = 4;
    f.dspark_num_experts_per_tok = 2;
    f.image_token_id = 129264;
    f.vision = {.present = true,
                .num_hidden_layers = 2,
                .hidden_size = 64,
                .num_attention_heads = 4,
                .patch_size = 14,
                .image_size = 224,
                .spatial_merge_size = 3};
    return c;
}

// v41-flash-4l (bench only: the hit-cost figure of bench/v41_replay_bench.cc, docs/
// swa_cache.md): V4.1-Flash's real widths (hidden 5120, 64 heads of 512 with rope 64,
// q_lora 1280, 8 output groups of 1024, index 32 heads x 128 with top-512, candidates
// 2048 blocks x 8, experts of 2304 with 6 routed + 1 shared per token) on 4 layers: 0
// encoder Full (ratio 2), 1 encoder Reuse, 2 decoder Full (ratio 1, the kv and candidate
// source), 3 Reindex. Three of its four layers score index keys (V4.1-Flash: 8 of 40), so
// the indexer weighs more here than in the real model. 8 routed experts (a token's work is
// the real one; the memory is not), vocabulary 16,384, no Engram, DSpark or vision:
// about 1.3 GB as FP8 / FP4.
ModelConfig v41_flash_4l_preset() {
    ModelConfig c = v41_tiny_preset();
    c.vocab_size = 16384;
    c.hidden_size = 5120;
    c.num_hidden_layers = 4;
    c.num_nextn_predict_layers = 0;
    c.compress_ratios = {2, 2, 1, 1};
    c.num_attention_heads = 64;
    c.head_dim = 512;
    c.qk_rope_head_dim = 64;
    c.q_lora_rank = 1280;
    c.o_groups = 8;
    c.o_lora_rank = 1024;
    c.index_n_heads = 32;
    c.index_head_dim = 128;
    c.index_topk = 512;
    c.n_routed_experts = 8;
    c.n_shared_experts = 1;
    c.num_experts_per_tok = 6;
    c.moe_intermediate_size = 2304;
    c.swiglu_limit = 10.0;
    V41Fields& f = c.v41;
    f.kv_source_layer_ids = {0, 2};
    f.index_source_layer_ids = {0, 2, 3};
    f.candidate_source_layer_id = 2;
    f.candidate_topk_blocks = 2048;
    f.candidate_block_size = 8;
    f.engram_layer_ids.clear();
    f.engram_num_embeddings.clear();
    f.dspark_target_layer_ids.clear();
    f.image_token_id = -1;
    f.vision = {};
    return c;
}

}  // namespace

Result<ModelConfig> synthetic_preset(std::string_view name) {
    ModelConfig c;
    // The real DeepSeek V3 tokenizer: 129280 embedding rows, bos 0, eos 1.
    c.vocab_size = 129280;
    c.bos_token_id = 0;
    c.eos_token_id = 1;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 10000.0;
    c.rope_scaling.yarn = true;
    c.rope_scaling.factor = 40.0;
    c.rope_scaling.beta_fast = 32.0;
    c.rope_scaling.beta_slow = 1.0;
    c.rope_scaling.original_max_position_embeddings = 4096;
    c.max_position_embeddings = 163840;
    if (name == "tiny") {
        c.architecture = "DeepseekV2ForCausalLM";
        c.family = ModelFamily::kDeepseekV2;
        c.hidden_size = 128;
        c.intermediate_size = 256;
        c.moe_intermediate_size = 64;
        // 26 layers: llama.cpp's deepseek2 loader takes "no q_lora" (V2-Lite) only
        // for 26- or 27-layer models, and tiny cross-checks that path.
        c.num_hidden_layers = 26;
        c.num_attention_heads = 4;
        c.q_lora_rank = 0;
        c.kv_lora_rank = 64;
        c.qk_nope_head_dim = 32;
        c.qk_rope_head_dim = 16;
        c.v_head_dim = 32;
        c.n_routed_experts = 8;
        c.n_shared_experts = 1;
        c.num_experts_per_tok = 2;
        c.topk_method = TopkMethod::kGreedy;
        c.scoring_func = ScoringFunc::kSoftmax;
        c.norm_topk_prob = false;
        c.routed_scaling_factor = 1.0;
        c.first_k_dense_replace = 1;
        c.rope_scaling.mscale = 0.707;
        c.rope_scaling.mscale_all_dim = 0.707;
    } else if (name == "tiny-v3") {
        c.architecture = "DeepseekV3ForCausalLM";
        c.family = ModelFamily::kDeepseekV3;
        c.hidden_size = 256;
        c.intermediate_size = 512;
        c.moe_intermediate_size = 128;
        c.num_hidden_layers = 3;
        c.num_attention_heads = 4;
        c.q_lora_rank = 192;
        c.kv_lora_rank = 128;
        c.qk_nope_head_dim = 32;
        c.qk_rope_head_dim = 32;
        c.v_head_dim = 32;
        c.n_routed_experts = 16;
        c.n_shared_experts = 1;
        c.num_experts_per_tok = 4;
        c.n_group = 4;
        c.topk_group = 2;
        c.topk_method = TopkMethod::kNoauxTc;
        c.scoring_func = ScoringFunc::kSigmoid;
        c.norm_topk_prob = true;
        c.routed_scaling_factor = 2.5;
        c.first_k_dense_replace = 1;
        c.num_nextn_predict_layers = 1;
        c.rope_scaling.mscale = 1.0;
        c.rope_scaling.mscale_all_dim = 1.0;
        c.fp8 = true;
        c.fp8_scale_ue8m0 = false;
    } else if (name == "small" || name == "medium") {
        // small: DeepSeek-V2-Lite widths with 3 layers (1 dense + 2 MoE). V2-Lite has no
        // q_lora, but llama.cpp only accepts that for 26/27-layer models, so this
        // preset uses DeepSeek-V2's q_lora_rank 1536 to stay loadable by llama.cpp
        // for side-by-side benchmarks.
        // medium, the benchmark shape (issue 20): the same widths with 30 layers, so the
        // output layer is 9.4 % of a decode token's weight bytes (small: 51 %), and 16
        // routed experts (V2-Lite: 64) to keep the Q8_0 file at 5.9 GB, so that dsinfer
        // and llama.cpp each fit beside the other's page cache on a 23 GB machine; a
        // token reads 6 of them either way, so one sequence's bytes per token equal a
        // 64-expert model's (docs/models.md).
        const bool medium = name == "medium";
        c.architecture = "DeepseekV2ForCausalLM";
        c.family = ModelFamily::kDeepseekV2;
        c.hidden_size = 2048;
        c.intermediate_size = 10944;
        c.moe_intermediate_size = 1408;
        c.num_hidden_layers = medium ? 30 : 3;
        c.num_attention_heads = 16;
        c.q_lora_rank = 1536;
        c.kv_lora_rank = 512;
        c.qk_nope_head_dim = 128;
        c.qk_rope_head_dim = 64;
        c.v_head_dim = 128;
        c.n_routed_experts = medium ? 16 : 64;
        c.n_shared_experts = 2;
        c.num_experts_per_tok = 6;
        c.topk_method = TopkMethod::kGreedy;
        c.scoring_func = ScoringFunc::kSoftmax;
        c.norm_topk_prob = false;
        c.routed_scaling_factor = 1.0;
        c.first_k_dense_replace = 1;
        c.rope_scaling.mscale = 0.707;
        c.rope_scaling.mscale_all_dim = 0.707;
    } else if (name == "tiny-v4") {
        // Every V4 path on a small model: window-only (0), ratio 4 with the indexer
        // (1, 3), ratio 128 (2), hash routing (0, 1), an MTP layer; index_topk 16 so
        // prompts over 64 tokens make the indexer choose; swiglu_limit 1.5 so the
        // clamp acts on O(1) activations. 16 indexer heads: with 4, entries whose
        // every head scores <= 0 tie at exactly 0 and implementations break the tie
        // differently (llama.cpp does not take the lower index).
        c = v4_preset_base();
        c.hidden_size = 256;
        c.num_hidden_layers = 4;
        c.compress_ratios = {0, 4, 128, 4, 0};
        c.num_attention_heads = 4;
        c.head_dim = 128;
        c.qk_rope_head_dim = 32;
        c.q_lora_rank = 128;
        c.o_groups = 2;
        c.o_lora_rank = 128;
        c.index_n_heads = 16;
        c.index_head_dim = 64;
        c.index_topk = 16;
        c.n_routed_experts = 16;
        c.n_shared_experts = 1;
        c.num_experts_per_tok = 4;
        c.moe_intermediate_size = 128;
        c.num_hash_layers = 2;
        c.swiglu_limit = 1.5;
    } else if (name == "small-v4") {
        // The benchmark shape: V4-Flash's head (512 = 448 nope + 64 rope), index
        // heads of 128 with top-512, 64 experts; hidden 1024, 4 layers + MTP.
        c = v4_preset_base();
        c.hidden_size = 1024;
        c.num_hidden_layers = 4;
        c.compress_ratios = {0, 4, 128, 4, 0};
        c.num_attention_heads = 16;
        c.head_dim = 512;
        c.qk_rope_head_dim = 64;
        c.q_lora_rank = 512;
        c.o_groups = 4;
        c.o_lora_rank = 512;
        c.index_n_heads = 16;
        c.index_head_dim = 128;
        c.index_topk = 512;
        c.n_routed_experts = 64;
        c.n_shared_experts = 1;
        c.num_experts_per_tok = 6;
        c.moe_intermediate_size = 512;
        c.num_hash_layers = 1;
        c.swiglu_limit = 10.0;
    } else if (name == "tiny-v41") {
        c = v41_tiny_preset();
    } else if (name == "v41-flash-4l") {
        c = v41_flash_4l_preset();
    } else {
        std::string names;
        for (const std::string& n : synthetic_preset_names())
            names += (names.empty() ? "" : ", ") + n;
        return invalid_argument("unknown preset '" + std::string(name) + "' (presets: " + names +
                                ")");
    }
    DSI_RETURN_IF_ERROR(c.validate());
    return c;
}

namespace {

// FP8 e4m3 codes per block_rows x block_cols block of `v` [rows, cols].
Fp8Matrix quantize_fp8_blocks(const ModelConfig& c, const std::vector<float>& v, int64_t rows,
                              int64_t cols) {
    const int64_t br = c.fp8_block_rows;
    const int64_t bc = c.fp8_block_cols;
    const int64_t srows = (rows + br - 1) / br;
    const int64_t scols = (cols + bc - 1) / bc;
    Fp8Matrix m;
    m.codes.resize(v.size());
    m.scale_inv.resize(static_cast<size_t>(srows * scols));
    for (int64_t bi = 0; bi < srows; ++bi) {
        for (int64_t bj = 0; bj < scols; ++bj) {
            float amax = 1e-4f;
            for (int64_t r = bi * br; r < std::min(rows, (bi + 1) * br); ++r) {
                for (int64_t q = bj * bc; q < std::min(cols, (bj + 1) * bc); ++q) {
                    amax = std::fmax(amax, std::fabs(v[r * cols + q]));
                }
            }
            float s = amax / 448.0f;
            // ue8m0: a power of two; otherwise a bf16 value, so codes * scale is exact in f32.
            s = c.fp8_scale_ue8m0 ? e8m0_to_f32(f32_to_e8m0_ceil(s))
                                  : bf16_to_f32(f32_to_bf16(s * 1.01f));
            m.scale_inv[bi * scols + bj] = s;
            for (int64_t r = bi * br; r < std::min(rows, (bi + 1) * br); ++r) {
                for (int64_t q = bj * bc; q < std::min(cols, (bj + 1) * bc); ++q) {
                    m.codes[r * cols + q] = f32_to_e4m3(v[r * cols + q] / s);
                }
            }
        }
    }
    return m;
}

}  // namespace

Fp8Matrix synthetic_fp8(const ModelConfig& c, const TensorSpec& spec, uint64_t seed) {
    DSI_CHECK(c.fp8 && spec.quantizable && spec.shape.size() == 2, spec.name);
    return quantize_fp8_blocks(c, raw_values(c, spec, seed), spec.shape[0], spec.shape[1]);
}

std::vector<float> synthetic_tensor(const ModelConfig& c, const TensorSpec& spec, uint64_t seed) {
    if (c.fp8 && spec.quantizable) {
        Fp8Matrix m = synthetic_fp8(c, spec, seed);
        const int64_t cols = spec.shape[1];
        const int64_t scols = (cols + c.fp8_block_cols - 1) / c.fp8_block_cols;
        std::vector<float> v(m.codes.size());
        for (size_t i = 0; i < v.size(); ++i) {
            const int64_t r = static_cast<int64_t>(i) / cols;
            const int64_t q = static_cast<int64_t>(i) % cols;
            v[i] = e4m3_to_f32(m.codes[i]) *
                   m.scale_inv[(r / c.fp8_block_rows) * scols + q / c.fp8_block_cols];
        }
        return v;
    }
    std::vector<float> v = raw_values(c, spec, seed);
    if (spec.name.find("e_score_correction_bias") == std::string::npos) {
        for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
    }
    return v;
}

std::unique_ptr<MemoryWeightSource> synthetic_memory_model(const ModelConfig& c, uint64_t seed) {
    auto src = std::make_unique<MemoryWeightSource>(c);
    for (const TensorSpec& spec : deepseek_tensor_specs(c)) {
        src->add(spec.name, spec.shape, synthetic_tensor(c, spec, seed));
    }
    return src;
}

// ---- DeepSeek V4 ----

namespace {

constexpr float kE2m1Values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// Mean and standard deviation of a V4 tensor's raw values, by name.
void v4_distribution(const ModelConfig& c, const V4TensorSpec& spec, double& mean, double& std) {
    const std::string& n = spec.name;
    mean = 0.0;
    std = 1.0 / std::sqrt(static_cast<double>(spec.shape.back()));
    if (ends_with(n, "norm.weight")) {
        mean = 1.0;
        std = 0.1;
    } else if (n == "embed.weight") {
        std = 1.0;
    } else if (n == "head.weight") {
        std = kSyntheticLogitStd / std::sqrt(static_cast<double>(c.hidden_size));
    } else if (ends_with(n, "_base")) {
        std = 0.5;
    } else if (ends_with(n, "_scale")) {  // hc_*_scale (block scales are not specs)
        mean = 0.5;
        std = 0.1;
    } else if (ends_with(n, "attn_sink")) {
        std = 1.0;
    } else if (ends_with(n, "ape")) {
        std = 0.5;
    } else if (ends_with(n, "gate.bias")) {
        std = 0.05;
    }
}

}  // namespace

float e2m1_to_f32(uint8_t code) {
    const float v = kE2m1Values[code & 7];
    return (code & 8) ? -v : v;
}

uint8_t f32_to_e2m1(float x) {
    const float a = std::fabs(x);
    int best = 0;
    for (int i = 1; i < 8; ++i) {
        const float d = std::fabs(kE2m1Values[i] - a);
        const float db = std::fabs(kE2m1Values[best] - a);
        if (d < db || (d == db && i % 2 == 0)) best = i;
    }
    return static_cast<uint8_t>(best | (x < 0 && best != 0 ? 8 : 0));
}

V4SyntheticTensor synthetic_v4_tensor(const ModelConfig& c, const V4TensorSpec& spec,
                                      uint64_t seed) {
    V4SyntheticTensor t;
    const int64_t n = shape_numel(spec.shape);
    SplitMix64 rng(seed ^ name_hash(spec.name));
    if (spec.storage == V4Storage::kI64) {
        // tid2eid [vocab, k]: k distinct experts per token.
        const int64_t k = spec.shape[1];
        t.dtype = DType::kI64;
        t.stored_shape = spec.shape;
        t.ints.resize(static_cast<size_t>(n));
        for (int64_t r = 0; r < spec.shape[0]; ++r) {
            for (int64_t j = 0; j < k; ++j) {
                int32_t e;
                bool dup;
                do {
                    e = static_cast<int32_t>(rng.next() %
                                             static_cast<uint64_t>(c.n_routed_experts));
                    dup = std::find(&t.ints[r * k], &t.ints[r * k + j], e) != &t.ints[r * k + j];
                } while (dup);
                t.ints[r * k + j] = e;
            }
        }
        t.values.assign(t.ints.begin(), t.ints.end());
        return t;
    }
    double mean, std;
    v4_distribution(c, spec, mean, std);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = static_cast<float>(mean + std * rng.next_normal());
    V4Storage st = spec.storage;
    if (st == V4Storage::kFp4 && !c.expert_fp4) st = V4Storage::kFp8;
    if (st == V4Storage::kFp8 && !c.fp8) st = V4Storage::kBF16;
    t.stored_shape = spec.shape;
    if (st == V4Storage::kF32) {
        t.dtype = DType::kF32;
        t.values = std::move(v);
        return t;
    }
    if (st == V4Storage::kBF16) {
        t.dtype = DType::kBF16;
        for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
        t.values = std::move(v);
        return t;
    }
    const int64_t rows = spec.shape[0];
    const int64_t cols = spec.shape[1];
    if (st == V4Storage::kFp8) {
        Fp8Matrix m = quantize_fp8_blocks(c, v, rows, cols);
        const int64_t scols = (cols + c.fp8_block_cols - 1) / c.fp8_block_cols;
        t.dtype = DType::kF8E4M3;
        t.scale_shape = {(rows + c.fp8_block_rows - 1) / c.fp8_block_rows, scols};
        t.scales.resize(m.scale_inv.size());
        for (size_t i = 0; i < m.scale_inv.size(); ++i)
            t.scales[i] = f32_to_e8m0_ceil(m.scale_inv[i]);
        t.values.resize(v.size());
        for (int64_t r = 0; r < rows; ++r) {
            for (int64_t q = 0; q < cols; ++q) {
                t.values[r * cols + q] =
                    e4m3_to_f32(m.codes[r * cols + q]) *
                    e8m0_to_f32(t.scales[(r / c.fp8_block_rows) * scols + q / c.fp8_block_cols]);
            }
        }
        t.codes = std::move(m.codes);
        return t;
    }
    // FP4: e2m1 pairs + one ue8m0 scale per 32 along the row.
    DSI_CHECK(cols % 32 == 0, spec.name);
    t.dtype = DType::kI8;
    t.stored_shape = {rows, cols / 2};
    t.scale_shape = {rows, cols / 32};
    t.codes.assign(static_cast<size_t>(rows * cols / 2), 0);
    t.scales.resize(static_cast<size_t>(rows * cols / 32));
    t.values.resize(v.size());
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < cols / 32; ++b) {
            const float* x = v.data() + r * cols + b * 32;
            float amax = 6.0f * 0x1.0p-126f;
            for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[i]));
            const uint8_t e = f32_to_e8m0_ceil(amax / 6.0f);
            const float s = e8m0_to_f32(e);
            t.scales[r * (cols / 32) + b] = e;
            for (int i = 0; i < 32; ++i) {
                const int64_t k = b * 32 + i;
                const uint8_t code = f32_to_e2m1(x[i] / s);
                t.codes[(r * cols + k) / 2] |= static_cast<uint8_t>(code << (4 * (k % 2)));
                t.values[r * cols + k] = e2m1_to_f32(code) * s;
            }
        }
    }
    return t;
}

std::unique_ptr<MemoryWeightSource> synthetic_v4_memory_model(const ModelConfig& c, uint64_t seed) {
    auto src = std::make_unique<MemoryWeightSource>(c);
    for (const V4TensorSpec& spec : deepseek_v4_tensor_specs(c)) {  // V4.1 included
        src->add(spec.name, spec.shape, synthetic_v4_tensor(c, spec, seed).values);
    }
    return src;
}

}  // namespace dsi
