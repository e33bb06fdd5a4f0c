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

// Reducers shared by the kernels (block_reduce / warp_reduce operands).
struct OrFlag {
  int v;
  __device__ __forceinline__ OrFlag shfl(int k) const { return OrFlag{shfl_xor(v, k)}; }
};
struct OrMerge {
  __device__ OrFlag operator()(const OrFlag& a, const OrFlag& b) const { return OrFlag{a.v | b.v}; }
};
struct SumF {
  float v;
  __device__ __forceinline__ SumF shfl(int k) const { return SumF{shfl_xor(v, k)}; }
};
struct SumMerge {
  __device__ SumF operator()(const SumF& a, const SumF& b) const { return SumF{a.v + b.v}; }
};
struct SumI64 {
  int64_t v;
  __device__ __forceinline__ SumI64 shfl(int k) const { return SumI64{shfl_xor(v, k)}; }
};
struct SumI64Merge {
  __device__ SumI64 operator()(const SumI64& a, const SumI64& b) const { return SumI64{a.v + b.v}; }
};
struct MaxArg {  // max of the raw logits with its first index
  float m;
  int64_t arg;
  __device__ __forceinline__ MaxArg shfl(int k) const { return MaxArg{shfl_xor(m, k), shfl_xor(arg, k)}; }
};
struct MaxArgMerge {
  __device__ MaxArg operator()(const MaxArg& a, const MaxArg& b) const {
    return (b.m > a.m || (b.m == a.m && b.arg < a.arg)) ? b : a;
  }
};

}  // namespace specdec::cuda
