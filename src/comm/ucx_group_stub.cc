// Built instead of ucx_group.cc when CMake does not find libucx-dev.
#include "comm/ucx_group.h"

namespace dsi::comm {

bool ucx_available() { return false; }

Result<std::unique_ptr<MoeCommunicator>> create_ucx_communicator(const UcxGroupOptions&) {
    return unimplemented("ucx group: this build has no UCX (install libucx-dev and reconfigure)");
}

}  // namespace dsi::comm
