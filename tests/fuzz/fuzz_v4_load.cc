// libFuzzer entry for the DeepSeek V4 loader (issue 15): any bytes, as a .gguf file,
// must give a Status naming the problem or a model that runs. A model that loads runs
// one prefill and one decode step (token ids taken from the input) and must answer
// ok; every tensor's presence, dtype and shape, the config fields read from the
// metadata and the hash-routing table are checked before anything is read (ASan and
// UBSan check each access). Seed: v4_fuzz_seed's micro V4 (every layer kind).
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/env.h"
#include "model/causal_lm.h"
#include "model/weights.h"

namespace {

// One scratch file per process, rewritten for each input, removed at exit.
const std::string& scratch_path() {
    static const std::string path = [] {
        std::atexit([] { ::unlink(("/tmp/fuzz_v4_load_" + std::to_string(::getpid()) + ".gguf").c_str()); });
        return "/tmp/fuzz_v4_load_" + std::to_string(::getpid()) + ".gguf";
    }();
    return path;
}

bool write_all(const uint8_t* data, size_t size) {
    const int fd = ::open(scratch_path().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return false;
    size_t done = 0;
    while (done < size) {
        const ssize_t n = ::write(fd, data + done, size - done);
        if (n <= 0) break;
        done += static_cast<size_t>(n);
    }
    ::close(fd);
    return done == size;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    DSI_CHECK(write_all(data, size), "fuzz_v4_load: cannot write ", scratch_path());
    auto src = dsi::open_checkpoint(dsi::Env::default_env(), scratch_path());
    if (!src.is_ok()) {
        DSI_CHECK(!src.status().message().empty());
        return 0;
    }
    // Only V4 is this target's subject (the V2/V3 loader has its own tests); a model
    // too large for a fuzzing process is refused by size, not loaded.
    const dsi::ModelConfig& c = (*src)->config();
    if (!c.is_v4() || c.vocab_size > 4096 || c.hidden_size > 1024 || c.sliding_window > 4096) return 0;
    dsi::ModelOptions o;
    o.kv_dtype = size % 2 ? "e4m3" : "f32";
    auto lm = dsi::load_causal_lm(std::move(src).value(), o);
    if (!lm.is_ok()) {
        DSI_CHECK(!lm.status().message().empty());
        return 0;
    }
    dsi::CausalLm& m = **lm;
    std::vector<int32_t> ids;
    for (size_t i = 0; i < 5; ++i) {
        ids.push_back(static_cast<int32_t>(data[(i * 7919) % size] % m.config().vocab_size));
    }
    auto cache = m.new_kv_cache(8);
    dsi::BatchOutput out;
    const dsi::SequenceStep prefill{std::span(ids).first(4), 0, cache.get(), false};
    dsi::Status s = m.forward_batch(std::span(&prefill, 1), out);
    DSI_CHECK(s.is_ok(), "fuzz_v4_load: a loaded model's prefill failed: ", s.to_string());
    const dsi::SequenceStep decode{std::span(ids).subspan(4), 4, cache.get(), false};
    s = m.forward_batch(std::span(&decode, 1), out);
    DSI_CHECK(s.is_ok(), "fuzz_v4_load: a loaded model's decode failed: ", s.to_string());
    DSI_CHECK(static_cast<int64_t>(out.logits.size()) == m.config().vocab_size);
    return 0;
}
