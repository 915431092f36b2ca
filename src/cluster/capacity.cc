#include "cluster/capacity.h"

#include <cmath>

namespace dsi::cluster {

Status CapacitySettings::validate() const {
    if (swa_stored_layers < 0 || swa_tokens < 0 || swa_bytes_per_token < 0) {
        return invalid_argument("capacity: SWA sizes must be >= 0");
    }
    if (!(logical_bytes_per_device > 0) || ec_data < 1 || ec_parity < 0 ||
        disks_per_server < 1 || !(disk_bytes > 0)) {
        return invalid_argument("capacity: store sizes must be > 0");
    }
    return Status::ok();
}

int64_t swa_state_bytes_per_sequence(const CapacitySettings& s) {
    return static_cast<int64_t>(s.swa_stored_layers) * s.swa_tokens * s.swa_bytes_per_token;
}

Result<StoreSizing> store_servers_for_devices(const CapacitySettings& s, int64_t num_devices) {
    DSI_RETURN_IF_ERROR(s.validate());
    if (num_devices < 0) {
        return invalid_argument("capacity: device count must be >= 0");
    }
    // S-KV-2: logical bytes x (10 + 2) / 10 over 20 x 30.73 TB per server.
    StoreSizing z;
    z.logical_bytes = static_cast<double>(num_devices) * s.logical_bytes_per_device;
    z.raw_bytes = z.logical_bytes * (s.ec_data + s.ec_parity) / s.ec_data;
    z.server_raw_bytes = s.disks_per_server * s.disk_bytes;
    z.servers = static_cast<int64_t>(std::ceil(z.raw_bytes / z.server_raw_bytes - 1e-9));
    return z;
}

Result<int64_t> devices_for_tokens_per_day(double tokens_per_day, double tokens_per_s_per_device) {
    if (!(tokens_per_s_per_device > 0) || !(tokens_per_day >= 0)) {
        return invalid_argument("capacity: need tokens/s/device > 0 and tokens/day >= 0");
    }
    return static_cast<int64_t>(std::ceil(tokens_per_day / (tokens_per_s_per_device * 86400.0)));
}

Result<double> tokens_per_day_for_devices(int64_t num_devices, double tokens_per_s_per_device) {
    if (!(tokens_per_s_per_device > 0) || num_devices < 0) {
        return invalid_argument("capacity: need tokens/s/device > 0 and devices >= 0");
    }
    return static_cast<double>(num_devices) * tokens_per_s_per_device * 86400.0;
}

}  // namespace dsi::cluster
