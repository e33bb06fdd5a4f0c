// Grid-stride loops of the kernels (framework-free CUDA).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace specdec::cuda {

// Calls fn(b) for rows b = global warp index, + total warps, ... (one warp per row).
template <typename Fn>
__device__ __forceinline__ void for_each_row_per_warp(int64_t B, Fn&& fn) {
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); b < B;
       b += warps_total)
    fn(b);
}


}  // namespace specdec::cuda
