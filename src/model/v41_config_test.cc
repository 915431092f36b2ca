#include "model/v41_config.h"

#include <gtest/gtest.h>

#include <string>

#include "model/config.h"
#include "model/synthetic.h"
#include "model/weights.h"

namespace dsi {
namespace {

// DeepSeek-V4.1-Flash's config.json (reference deepseek_v4.md §7.1; the widths V4.1
// shares with V4-Flash where §7.1 does not list them).
std::string v41_json() {
    std::string ratios = "[0,0";
    for (int i = 0; i < 18; ++i) ratios += ",2";
    for (int i = 0; i < 20; ++i) ratios += ",1";
    ratios += ",0,0,0]";
    return R"({"architectures":["DeepseekV41ForCausalLM"],"model_type":"deepseek_v41",
      "image_token_id":129264,
      "quantization_config":{"quant_method":"fp8","weight_block_size":[32,32],
                             "scale_fmt":"ue8m0","expert_dtype":"fp4"},
      "vision_config":{"num_hidden_layers":32,"hidden_size":1024,"num_attention_heads":16,
                       "patch_size":14,"spatial_merge_size":3},
      "text_config":{"vocab_size":129280,"hidden_size":5120,"num_hidden_layers":40,
        "num_attention_heads":64,"num_key_value_heads":1,"head_dim":512,"qk_rope_head_dim":64,
        "q_lora_rank":1280,"o_lora_rank":1024,"o_groups":8,"moe_intermediate_size":2304,
        "n_routed_experts":384,"n_shared_experts":1,"num_experts_per_tok":6,
        "scoring_func":"sqrtsoftplus","routed_scaling_factor":1.5,"norm_topk_prob":true,
        "swiglu_limit":10,"rms_norm_eps":1e-20,"sliding_window":128,
        "max_position_embeddings":1048576,"rope_theta":10000,
        "rope_scaling":{"type":"yarn","factor":16,"original_max_position_embeddings":65536,
                        "beta_fast":32,"beta_slow":1},
        "compress_rope_theta":160000,"compress_ratios":)" +
           ratios + R"(,
        "kv_source_layer_ids":[2,8,14,20],"index_source_layer_ids":[2,8,14,20,24,28,32,36],
        "index_n_heads":32,"index_head_dim":128,"index_topk":512,
        "candidate_source_layer_id":20,"candidate_topk_blocks":2048,"candidate_block_size":8,
        "hc_mult":4,"hc_sinkhorn_iters":20,"hc_eps":1e-6,
        "engram_layer_ids":[1,14],"engram_num_embeddings":[384006168,384016682],
        "engram_max_ngram_size":4,"engram_vocab_size":16000000,"engram_n_heads":8,
        "engram_head_dim":256,"engram_pad_token_id":2,"engram_compressed_vocab_size":99092,
        "num_nextn_predict_layers":3,"dspark_block_size":5,"dspark_noise_token_id":128799,
        "dspark_target_layer_ids":[37,38,39],"dspark_markov_rank":256,
        "dspark_n_routed_experts":128,"dspark_num_experts_per_tok":3}})";
}

std::string replaced(std::string s, const std::string& from, const std::string& to) {
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) s.replace(at, from.size(), to);
    return s;
}

// The error of parsing `json` names `field`.
void expect_field_error(const std::string& json, const std::string& field) {
    Result<ModelConfig> c = parse_hf_config(json);
    ASSERT_FALSE(c.is_ok()) << field;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(field), std::string::npos) << c.status().to_string();
}

TEST(V41ConfigTest, RealConfig) {
    Result<ModelConfig> c = parse_hf_config(v41_json());
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_TRUE(c->is_v41());
    EXPECT_TRUE(c->v4_layout());
    EXPECT_FALSE(c->is_v4());
    EXPECT_EQ(c->fp8_block_rows, 32);
    EXPECT_TRUE(c->fp8_scale_ue8m0);
    EXPECT_TRUE(c->expert_fp4);
    EXPECT_EQ(c->v41.vision.hidden_size, 1024);
    EXPECT_EQ(v41_first_decoder_layer(*c), 20);
    EXPECT_EQ(v41_swa_row_bytes(*c), 528);
    // Layers 2, 8 and 14 (ratio 2) keep one pending token: f32 kv + score of 512.
    EXPECT_EQ(v41_partial_state_bytes(*c), 3 * 2 * 512 * 4);
    EXPECT_EQ(v41_first_decoder_layer(*c) * 134 * v41_swa_row_bytes(*c), 1415040);
    // The report's 890 B of block KV per token: 3 x (288 + 68) / 2 + (288 + 68).
    EXPECT_DOUBLE_EQ(v41_block_kv_bytes_per_token(*c), 890.0);
    // Layer roles (§7.2).
    EXPECT_EQ(v41_attn_kind(*c, 0), V41AttnKind::kWindow);
    EXPECT_EQ(v41_attn_kind(*c, 8), V41AttnKind::kFull);
    EXPECT_EQ(v41_attn_kind(*c, 9), V41AttnKind::kReuse);
    EXPECT_EQ(v41_kv_source_of(*c, 13), 8);
    EXPECT_EQ(v41_kv_source_of(*c, 19), 14);
    EXPECT_EQ(v41_attn_kind(*c, 24), V41AttnKind::kReindex);
    EXPECT_EQ(v41_kv_source_of(*c, 26), 20);
    EXPECT_EQ(v41_topk_source_of(*c, 26), 24);
    EXPECT_EQ(v41_topk_source_of(*c, 21), 20);
    EXPECT_EQ(v41_topk_source_of(*c, 39), 36);
    // The Engram tables are 24 sub-tables of consecutive primes above 16,000,000 each
    // (the check that reads engram_num_embeddings back); the first modulus is 16000057.
    EXPECT_EQ(v41_engram_moduli(*c, 0).front(), 16000057);
    EXPECT_EQ(v41_engram_moduli(*c, 1).size(), 24u);
    // Round trip through the writer.
    Result<ModelConfig> back = parse_hf_config(to_hf_config_json(*c));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(back->v41.engram_num_embeddings, c->v41.engram_num_embeddings);
    EXPECT_EQ(back->compress_ratios, c->compress_ratios);
    EXPECT_EQ(back->v41.vision.patch_size, 14);
}

TEST(V41ConfigTest, BadFieldsAreNamed) {
    const std::string j = v41_json();
    expect_field_error(R"({"architectures":["DeepseekV41ForCausalLM"]})", "text_config");
    expect_field_error(
        replaced(j, R"("kv_source_layer_ids":[2,8,14,20])", R"("kv_source_layer_ids":[])"),
        "kv_source_layer_ids");
    expect_field_error(
        replaced(j, R"("kv_source_layer_ids":[2,8,14,20])", R"("kv_source_layer_ids":[8,14,20])"),
        "kv_source_layer_ids");  // layers 2..7 lose their source
    expect_field_error(replaced(j, "[0,0,2", "[0,2"), "compress_ratios");
    expect_field_error(replaced(j, "[0,0,2", "[0,0,4"), "compress_ratios");
    expect_field_error(replaced(j, R"("head_dim":512)", R"("head_dim":500)"), "head_dim");
    expect_field_error(replaced(j, "[2,8,14,20,24", "[0,2,8,14,20,24"), "index_source_layer_ids");
    expect_field_error(replaced(j, "[2,8,14,20,24", "[2,5,8,14,20,24"), "index_source_layer_ids");
    expect_field_error(
        replaced(j, R"("candidate_source_layer_id":20)", R"("candidate_source_layer_id":14)"),
        "candidate_source_layer_id");
    expect_field_error(replaced(j, "384016682", "384016683"), "engram_num_embeddings");
    expect_field_error(replaced(j, R"("engram_layer_ids":[1,14])", R"("engram_layer_ids":[14,1])"),
                       "engram_layer_ids");
    expect_field_error(
        replaced(j, R"("dspark_num_experts_per_tok":3)", R"("dspark_num_experts_per_tok":300)"),
        "dspark_num_experts_per_tok");
    expect_field_error(replaced(j, R"("patch_size":14)", R"("patch_size":0)"),
                       "vision_config.patch_size");
    expect_field_error(replaced(j, R"("num_attention_heads":16)", R"("num_attention_heads":3)"),
                       "vision_config.num_attention_heads");
    expect_field_error(replaced(j, R"("vision_config":{)", R"("vision_config":3,"x":{)"),
                       "vision_config");
}

TEST(V41ConfigTest, TinyPresetHasEveryLayerKind) {
    Result<ModelConfig> c = synthetic_preset("tiny-v41");
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    std::string kinds;
    for (int64_t l = 0; l < c->num_hidden_layers; ++l) {
        kinds += v41_attn_kind_name(v41_attn_kind(*c, l));
        kinds += v41_engram_index(*c, l) >= 0 ? "+engram " : " ";
    }
    EXPECT_EQ(kinds, "window window+engram full reuse+engram full reuse reindex reuse ");
    EXPECT_EQ(v41_first_decoder_layer(*c), 4);
    Result<ModelConfig> back = parse_hf_config(to_hf_config_json(*c));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(to_hf_config_json(*back), to_hf_config_json(*c));
    // Every role's tensors are listed; DSpark blocks as mtp.K.
    int full = 0, reindex_q = 0, engram = 0, dspark = 0;
    for (const V4TensorSpec& s : deepseek_v41_tensor_specs(*c)) {
        full += s.name.ends_with("indexer.wk.weight");
        reindex_q += s.name.ends_with("indexer.wq_b.weight");
        engram += s.name.ends_with("engram.embed.weight");
        dspark += s.name.starts_with("mtp.") && s.name.ends_with("attn.wkv.weight");
    }
    EXPECT_EQ(full, 2);
    EXPECT_EQ(reindex_q, 3);
    EXPECT_EQ(engram, 2);
    EXPECT_EQ(dspark, 2);
}

}  // namespace
}  // namespace dsi
