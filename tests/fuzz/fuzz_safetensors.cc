// libFuzzer entry for SafetensorsFile::parse_bytes: any input must give a Status or a
// file whose every tensor view lies inside the input (ASan checks each byte read).
#include <cstddef>
#include <cstdint>
#include <span>

#include "base/check.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto file = dsi::SafetensorsFile::parse_bytes(std::span<const uint8_t>(data, size));
    if (!file.is_ok()) {
        DSI_CHECK(!file.status().message().empty());
        return 0;
    }
    uint64_t sum = 0;
    for (const dsi::SafetensorsEntry& e : file->entries()) {
        dsi::TensorView v = file->view(e);
        DSI_CHECK(file->find(e.name) == &e);
        DSI_CHECK(static_cast<uint64_t>(v.data.size()) == e.end - e.begin);
        for (uint8_t b : v.data) sum += b;
    }
    for (const auto& [key, value] : file->metadata()) sum += key.size() + value.size();
    return sum == 1 ? 0 : 0;  // keep the reads
}
