// Capacity arithmetic of the deployment (SPEC S-KV-2, S-KV-8, S-SCALE): SWA state per
// sequence, storage servers for N devices, tokens/day <-> devices. Pure functions on a
// settings struct whose defaults are the documents' numbers. Thread model: none.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace dsi::cluster {

struct CapacitySettings {
    int swa_stored_layers = 20;           // S-KV-8: only the first 20 layers are stored
    int64_t swa_tokens = 134;             // window 128 + 6 extra positions
    int64_t swa_bytes_per_token = 528;    // MXFP8
    double logical_bytes_per_device = 14.4e12;  // S-KV-2: ~14.4 TB per online device
    int ec_data = 10;                     // 10 + 2 erasure coding
    int ec_parity = 2;
    int disks_per_server = 20;
    double disk_bytes = 30.73e12;
    Status validate() const;
};

// S-KV-8: layers x 134 x 528 B (1,415,040 B for 20 layers).
int64_t swa_state_bytes_per_sequence(const CapacitySettings& s);

struct StoreSizing {
    double logical_bytes = 0;
    double raw_bytes = 0;        // with erasure-coding overhead
    double server_raw_bytes = 0;
    int64_t servers = 0;         // rounded up
};
Result<StoreSizing> store_servers_for_devices(const CapacitySettings& s, int64_t num_devices);

// tokens/day = devices x tokens/s/device x 86,400.
Result<int64_t> devices_for_tokens_per_day(double tokens_per_day, double tokens_per_s_per_device);
Result<double> tokens_per_day_for_devices(int64_t num_devices, double tokens_per_s_per_device);

}  // namespace dsi::cluster
