// open_checkpoint: Hugging Face directories and GGUF files behind one WeightSource.
#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "model/gguf.h"
#include "model/gguf_names.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace dsi {
namespace {

bool is_directory(const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// A matrix whose bytes the returned WeightMatrix owns (rebuilt or re-laid-out data).
WeightMatrix owned_matrix(DType dtype, int64_t rows, int64_t cols,
                          std::shared_ptr<std::vector<uint8_t>> bytes) {
    WeightMatrix m;
    m.dtype = dtype;
    m.rows = rows;
    m.cols = cols;
    m.data = bytes->data();
    m.owned = std::move(bytes);
    return m;
}

bool is_float_dtype(DType t) {
    return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kQ8_0 ||
           t == DType::kMXFP4;
}

Status check_shape(const std::string& where, const std::string& name, const TensorView& v,
                   const std::vector<int64_t>& want) {
    if (v.shape != want) {
        return invalid_argument(where + ": tensor '" + name + "' has shape " +
                                shape_to_string(v.shape) + ", expected " + shape_to_string(want));
    }
    return Status::ok();
}

Result<std::vector<float>> to_f32(const std::string& where, const std::string& name,
                                  const TensorView& v) {
    if (!is_float_dtype(v.dtype) && v.dtype != DType::kF8E4M3 && v.dtype != DType::kE8M0) {
        return invalid_argument(where + ": tensor '" + name + "' has dtype " +
                                std::string(dtype_name(v.dtype)) + ", expected a float type");
    }
    std::vector<float> out(static_cast<size_t>(v.numel()));
    dequantize_row(v.dtype, v.data.data(), out.data(), v.numel());
    return out;
}

// ---- Hugging Face: config.json + safetensors (bf16/f16/f32, or FP8 + scale_inv) ----

class HfWeightSource final : public WeightSource {
public:
    HfWeightSource(ModelConfig config, SafetensorsSet set, std::string dir)
        : config_(std::move(config)), set_(std::move(set)), dir_(std::move(dir)) {}

    const ModelConfig& config() const override { return config_; }
    bool has(const std::string& name) const override { return set_.has(name); }
    std::string description() const override { return "hf:" + dir_; }

    Result<WeightMatrix> matrix(const std::string& name, int64_t rows, int64_t cols) override {
        DSI_ASSIGN_OR_RETURN(TensorView v, set_.view(name));
        if (v.dtype == DType::kI8 && config_.v4_layout()) return fp4_matrix(name, v, rows, cols);
        DSI_RETURN_IF_ERROR(check_shape(where(name), name, v, {rows, cols}));
        WeightMatrix m;
        m.dtype = v.dtype;
        m.rows = rows;
        m.cols = cols;
        m.data = v.data.data();
        if (v.dtype == DType::kF8E4M3) {
            DSI_RETURN_IF_ERROR(attach_fp8_scales(name, m));
        } else if (!is_float_dtype(v.dtype)) {
            return invalid_argument(where(name) + ": tensor '" + name + "' has unsupported dtype " +
                                    std::string(dtype_name(v.dtype)));
        }
        return m;
    }

    Result<std::vector<float>> vector(const std::string& name, int64_t n) override {
        DSI_ASSIGN_OR_RETURN(TensorView v, set_.view(name));
        DSI_RETURN_IF_ERROR(check_shape(where(name), name, v, {n}));
        return to_f32(where(name), name, v);
    }

    Result<std::vector<int32_t>> int_matrix(const std::string& name, int64_t rows,
                                            int64_t cols) override {
        DSI_ASSIGN_OR_RETURN(TensorView v, set_.view(name));
        DSI_RETURN_IF_ERROR(check_shape(where(name), name, v, {rows, cols}));
        std::vector<int32_t> out(static_cast<size_t>(rows * cols));
        if (v.dtype == DType::kI32) {
            std::memcpy(out.data(), v.data.data(), out.size() * 4);
            return out;
        }
        if (v.dtype != DType::kI64) {
            return invalid_argument(where(name) + ": tensor '" + name + "' has dtype " +
                                    std::string(dtype_name(v.dtype)) + ", expected I32 or I64");
        }
        for (size_t i = 0; i < out.size(); ++i) {
            int64_t x;
            std::memcpy(&x, v.data.data() + 8 * i, 8);
            if (x < INT32_MIN || x > INT32_MAX) {
                return invalid_argument(where(name) + ": tensor '" + name +
                                        "' has a value outside int32");
            }
            out[i] = static_cast<int32_t>(x);
        }
        return out;
    }

private:
    std::string where(const std::string& name) const {
        const SafetensorsFile* f = set_.file_of(name);
        return f ? f->path() : dir_;
    }

    // DeepSeek V4 FP4 experts: I8 [rows, cols/2] e2m1 pairs (low nibble = even
    // element) + "<x>.scale" F8_E8M0 [rows, cols/32]. Re-laid out, bit for bit, into
    // GGUF MXFP4 blocks (scale byte, then byte j = element j | element j+16 << 4), the
    // format kernels/ packs for its MXFP4 GEMM: the codes are never dequantised.
    Result<WeightMatrix> fp4_matrix(const std::string& name, const TensorView& v, int64_t rows,
                                    int64_t cols) {
        if (cols % 32 != 0) {
            return invalid_argument(where(name) + ": FP4 tensor '" + name +
                                    "' needs a multiple of 32 columns, got " +
                                    std::to_string(cols));
        }
        DSI_RETURN_IF_ERROR(check_shape(where(name), name, v, {rows, cols / 2}));
        const std::string scale_name = v4_scale_name(name);
        if (!set_.has(scale_name)) {
            return invalid_argument(where(name) + ": FP4 tensor '" + name + "' has no '" +
                                    scale_name + "'");
        }
        DSI_ASSIGN_OR_RETURN(TensorView s, set_.view(scale_name));
        DSI_RETURN_IF_ERROR(check_shape(where(scale_name), scale_name, s, {rows, cols / 32}));
        if (s.dtype != DType::kE8M0) {
            return invalid_argument(where(scale_name) + ": tensor '" + scale_name + "' has dtype " +
                                    std::string(dtype_name(s.dtype)) + ", expected F8_E8M0");
        }
        const int64_t blocks = rows * (cols / 32);
        auto bytes = std::make_shared<std::vector<uint8_t>>(
            static_cast<size_t>(blocks * dtype_block_bytes(DType::kMXFP4)));
        const uint8_t* codes = v.data.data();
        const uint8_t* scales = s.data.data();
        for (int64_t b = 0; b < blocks; ++b) {
            if (scales[b] == 0xff) {
                return invalid_argument(where(scale_name) + ": tensor '" + scale_name +
                                        "' has the NaN scale 0xff");
            }
            uint8_t* out = bytes->data() + b * dtype_block_bytes(DType::kMXFP4);
            const uint8_t* in = codes + b * 16;  // 32 codes of this block, 2 per byte
            out[0] = scales[b];
            for (int j = 0; j < 16; ++j) {
                const uint8_t lo = (in[j / 2] >> (4 * (j % 2))) & 0xf;
                const uint8_t hi = (in[(j + 16) / 2] >> (4 * (j % 2))) & 0xf;
                out[1 + j] = static_cast<uint8_t>(lo | (hi << 4));
            }
        }
        return owned_matrix(DType::kMXFP4, rows, cols, std::move(bytes));
    }

    // DeepSeek FP8: `<name minus .weight>.weight_scale_inv`, f32 (or e8m0), one
    // scale per block_rows x block_cols block.
    // DeepSeek V4 names it "<name minus weight>scale" (F8_E8M0).
    Status attach_fp8_scales(const std::string& name, WeightMatrix& m) {
        const std::string scale_name =
            config_.v4_layout() ? v4_scale_name(name) : name + "_scale_inv";
        if (!set_.has(scale_name)) {
            return invalid_argument(where(name) + ": FP8 tensor '" + name + "' has no '" +
                                    scale_name + "'");
        }
        DSI_ASSIGN_OR_RETURN(TensorView s, set_.view(scale_name));
        m.block_rows = config_.fp8_block_rows;
        m.block_cols = config_.fp8_block_cols;
        const std::vector<int64_t> want = {(m.rows + m.block_rows - 1) / m.block_rows,
                                           (m.cols + m.block_cols - 1) / m.block_cols};
        DSI_RETURN_IF_ERROR(check_shape(where(scale_name), scale_name, s, want));
        if (s.dtype == DType::kF32) {
            m.block_scale = reinterpret_cast<const float*>(s.data.data());
            if (reinterpret_cast<uintptr_t>(m.block_scale) % alignof(float) != 0) {
                DSI_ASSIGN_OR_RETURN(auto f, to_f32(where(scale_name), scale_name, s));
                keep_scales(m, std::move(f));
            }
        } else if (s.dtype == DType::kE8M0 || s.dtype == DType::kBF16) {
            DSI_ASSIGN_OR_RETURN(auto f, to_f32(where(scale_name), scale_name, s));
            keep_scales(m, std::move(f));
        } else {
            return invalid_argument(where(scale_name) + ": tensor '" + scale_name + "' has dtype " +
                                    std::string(dtype_name(s.dtype)) + ", expected F32 or F8_E8M0");
        }
        for (int64_t i = 0; i < want[0] * want[1]; ++i) {
            float v = m.block_scale[i];
            if (!(v > 0.0f) || !std::isfinite(v)) {
                return invalid_argument(where(scale_name) + ": tensor '" + scale_name +
                                        "' has a non-positive or non-finite scale");
            }
        }
        return Status::ok();
    }

    static void keep_scales(WeightMatrix& m, std::vector<float> f) {
        auto bytes = std::make_shared<std::vector<uint8_t>>(f.size() * sizeof(float));
        std::memcpy(bytes->data(), f.data(), bytes->size());
        m.block_scale = reinterpret_cast<const float*>(bytes->data());
        m.owned = std::move(bytes);
    }

    ModelConfig config_;
    SafetensorsSet set_;
    std::string dir_;
};

// ---- GGUF (llama.cpp deepseek2) ----

class GgufWeightSource final : public WeightSource {
public:
    GgufWeightSource(ModelConfig config, GgufFile file)
        : config_(std::move(config)), file_(std::move(file)) {}

    const ModelConfig& config() const override { return config_; }
    std::string description() const override { return "gguf:" + file_.path(); }

    bool has(const std::string& name) const override {
        std::optional<GgufTensorRef> ref = gguf_tensor_for_hf_name(config_, name);
        return ref && file_.find_tensor(ref->gguf_name) != nullptr;
    }

    Result<WeightMatrix> matrix(const std::string& name, int64_t rows, int64_t cols) override {
        std::optional<GgufTensorRef> direct = gguf_tensor_for_hf_name(config_, name);
        if (direct && direct->gguf_name.ends_with("attn_kv_b.weight") &&
            file_.find_tensor(direct->gguf_name) == nullptr) {
            return kv_b_from_split(*direct, rows, cols);
        }
        DSI_ASSIGN_OR_RETURN(GgufTensorRef ref, resolve(name));
        DSI_ASSIGN_OR_RETURN(TensorView v, file_.view(ref.gguf_name));
        if (!is_float_dtype(v.dtype)) {
            return invalid_argument(file_.path() + ": tensor '" + ref.gguf_name +
                                    "' has unsupported dtype " + std::string(dtype_name(v.dtype)));
        }
        if (ref.col_half >= 0) return column_half(ref, v, rows, cols);
        WeightMatrix m;
        m.dtype = v.dtype;
        m.rows = rows;
        m.cols = cols;
        if (ref.expert >= 0) {
            // A slice [expert] of a merged [experts, rows, cols] tensor.
            DSI_RETURN_IF_ERROR(check_shape(file_.path(), ref.gguf_name, v,
                                            {config_.n_routed_experts, rows, cols}));
            const int64_t slice_bytes = rows * dtype_row_bytes(v.dtype, cols);
            m.data = v.data.data() + ref.expert * slice_bytes;
            return m;
        }
        DSI_RETURN_IF_ERROR(check_shape(file_.path(), ref.gguf_name, v, {rows, cols}));
        m.data = v.data.data();
        return m;
    }

    Result<std::vector<float>> vector(const std::string& name, int64_t n) override {
        DSI_ASSIGN_OR_RETURN(GgufTensorRef ref, resolve(name));
        DSI_ASSIGN_OR_RETURN(TensorView v, file_.view(ref.gguf_name));
        DSI_RETURN_IF_ERROR(check_shape(file_.path(), ref.gguf_name, v, {n}));
        return to_f32(file_.path(), ref.gguf_name, v);
    }

    // V4's ffn_gate_tid2eid: I32 [vocab, experts_per_tok].
    Result<std::vector<int32_t>> int_matrix(const std::string& name, int64_t rows,
                                            int64_t cols) override {
        DSI_ASSIGN_OR_RETURN(GgufTensorRef ref, resolve(name));
        DSI_ASSIGN_OR_RETURN(TensorView v, file_.view(ref.gguf_name));
        DSI_RETURN_IF_ERROR(check_shape(file_.path(), ref.gguf_name, v, {rows, cols}));
        if (v.dtype != DType::kI32) {
            return invalid_argument(file_.path() + ": tensor '" + ref.gguf_name + "' has dtype " +
                                    std::string(dtype_name(v.dtype)) + ", expected I32");
        }
        std::vector<int32_t> out(static_cast<size_t>(rows * cols));
        std::memcpy(out.data(), v.data.data(), out.size() * 4);
        return out;
    }

private:
    // llama.cpp's MLA files store kv_b_proj split per head: attn_k_b [heads, kv_lora,
    // nope] (transposed) and attn_v_b [heads, v, kv_lora]. Rebuild [heads * (nope + v),
    // kv_lora] in f32.
    Result<WeightMatrix> kv_b_from_split(const GgufTensorRef& ref, int64_t rows, int64_t cols) {
        const std::string blk =
            ref.gguf_name.substr(0, ref.gguf_name.size() - std::string("attn_kv_b.weight").size());
        const int64_t nh = config_.num_attention_heads, nope = config_.qk_nope_head_dim,
                      vd = config_.v_head_dim, lora = config_.kv_lora_rank;
        DSI_CHECK_EQ(rows, nh * (nope + vd));
        DSI_CHECK_EQ(cols, lora);
        if (file_.find_tensor(blk + "attn_k_b.weight") == nullptr) {
            return not_found(file_.path() + ": missing tensor '" + ref.gguf_name + "' (or '" + blk +
                             "attn_k_b.weight' + '" + blk + "attn_v_b.weight')");
        }
        DSI_ASSIGN_OR_RETURN(TensorView kb, file_.view(blk + "attn_k_b.weight"));
        DSI_ASSIGN_OR_RETURN(TensorView vb, file_.view(blk + "attn_v_b.weight"));
        DSI_RETURN_IF_ERROR(
            check_shape(file_.path(), blk + "attn_k_b.weight", kb, {nh, lora, nope}));
        DSI_RETURN_IF_ERROR(check_shape(file_.path(), blk + "attn_v_b.weight", vb, {nh, vd, lora}));
        DSI_ASSIGN_OR_RETURN(std::vector<float> k,
                             to_f32(file_.path(), blk + "attn_k_b.weight", kb));
        DSI_ASSIGN_OR_RETURN(std::vector<float> v,
                             to_f32(file_.path(), blk + "attn_v_b.weight", vb));
        auto bytes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rows * cols * 4));
        float* out = reinterpret_cast<float*>(bytes->data());
        for (int64_t h = 0; h < nh; ++h) {
            for (int64_t d = 0; d < nope; ++d) {
                for (int64_t l = 0; l < lora; ++l) {
                    out[(h * (nope + vd) + d) * lora + l] = k[(h * lora + l) * nope + d];
                }
            }
            for (int64_t j = 0; j < vd; ++j) {
                std::copy_n(&v[(h * vd + j) * lora], lora,
                            out + (h * (nope + vd) + nope + j) * lora);
            }
        }
        return owned_matrix(DType::kF32, rows, cols, std::move(bytes));
    }

    // Half `ref.col_half` of a [rows, 2 * cols] tensor (V4's nextn.eh_proj = [e_proj |
    // h_proj]), copied out row by row in its stored format: a half of a block-quantised
    // row is whole blocks when cols is a multiple of the block.
    Result<WeightMatrix> column_half(const GgufTensorRef& ref, const TensorView& v, int64_t rows,
                                     int64_t cols) {
        DSI_RETURN_IF_ERROR(check_shape(file_.path(), ref.gguf_name, v, {rows, 2 * cols}));
        const int64_t block = dtype_block_elems(v.dtype);
        if (cols % block != 0) {
            return invalid_argument(file_.path() + ": tensor '" + ref.gguf_name + "' in " +
                                    std::string(dtype_name(v.dtype)) +
                                    " cannot be split at column " + std::to_string(cols) +
                                    " (blocks of " + std::to_string(block) + ")");
        }
        const int64_t full = dtype_row_bytes(v.dtype, 2 * cols);
        const int64_t half = dtype_row_bytes(v.dtype, cols);
        auto bytes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rows * half));
        for (int64_t r = 0; r < rows; ++r) {
            std::memcpy(bytes->data() + r * half, v.data.data() + r * full + ref.col_half * half,
                        static_cast<size_t>(half));
        }
        return owned_matrix(v.dtype, rows, cols, std::move(bytes));
    }

    Result<GgufTensorRef> resolve(const std::string& name) const {
        std::optional<GgufTensorRef> ref = gguf_tensor_for_hf_name(config_, name);
        if (!ref) return not_found(file_.path() + ": no GGUF tensor for '" + name + "'");
        if (file_.find_tensor(ref->gguf_name) == nullptr) {
            return not_found(file_.path() + ": missing tensor '" + ref->gguf_name + "' (for '" +
                             name + "')");
        }
        return *ref;
    }

    ModelConfig config_;
    GgufFile file_;
};

}  // namespace

Result<std::unique_ptr<WeightSource>> open_checkpoint(Env* env, const std::string& path) {
    if (is_directory(path)) {
        const std::string config_path = path + "/config.json";
        DSI_ASSIGN_OR_RETURN(std::string text, env->read_file(config_path));
        Result<ModelConfig> config = parse_hf_config(text);
        if (!config.is_ok()) return config.status().with_context(config_path);
        DSI_ASSIGN_OR_RETURN(SafetensorsSet set, SafetensorsSet::open_dir(env, path));
        return std::unique_ptr<WeightSource>(
            new HfWeightSource(std::move(config).value(), std::move(set), path));
    }
    if (path.size() > 5 && path.substr(path.size() - 5) == ".gguf") {
        DSI_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(env, path));
        Result<ModelConfig> config = config_from_gguf(file);
        if (!config.is_ok()) return config.status().with_context(path);
        return std::unique_ptr<WeightSource>(
            new GgufWeightSource(std::move(config).value(), std::move(file)));
    }
    if (!env->file_exists(path)) return not_found("checkpoint '" + path + "' does not exist");
    return invalid_argument("checkpoint '" + path +
                            "' is neither a Hugging Face directory nor a .gguf file");
}

}  // namespace dsi
