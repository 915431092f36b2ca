// serving/: data lookup, the model id rule and open_replica over small checkpoints
// written to temporary directories (the process-level checks are in tests/serving/).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "kvstore/block_store.h"
#include "model/checkpoint_writer.h"
#include "model/synthetic.h"
#include "serving/data_dir.h"
#include "serving/default_model.h"
#include "serving/model_id.h"
#include "serving/replica.h"

namespace dsi::serving {
namespace {

namespace fs = std::filesystem;

struct TempDir {
    fs::path path;
    TempDir() {
        std::string tmpl = (fs::temp_directory_path() / "dsi_serving_XXXXXX").string();
        path = ::mkdtemp(tmpl.data());
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    std::string str() const { return path.string(); }
};

// A 2-layer tiny-v3 checkpoint with a 512-token vocabulary (no tokenizer files that
// parse: the tests that load one ask for load_tokenizer = false).
void write_small_checkpoint(const std::string& dir, uint64_t seed) {
    ModelConfig c = synthetic_preset("tiny-v3").value();
    c.vocab_size = 512;
    c.num_hidden_layers = 2;
    TokenizerFiles tok{"{}", "{}"};
    Status s = write_hf_checkpoint(Env::default_env(), c, seed, tok, dir);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
}

ReplicaOptions small_options(const std::string& model) {
    ReplicaOptions o;
    o.model_path = model;
    o.load_tokenizer = false;
    o.num_threads = 1;
    o.engine.num_kv_blocks = 32;
    return o;
}

std::vector<int32_t> prompt_of(int n) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) {
        p.push_back(3 + (i * 37) % 500);
    }
    return p;
}

// Greedy tokens of one request run to the end on the replica's engine.
std::vector<int32_t> generate(Replica& r, const std::vector<int32_t>& prompt, int n) {
    engine::GenerateRequest req;
    req.prompt = prompt;
    req.sampling.max_tokens = n;
    req.sampling.ignore_eos = true;
    std::vector<int32_t> out;
    Result<engine::RequestId> id =
        r.engine()->add_request(std::move(req), [&](const engine::TokenEvent& ev) {
            if (ev.token >= 0) {
                out.push_back(ev.token);
            }
        });
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    Status s = r.engine()->run();
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return out;
}

TEST(DataDirTest, CandidatesAreBesideTheBinary) {
    EXPECT_EQ(data_dir_candidates("/opt/dsi/bin"),
              (std::vector<std::string>{"/opt/dsi/share/dsinfer", "/opt/share/dsinfer"}));
    EXPECT_EQ(data_dir_candidates("/w/build/apps/dsinfer"),
              (std::vector<std::string>{"/w/build/apps/share/dsinfer", "/w/build/share/dsinfer"}));
    EXPECT_TRUE(data_dir_candidates("").empty());
    EXPECT_FALSE(executable_dir().empty());
}

TEST(DataDirTest, ExplicitDirMustHoldTheTokenizer) {
    TempDir d;
    Env* env = Env::default_env();
    Result<std::string> r = find_data_dir(env, d.str());
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
    EXPECT_NE(r.status().message().find("tokenizer/deepseek_v3/tokenizer.json"), std::string::npos);
    ASSERT_TRUE(env->create_dirs(d.str() + "/" + kTokenizerSubdir).is_ok());
    ASSERT_TRUE(
        env->write_file(d.str() + "/" + kTokenizerSubdir + "/tokenizer.json", "{}").is_ok());
    EXPECT_EQ(find_data_dir(env, d.str()).value(), d.str());
    EXPECT_EQ(find_tokenizer_data_dir(env, d.str()).value(), d.str() + "/tokenizer/deepseek_v3");
}

TEST(ModelIdTest, ServedNameRule) {
    EXPECT_EQ(served_model_name("mine", "models/tiny", false), "mine");
    EXPECT_EQ(served_model_name("", "/x/models/tiny", false), "tiny");
    EXPECT_EQ(served_model_name("", "models/tiny/", false), "tiny");
    EXPECT_EQ(served_model_name("", "m/model-q8_0.gguf", false), "model-q8_0.gguf");
    EXPECT_EQ(served_model_name("", "/c/models/tiny", true), kDefaultModelName);
    EXPECT_EQ(served_model_name("x", "/c/models/tiny", true), "x");
}

TEST(ModelIdTest, FingerprintFollowsBytesNotPaths) {
    TempDir a, b, c;
    write_small_checkpoint(a.str() + "/m", 1);
    fs::copy(a.path / "m", b.path / "other-name");
    write_small_checkpoint(c.str() + "/m", 2);  // same shapes, other weights
    Env* env = Env::default_env();
    const std::string fa = checkpoint_fingerprint(env, a.str() + "/m").value();
    EXPECT_EQ(fa.size(), 32u);
    EXPECT_EQ(checkpoint_fingerprint(env, b.str() + "/other-name").value(), fa);
    EXPECT_EQ(checkpoint_fingerprint(env, a.str() + "/m/").value(), fa);
    EXPECT_NE(checkpoint_fingerprint(env, c.str() + "/m").value(), fa);
    // A file that is not part of the checkpoint does not change it; config.json does.
    ASSERT_TRUE(env->write_file(a.str() + "/m/notes.txt", "x").is_ok());
    EXPECT_EQ(checkpoint_fingerprint(env, a.str() + "/m").value(), fa);
    std::ofstream(a.str() + "/m/config.json", std::ios::app) << " ";
    EXPECT_NE(checkpoint_fingerprint(env, a.str() + "/m").value(), fa);

    Result<std::string> none = checkpoint_fingerprint(env, a.str() + "/nothing");
    EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
    EXPECT_EQ(cache_identity(fa, "auto"), "ckpt-" + fa + "/auto");
}

TEST(ReplicaTest, OpensAndGenerates) {
    TempDir d;
    write_small_checkpoint(d.str() + "/m", 1);
    Result<std::unique_ptr<Replica>> r =
        open_replica(small_options(d.str() + "/m"), Env::default_env());
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    Replica& rep = **r;
    EXPECT_EQ(rep.served_model_name(), "m");
    EXPECT_FALSE(rep.is_default_model());
    EXPECT_TRUE(rep.cache_identity().starts_with("ckpt-"));
    EXPECT_EQ(rep.engine_options().model_id, rep.cache_identity());
    EXPECT_EQ(rep.engine_options().cost_model_path, d.str() + "/m/dsinfer_prefill_cost.json");
    EXPECT_EQ(rep.tokenizer(), nullptr);
    EXPECT_EQ(rep.kv_store(), nullptr);
    const std::vector<int32_t> a = generate(rep, prompt_of(20), 4);
    EXPECT_EQ(a.size(), 4u);
    // A fresh engine over the same model (async off) gives the same tokens.
    engine::EngineOptions eo = rep.engine_options();
    eo.async = false;
    ASSERT_TRUE(rep.reset_engine(eo).is_ok());
    EXPECT_FALSE(rep.engine_options().async);
    EXPECT_EQ(generate(rep, prompt_of(20), 4), a);
}

TEST(ReplicaTest, StoreBlocksHitAcrossCopiesOfTheCheckpoint) {
    TempDir d, store;
    write_small_checkpoint(d.str() + "/m", 1);
    fs::copy(d.path / "m", d.path / "copy");
    const std::string uri = "file://" + store.str() + "?fsync=0";
    const std::vector<int32_t> prompt = prompt_of(3 * 128 + 10);
    std::vector<int32_t> cold;
    {
        ReplicaOptions o = small_options(d.str() + "/m");
        o.kv_store_uri = uri;
        auto r = open_replica(o, Env::default_env());
        ASSERT_TRUE(r.is_ok()) << r.status().to_string();
        ASSERT_NE((*r)->kv_store(), nullptr);
        cold = generate(**r, prompt, 3);
        EXPECT_EQ((*r)->engine()->stats().store_blocks_offered, 3);
    }  // the engine drains its write-behind queue before the store closes
    ReplicaOptions o = small_options(d.str() + "/copy");
    o.model_id = "served-elsewhere";  // the served name does not key the cache
    o.kv_store_uri = uri;
    auto r = open_replica(o, Env::default_env());
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(generate(**r, prompt, 3), cold);
    const engine::EngineStats st = (*r)->engine()->stats();
    EXPECT_EQ(st.store_hit_blocks, 3);
    EXPECT_EQ(st.cached_prompt_tokens, 3 * 128);

    // Another weight format is another identity: no hit.
    ReplicaOptions q = small_options(d.str() + "/copy");
    q.kv_store_uri = uri;
    q.weight_format = "f32";
    auto rq = open_replica(q, Env::default_env());
    ASSERT_TRUE(rq.is_ok()) << rq.status().to_string();
    EXPECT_NE((*rq)->cache_identity(), (*r)->cache_identity());
    (void)generate(**rq, prompt, 1);
    EXPECT_EQ((*rq)->engine()->stats().store_hit_blocks, 0);
}

// Issue 18, a V4 decode engine: with an inbox the replica owns the SWA pool, hands it to
// the engine (also after reset_engine) for the inbox to put states where the engine's
// hit rule looks; the block shape lists every cache group's layers and the state's size.
// A V3 replica's inbox has no state and no pool.
TEST(ReplicaTest, AV4InboxSharesTheReplicasSwaPoolWithTheEngine) {
    TempDir d;
    ModelConfig c = synthetic_preset("tiny-v4").value();
    c.vocab_size = 512;
    ASSERT_TRUE(
        write_hf_checkpoint(Env::default_env(), c, 3, TokenizerFiles{"{}", "{}"}, d.str() + "/v4")
            .is_ok());
    ReplicaOptions o = small_options(d.str() + "/v4");
    o.engine.swa_pool_bytes = int64_t{16} << 20;
    o.kv_inbox_bytes = int64_t{8} << 20;
    auto r = open_replica(o, Env::default_env());
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    Replica& rep = **r;
    ASSERT_NE(rep.kv_inbox(), nullptr);
    ASSERT_TRUE(rep.kv_block_shape().has_value());
    int64_t store_layers = 0;
    for (const KvGroupLayout& g : rep.model()->kv_layout().groups) store_layers += g.num_layers;
    EXPECT_EQ(rep.kv_block_shape()->num_layers(), static_cast<uint32_t>(store_layers));
    EXPECT_EQ(rep.kv_block_shape()->swa_state_bytes,
              static_cast<uint64_t>(rep.model()->kv_layout().state_floats) * 4 + 8);
    ASSERT_NE(rep.swa_pool(), nullptr);
    EXPECT_EQ(rep.swa_pool()->stats().capacity_bytes, int64_t{16} << 20);
    EXPECT_EQ(rep.engine_options().swa_pool, rep.swa_pool());
    engine::EngineOptions eo = rep.engine_options();
    eo.swa_pool = nullptr;
    ASSERT_TRUE(rep.reset_engine(eo).is_ok());
    EXPECT_EQ(rep.engine_options().swa_pool, rep.swa_pool());
    (void)generate(rep, prompt_of(300), 1);  // the prefill's state at 256 lands there
    EXPECT_EQ(rep.swa_pool()->stats().num_entries, 1);

    write_small_checkpoint(d.str() + "/v3", 1);
    ReplicaOptions o3 = small_options(d.str() + "/v3");
    o3.kv_inbox_bytes = int64_t{8} << 20;
    auto r3 = open_replica(o3, Env::default_env());
    ASSERT_TRUE(r3.is_ok()) << r3.status().to_string();
    ASSERT_NE((*r3)->kv_inbox(), nullptr);
    EXPECT_EQ((*r3)->kv_block_shape()->swa_state_bytes, 0u);
    EXPECT_EQ((*r3)->swa_pool(), nullptr);
}

TEST(ReplicaTest, BadOptionsAreClearErrors) {
    TempDir d;
    write_small_checkpoint(d.str() + "/m", 1);
    Env* env = Env::default_env();

    ReplicaOptions bad_uri = small_options(d.str() + "/m");
    bad_uri.kv_store_uri = "ftp://nowhere";
    Result<std::unique_ptr<Replica>> r = open_replica(bad_uri, env);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("--kv-store"), std::string::npos) << r.status().message();

    r = open_replica(small_options(d.str() + "/missing"), env);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
    EXPECT_NE(r.status().message().find("--model"), std::string::npos);

    ReplicaOptions bad_dtype = small_options(d.str() + "/m");
    bad_dtype.kv_dtype = "f7";
    EXPECT_FALSE(open_replica(bad_dtype, env).is_ok());

    // The checkpoint has no tokenizer that loads.
    ReplicaOptions tok = small_options(d.str() + "/m");
    tok.load_tokenizer = true;
    r = open_replica(tok, env);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("tokenizer"), std::string::npos);

    // No data for the default model.
    ReplicaOptions def;
    def.cache_dir = d.str() + "/cache";
    def.data_dir = d.str();
    r = open_replica(def, env);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
    EXPECT_NE(r.status().message().find("default model"), std::string::npos);
    EXPECT_FALSE(fs::exists(d.path / "cache" / "models" / "tiny"));
}

TEST(ReplicaTest, UnreachableStoreIsLeftOut) {
    TempDir d;
    write_small_checkpoint(d.str() + "/m", 1);
    ReplicaOptions o = small_options(d.str() + "/m");
    o.kv_store_uri = "redis://127.0.0.1:1";  // nothing listens on port 1
    Result<std::unique_ptr<Replica>> r = open_replica(o, Env::default_env());
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(generate(**r, prompt_of(10), 2).size(), 2u);
}

}  // namespace
}  // namespace dsi::serving
