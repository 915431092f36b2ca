// libFuzzer entry for GgufFile::parse_bytes: any input must give a Status or a file
// whose every tensor view lies inside the input (ASan checks each byte read), and
// whose typed getters answer every key without crashing.
#include <cstddef>
#include <cstdint>
#include <span>

#include "base/check.h"
#include "model/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto file = dsi::GgufFile::parse_bytes(std::span<const uint8_t>(data, size));
    if (!file.is_ok()) {
        DSI_CHECK(!file.status().message().empty());
        return 0;
    }
    uint64_t sum = 0;
    for (const dsi::GgufTensorInfo& t : file->tensors()) {
        dsi::TensorView v = file->view(t);
        DSI_CHECK(file->find_tensor(t.name) == &t);
        DSI_CHECK(static_cast<uint64_t>(v.data.size()) == t.nbytes);
        DSI_CHECK(t.offset % file->alignment() == 0);
        for (uint8_t b : v.data) sum += b;
    }
    for (const auto& [key, value] : file->kvs()) {
        sum += file->get_u32(key).is_ok() + file->get_i64(key).is_ok() +
               file->get_f32(key).is_ok() + file->get_bool(key).is_ok() +
               file->get_string(key).is_ok() + file->get_string_array(key).is_ok() +
               file->get_f32_array(key).is_ok() + file->get_i32_array(key).is_ok();
    }
    return sum == 1 ? 0 : 0;  // keep the reads
}
