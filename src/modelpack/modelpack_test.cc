#include "modelpack/modelpack.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/deepseek.h"
#include "model/draft_vocab.h"
#include "model/synthetic.h"
#include "tensor/dtype.h"

namespace dsi {
namespace {

// A small V3 config (the tiny-v3 preset without FP8, 3 layers + MTP) over a
// 512-id vocabulary.
ModelConfig small_config() {
    ModelConfig c = synthetic_preset("tiny-v3").value();
    c.fp8 = false;
    c.vocab_size = 512;
    return c;
}

struct PackBuilder {
    ModelConfig config = small_config();
    std::vector<int32_t> used = {0, 1, 7, 100, 511};
    std::vector<std::vector<uint8_t>> storage;
    SafetensorsWriter w;
    std::vector<std::string> skip;

    // Matrix values: code (i % 255 - 127) with exponent byte 120 + (block % 5).
    void matrix(const std::string& name, int64_t rows, int64_t cols) {
        std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
        for (size_t i = 0; i < codes.size(); ++i) {
            codes[i] = static_cast<uint8_t>(static_cast<int8_t>(static_cast<int>(i % 255) - 127));
        }
        std::vector<uint8_t> scales(static_cast<size_t>(rows * cols / 32));
        for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<uint8_t>(120 + i % 5);
        w.add(name, DType::kI8, {rows, cols}, codes);
        w.add(name + ".qscale", DType::kE8M0, {rows, cols / 32}, scales);
    }
    void vector(const std::string& name, int64_t n, float value) {
        std::vector<float> v(static_cast<size_t>(n), value);
        w.add(name, DType::kF32, {n},
              std::span(reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4));
    }
    std::string write(const std::string& path) {
        const int64_t H = config.hidden_size;
        w.add("vocab.used_ids", DType::kI32, {static_cast<int64_t>(used.size())},
              std::span(reinterpret_cast<const uint8_t*>(used.data()), used.size() * 4));
        matrix("model.embed_tokens.weight", static_cast<int64_t>(used.size()), H);
        vector("model.embed_tokens.other", H, 0.25f);
        matrix("lm_head.weight", static_cast<int64_t>(used.size()), H);
        vector("lm_head.other", H, -0.5f);
        const std::string mtp = "model.layers." + std::to_string(config.num_hidden_layers) + ".";
        for (const TensorSpec& s : deepseek_tensor_specs(config)) {
            if (s.name == "model.embed_tokens.weight" || s.name == "lm_head.weight" ||
                s.name == mtp + "embed_tokens.weight" || s.name == mtp + "shared_head.head.weight") {
                continue;
            }
            if (std::find(skip.begin(), skip.end(), s.name) != skip.end()) continue;
            if (s.shape.size() == 2) {
                matrix(s.name, s.shape[0], s.shape[1]);
            } else {
                vector(s.name, s.shape[0], 1.0f);
            }
        }
        w.set_metadata("format", std::string(kModelPackFormat));
        w.set_metadata("config", to_hf_config_json(config));
        w.set_metadata("recipe", R"({"step": 3})");
        EXPECT_TRUE(w.write(Env::default_env(), path).is_ok());
        return path;
    }
};

std::string temp_dir(const std::string& name) {
    std::string d = testing::TempDir() + "/modelpack_" + name;
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d;
}

TEST(ModelPack, VocabularyRuleAndMtpCopies) {
    PackBuilder b;
    const std::string path = b.write(temp_dir("vocab") + "/p.safetensors");
    auto pack = ModelPack::open(Env::default_env(), path);
    ASSERT_TRUE(pack.is_ok()) << pack.status().to_string();
    const ModelConfig& c = (*pack)->config();
    EXPECT_EQ(c.vocab_size, 512);
    EXPECT_EQ((*pack)->recipe_json(), R"({"step": 3})");
    const int64_t H = c.hidden_size;
    auto embed = (*pack)->values({"model.embed_tokens.weight", {512, H}, false});
    ASSERT_TRUE(embed.is_ok());
    // id 7 is the third used row: element (2, j) has code ((2H + j) % 255 - 127).
    for (int64_t j : {0L, 31L, 32L, H - 1}) {
        const int64_t i = 2 * H + j;
        const float want = static_cast<float>(i % 255 - 127) * e8m0_to_f32(120 + (i / 32) % 5);
        EXPECT_EQ((*embed)[7 * H + j], want) << j;
        EXPECT_EQ((*embed)[8 * H + j], 0.25f);  // unused id: the "other" row
        // Exact in bf16: the expanded checkpoint holds these values.
        EXPECT_EQ(bf16_to_f32(f32_to_bf16(want)), want);
    }
    const std::string mtp = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
    auto mtp_embed = (*pack)->values({mtp + "embed_tokens.weight", {512, H}, false});
    ASSERT_TRUE(mtp_embed.is_ok());
    EXPECT_EQ(*mtp_embed, *embed);
    auto head = (*pack)->values({mtp + "shared_head.head.weight", {512, H}, false});
    ASSERT_TRUE(head.is_ok());
    EXPECT_EQ((*head)[300 * H], -0.5f);
}

TEST(ModelPack, ExpandsIntoALoadableCheckpoint) {
    PackBuilder b;
    const std::string dir = temp_dir("expand");
    const std::string path = b.write(dir + "/p.safetensors");
    auto pack = ModelPack::open(Env::default_env(), path);
    ASSERT_TRUE(pack.is_ok()) << pack.status().to_string();
    // Minimal tokenizer files: the writers copy the HF ones and read the vocabulary
    // for the GGUF.
    TokenizerFiles tok;
    tok.tokenizer_json = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}})";
    tok.tokenizer_config_json = "{}";
    ASSERT_TRUE(expand_model_pack(Env::default_env(), **pack, tok, dir + "/hf",
                                  dir + "/hf/model-f32.gguf", DType::kF32)
                    .is_ok());
    for (const std::string& p : {dir + "/hf", dir + "/hf/model-f32.gguf"}) {
        auto src = open_checkpoint(Env::default_env(), p);
        ASSERT_TRUE(src.is_ok()) << p << ": " << src.status().to_string();
        auto w = (*src)->matrix("model.embed_tokens.weight", 512, b.config.hidden_size);
        ASSERT_TRUE(w.is_ok()) << p;
        std::vector<float> row(static_cast<size_t>(b.config.hidden_size));
        auto want = (*pack)->values({"model.embed_tokens.weight", {512, b.config.hidden_size}, false});
        for (int64_t id : {1L, 7L, 8L, 511L}) {
            w->dequantize_row(id, row.data());
            for (int64_t j = 0; j < b.config.hidden_size; ++j) {
                ASSERT_EQ(row[j], (*want)[id * b.config.hidden_size + j]) << p << " id " << id;
            }
        }
        DeepseekModel::Options o;
        auto model = DeepseekModel::load(std::move(src).value(), o);
        ASSERT_TRUE(model.is_ok()) << p << ": " << model.status().to_string();
    }
    // The draft vocabulary beside it is the pack's used ids (issue 24).
    auto text = Env::default_env()->read_file(dir + "/hf/draft_vocab.json");
    ASSERT_TRUE(text.is_ok());
    auto ids = parse_draft_vocab(*text, 512);
    ASSERT_TRUE(ids.is_ok()) << ids.status().to_string();
    EXPECT_EQ(*ids, (*pack)->used_ids());
    EXPECT_FALSE(ids->empty());
}

TEST(ModelPack, RejectsMalformedPacks) {
    Env* env = Env::default_env();
    const std::string dir = temp_dir("bad");
    {
        PackBuilder b;
        b.skip = {"model.layers.1.mlp.gate.weight"};
        auto pack = ModelPack::open(env, b.write(dir + "/missing.safetensors"));
        ASSERT_FALSE(pack.is_ok());
        EXPECT_NE(pack.status().message().find("model.layers.1.mlp.gate.weight"), std::string::npos);
    }
    {
        PackBuilder b;
        b.used = {0, 7, 7};
        auto pack = ModelPack::open(env, b.write(dir + "/order.safetensors"));
        ASSERT_FALSE(pack.is_ok());
        EXPECT_NE(pack.status().message().find("used_ids"), std::string::npos);
    }
    {
        SafetensorsWriter w;
        w.set_metadata("format", "something-else");
        ASSERT_TRUE(w.write(env, dir + "/format.safetensors").is_ok());
        auto pack = ModelPack::open(env, dir + "/format.safetensors");
        ASSERT_FALSE(pack.is_ok());
        EXPECT_NE(pack.status().message().find("not a model pack"), std::string::npos);
    }
    EXPECT_FALSE(ModelPack::open(env, dir + "/absent.safetensors").is_ok());
}

}  // namespace
}  // namespace dsi
