// DeepSeek V4: config parsing and checks, the official tensor layout, the HF
// checkpoint round trip (FP8 + ue8m0, FP4 experts), and the forward pass against a
// double-precision reference written here from the reference notes
// (../shared/reference/deepseek_v4.md §2), compared layer by layer; prefill chunking,
// token-by-token decode, batch and thread invariance (bitwise); bad input.
//
// The reference computes each quantity directly from its definition over the whole
// sequence (compressed entries from their groups, top-k from all visible keys), not
// with the model's incremental state machine.
#include "model/deepseek_v4.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>

#include "base/env.h"
#include "model/causal_lm.h"
#include "model/checkpoint_writer.h"
#include "model/gguf.h"
#include "model/gguf_names.h"
#include "model/internal/v4_reference_test_util.h"
#include "model/memory_plan.h"
#include "model/synthetic.h"
#include "model/weights.h"

namespace dsi {
namespace {

using test::Ref;
using test::Tensors;
using test::Vec;

// DeepSeek-V4-Flash's config.json (reference deepseek_v4.md §1).
constexpr const char* kV4FlashConfig = R"({
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 43,
  "num_nextn_predict_layers": 1, "num_attention_heads": 64, "num_key_value_heads": 1,
  "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_lora_rank": 1024,
  "o_groups": 8, "sliding_window": 128,
  "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4,
                      128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4,
                      128, 4, 128, 4, 128, 4, 0],
  "compress_rope_theta": 160000, "rope_theta": 10000,
  "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                   "beta_fast": 32, "beta_slow": 1},
  "max_position_embeddings": 1048576, "index_n_heads": 64, "index_head_dim": 128,
  "index_topk": 512, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 6,
  "moe_intermediate_size": 2048, "num_hash_layers": 3, "scoring_func": "sqrtsoftplus",
  "topk_method": "noaux_tc", "norm_topk_prob": true, "routed_scaling_factor": 1.5,
  "swiglu_limit": 10.0, "hidden_act": "silu", "hc_mult": 4, "hc_sinkhorn_iters": 20,
  "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "expert_dtype": "fp4", "torch_dtype": "bfloat16",
  "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}
})";

std::string with_field(std::string json, const std::string& key, const std::string& value) {
    const std::string k = "\"" + key + "\": ";
    const size_t at = json.find(k);
    EXPECT_NE(at, std::string::npos) << key;
    size_t end = at + k.size();
    int depth = 0;
    for (; end < json.size(); ++end) {
        const char ch = json[end];
        if (ch == '[' || ch == '{') ++depth;
        if (ch == ']' || ch == '}') {
            if (depth == 0) break;
            --depth;
        }
        if (ch == ',' && depth == 0) break;
    }
    return json.substr(0, at + k.size()) + value + json.substr(end);
}

TEST(V4ConfigTest, ParsesV4Flash) {
    Result<ModelConfig> r = parse_hf_config(kV4FlashConfig);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    const ModelConfig& c = *r;
    EXPECT_TRUE(c.is_v4());
    EXPECT_EQ(c.head_dim, 512);
    EXPECT_EQ(c.qk_nope_head_dim, 448);
    EXPECT_EQ(c.o_groups, 8);
    EXPECT_EQ(c.o_lora_rank, 1024);
    EXPECT_EQ(c.compress_ratios.size(), 44u);
    EXPECT_EQ(c.compress_ratio(0), 0);
    EXPECT_EQ(c.compress_ratio(2), 4);
    EXPECT_EQ(c.compress_ratio(3), 128);
    EXPECT_EQ(c.compress_ratio(43), 0);
    EXPECT_EQ(c.index_topk, 512);
    EXPECT_EQ(c.num_hash_layers, 3);
    EXPECT_EQ(c.scoring_func, ScoringFunc::kSqrtSoftplus);
    EXPECT_DOUBLE_EQ(c.swiglu_limit, 10.0);
    EXPECT_EQ(c.hc_mult, 4);
    EXPECT_EQ(c.hc_sinkhorn_iters, 20);
    EXPECT_TRUE(c.expert_fp4);
    EXPECT_TRUE(c.fp8 && c.fp8_scale_ue8m0);
    EXPECT_TRUE(c.rope_scaling.yarn);
    // Window-only layers: plain theta 10000; compressed: 160000 with YaRN (factor 16
    // slows the lowest frequency by 16).
    std::vector<double> f0 = c.v4_rope_inv_freq(0);
    std::vector<double> f2 = c.v4_rope_inv_freq(2);
    EXPECT_DOUBLE_EQ(f0[0], 1.0);
    EXPECT_NEAR(f0[31], std::pow(10000.0, -62.0 / 64.0), 1e-15);
    EXPECT_DOUBLE_EQ(f2[0], 1.0);  // high frequencies are kept
    EXPECT_NEAR(f2[31], std::pow(160000.0, -62.0 / 64.0) / 16.0, 1e-15);
    // Round trip through our writer.
    Result<ModelConfig> back = parse_hf_config(to_hf_config_json(c));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(back->compress_ratios, c.compress_ratios);
    EXPECT_EQ(back->index_n_heads, 64);
    EXPECT_EQ(back->hc_eps, c.hc_eps);
}

TEST(V4ConfigTest, ErrorsNameTheField) {
    struct Case {
        std::string key, value, want;
    } cases[] = {
        {"compress_ratios", "[0, 4, 128]", "'compress_ratios' has 3 entries, expected"},
        {"compress_ratios",
         "[0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, "
         "128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, "
         "4, 4]",
         "MTP layer entry 43"},
        {"num_key_value_heads", "8", "'num_key_value_heads' must be 1"},
        {"o_groups", "7", "'o_groups' must divide"},
        {"scoring_func", "\"sigmoid\"", "'scoring_func'"},
        {"hc_mult", "0", "'hc_mult' must be > 0"},
        {"index_topk", "0", "'index_topk' must be > 0"},
        {"num_hash_layers", "50", "'num_hash_layers'"},
        {"expert_dtype", "\"int3\"", "'expert_dtype'"},
        {"o_lora_rank", "1000", "'o_lora_rank' must be a multiple"},
        {"head_dim", "\"big\"", "'head_dim' has the wrong type"},
    };
    for (const Case& k : cases) {
        Result<ModelConfig> r = parse_hf_config(with_field(kV4FlashConfig, k.key, k.value));
        ASSERT_FALSE(r.is_ok()) << k.key;
        EXPECT_NE(r.status().message().find(k.want), std::string::npos)
            << k.key << ": " << r.status().to_string();
    }
    // A required field missing.
    std::string missing = kV4FlashConfig;
    missing.replace(missing.find("\"hc_sinkhorn_iters\": 20,"), 24, "");
    Result<ModelConfig> r = parse_hf_config(missing);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("'hc_sinkhorn_iters'"), std::string::npos);
}

// small-v4 is the benchmark shape: V4-Flash's head, hidden >= 1024, >= 64 experts; every
// layer kind and an MTP layer.
TEST(V4ConfigTest, SmallV4IsTheBenchmarkShape) {
    Result<ModelConfig> r = synthetic_preset("small-v4");
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->head_dim, 512);
    EXPECT_EQ(r->qk_rope_head_dim, 64);
    EXPECT_GE(r->hidden_size, 1024);
    EXPECT_GE(r->n_routed_experts, 64);
    EXPECT_EQ(r->compress_ratios, (std::vector<int64_t>{0, 4, 128, 4, 0}));
    EXPECT_TRUE(r->expert_fp4 && r->fp8 && r->fp8_scale_ue8m0);
    // Its memory plan: FP4 experts are 0.53 bytes per weight.
    MemoryPlan p = plan_memory(*r, 4096);
    int64_t fp4 = 0;
    for (const auto& w : p.weights) {
        if (w.format.rfind("fp4", 0) == 0) fp4 = w.bytes;
    }
    const int64_t per_expert = 3 * 512 * 1024;
    EXPECT_EQ(fp4, 5 * 64 * (per_expert / 2 + per_expert / 32));  // 4 layers + MTP
}

// Reference §3: 69,187 tensors in the official checkpoint (weights, and one scale per
// FP8 / FP4 weight), 1,575 of them under mtp.0.
TEST(V4LayoutTest, TensorCountMatchesTheOfficialCheckpoint) {
    ModelConfig c = parse_hf_config(kV4FlashConfig).value();
    int64_t total = 0, mtp = 0;
    for (const V4TensorSpec& s : deepseek_v4_tensor_specs(c)) {
        const int64_t n = s.storage == V4Storage::kFp8 || s.storage == V4Storage::kFp4 ? 2 : 1;
        total += n;
        if (s.name.rfind("mtp.0.", 0) == 0) mtp += n;
    }
    EXPECT_EQ(total, 69187);
    EXPECT_EQ(mtp, 1575);
}

// Hand arithmetic (reference deepseek_v4.md §3, §4.2) for the real V4-Flash config.
TEST(V4PlanTest, V4FlashByHand) {
    ModelConfig c = parse_hf_config(kV4FlashConfig).value();
    MemoryPlan p = plan_memory(c, 8192);
    // The official checkpoint's total_size: BF16, FP8 + ue8m0 per 128x128, FP4 pairs +
    // ue8m0 per 32, F32, I64 tid2eid.
    EXPECT_EQ(p.weight_bytes, 159609485896);
    ASSERT_EQ(p.kinds.size(), 3u);
    // window: 2 + MTP; ratio 4: 21 layers; ratio 128: 20 layers.
    EXPECT_EQ(p.kinds[0].layers, 3);
    EXPECT_EQ(p.kinds[1].layers, 21);
    EXPECT_EQ(p.kinds[2].layers, 20);
    // Compact: 21 x (584/4 + 68/4) + 20 x 584/128 = 3514.25 B per token.
    EXPECT_DOUBLE_EQ(p.kinds[1].compact_bytes_per_token + p.kinds[2].compact_bytes_per_token,
                     3514.25);
    // dsinfer f32: 21 x (512 + 128) x 4 / 4 + 20 x 512 x 4 / 128.
    EXPECT_DOUBLE_EQ(p.kinds[1].dsinfer_bytes_per_token + p.kinds[2].dsinfer_bytes_per_token,
                     13760.0);
    // State: 44 window rings of 128 rows (584 B compact); accumulators kv + score in f32:
    // ratio 4: 2 x (8 x 1024) + 2 x (8 x 256) floats, ratio 128: 2 x (128 x 512) floats.
    const int64_t rings = 44 * 128 * 584;
    const int64_t acc = 21 * (2 * 8 * 1024 + 2 * 8 * 256) * 4 + 20 * 2 * 128 * 512 * 4;
    EXPECT_EQ(p.kinds[0].compact_state_bytes + p.kinds[1].compact_state_bytes +
                  p.kinds[2].compact_state_bytes,
              rings + acc);
    // 8192 tokens: 2048 ratio-4 entries + keys, 64 ratio-128 entries, plus the state.
    EXPECT_EQ(p.compact_kv_bytes, 21 * 2048 * (584 + 68) + 20 * 64 * 584 + rings + acc);
    EXPECT_EQ(p.dsinfer_kv_bytes,
              21 * 2048 * (512 + 128) * 4 + 20 * 64 * 512 * 4 + 44 * 128 * 512 * 4 + acc);
    const std::string text = format_memory_plan(p, 1);
    EXPECT_NE(text.find("does NOT fit"), std::string::npos) << text;
    EXPECT_NE(text.find("fp4-e2m1"), std::string::npos) << text;
}

// ---- double-precision reference ----------------------------------------------------

ModelConfig tiny_v4() {
    ModelConfig c = synthetic_preset("tiny-v4").value();
    c.vocab_size = 512;
    return c;
}

std::vector<int32_t> prompt(int64_t n, int32_t vocab, uint64_t seed = 7) {
    SplitMix64 rng(seed);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int32_t& t : ids) t = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab));
    return ids;
}

std::unique_ptr<DeepseekV4Model> load_memory(const ModelConfig& c, int threads = 1,
                                             const std::string& fmt = "auto",
                                             kernels::KvDtype kv = kernels::KvDtype::kF32) {
    DeepseekV4Model::Options o;
    o.num_threads = threads;
    o.weight_format = fmt;
    o.kv_dtype = kv;
    auto m = DeepseekV4Model::load(synthetic_v4_memory_model(c, 1), o);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return std::move(m).value();
}

double max_abs(const std::vector<float>& v) {
    double m = 0;
    for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
    return m;
}

// Every layer's streams and the last logits (main and MTP) against the reference,
// on 300 tokens: the window (128) is full, the ratio-4 layers' indexer chooses 16 of
// 75 entries, the ratio-128 layer attends to 2 entries.
// kv e4m3: against the reference with its simulated KV quantisation (every layer from
// the model's own input streams), to a tolerance that allows the odd value our f32
// arithmetic rounds to the neighbouring e4m3 / FP4 code (the f32 cache's logits
// differ from these by ~10 % of their std).
void check_against_reference(kernels::KvDtype kv, int64_t T, double layer_tol, double logit_tol) {
    const ModelConfig c = tiny_v4();
    auto mem = synthetic_v4_memory_model(c, 1);
    Ref ref{c, mem->tensors(), kv == kernels::KvDtype::kE4m3};
    auto model = load_memory(c, 1, "auto", kv);

    std::vector<int32_t> ids = prompt(T, static_cast<int32_t>(c.vocab_size));
    auto st = model->new_state(T + 8);
    V4Output out;
    out.capture_layers = true;
    ASSERT_TRUE(model->forward(ids, 0, *st, false, out).is_ok());
    ASSERT_EQ(out.layer_streams.size(), static_cast<size_t>(c.num_hidden_layers));

    const int64_t hc = c.hc_mult, H = c.hidden_size;
    std::vector<std::vector<Vec>> h(static_cast<size_t>(T));
    for (int64_t s = 0; s < T; ++s) {
        const auto& e = ref.t("embed.weight");
        h[s].assign(static_cast<size_t>(hc),
                    Vec(e.begin() + ids[s] * H, e.begin() + (ids[s] + 1) * H));
    }
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        if (ref.fp8 && l > 0) {
            // Teacher forcing per layer: the model's own input streams, so that a value
            // rounded to the neighbouring code upstream does not cascade (each one
            // moves the next layer's inputs and so its codes and indexer choices).
            for (int64_t s = 0; s < T; ++s) {
                for (int64_t j = 0; j < hc; ++j) {
                    for (int64_t i = 0; i < H; ++i)
                        h[s][j][i] = out.layer_streams[l - 1][(s * hc + j) * H + i];
                }
            }
        }
        ref.block("layers." + std::to_string(l) + ".", l, h, ids);
        double worst = 0, scale = 0;
        for (int64_t s = 0; s < T; ++s) {
            for (int64_t j = 0; j < hc; ++j) {
                for (int64_t i = 0; i < H; ++i) {
                    const double want = h[s][j][i];
                    const double got = out.layer_streams[l][(s * hc + j) * H + i];
                    worst = std::max(worst, std::fabs(got - want));
                    scale = std::max(scale, std::fabs(want));
                }
            }
        }
        EXPECT_LT(worst, layer_tol * (1 + scale))
            << "layer " << l << " (ratio " << c.compress_ratio(l) << "): max |diff| " << worst
            << ", max |ref| " << scale;
    }
    Vec want = ref.logits("", h[T - 1], "norm.weight");
    double worst = 0, sd = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, std::fabs(out.logits[i] - want[i]));
        sd += want[i] * want[i];
    }
    sd = std::sqrt(sd / static_cast<double>(want.size()));
    EXPECT_LT(worst, logit_tol * sd) << "logits; std " << sd;

    // MTP at every position (teacher forcing: the next token is the prompt's).
    std::vector<int32_t> next(ids.begin() + 1, ids.end());
    next.push_back(3);
    std::vector<float> draft;
    ASSERT_TRUE(model->mtp_forward(next, out.streams, 0, *st, draft).is_ok());
    std::vector<std::vector<Vec>> x(static_cast<size_t>(T));
    for (int64_t s = 0; s < T; ++s) {
        const auto& e = ref.t("embed.weight");
        Vec en = ref.norm("mtp.0.enorm.weight",
                          Vec(e.begin() + next[s] * H, e.begin() + (next[s] + 1) * H));
        Vec ep = ref.linear("mtp.0.e_proj.weight", en);
        for (int64_t j = 0; j < hc; ++j) {
            Vec hp = ref.linear("mtp.0.h_proj.weight", ref.norm("mtp.0.hnorm.weight", h[s][j]));
            for (int64_t i = 0; i < H; ++i) hp[i] += ep[i];
            x[s].push_back(hp);
        }
    }
    ref.block("mtp.0.", c.num_hidden_layers, x, next);
    Vec dwant = ref.logits("mtp.0.", x[T - 1], "mtp.0.norm.weight");
    worst = 0;
    for (size_t i = 0; i < dwant.size(); ++i) {
        worst = std::max(worst, std::fabs(draft[(T - 1) * c.vocab_size + i] - dwant[i]));
    }
    EXPECT_LT(worst, logit_tol * sd) << "MTP logits";
}

TEST(V4ForwardTest, MatchesDoubleReferencePerLayer) {
    check_against_reference(kernels::KvDtype::kF32, 300, 2e-4, 1e-4);
}

TEST(V4ForwardTest, E4m3MatchesSimulatedReferencePerLayer) {
    check_against_reference(kernels::KvDtype::kE4m3, 300, 2e-3, 2e-3);
}

// One chunk = uneven chunks = token by token, bitwise (streams of every token and the
// last logits), with 2 threads against 1; for each KV dtype.
class V4KvDtypeTest : public ::testing::TestWithParam<kernels::KvDtype> {};
std::string kv_dtype_param_name(const ::testing::TestParamInfo<kernels::KvDtype>& p) {
    return kernels::kv_dtype_name(p.param);
}
INSTANTIATE_TEST_SUITE_P(KvDtypes, V4KvDtypeTest,
                         ::testing::Values(kernels::KvDtype::kF32, kernels::KvDtype::kE4m3),
                         kv_dtype_param_name);

TEST_P(V4KvDtypeTest, ChunkingDecodeAndThreadsAreBitwiseInvariant) {
    const ModelConfig c = tiny_v4();
    auto one = load_memory(c, 1, "auto", GetParam());
    auto two = load_memory(c, 2, "auto", GetParam());
    const int64_t T = 300;
    std::vector<int32_t> ids = prompt(T, static_cast<int32_t>(c.vocab_size), 11);
    auto run = [&](DeepseekV4Model& m, const std::vector<int64_t>& chunks) {
        auto st = m.new_state(T);
        std::vector<float> streams, last;
        int64_t at = 0;
        for (int64_t n : chunks) {
            V4Output out;
            std::span<const int32_t> part(ids.data() + at, static_cast<size_t>(n));
            EXPECT_TRUE(m.forward(part, at, *st, false, out).is_ok());
            streams.insert(streams.end(), out.streams.begin(), out.streams.end());
            last = out.logits;
            at += n;
        }
        EXPECT_EQ(at, T);
        EXPECT_EQ(st->length(), T);
        return std::make_pair(streams, last);
    };
    const auto whole = run(*one, {T});
    std::vector<int64_t> singles(static_cast<size_t>(T), 1);
    EXPECT_EQ(run(*one, {1, 127, 1, 3, 125, 43}), whole);
    EXPECT_EQ(run(*one, singles), whole);
    EXPECT_EQ(run(*two, {T}), whole);
    EXPECT_EQ(run(*two, {129, 171}), whole);
}

// A sequence's results do not depend on the other sequences in its step.
TEST_P(V4KvDtypeTest, BatchInvariant) {
    const ModelConfig c = tiny_v4();
    auto m = load_memory(c, 2, "auto", GetParam());
    std::vector<int32_t> a = prompt(140, static_cast<int32_t>(c.vocab_size), 1);
    std::vector<int32_t> b = prompt(70, static_cast<int32_t>(c.vocab_size), 2);
    std::vector<int32_t> d = prompt(9, static_cast<int32_t>(c.vocab_size), 3);
    auto sa = m->new_state(200);
    V4Output alone;
    ASSERT_TRUE(m->forward(a, 0, *sa, true, alone).is_ok());
    auto sa2 = m->new_state(200), sb = m->new_state(200), sd = m->new_state(200);
    // b and d run a first chunk alone, then all three share a step.
    V4Output tmp;
    ASSERT_TRUE(m->forward(std::span(b).first(30), 0, *sb, false, tmp).is_ok());
    V4Step steps[] = {{std::span(d), 0, sd.get(), false},
                      {std::span(a), 0, sa2.get(), true},
                      {std::span(b).subspan(30), 30, sb.get(), true}};
    V4Output batched;
    ASSERT_TRUE(m->forward_batch(steps, batched).is_ok());
    const size_t V = static_cast<size_t>(c.vocab_size);
    std::vector<float> mine(batched.logits.begin() + batched.logit_row[1] * V,
                            batched.logits.begin() + (batched.logit_row[1] + 140) * V);
    EXPECT_EQ(mine, alone.logits);
}

// e4m3 KV stores what the reference simulates: rows take the compact sizes (584
// bytes at head_dim 512: a small-v4-shaped head here), the logits move off the f32
// cache's by a quantisation-sized amount (not zero: the rows really are quantised;
// not more: nothing else changed), and the MTP layer runs on the same cache.
TEST(V4ForwardTest, E4m3CacheIsCompactAndCloseToF32) {
    ModelConfig c = tiny_v4();
    c.head_dim = 512;  // V4-Flash's head: 448 nope + 64 rope
    c.qk_rope_head_dim = 64;
    c.index_head_dim = 128;
    auto f32 = load_memory(c, 2);
    auto fp8 = load_memory(c, 2, "auto", kernels::KvDtype::kE4m3);
    EXPECT_EQ(fp8->kv_dtype(), kernels::KvDtype::kE4m3);
    const KvLayout lf = f32->kv_layout(), l8 = fp8->kv_layout();
    ASSERT_EQ(l8.groups.size(), 3u);
    EXPECT_EQ(l8.groups[0].floats_per_entry * 4, 584);  // c4
    EXPECT_EQ(l8.groups[1].floats_per_entry * 4, 68);   // c4_index
    EXPECT_EQ(l8.groups[2].floats_per_entry * 4, 584);  // c128
    EXPECT_EQ(lf.groups[0].floats_per_entry * 4, 2048);
    // State: per layer (4 + MTP) a ring of 128 rows, plus the f32 accumulators.
    EXPECT_EQ((lf.state_floats - l8.state_floats) * 4, 5 * 128 * (2048 - 584));
    // The plan's compact column is what the engine allocates with e4m3.
    const MemoryPlan p = plan_memory(c, 4096);
    double compact = 0, engine = 0;
    int64_t compact_state = 0;
    for (const MemoryPlan::LayerKind& k : p.kinds) {
        compact += k.compact_bytes_per_token;
        compact_state += k.compact_state_bytes;
    }
    for (const KvGroupLayout& g : l8.groups) {
        engine += static_cast<double>(g.num_layers * g.floats_per_entry * 4) /
                  static_cast<double>(g.tokens_per_entry);
    }
    EXPECT_DOUBLE_EQ(compact, engine);
    EXPECT_EQ(compact_state + 16, l8.state_floats * 4);

    const int64_t T = 300;
    std::vector<int32_t> ids = prompt(T, static_cast<int32_t>(c.vocab_size), 5);
    auto run = [&](DeepseekV4Model& m, std::vector<float>& draft) {
        auto st = m.new_state(T);
        V4Output out;
        EXPECT_TRUE(m.forward(ids, 0, *st, true, out).is_ok());
        std::vector<int32_t> next(ids.begin() + 1, ids.end());
        next.push_back(1);
        EXPECT_TRUE(m.mtp_forward(next, out.streams, 0, *st, draft).is_ok());
        return out.logits;
    };
    std::vector<float> df, d8;
    const std::vector<float> a = run(*f32, df), b = run(*fp8, d8);
    ASSERT_EQ(a.size(), b.size());
    // Per position the largest logit difference (main and MTP), as a share of the
    // logits' std. A random model is sensitive (a 6 % error per cached value moves its
    // logits by ~8 % of their std; a changed indexer choice by more), so this bounds
    // the median and asks for the same argmax almost everywhere; the exact check is
    // E4m3MatchesSimulatedReferencePerLayer.
    double sd = 0;
    int64_t argmax_same = 0;
    std::vector<double> worst(static_cast<size_t>(T)), dworst(static_cast<size_t>(T));
    const int64_t V = c.vocab_size;
    for (int64_t t = 0; t < T; ++t) {
        const float* x = a.data() + t * V;
        const float* y = b.data() + t * V;
        argmax_same += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
        for (int64_t v = 0; v < V; ++v) {
            sd += double(x[v]) * x[v];
            worst[t] = std::max(worst[t], std::fabs(double(x[v]) - y[v]));
            dworst[t] = std::max(dworst[t], std::fabs(double(df[t * V + v]) - d8[t * V + v]));
        }
    }
    sd = std::sqrt(sd / static_cast<double>(a.size()));
    std::sort(worst.begin(), worst.end());
    std::sort(dworst.begin(), dworst.end());
    EXPECT_GT(worst[0], 1e-4 * sd) << "e4m3 logits equal the f32 cache's: nothing was quantised";
    EXPECT_LT(worst[T / 2], 0.15 * sd) << "median; logit std " << sd;
    EXPECT_GT(dworst[0], 1e-4 * sd);
    EXPECT_LT(dworst[T / 2], 0.15 * sd);
    EXPECT_GE(argmax_same, T * 9 / 10);
}

// The HF directory written by make-model (FP8 + ue8m0 scales, FP4 I8 experts) loads
// to the same values as the in-memory model: experts repacked as f32 give the same
// logits to f32 rounding; kept as MXFP4 (activations quantised to Q8_0 per 32, as in
// llama.cpp) they stay close.
class V4CheckpointTest : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = std::filesystem::temp_directory_path() /
               ("dsi_v4_test_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        std::filesystem::remove_all(dir_);
        config_ = tiny_v4();
        TokenizerFiles tok{"{}", "{}"};
        ASSERT_TRUE(write_hf_checkpoint(Env::default_env(), config_, 1, tok, dir_.string(), 8 << 20)
                        .is_ok());
    }
    void TearDown() override { std::filesystem::remove_all(dir_); }

    Result<std::unique_ptr<DeepseekV4Model>> open(const std::string& fmt = "auto") {
        DSI_ASSIGN_OR_RETURN(auto src, open_checkpoint(Env::default_env(), dir_.string()));
        DeepseekV4Model::Options o;
        o.weight_format = fmt;
        return DeepseekV4Model::load(std::move(src), o);
    }

    std::filesystem::path dir_;
    ModelConfig config_;
};

TEST_F(V4CheckpointTest, LoadsTheOfficialLayout) {
    auto mem = load_memory(config_);
    auto f32 = open("experts=f32");
    ASSERT_TRUE(f32.is_ok()) << f32.status().to_string();
    auto mx = open();
    ASSERT_TRUE(mx.is_ok()) << mx.status().to_string();
    std::vector<int32_t> ids = prompt(150, static_cast<int32_t>(config_.vocab_size), 5);
    auto logits = [&](DeepseekV4Model& m) {
        auto st = m.new_state(200);
        V4Output out;
        EXPECT_TRUE(m.forward(ids, 0, *st, true, out).is_ok());
        return out.logits;
    };
    const std::vector<float> want = logits(*mem);
    double sd = 0;
    for (float v : want) sd += double(v) * v;
    sd = std::sqrt(sd / want.size());
    auto diff = [&](const std::vector<float>& got) {
        double w = 0;
        for (size_t i = 0; i < want.size(); ++i)
            w = std::max(w, std::fabs(double(got[i]) - want[i]));
        return w;
    };
    EXPECT_LT(diff(logits(**f32)), 1e-4 * sd);
    // MXFP4 experts quantise activations to Q8_0 (as llama.cpp): typically ~2% of the
    // logit std per position; a routing or indexer top-k flip moves a few positions more.
    const std::vector<float> got = logits(**mx);
    const size_t V = static_cast<size_t>(config_.vocab_size);
    size_t far = 0;
    for (size_t t = 0; t < got.size() / V; ++t) {
        double w = 0;
        for (size_t i = 0; i < V; ++i)
            w = std::max(w, std::fabs(double(got[t * V + i]) - want[t * V + i]));
        far += w > 0.1 * sd;
    }
    EXPECT_LE(far, got.size() / V / 10) << "positions beyond 0.1 of the logit std";
    EXPECT_GT(max_abs(want), 1.0);
}

TEST_F(V4CheckpointTest, BadFilesGiveClearErrors) {
    // A truncated shard.
    std::string shard;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
        if (e.path().extension() == ".safetensors") shard = e.path().string();
    }
    ASSERT_FALSE(shard.empty());
    const auto size = std::filesystem::file_size(shard);
    std::filesystem::resize_file(shard, size / 2);
    Result<std::unique_ptr<WeightSource>> r = open_checkpoint(Env::default_env(), dir_.string());
    Status s = r.is_ok() ? DeepseekV4Model::load(std::move(r).value(), {}).status() : r.status();
    EXPECT_FALSE(s.is_ok());
    EXPECT_NE(s.to_string().find(".safetensors"), std::string::npos) << s.to_string();

    // An inconsistent config names config.json and the field.
    std::string cfg = to_hf_config_json(config_);
    cfg.replace(cfg.find("\"compress_ratios\""), 17, "\"compress_ratiox\"");
    std::ofstream(dir_ / "config.json") << cfg;
    r = open_checkpoint(Env::default_env(), dir_.string());
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().to_string().find("config.json"), std::string::npos);
    EXPECT_NE(r.status().to_string().find("compress_ratios"), std::string::npos);
}

// GGUF deepseek4 written from the same values: F32 matrices give the in-memory model's
// logits bit for bit; MXFP4 experts equal the in-memory model with its experts
// repacked as MXFP4 (the FP4 values are exact in llama.cpp's MXFP4 rounding). The MTP
// layer travels too (block num_hidden_layers, e_proj | h_proj as nextn.eh_proj): its
// drafts equal the in-memory model's whose MTP hc_head is the trunk's, the one thing
// llama.cpp's layout has no slot for.
TEST(V4GgufTest, RoundTripIsExact) {
    const ModelConfig c = tiny_v4();
    const std::string dir =
        std::filesystem::temp_directory_path() / ("dsi_v4_gguf_" + std::to_string(::getpid()));
    TokenizerFiles tok{R"({"model": {"vocab": {"a": 0, "b": 1}, "merges": []}})", "{}"};
    ASSERT_TRUE(write_gguf_checkpoint(Env::default_env(), c, 1, tok, DType::kF32, dir + "/f32.gguf")
                    .is_ok());
    ASSERT_TRUE(write_gguf_checkpoint(Env::default_env(), c, 1, tok, DType::kF32, dir + "/mx.gguf",
                                      DType::kMXFP4)
                    .is_ok());
    std::vector<int32_t> ids = prompt(140, static_cast<int32_t>(c.vocab_size), 9);
    auto logits = [&](std::unique_ptr<DeepseekV4Model> m) {
        auto st = m->new_state(160);
        V4Output out;
        EXPECT_TRUE(m->forward(ids, 0, *st, true, out).is_ok());
        return out.logits;
    };
    auto drafts = [&](std::unique_ptr<DeepseekV4Model> m) {
        auto st = m->new_state(160);
        V4Output out;
        EXPECT_TRUE(m->forward(ids, 0, *st, true, out).is_ok());
        std::vector<int32_t> next(ids.begin() + 1, ids.end());
        next.push_back(5);
        std::vector<float> draft;
        EXPECT_TRUE(m->mtp_forward(next, out.streams, 0, *st, draft).is_ok());
        return draft;
    };
    auto open_gguf = [&](const std::string& file) {
        auto src = open_checkpoint(Env::default_env(), dir + "/" + file);
        EXPECT_TRUE(src.is_ok()) << src.status().to_string();
        EXPECT_TRUE(src->get()->config().is_v4());
        EXPECT_EQ(src->get()->config().num_nextn_predict_layers, 1);
        EXPECT_TRUE(src->get()->has("mtp.0.e_proj.weight"));
        EXPECT_FALSE(src->get()->has("mtp.0.hc_head_fn"));
        auto m = DeepseekV4Model::load(std::move(src).value(), {});
        EXPECT_TRUE(m.is_ok()) << m.status().to_string();
        return std::move(m).value();
    };
    // The in-memory model with the trunk's hc_head in the MTP layer.
    auto trunk_head = [&](const std::string& fmt) {
        auto full = synthetic_v4_memory_model(c, 1);
        auto src = std::make_unique<MemoryWeightSource>(c);
        for (const auto& [name, t] : full->tensors()) {
            const std::string trunk = name.starts_with("mtp.0.hc_head_") ? name.substr(6) : name;
            const auto& from = full->tensors().at(trunk);
            src->add(name, from.shape, from.data);
        }
        DeepseekV4Model::Options o;
        o.weight_format = fmt;
        auto m = DeepseekV4Model::load(std::move(src), o);
        EXPECT_TRUE(m.is_ok()) << m.status().to_string();
        return std::move(m).value();
    };
    EXPECT_EQ(logits(open_gguf("f32.gguf")), logits(load_memory(c)));
    EXPECT_EQ(logits(open_gguf("mx.gguf")), logits(load_memory(c, 1, "experts=mxfp4")));
    const std::vector<float> gguf_drafts = drafts(open_gguf("f32.gguf"));
    EXPECT_EQ(gguf_drafts, drafts(trunk_head("auto")));
    EXPECT_NE(gguf_drafts, drafts(load_memory(c)));  // the MTP hc_head does matter
    EXPECT_EQ(drafts(open_gguf("mx.gguf")), drafts(trunk_head("experts=mxfp4")));

    // A file that declares an MTP block without its tensors has none (llama.cpp's rule).
    {
        auto f = GgufFile::open(Env::default_env(), dir + "/f32.gguf");
        ASSERT_TRUE(f.is_ok());
        GgufWriter w;
        for (const auto& [k, v] : gguf_metadata_for_config(c, "no mtp tensors")) w.add_kv(k, v);
        for (const GgufTensorInfo& t : f->tensors()) {
            if (t.name.starts_with("blk." + std::to_string(c.num_hidden_layers) + ".")) continue;
            auto view = f->view(t.name);
            ASSERT_TRUE(view.is_ok());
            w.add_tensor(t.name, view->dtype, t.shape,
                         std::vector<uint8_t>(view->data.begin(), view->data.end()));
        }
        ASSERT_TRUE(w.write(Env::default_env(), dir + "/nomtp.gguf").is_ok());
        auto src = open_checkpoint(Env::default_env(), dir + "/nomtp.gguf");
        ASSERT_TRUE(src.is_ok()) << src.status().to_string();
        EXPECT_EQ(src->get()->config().num_nextn_predict_layers, 0);
        auto m = DeepseekV4Model::load(std::move(src).value(), {});
        ASSERT_TRUE(m.is_ok()) << m.status().to_string();
        EXPECT_EQ(logits(std::move(m).value()), logits(load_memory(c)));
    }
    std::filesystem::remove_all(dir);
}

TEST(V4LoadTest, MissingOrMisshapedTensorsAreNamed) {
    const ModelConfig c = tiny_v4();
    const auto full = synthetic_v4_memory_model(c, 1);
    {
        auto src = std::make_unique<MemoryWeightSource>(c);
        for (const auto& [name, t] : full->tensors()) {
            if (name != "layers.1.attn.indexer.compressor.ape") src->add(name, t.shape, t.data);
        }
        auto m = DeepseekV4Model::load(std::move(src), {});
        ASSERT_FALSE(m.is_ok());
        EXPECT_NE(m.status().message().find("layers.1.attn.indexer.compressor.ape"),
                  std::string::npos);
    }
    {
        auto src = std::make_unique<MemoryWeightSource>(c);
        for (const auto& [name, t] : full->tensors()) {
            if (name == "layers.2.attn.wq_a.weight") {
                src->add(name, {t.shape[1], t.shape[0]}, t.data);
            } else {
                src->add(name, t.shape, t.data);
            }
        }
        auto m = DeepseekV4Model::load(std::move(src), {});
        ASSERT_FALSE(m.is_ok());
        EXPECT_NE(m.status().message().find("layers.2.attn.wq_a.weight"), std::string::npos);
    }
    {
        auto src = std::make_unique<MemoryWeightSource>(c);
        for (const auto& [name, t] : full->tensors()) {
            std::vector<float> d = t.data;
            if (name == "layers.0.ffn.gate.tid2eid") d[5] = static_cast<float>(c.n_routed_experts);
            src->add(name, t.shape, d);
        }
        auto m = DeepseekV4Model::load(std::move(src), {});
        ASSERT_FALSE(m.is_ok());
        EXPECT_NE(m.status().message().find("tid2eid"), std::string::npos);
    }
}

// Why MXFP4 experts agree with llama.cpp less closely than f32 ones (docs/models.md,
// "llama.cpp agreement"): expert inputs are rounded to Q8_0 per 32 values (on both sides,
// as llama.cpp's vec_dot_mxfp4_q8_0), and that rounding turns a last-bit difference
// upstream into a whole quantisation step wherever a value sits near a rounding
// boundary. Here one norm weight moved by one ulp (what a different f32 summation
// order does everywhere in another implementation) changes f32-expert logits by
// round-off only, and MXFP4-expert logits by orders of magnitude more.
TEST(V4ForwardTest, Q8ExpertInputsAmplifyLastBitDifferences) {
    const ModelConfig c = tiny_v4();
    const std::vector<int32_t> ids = prompt(300, static_cast<int32_t>(c.vocab_size), 21);
    const auto base = synthetic_v4_memory_model(c, 1);
    auto logits = [&](const std::string& fmt, bool perturb) {
        auto src = std::make_unique<MemoryWeightSource>(c);
        for (const auto& [name, t] : base->tensors()) {
            std::vector<float> d = t.data;
            if (perturb && name == "layers.0.attn_norm.weight") d[3] = std::nextafter(d[3], 10.0f);
            src->add(name, t.shape, d);
        }
        DeepseekV4Model::Options o;
        o.weight_format = fmt;
        auto m = DeepseekV4Model::load(std::move(src), o);
        EXPECT_TRUE(m.is_ok()) << m.status().to_string();
        auto st = (*m)->new_state(static_cast<int64_t>(ids.size()));
        V4Output out;
        EXPECT_TRUE((*m)->forward(ids, 0, *st, true, out).is_ok());
        return out.logits;
    };
    // Per position: max |logit change| over the vocabulary; then the median and the
    // maximum over positions.
    auto spread = [&](const std::vector<float>& a, const std::vector<float>& b) {
        const size_t v = static_cast<size_t>(c.vocab_size);
        std::vector<double> per(a.size() / v, 0.0);
        for (size_t i = 0; i < a.size(); ++i) {
            per[i / v] = std::max(per[i / v], std::fabs(double{a[i]} - b[i]));
        }
        std::sort(per.begin(), per.end());
        return std::pair<double, double>{per[per.size() / 2], per.back()};
    };
    const auto f32 = spread(logits("auto", false), logits("auto", true));
    const auto mx = spread(logits("experts=mxfp4", false), logits("experts=mxfp4", true));
    std::printf(
        "one-ulp change of one norm weight, 300 positions, max |logit change| per "
        "position: f32 experts median %.2e max %.2e; MXFP4 experts (Q8_0 inputs) median "
        "%.2e max %.2e\n",
        f32.first, f32.second, mx.first, mx.second);
    EXPECT_LT(f32.second, 1e-3);
    EXPECT_GT(mx.first, 10 * f32.first);
    EXPECT_GT(mx.second, 30 * f32.second);
}

// The engine's seam (model/causal_lm.h): load_causal_lm picks the family; V4 through
// CausalLm::forward_batch on its own cache layout equals the V4State path bitwise; bad
// caches and options are refused.
TEST(V4CausalLmTest, SeamMatchesV4StateAndRefusesBadInput) {
    const ModelConfig c = tiny_v4();
    ModelOptions o;
    o.num_threads = 2;
    auto lm = load_causal_lm(synthetic_v4_memory_model(c, 1), o);
    ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
    CausalLm& m = **lm;
    const KvLayout layout = m.kv_layout();
    EXPECT_FALSE(layout.prefix_reusable);
    EXPECT_GT(layout.state_floats, 0);
    const std::vector<int32_t> ids = prompt(140, static_cast<int32_t>(c.vocab_size), 3);
    // Two chunks through the seam vs one call on a V4State.
    auto cache = m.new_kv_cache(160);
    BatchOutput bo;
    const SequenceStep a{std::span(ids).first(100), 0, cache.get(), false};
    ASSERT_TRUE(m.forward_batch(std::span(&a, 1), bo).is_ok());
    const SequenceStep b{std::span(ids).subspan(100), 100, cache.get(), false};
    ASSERT_TRUE(m.forward_batch(std::span(&b, 1), bo).is_ok());
    EXPECT_TRUE(bo.hidden.empty());
    auto ref = load_memory(c, 2);
    auto st = ref->new_state(160);
    V4Output out;
    ASSERT_TRUE(ref->forward(ids, 0, *st, false, out).is_ok());
    EXPECT_EQ(bo.logits, out.logits);
    // Starting again at 0 resets the state: the same logits as a fresh cache.
    const SequenceStep again{std::span(ids), 0, cache.get(), false};
    ASSERT_TRUE(m.forward_batch(std::span(&again, 1), bo).is_ok());
    EXPECT_EQ(bo.logits, out.logits);
    // A step that does not continue the sequence, a cache without a state slot.
    const SequenceStep gap{std::span(ids).first(3), 200, cache.get(), false};
    EXPECT_EQ(m.forward_batch(std::span(&gap, 1), bo).code(), StatusCode::kInvalidArgument);
    ContiguousKvCache plain(4, 128, 16);
    const SequenceStep stateless{std::span(ids).first(3), 0, &plain, false};
    EXPECT_EQ(m.forward_batch(std::span(&stateless, 1), bo).code(), StatusCode::kInvalidArgument);
    // Options V4 does not take: a bf16 cache; e4m3 loads.
    ModelOptions bf16 = o;
    bf16.kv_dtype = "bf16";
    auto bad = load_causal_lm(synthetic_v4_memory_model(c, 1), bf16);
    ASSERT_FALSE(bad.is_ok());
    EXPECT_NE(bad.status().message().find("kv dtype 'bf16'"), std::string::npos);
    ModelOptions e4m3 = o;
    e4m3.kv_dtype = "fp8";
    auto fp8 = load_causal_lm(synthetic_v4_memory_model(c, 1), e4m3);
    ASSERT_TRUE(fp8.is_ok()) << fp8.status().to_string();
    EXPECT_EQ((*fp8)->kv_dtype(), kernels::KvDtype::kE4m3);
    ModelConfig odd = c;
    odd.index_head_dim = 48;
    DeepseekV4Model::Options oo;
    oo.kv_dtype = kernels::KvDtype::kE4m3;
    auto odd_m = DeepseekV4Model::load(synthetic_v4_memory_model(odd, 1), oo);
    ASSERT_FALSE(odd_m.is_ok());
    EXPECT_NE(odd_m.status().message().find("index_head_dim"), std::string::npos);
    ModelOptions ref_kernels = o;
    ref_kernels.reference_kernels = true;
    EXPECT_EQ(load_causal_lm(synthetic_v4_memory_model(c, 1), ref_kernels).status().code(),
              StatusCode::kInvalidArgument);
    // A V3 checkpoint gets the MLA layout: one group, no state, reusable prefixes.
    ModelConfig v3 = synthetic_preset("tiny-v3").value();
    v3.vocab_size = 512;
    auto mla = load_causal_lm(synthetic_memory_model(v3, 1), o);
    ASSERT_TRUE(mla.is_ok()) << mla.status().to_string();
    const KvLayout ml = (*mla)->kv_layout();
    ASSERT_EQ(ml.groups.size(), 1u);
    EXPECT_EQ(ml.groups[0].name, "mla");
    EXPECT_EQ(ml.state_floats, 0);
    EXPECT_TRUE(ml.prefix_reusable);
}

// `dsinfer plan` describes what the engine really allocates for a V4 sequence: the
// paged groups' bytes per token and the state slot (plus its 16-byte length header).
TEST(V4CausalLmTest, MemoryPlanMatchesTheEnginesLayout) {
    const ModelConfig c = tiny_v4();
    const KvLayout l = load_memory(c)->kv_layout();
    double per_token = 0;
    for (const KvGroupLayout& g : l.groups) {
        per_token += static_cast<double>(g.num_layers * g.floats_per_entry * 4) /
                     static_cast<double>(g.tokens_per_entry);
    }
    const MemoryPlan p = plan_memory(c, 4096);
    double plan_per_token = 0;
    int64_t plan_state = 0;
    for (const MemoryPlan::LayerKind& k : p.kinds) {
        plan_per_token += k.dsinfer_bytes_per_token;
        plan_state += k.dsinfer_state_bytes;
    }
    EXPECT_DOUBLE_EQ(plan_per_token, per_token);
    EXPECT_EQ(plan_state + 16, l.state_floats * 4);
}

TEST(V4ForwardTest, BadCallsAreRejected) {
    const ModelConfig c = tiny_v4();
    auto m = load_memory(c);
    auto st = m->new_state(16);
    V4Output out;
    std::vector<int32_t> ok = {1, 2, 3};
    std::vector<int32_t> bad = {1, static_cast<int32_t>(c.vocab_size)};
    EXPECT_FALSE(m->forward(bad, 0, *st, false, out).is_ok());
    EXPECT_FALSE(m->forward(ok, 1, *st, false, out).is_ok());  // not the state's length
    EXPECT_FALSE(m->forward({}, 0, *st, false, out).is_ok());
    std::vector<int32_t> many(17, 1);
    EXPECT_EQ(m->forward(many, 0, *st, false, out).code(), StatusCode::kOutOfRange);
    ASSERT_TRUE(m->forward(ok, 0, *st, false, out).is_ok());
    EXPECT_EQ(st->length(), 3);
    V4Step twice[] = {{std::span(ok), 3, st.get(), false}, {std::span(ok), 3, st.get(), false}};
    EXPECT_FALSE(m->forward_batch(twice, out).is_ok());
    std::vector<float> logits;
    EXPECT_FALSE(m->mtp_forward(ok, std::vector<float>(5), 0, *st, logits).is_ok());
    // A V3 checkpoint is not V4.
    ModelConfig v3 = synthetic_preset("tiny-v3").value();
    v3.vocab_size = 512;
    EXPECT_FALSE(DeepseekV4Model::load(synthetic_memory_model(v3, 1), {}).is_ok());
}

}  // namespace
}  // namespace dsi
