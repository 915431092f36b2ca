// Weight access independent of the checkpoint format.
//
// A WeightSource serves tensors by their Hugging Face name
// ("model.layers.3.mlp.experts.7.gate_proj.weight"), whatever the file format: HF
// safetensors directories map 1:1, GGUF files map llama.cpp names (and slices of
// merged expert tensors) back to HF names. Every lookup checks presence, dtype and
// shape and names the tensor in its error. Thread model: sources are immutable after
// open and may be read from any thread; views live as long as the source.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "model/config.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace dsi {

// A matrix [rows (outputs), cols (inputs)] in its stored format, row-major.
struct WeightMatrix {
    DType dtype = DType::kF32;
    int64_t rows = 0;
    int64_t cols = 0;
    const uint8_t* data = nullptr;
    // FP8 e4m3 block scales (weight_scale_inv, f32): [ceil(rows/br), ceil(cols/bc)].
    const float* block_scale = nullptr;
    int64_t block_rows = 128;
    int64_t block_cols = 128;
    // Keeps reconstructed data alive (e.g. kv_b rebuilt from GGUF's k_b/v_b).
    std::shared_ptr<const std::vector<uint8_t>> owned;

    int64_t row_bytes() const { return dtype_row_bytes(dtype, cols); }
    // Dequantises row r into out[cols] (f32), applying FP8 block scales.
    void dequantize_row(int64_t r, float* out) const;
};

class WeightSource {
public:
    virtual ~WeightSource() = default;
    virtual const ModelConfig& config() const = 0;
    virtual bool has(const std::string& name) const = 0;
    // A [rows, cols] matrix; NOT_FOUND / INVALID_ARGUMENT naming file and tensor.
    virtual Result<WeightMatrix> matrix(const std::string& name, int64_t rows, int64_t cols) = 0;
    // A vector of n values (norm weights, biases) as f32.
    virtual Result<std::vector<float>> vector(const std::string& name, int64_t n) = 0;
    // An integer matrix [rows, cols] (V4's ffn.gate.tid2eid: I32 or I64 stored) as int32;
    // values outside int32 are INVALID_ARGUMENT.
    virtual Result<std::vector<int32_t>> int_matrix(const std::string& name, int64_t rows,
                                                    int64_t cols);
    // Where the weights come from ("hf:/path", "gguf:/path"), for messages.
    virtual std::string description() const = 0;
};

// Opens a checkpoint: a directory with config.json + *.safetensors (HF), or a
// .gguf file. REQUIRES: env outlives the source.
Result<std::unique_ptr<WeightSource>> open_checkpoint(Env* env, const std::string& path);

// An in-memory source of f32 tensors, for tests and for make-model.
class MemoryWeightSource : public WeightSource {
public:
    struct Tensor {
        std::vector<int64_t> shape;
        std::vector<float> data;
    };
    explicit MemoryWeightSource(ModelConfig config) : config_(std::move(config)) {}
    void add(std::string name, std::vector<int64_t> shape, std::vector<float> data);
    const std::map<std::string, Tensor>& tensors() const { return tensors_; }

    const ModelConfig& config() const override { return config_; }
    bool has(const std::string& name) const override { return tensors_.count(name) != 0; }
    Result<WeightMatrix> matrix(const std::string& name, int64_t rows, int64_t cols) override;
    Result<std::vector<float>> vector(const std::string& name, int64_t n) override;
    Result<std::vector<int32_t>> int_matrix(const std::string& name, int64_t rows,
                                            int64_t cols) override;
    std::string description() const override { return "memory"; }

private:
    ModelConfig config_;
    std::map<std::string, Tensor> tensors_;
};

// All HF tensor names of a DeepSeek V2/V3 model with their shapes, in a stable
// order (layers, then MTP). Used by loaders (presence checks) and make-model.
struct TensorSpec {
    std::string name;
    std::vector<int64_t> shape;
    bool quantizable;  // FP8 in DeepSeek's checkpoints (linear weights, not norms/gate/embeddings)
};
std::vector<TensorSpec> deepseek_tensor_specs(const ModelConfig& config);

// DeepSeek V4 (DeepseekV4ForCausalLM): every tensor of the official checkpoint
// (reference deepseek_v4.md §3: names without a "model." prefix, "layers.N.",
// "mtp.0."), with its logical shape [out, in] and how the official checkpoint stores it.
enum class V4Storage : uint8_t {
    kBF16,  // norms, embed/head, compressor and router weights
    kF32,   // hc_*, attn_sink, compressor ape, gate bias
    kFp8,   // e4m3 + "<name minus weight>scale" F8_E8M0 per 128x128 block (bf16 if !fp8)
    kFp4,   // routed experts: I8 [out, in/2] e2m1 pairs (low nibble = even element) +
            // ".scale" F8_E8M0 [out, in/32] (FP8 if !expert_fp4)
    kI64,   // ffn.gate.tid2eid (I64 in the official files: their total_size counts 8 bytes)
};
struct V4TensorSpec {
    std::string name;
    std::vector<int64_t> shape;
    V4Storage storage;
};
// For a V4.1 config: deepseek_v41_tensor_specs.
std::vector<V4TensorSpec> deepseek_v4_tensor_specs(const ModelConfig& config);
// DeepSeek V4.1 (DeepseekV41ForCausalLM): the tensors dsinfer reads (reference
// deepseek_v4.md §7; names and shapes it does not give are chosen in docs/models_v41.md).
std::vector<V4TensorSpec> deepseek_v41_tensor_specs(const ModelConfig& config);
// The scale tensor of an FP8 / FP4 V4 weight: "x.weight" -> "x.scale".
std::string v4_scale_name(const std::string& weight_name);

}  // namespace dsi
