// The launch sequences of the KV-cache ops, torch-free: plan (launch_plan.h:
// plan_copies), vector and index type, one launch through the launch layer. The
// CUDA launcher (kv_cache_cuda.cu) and the SIMT emulation run exactly this code.
#pragma once
#include <cstdint>

#include "kv_kernels.cuh"
#include "launch.h"

namespace specdec::cuda {

// OR of the addresses and byte strides of a (key, value) pair of tensors: a
// vector width must divide all of them.
template <typename Ptr, size_t N>
uint64_t pair_alignment(Ptr const (&ptr)[2], const int64_t (&stride)[2][N]) {
  uint64_t acc = 0;
  for (int i = 0; i < 2; ++i) {
    acc |= static_cast<uint64_t>(reinterpret_cast<uintptr_t>(ptr[i]));
    for (size_t d = 0; d < N; ++d) acc |= static_cast<uint64_t>(stride[i][d]);
  }
  return acc;
}

// Calls fn(V{}, I{}) with V the vector type of `bytes` and I the flat index type.
template <typename Fn>
void with_copy_types(const CopyPlan& p, Fn&& fn) {
  auto with_index = [&](auto vtag) {
    if (p.index32) fn(vtag, uint32_t{});
    else fn(vtag, int64_t{});
  };
  switch (p.vector_bytes) {
    case 16: with_index(uint4{}); break;
    case 8: with_index(uint2{}); break;
    case 4: with_index(uint32_t{}); break;
    case 2: with_index(uint16_t{}); break;
    default: with_index(uint8_t{}); break;
  }
}

// One launch of the append kernel kernel_of(V{}, I{}) (vector and index type from the
// plan) with P and the plan's (nvec, copies, total).
template <typename KernelOf, typename Params>
void launch_append(const CopyPlan& plan, cudaStream_t stream, KernelOf kernel_of, const Params& P) {
  if (plan.total == 0) return;
  with_copy_types(plan, [&](auto vtag, auto itag) {
    using I = decltype(itag);
    launch(kernel_of(vtag, itag), to_dim(plan.blocks), dim3(kKVThreads), stream, P, static_cast<I>(plan.nvec),
           static_cast<I>(plan.copies), static_cast<I>(plan.total));
  });
}

inline void launch_kv_append(const KVAppendParams& P, cudaStream_t stream) {
  launch_append(plan_copies(pair_alignment(P.cache, P.cache_stride) | pair_alignment(P.src, P.src_stride),
                            P.row_bytes, P.B * P.H * P.S, P.overflow ? P.B : 0),
                stream, [](auto v, auto i) { return kv_append_kernel<decltype(v), decltype(i)>; }, P);
}

inline void launch_kv_rollback(const KVRollbackParams& P, cudaStream_t stream) {
  if (P.B == 0) return;
  launch(kv_rollback_kernel, to_dim(kv_blocks_for(P.B)), dim3(kKVThreads), stream, P);
}

inline void launch_paged_append(const PagedAppendParams& P, cudaStream_t stream) {
  launch_append(plan_copies(pair_alignment(P.cache, P.cache_stride) | pair_alignment(P.src, P.src_stride),
                            P.row_bytes, P.T * P.H, P.invalid ? P.T : 0),
                stream, [](auto v, auto i) { return paged_append_kernel<decltype(v), decltype(i)>; }, P);
}

// kv_compact_ and paged_kv_compact_ (one kernel: KVCompactParams addresses both caches as blocks).
inline void launch_kv_compact(const KVCompactParams& P, cudaStream_t stream) {
  launch_append(plan_copies(pair_alignment(P.cache, P.cache_stride), P.row_bytes, P.B * P.H, P.invalid ? P.B : 0),
                stream, [](auto v, auto i) { return kv_compact_kernel<decltype(v), decltype(i)>; }, P);
}

inline void launch_paged_gather(const PagedGatherParams& P, cudaStream_t stream) {
  const CopyPlan plan = plan_copies(pair_alignment(P.cache, P.cache_stride) | pair_alignment(P.out, P.out_stride),
                                    P.row_bytes, P.B * P.H * P.max_len, 0);
  if (plan.total == 0) return;
  with_copy_types(plan, [&](auto vtag, auto itag) {
    using I = decltype(itag);
    launch(paged_gather_kernel<decltype(vtag), I>, to_dim(plan.blocks), dim3(kKVThreads), stream, P,
           static_cast<I>(plan.nvec), static_cast<I>(plan.total));
  });
}

}  // namespace specdec::cuda
