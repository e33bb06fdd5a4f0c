// The CUDA backend of the launch layer (launch.h): builds the void** argument
// array of cudaLaunchKernel / cudaLaunchCooperativeKernel. Torch-free; errors are
// std::runtime_error naming the CUDA error.
#pragma once
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "launch_plan.h"

namespace specdec::cuda {

inline void check_cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();  // a non-sticky error must not stay pending for torch's next launch check
  throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

namespace detail {
// The kernel's parameters, converted from the call's arguments, and the array of
// their addresses that the runtime copies from.
template <typename... KArgs>
struct KernelArgs {
  std::tuple<std::decay_t<KArgs>...> values;
  void* ptrs[sizeof...(KArgs) + 1] = {};
  // brace-initialised: a narrowing conversion (int64_t to int, double to float) does not compile
  template <typename... Args>
  explicit KernelArgs(Args&&... args) : values{std::decay_t<KArgs>{std::forward<Args>(args)}...} {
    std::apply([this](auto&... v) {
      int i = 0;
      ((ptrs[i++] = const_cast<void*>(static_cast<const void*>(&v))), ...);
    }, values);
  }
};
}  // namespace detail

template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(KArgs) == sizeof...(Args), "launch: wrong number of kernel arguments");
  detail::KernelArgs<KArgs...> a(std::forward<Args>(args)...);
  check_cuda(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, a.ptrs, 0, stream),
             "kernel launch");
}

template <typename... KArgs, typename... Args>
CoopLaunch launch_cooperative(void (*kernel)(KArgs...), dim3 grid, dim3 block, cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(KArgs) == sizeof...(Args), "launch_cooperative: wrong number of kernel arguments");
  detail::KernelArgs<KArgs...> a(std::forward<Args>(args)...);
  const cudaError_t err =
      cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), grid, block, a.ptrs, 0, stream);
  if (err == cudaErrorCooperativeLaunchTooLarge || err == cudaErrorNotSupported) {
    (void)cudaGetLastError();  // refused before anything ran: clear it
    return CoopLaunch::kRefused;
  }
  check_cuda(err, "cooperative kernel launch");
  return CoopLaunch::kLaunched;
}

// Per kernel, block size and device; queried once (no sync involved).
inline DeviceInfo device_info(const void* kernel, int threads, int device) {
  static std::map<std::tuple<const void*, int, int>, DeviceInfo> cache;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(kernel, threads, device);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  DeviceInfo d;
  int coop = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&d.blocks_per_sm, kernel, threads, 0), "occupancy query");
  check_cuda(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device), "device query");
  check_cuda(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device), "device query");
  d.cooperative = coop != 0;
  return cache[key] = d;
}

inline bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace specdec::cuda
