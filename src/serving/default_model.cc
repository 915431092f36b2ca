#include "serving/default_model.h"

#include <filesystem>

#include "base/logging.h"
#include "model/checkpoint_writer.h"
#include "model/synthetic.h"
#include "modelpack/modelpack.h"

namespace dsi::serving {

Result<std::string> ensure_default_model(Env* env, const std::string& cache_dir,
                                         const std::string& tokenizer_dir,
                                         const std::string& pack_path) {
    if (!pack_path.empty() && env->file_exists(pack_path)) {
        return ensure_expanded_pack(env, pack_path, tokenizer_dir, cache_dir);
    }
    const std::string dir = cache_dir + "/models/tiny";
    if (env->file_exists(dir + "/config.json")) {
        return dir;
    }
    DSI_LOG(kInfo) << "creating the default model in " << dir;
    DSI_ASSIGN_OR_RETURN(ModelConfig config, synthetic_preset("tiny"));
    Result<TokenizerFiles> tok = read_tokenizer_files(env, tokenizer_dir);
    if (!tok.is_ok()) {
        return tok.status().with_context("tokenizer files for the default model");
    }
    const std::string tmp = dir + ".tmp" + std::to_string(env->random_seed() % 1000000);
    DSI_RETURN_IF_ERROR(env->create_dirs(tmp));
    DSI_RETURN_IF_ERROR(write_hf_checkpoint(env, config, 1, *tok, tmp));
    std::error_code ec;
    std::filesystem::rename(tmp, dir, ec);
    if (ec && !env->file_exists(dir + "/config.json")) {
        const std::string why = ec.message();
        std::filesystem::remove_all(tmp, ec);
        return internal_error("rename " + tmp + " -> " + dir + ": " + why);
    }
    if (ec) {
        std::filesystem::remove_all(tmp, ec);  // another process won the race
    }
    return dir;
}

}  // namespace dsi::serving
