// Warp / block reductions over small structs (framework-free CUDA).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace specdec::cuda {

// Shuffle helpers for the struct fields we reduce.
__device__ __forceinline__ float shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
__device__ __forceinline__ int shfl_xor(int v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
__device__ __forceinline__ int64_t shfl_xor(int64_t v, int mask) {
  return static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(v), mask));
}

// Butterfly reduction: every lane ends with the warp's result. T provides
// `T shfl(int mask) const`; Merge is associative and commutative.
template <typename T, typename Merge>
__device__ __forceinline__ T warp_reduce(T v, Merge merge) {
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) v = merge(v, v.shfl(mask));
  return v;
}

// Block reduction; every thread gets the result. `scratch` holds >= 32 T.
// Contains __syncthreads: call from all threads of the block.
template <typename T, typename Merge>
__device__ __forceinline__ T block_reduce(T v, Merge merge, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = warp_reduce(v, merge);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T r = scratch[0];
  for (int w = 1; w < warps; ++w) r = merge(r, scratch[w]);
  return r;
}

}  // namespace specdec::cuda
