// The two Registry backends behind open_registry (registry.h). Private to membership/.
#pragma once

#include <memory>
#include <string>

#include "membership/registry.h"
#include "net/http_client.h"

namespace dsi::membership::internal {

// `prefix` ends with '/'.
std::unique_ptr<Registry> make_etcd_registry(net::HttpTarget target, std::string prefix,
                                             const RegistryOptions& options);
std::unique_ptr<Registry> make_file_registry(std::string path, const RegistryOptions& options,
                                             Env* env);

}  // namespace dsi::membership::internal
