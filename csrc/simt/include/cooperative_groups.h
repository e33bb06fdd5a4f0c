// SIMT emulation build: the part of cooperative_groups the kernels use (grid.sync()).
#pragma once
#include "../simt.h"

namespace cooperative_groups {
struct grid_group {
  void sync(const char* file = __builtin_FILE(), int line = __builtin_LINE()) const { ::simt::grid_sync(file, line); }
};
inline grid_group this_grid() { return grid_group{}; }
}  // namespace cooperative_groups
