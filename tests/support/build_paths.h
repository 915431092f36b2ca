// Where the source and build trees are, for the tests, benchmarks and fuzz targets that
// read vendored data (tests/data) or write artifacts into the build tree.
// The paths live only in build_paths.cc, which CMake generates into the build tree: no
// other object has them in its compile command, so the same source compiles to the same
// object in every checkout and ccache shares it across worktrees.
#pragma once

namespace dsi::build_paths {

const char* source_dir();  // the checkout's root (absolute)
const char* binary_dir();  // the build tree's root (absolute)

}  // namespace dsi::build_paths

#define DSINFER_SOURCE_DIR (::dsi::build_paths::source_dir())
#define DSINFER_BINARY_DIR (::dsi::build_paths::binary_dir())
