// The SIMT backend of the launch layer (csrc/cuda/launch.h): a launch runs the kernel
// in the emulator (simt.h) before it returns; the emulated device is described by
// simt::config_from_env() (SPECDEC_SIMT_SMS, _BLOCKS_PER_SM, _COOPERATIVE); a capture
// is emulated by SPECDEC_SIMT_CAPTURING=1 (only the launch-path choice sees it).
#pragma once
#include <cstdlib>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../cuda/launch_plan.h"
#include "simt.h"

namespace specdec::cuda {

template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, cudaStream_t, Args&&... args) {
  static_assert(sizeof...(KArgs) == sizeof...(Args), "launch: wrong number of kernel arguments");
  const std::tuple<std::decay_t<KArgs>...> values{std::decay_t<KArgs>{std::forward<Args>(args)}...};
  ++simt::launch_counts().ordinary;
  simt::run_grid(grid, block, false, simt::config_from_env(), [&] { std::apply(kernel, values); });
}

template <typename... KArgs, typename... Args>
CoopLaunch launch_cooperative(void (*kernel)(KArgs...), dim3 grid, dim3 block, cudaStream_t, Args&&... args) {
  static_assert(sizeof...(KArgs) == sizeof...(Args), "launch_cooperative: wrong number of kernel arguments");
  const simt::Config cfg = simt::config_from_env();
  // what cudaLaunchCooperativeKernel refuses: no support, or more blocks than can be resident
  if (!cfg.cooperative || cfg.refuse_cooperative ||
      static_cast<int64_t>(grid.x) > static_cast<int64_t>(cfg.sms) * cfg.blocks_per_sm) {
    ++simt::launch_counts().refused;
    return CoopLaunch::kRefused;
  }
  const std::tuple<std::decay_t<KArgs>...> values{std::decay_t<KArgs>{std::forward<Args>(args)}...};
  ++simt::launch_counts().cooperative;
  simt::run_grid(grid, block, true, cfg, [&] { std::apply(kernel, values); });
  return CoopLaunch::kLaunched;
}

inline DeviceInfo device_info(const void*, int, int) {
  const simt::Config cfg = simt::config_from_env();
  return DeviceInfo{cfg.sms, cfg.blocks_per_sm, cfg.cooperative};
}

inline bool stream_is_capturing(cudaStream_t) { return simt::env_flag("SPECDEC_SIMT_CAPTURING", false); }

}  // namespace specdec::cuda
