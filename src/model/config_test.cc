#include "model/config.h"

#include <gtest/gtest.h>

#include <cmath>

namespace dsi {
namespace {

// DeepSeek-V3's config.json (the fields the model uses).
constexpr const char* kV3Config = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
  "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
  "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
  "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
  "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
  "norm_topk_prob": true, "routed_scaling_factor": 2.5, "first_k_dense_replace": 3,
  "moe_layer_freq": 1, "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-06,
  "rope_theta": 10000, "max_position_embeddings": 163840, "bos_token_id": 0, "eos_token_id": 1,
  "tie_word_embeddings": false,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]}
})";

constexpr const char* kV2LiteConfig = R"({
  "architectures": ["DeepseekV2ForCausalLM"], "vocab_size": 102400, "hidden_size": 2048,
  "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
  "num_attention_heads": 16, "q_lora_rank": null, "kv_lora_rank": 512,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
  "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
  "n_group": 1, "topk_group": 1, "topk_method": "greedy", "scoring_func": "softmax",
  "norm_topk_prob": false, "routed_scaling_factor": 1.0, "first_k_dense_replace": 1,
  "moe_layer_freq": 1, "rms_norm_eps": 1e-06, "rope_theta": 10000,
  "bos_token_id": 100000, "eos_token_id": 100001,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                   "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096, "type": "yarn"}
})";

TEST(ConfigTest, ParsesV3) {
    Result<ModelConfig> r = parse_hf_config(kV3Config);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    const ModelConfig& c = *r;
    EXPECT_EQ(c.family, ModelFamily::kDeepseekV3);
    EXPECT_EQ(c.qk_head_dim(), 192);
    EXPECT_EQ(c.topk_method, TopkMethod::kNoauxTc);
    EXPECT_EQ(c.scoring_func, ScoringFunc::kSigmoid);
    EXPECT_TRUE(c.fp8);
    EXPECT_FALSE(c.is_moe_layer(2));
    EXPECT_TRUE(c.is_moe_layer(3));
    // Reference value: 192^-0.5 * (0.1 * ln 40 + 1)^2.
    EXPECT_NEAR(c.softmax_scale(), 0.1352338, 1e-6);
    EXPECT_DOUBLE_EQ(c.rope_attention_factor(), 1.0);
}

TEST(ConfigTest, ParsesV2Lite) {
    Result<ModelConfig> r = parse_hf_config(kV2LiteConfig);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->q_lora_rank, 0);
    EXPECT_EQ(r->family, ModelFamily::kDeepseekV2);
    EXPECT_NEAR(r->softmax_scale(), 0.1147214, 1e-6);
}

TEST(ConfigTest, YarnFrequencies) {
    ModelConfig c = parse_hf_config(kV3Config).value();
    std::vector<double> f = c.rope_inv_freq();
    ASSERT_EQ(f.size(), 32u);
    // Pairs below low = 10 keep their frequency; pairs from high = 23 on are divided
    // by the factor (40); in between they blend linearly.
    EXPECT_DOUBLE_EQ(f[0], 1.0);
    EXPECT_NEAR(f[5], std::pow(10000.0, -10.0 / 64.0), 1e-15);
    EXPECT_NEAR(f[25], std::pow(10000.0, -50.0 / 64.0) / 40.0, 1e-15);
    double orig = std::pow(10000.0, -32.0 / 64.0);
    double ramp = (16.0 - 10.0) / 13.0;
    EXPECT_NEAR(f[16], orig / 40.0 * ramp + orig * (1 - ramp), 1e-15);
}

TEST(ConfigTest, RoundTripsThroughJson) {
    ModelConfig c = parse_hf_config(kV3Config).value();
    Result<ModelConfig> back = parse_hf_config(to_hf_config_json(c));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(to_hf_config_json(*back), to_hf_config_json(c));
    EXPECT_EQ(back->n_group, 8);
    EXPECT_EQ(back->q_lora_rank, 1536);
}

TEST(ConfigTest, RejectsMalformed) {
    struct Case {
        const char* json;
        const char* needle;
    };
    const Case cases[] = {
        {"not json", "not valid JSON"},
        {"[1,2]", "object"},
        {R"({"architectures": ["LlamaForCausalLM"]})", "unsupported architecture 'LlamaForCausalLM'"},
        {R"({"architectures": []})", "empty"},
        {R"({"architectures": ["DeepseekV3ForCausalLM"], "vocab_size": "big"})", "'vocab_size'"},
        {R"({"architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 10})", "'hidden_size'"},
    };
    for (const Case& k : cases) {
        Result<ModelConfig> r = parse_hf_config(k.json);
        ASSERT_FALSE(r.is_ok()) << k.json;
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(r.status().message().find(k.needle), std::string::npos) << r.status().message();
    }
}

TEST(ConfigTest, ValidateCatchesInconsistency) {
    ModelConfig c = parse_hf_config(kV3Config).value();
    c.topk_group = 9;
    EXPECT_FALSE(c.validate().is_ok());
    c = parse_hf_config(kV3Config).value();
    c.n_routed_experts = 250;  // not a multiple of n_group
    EXPECT_FALSE(c.validate().is_ok());
    c = parse_hf_config(kV3Config).value();
    c.num_experts_per_tok = 300;
    EXPECT_FALSE(c.validate().is_ok());
    c = parse_hf_config(kV3Config).value();
    c.qk_rope_head_dim = 63;
    EXPECT_FALSE(c.validate().is_ok());
}

}  // namespace
}  // namespace dsi
