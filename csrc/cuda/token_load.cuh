// Loads of logits / probability rows as float (framework-free CUDA): the element
// conversions, the 4-token load of a lane (16-byte / 8-byte vectors or scalars) and the
// block-wide walks over a row position's tokens.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../core/prob_input.h"
#include "tile_stats.cuh"

namespace specdec::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(ProbAsLogit x) { return static_cast<float>(x); }  // log p


__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }


// Word w (0..3) of a 16-byte vector; w is a compile-time constant after unrolling.
__device__ __forceinline__ uint32_t u4_word(const uint4& u, int w) {
  return w == 0 ? u.x : w == 1 ? u.y : w == 2 ? u.z : u.w;
}

// Element k of a vector of T held in a uint4 (16 / sizeof(T) elements), as float.
template <typename T>
__device__ __forceinline__ float vec_elem(const uint4& u, int k);
template <>
__device__ __forceinline__ float vec_elem<float>(const uint4& u, int k) { return __uint_as_float(u4_word(u, k)); }
template <>
__device__ __forceinline__ float vec_elem<__half>(const uint4& u, int k) {
  const uint32_t w = u4_word(u, k >> 1);
  return __half2float(__ushort_as_half(static_cast<unsigned short>((k & 1) ? (w >> 16) : (w & 0xffffu))));
}
template <>
__device__ __forceinline__ float vec_elem<__nv_bfloat16>(const uint4& u, int k) {
  const uint32_t w = u4_word(u, k >> 1);
  return __uint_as_float((k & 1) ? (w & 0xffff0000u) : (w << 16));  // bf16 -> fp32 is exact
}
template <>
__device__ __forceinline__ float vec_elem<ProbAsLogit>(const uint4& u, int k) {
  return to_float(ProbAsLogit{__uint_as_float(u4_word(u, k))});
}

// 4 consecutive elements of T [v0, v0 + 4) as float, v0 a multiple of 4; `fill`
// for tokens >= V. vec: one 16-byte (fp32) or 8-byte (16-bit) load, which needs
// the row 16-byte aligned and V a multiple of the 16-byte vector width (the
// launcher checks); else scalar loads. No data-dependent branch around the loads.
template <typename T>
__device__ __forceinline__ void load4(const T* p, int64_t v0, int64_t V, bool vec, float fill, float out[4]) {
  if (vec) {
    uint4 u = make_uint4(0u, 0u, 0u, 0u);
    const bool in = v0 < V;  // V % 4 == 0 here: the 4 tokens are all in range or all out
    if constexpr (sizeof(T) == 4) {
      if (in) u = *reinterpret_cast<const uint4*>(p + v0);
    } else {
      if (in) {
        const uint2 h = *reinterpret_cast<const uint2*>(p + v0);
        u.x = h.x;
        u.y = h.y;
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = in ? vec_elem<T>(u, k) : fill;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = v0 + k < V ? to_float(p[v0 + k]) : fill;
  }
}


// fn(v, x) for every token v of a row position, x its logit as float (block-wide: thread
// t takes the groups of 4 tokens t, t + blockDim, ...; one 16-byte / 8-byte load each when
// vec; a thread sees its tokens in increasing order).
template <typename T, typename Fn>
__device__ __forceinline__ void for_each_token_at(const T* row, int64_t V, bool vec, Fn&& fn) {
  for (int64_t v0 = 4 * static_cast<int64_t>(threadIdx.x); v0 < V; v0 += 4 * static_cast<int64_t>(blockDim.x)) {
    float x[4];
    load4(row, v0, V, vec, -kInf, x);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (v0 + k < V) fn(v0 + k, x[k]);
  }
}

// fn(x) for every token of a row position (for_each_token_at without the index).
template <typename T, typename Fn>
__device__ __forceinline__ void for_each_token(const T* row, int64_t V, bool vec, Fn&& fn) {
  for_each_token_at(row, V, vec, [&](int64_t, float x) { fn(x); });
}


}  // namespace specdec::cuda
