#include "model/v41_config.h"

#include <gtest/gtest.h>

#include <string>

namespace dsi {
namespace {

// The SWA-sizing fields of DeepSeek-V4.1-Flash (reference deepseek_v4.md §7.1).
std::string v41_json(const std::string& extra = "") {
    std::string ratios = "[0,0";
    for (int i = 0; i < 18; ++i) ratios += ",2";
    for (int i = 0; i < 20; ++i) ratios += ",1";
    ratios += ",0,0,0]";
    return R"({"architectures":["DeepseekV41ForCausalLM"],"model_type":"deepseek_v41",)"
           R"("text_config":{"num_hidden_layers":40,"head_dim":512,"sliding_window":128,)"
           R"("num_nextn_predict_layers":3,"kv_source_layer_ids":[2,8,14,20],)" +
           extra + R"("compress_ratios":)" + ratios + "}}";
}

TEST(V41ConfigTest, RealConfigSizes) {
    ASSERT_TRUE(is_v41_config(v41_json()));
    Result<V41TextConfig> c = parse_v41_config(v41_json());
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ(c->architecture, "DeepseekV41ForCausalLM");
    EXPECT_EQ(c->encoder_layers(), 20);
    EXPECT_EQ(c->swa_row_bytes(), 528);
    // Layers 2, 8 and 14 (ratio 2) keep one pending token: f32 kv + score of 512.
    EXPECT_EQ(c->partial_state_bytes(), 3 * 2 * 512 * 4);
    EXPECT_EQ(c->encoder_layers() * 134 * c->swa_row_bytes(), 1415040);
}

TEST(V41ConfigTest, OtherConfigsAndBadFields) {
    EXPECT_FALSE(is_v41_config(R"({"architectures":["DeepseekV4ForCausalLM"]})"));
    EXPECT_FALSE(is_v41_config("not json"));
    EXPECT_TRUE(is_v41_config(R"({"model_type":"deepseek_v41"})"));
    EXPECT_EQ(parse_v41_config(R"({"model_type":"deepseek_v41"})").status().code(),
              StatusCode::kInvalidArgument);
    std::string no_sources = v41_json();
    no_sources.replace(no_sources.find("[2,8,14,20]"), 11, "[]");
    Result<V41TextConfig> c = parse_v41_config(no_sources);
    ASSERT_FALSE(c.is_ok());
    EXPECT_NE(c.status().message().find("kv_source_layer_ids"), std::string::npos);
    std::string short_ratios = v41_json();
    short_ratios.replace(short_ratios.find("[0,0,"), 5, "[0,");
    c = parse_v41_config(short_ratios);
    ASSERT_FALSE(c.is_ok());
    EXPECT_NE(c.status().message().find("compress_ratios"), std::string::npos);
    std::string bad_head = v41_json();
    bad_head.replace(bad_head.find("\"head_dim\":512"), 14, "\"head_dim\":500");
    EXPECT_FALSE(parse_v41_config(bad_head).is_ok());
}

}  // namespace
}  // namespace dsi
