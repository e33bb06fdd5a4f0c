// CUDA kernels of the KV-cache ops. One launch per op for the whole batch (key
// and value together); each thread moves one vector of 16 bytes when every
// base pointer, stride and the row size (D * element size) are 16-byte aligned,
// else the widest of 8 / 4 / 2 / 1 bytes that is. No host sync: an invalid row
// or slot is skipped and reported through the optional sticky flag tensors
// (see the schemas in csrc/ops.cpp).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "../kv_args.h"

namespace specdec {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride beyond this

int64_t num_blocks_for(int64_t total) {
  return std::max<int64_t>(1, std::min<int64_t>((total + kThreads - 1) / kThreads, kMaxBlocks));
}

// Widest power of two <= 16 dividing every value (addresses and byte strides).
int vector_bytes(std::initializer_list<int64_t> values) {
  uint64_t acc = 16;
  for (int64_t v : values) acc |= static_cast<uint64_t>(v);
  return static_cast<int>(acc & (~acc + 1));
}

template <typename Fn>
void with_vector_type(int bytes, Fn&& fn) {
  switch (bytes) {
    case 16: fn(uint4{}); break;
    case 8: fn(uint2{}); break;
    case 4: fn(uint32_t{}); break;
    case 2: fn(uint16_t{}); break;
    default: fn(uint8_t{}); break;
  }
}

__device__ __forceinline__ int64_t grid_start() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_step() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// ---- kv_append_ --------------------------------------------------------------
// Flat index i = (((kv * B + b) * H + h) * S + s) * nvec + v (consecutive threads
// copy consecutive vectors of one row). Threads i < B also flag overflowing rows.
template <typename V>
__global__ void kv_append_kernel(const KVAppendParams P, int64_t nvec, int64_t total) {
  for (int64_t i = grid_start(); i < total; i += grid_step()) {
    if (P.overflow != nullptr && i < P.B && !kv_append_fits(P.lengths.get(i), P.S, P.max_len)) {
      P.overflow[i * P.overflow_stride] = true;
    }
    if (i >= 2 * P.B * P.H * P.S * nvec) continue;
    const int64_t v = i % nvec;
    int64_t r = i / nvec;
    const int64_t s = r % P.S;
    r /= P.S;
    const int64_t h = r % P.H;
    r /= P.H;
    const int64_t b = r % P.B;
    const int kv = static_cast<int>(r / P.B);
    const int64_t n = P.lengths.get(b);
    if (!kv_append_fits(n, P.S, P.max_len)) continue;
    const char* src = (kv ? P.src[1] : P.src[0]) + b * P.src_stride[kv][0] + h * P.src_stride[kv][1] +
                      s * P.src_stride[kv][2];
    char* dst = (kv ? P.cache[1] : P.cache[0]) + b * P.cache_stride[kv][0] + h * P.cache_stride[kv][1] +
                (n + s) * P.cache_stride[kv][2];
    reinterpret_cast<V*>(dst)[v] = reinterpret_cast<const V*>(src)[v];
  }
}

void kv_append_cuda(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& new_k,
                    const at::Tensor& new_v, const at::Tensor& lengths,
                    const std::optional<at::Tensor>& overflow) {
  kv::KVAppendLaunch L = kv::prepare_kv_append(key_cache, value_cache, new_k, new_v, lengths, overflow);
  const KVAppendParams& P = L.p;
  if (P.B == 0) return;
  const int vb = vector_bytes({reinterpret_cast<int64_t>(P.cache[0]), reinterpret_cast<int64_t>(P.cache[1]),
                               reinterpret_cast<int64_t>(P.src[0]), reinterpret_cast<int64_t>(P.src[1]),
                               P.cache_stride[0][0], P.cache_stride[0][1], P.cache_stride[0][2],
                               P.cache_stride[1][0], P.cache_stride[1][1], P.cache_stride[1][2],
                               P.src_stride[0][0], P.src_stride[0][1], P.src_stride[0][2],
                               P.src_stride[1][0], P.src_stride[1][1], P.src_stride[1][2], P.row_bytes});
  const int64_t nvec = P.row_bytes / vb;
  const int64_t total = std::max<int64_t>(2 * P.B * P.H * P.S * nvec, P.overflow ? P.B : 0);
  if (total == 0) return;
  c10::cuda::CUDAGuard guard(key_cache.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  with_vector_type(vb, [&](auto tag) {
    using V = decltype(tag);
    kv_append_kernel<V><<<num_blocks_for(total), kThreads, 0, stream>>>(P, nvec, total);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// ---- kv_rollback_ ------------------------------------------------------------
__global__ void kv_rollback_kernel(const KVRollbackParams P) {
  for (int64_t b = grid_start(); b < P.B; b += grid_step()) {
    const int64_t out = kv_rollback_length(P.lengths.get(b), P.num_appended, P.num_kept.get(b));
    if (out < 0) {
      if (P.invalid != nullptr) P.invalid[b * P.invalid_stride] = true;
    } else {
      P.lengths.set(b, out);
    }
  }
}

void kv_rollback_cuda(at::Tensor& lengths, int64_t num_appended, const at::Tensor& num_kept,
                      const std::optional<at::Tensor>& invalid) {
  KVRollbackParams P = kv::prepare_kv_rollback(lengths, num_appended, num_kept, invalid);
  if (P.B == 0) return;
  c10::cuda::CUDAGuard guard(lengths.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  kv_rollback_kernel<<<num_blocks_for(P.B), kThreads, 0, stream>>>(P);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// ---- paged_kv_append_ ----------------------------------------------------------
// Flat index i = ((kv * T + t) * H + h) * nvec + v. Threads i < T flag invalid slots.
template <typename V>
__global__ void paged_append_kernel(const PagedAppendParams P, int64_t nvec, int64_t total) {
  const int64_t num_slots = P.num_blocks * P.block_size;
  for (int64_t i = grid_start(); i < total; i += grid_step()) {
    if (P.invalid != nullptr && i < P.T && classify_slot(P.slots.get(i), num_slots) == SlotKind::kInvalid) {
      *P.invalid = true;
    }
    if (i >= 2 * P.T * P.H * nvec) continue;
    const int64_t v = i % nvec;
    int64_t r = i / nvec;
    const int64_t h = r % P.H;
    r /= P.H;
    const int64_t t = r % P.T;
    const int kv = static_cast<int>(r / P.T);
    const int64_t slot = P.slots.get(t);
    if (classify_slot(slot, num_slots) != SlotKind::kWrite) continue;
    const int64_t blk = slot / P.block_size, off = slot % P.block_size;
    const char* src = (kv ? P.src[1] : P.src[0]) + t * P.src_stride[kv][0] + h * P.src_stride[kv][1];
    char* dst = (kv ? P.cache[1] : P.cache[0]) + blk * P.cache_stride[kv][0] + off * P.cache_stride[kv][1] +
                h * P.cache_stride[kv][2];
    reinterpret_cast<V*>(dst)[v] = reinterpret_cast<const V*>(src)[v];
  }
}

void paged_kv_append_cuda(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& new_k,
                          const at::Tensor& new_v, const at::Tensor& slot_mapping,
                          const std::optional<at::Tensor>& invalid) {
  kv::PagedAppendLaunch L = kv::prepare_paged_append(key_cache, value_cache, new_k, new_v, slot_mapping, invalid);
  const PagedAppendParams& P = L.p;
  if (P.T == 0) return;
  const int vb = vector_bytes({reinterpret_cast<int64_t>(P.cache[0]), reinterpret_cast<int64_t>(P.cache[1]),
                               reinterpret_cast<int64_t>(P.src[0]), reinterpret_cast<int64_t>(P.src[1]),
                               P.cache_stride[0][0], P.cache_stride[0][1], P.cache_stride[0][2],
                               P.cache_stride[1][0], P.cache_stride[1][1], P.cache_stride[1][2],
                               P.src_stride[0][0], P.src_stride[0][1], P.src_stride[1][0], P.src_stride[1][1],
                               P.row_bytes});
  const int64_t nvec = P.row_bytes / vb;
  const int64_t total = std::max<int64_t>(2 * P.T * P.H * nvec, P.invalid ? P.T : 0);
  if (total == 0) return;
  c10::cuda::CUDAGuard guard(key_cache.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  with_vector_type(vb, [&](auto tag) {
    using V = decltype(tag);
    paged_append_kernel<V><<<num_blocks_for(total), kThreads, 0, stream>>>(P, nvec, total);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// ---- paged_kv_gather / paged_kv_gather_into_ ------------------------------------
// Flat index i = (kv * rows + r) * nvec + v with r = (b * H + h) * max_len + p.
template <typename V>
__global__ void paged_gather_kernel(const PagedGatherParams P, int64_t nvec, int64_t total) {
  const int64_t rows = P.B * P.H * P.max_len;
  for (int64_t i = grid_start(); i < total; i += grid_step()) {
    const int64_t v = i % nvec;
    const int64_t q = i / nvec;
    const int64_t r = q % rows;
    const int kv = static_cast<int>(q / rows);
    const int64_t p = r % P.max_len;
    const int64_t h = (r / P.max_len) % P.H;
    const int64_t b = r / (P.max_len * P.H);
    const int64_t blk = p < P.clamped_length(b) ? P.block_of(b, p) : -1;
    V* dst = reinterpret_cast<V*>(P.out_row(kv, b, h, p)) + v;
    if (blk < 0) {
      *dst = V{};
    } else {
      const char* src = (kv ? P.cache[1] : P.cache[0]) + blk * P.cache_stride[kv][0] +
                        (p % P.block_size) * P.cache_stride[kv][1] + h * P.cache_stride[kv][2];
      *dst = reinterpret_cast<const V*>(src)[v];
    }
  }
}

void launch_gather(const PagedGatherParams& P) {
  if (P.B * P.H * P.max_len == 0 || P.row_bytes == 0) return;
  const int vb = vector_bytes({reinterpret_cast<int64_t>(P.cache[0]), reinterpret_cast<int64_t>(P.cache[1]),
                               reinterpret_cast<int64_t>(P.out[0]), reinterpret_cast<int64_t>(P.out[1]),
                               P.cache_stride[0][0], P.cache_stride[0][1], P.cache_stride[0][2],
                               P.cache_stride[1][0], P.cache_stride[1][1], P.cache_stride[1][2],
                               P.out_stride[0][0], P.out_stride[0][1], P.out_stride[0][2],
                               P.out_stride[1][0], P.out_stride[1][1], P.out_stride[1][2], P.row_bytes});
  const int64_t nvec = P.row_bytes / vb;
  const int64_t total = 2 * P.B * P.H * P.max_len * nvec;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  with_vector_type(vb, [&](auto tag) {
    using V = decltype(tag);
    paged_gather_kernel<V><<<num_blocks_for(total), kThreads, 0, stream>>>(P, nvec, total);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

std::tuple<at::Tensor, at::Tensor> paged_kv_gather_cuda(const at::Tensor& key_cache, const at::Tensor& value_cache,
                                                        const at::Tensor& block_tables, const at::Tensor& lengths,
                                                        int64_t max_len) {
  PagedGatherParams P = kv::prepare_paged_gather(key_cache, value_cache, block_tables, lengths, max_len);
  c10::cuda::CUDAGuard guard(key_cache.device());
  const int64_t D = key_cache.size(3);
  at::Tensor keys = at::empty({P.B, P.H, max_len, D}, key_cache.options());
  at::Tensor values = at::empty({P.B, P.H, max_len, D}, value_cache.options());
  kv::set_gather_outputs(P, key_cache, keys, values);
  launch_gather(P);
  return {keys, values};
}

void paged_kv_gather_into_cuda(const at::Tensor& key_cache, const at::Tensor& value_cache,
                               const at::Tensor& block_tables, const at::Tensor& lengths, at::Tensor& keys_out,
                               at::Tensor& values_out) {
  TORCH_CHECK(keys_out.dim() == 4, "keys_out must be [B, H, max_len, D], got shape ", keys_out.sizes());
  PagedGatherParams P = kv::prepare_paged_gather(key_cache, value_cache, block_tables, lengths, keys_out.size(2));
  kv::set_gather_outputs(P, key_cache, keys_out, values_out);
  c10::cuda::CUDAGuard guard(key_cache.device());
  launch_gather(P);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("kv_append_", &kv_append_cuda);
  m.impl("kv_rollback_", &kv_rollback_cuda);
  m.impl("paged_kv_append_", &paged_kv_append_cuda);
  m.impl("paged_kv_gather", &paged_kv_gather_cuda);
  m.impl("paged_kv_gather_into_", &paged_kv_gather_into_cuda);
}

}  // namespace specdec
