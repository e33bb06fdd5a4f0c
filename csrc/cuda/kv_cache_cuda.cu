// CUDA launchers of the KV-cache ops: the torch side only (argument handling of
// kv_args.h, device guard, stream); the launches are kv_launch.cuh, which the SIMT
// emulation runs too. No host sync: an invalid row or slot is skipped and reported
// through the optional sticky flag tensors (see the schemas in csrc/ops.cpp).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../kv_args.h"
#include "kv_launch.cuh"

namespace specdec::cuda {
namespace {

cudaStream_t stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.get_device()).stream(); }

void kv_append_cuda(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& new_k,
                    const at::Tensor& new_v, const at::Tensor& lengths,
                    const std::optional<at::Tensor>& overflow) {
  kv::KVAppendLaunch L = kv::prepare_kv_append(key_cache, value_cache, new_k, new_v, lengths, overflow);
  const c10::cuda::CUDAGuard guard(key_cache.device());
  launch_kv_append(L.p, stream_of(key_cache));
}

void kv_rollback_cuda(at::Tensor& lengths, int64_t num_appended, const at::Tensor& num_kept,
                      const std::optional<at::Tensor>& invalid) {
  KVRollbackParams P = kv::prepare_kv_rollback(lengths, num_appended, num_kept, invalid);
  const c10::cuda::CUDAGuard guard(lengths.device());
  launch_kv_rollback(P, stream_of(lengths));
}

void paged_kv_append_cuda(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& new_k,
                          const at::Tensor& new_v, const at::Tensor& slot_mapping,
                          const std::optional<at::Tensor>& invalid) {
  kv::PagedAppendLaunch L = kv::prepare_paged_append(key_cache, value_cache, new_k, new_v, slot_mapping, invalid);
  const c10::cuda::CUDAGuard guard(key_cache.device());
  launch_paged_append(L.p, stream_of(key_cache));
}

void paged_kv_gather_into_cuda(const at::Tensor& key_cache, const at::Tensor& value_cache,
                               const at::Tensor& block_tables, const at::Tensor& lengths, at::Tensor& keys_out,
                               at::Tensor& values_out) {
  const PagedGatherParams P =
      kv::prepare_paged_gather_into(key_cache, value_cache, block_tables, lengths, keys_out, values_out);
  const c10::cuda::CUDAGuard guard(key_cache.device());
  launch_paged_gather(P, stream_of(key_cache));
}

std::tuple<at::Tensor, at::Tensor> paged_kv_gather_cuda(const at::Tensor& key_cache, const at::Tensor& value_cache,
                                                        const at::Tensor& block_tables, const at::Tensor& lengths,
                                                        int64_t max_len) {
  return kv::gather_by_allocating(key_cache, value_cache, block_tables, lengths, max_len,
                                  &paged_kv_gather_into_cuda);
}

void kv_compact_cuda(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& lengths,
                     const at::Tensor& src_index, const at::Tensor& count, const std::optional<at::Tensor>& invalid) {
  const KVCompactParams P = kv::prepare_kv_compact(key_cache, value_cache, lengths, src_index, count, invalid);
  const c10::cuda::CUDAGuard guard(key_cache.device());
  launch_kv_compact(P, stream_of(key_cache));
}

void paged_kv_compact_cuda(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& block_tables,
                           const at::Tensor& lengths, const at::Tensor& src_index, const at::Tensor& count,
                           const std::optional<at::Tensor>& invalid) {
  const KVCompactParams P =
      kv::prepare_paged_compact(key_cache, value_cache, block_tables, lengths, src_index, count, invalid);
  const c10::cuda::CUDAGuard guard(key_cache.device());
  launch_kv_compact(P, stream_of(key_cache));
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("kv_append_", &kv_append_cuda);
  m.impl("kv_rollback_", &kv_rollback_cuda);
  m.impl("paged_kv_append_", &paged_kv_append_cuda);
  m.impl("paged_kv_gather", &paged_kv_gather_cuda);
  m.impl("paged_kv_gather_into_", &paged_kv_gather_into_cuda);
  m.impl("kv_compact_", &kv_compact_cuda);
  m.impl("paged_kv_compact_", &paged_kv_compact_cuda);
}

}  // namespace specdec::cuda
