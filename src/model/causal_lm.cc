#include "model/causal_lm.h"

#include "model/deepseek.h"
#include "model/deepseek_v4.h"
#include "model/deepseek_v41.h"

namespace dsi {

Result<std::unique_ptr<CausalLm>> load_causal_lm(std::unique_ptr<WeightSource> source,
                                                 const ModelOptions& options) {
    if (source->config().is_v41()) {
        if (options.reference_kernels) {
            return invalid_argument(source->description() +
                                    ": DeepSeek V4.1 has no reference-kernel path "
                                    "(reference_kernels is for V2/V3)");
        }
        DeepseekV41Model::Options o;
        if (!kernels::parse_kv_dtype(options.kv_dtype.c_str(), &o.kv_dtype) ||
            o.kv_dtype == kernels::KvDtype::kBf16) {
            return invalid_argument(source->description() + ": DeepSeek V4.1 keeps its KV in f32 " +
                                    "or e4m3 (FP4 / MXFP4 / MXFP8 rows); kv dtype '" +
                                    options.kv_dtype + "' is not supported");
        }
        o.num_threads = options.num_threads;
        o.weight_format = options.weight_format;
        o.expert_parallel = options.expert_parallel;
        DSI_ASSIGN_OR_RETURN(std::unique_ptr<DeepseekV41Model> m,
                             DeepseekV41Model::load(std::move(source), o));
        return std::unique_ptr<CausalLm>(std::move(m));
    }
    if (source->config().is_v4()) {
        if (options.reference_kernels) {
            return invalid_argument(source->description() +
                                    ": DeepSeek V4 has no reference-kernel path "
                                    "(reference_kernels is for V2/V3)");
        }
        DeepseekV4Model::Options o;
        if (!kernels::parse_kv_dtype(options.kv_dtype.c_str(), &o.kv_dtype) ||
            o.kv_dtype == kernels::KvDtype::kBf16) {
            return invalid_argument(source->description() +
                                    ": DeepSeek V4 keeps its KV in f32 or " + "e4m3; kv dtype '" +
                                    options.kv_dtype + "' is not supported");
        }
        o.num_threads = options.num_threads;
        o.weight_format = options.weight_format;
        o.expert_parallel = options.expert_parallel;
        DSI_ASSIGN_OR_RETURN(std::unique_ptr<DeepseekV4Model> m,
                             DeepseekV4Model::load(std::move(source), o));
        return std::unique_ptr<CausalLm>(std::move(m));
    }
    DeepseekModel::Options o;
    o.num_threads = options.num_threads;
    o.weight_format = options.weight_format;
    o.reference_kernels = options.reference_kernels;
    o.kv_dtype = options.kv_dtype;
    o.expert_parallel = options.expert_parallel;
    DSI_ASSIGN_OR_RETURN(std::unique_ptr<DeepseekModel> m,
                         DeepseekModel::load(std::move(source), o));
    return std::unique_ptr<CausalLm>(std::move(m));
}

}  // namespace dsi
