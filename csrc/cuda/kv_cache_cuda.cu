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

#include "../kv_args.h"

namespace specdec {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride beyond this

int64_t num_blocks_for(int64_t total) {
  return std::max<int64_t>(1, std::min<int64_t>((total + kThreads - 1) / kThreads, kMaxBlocks));
}

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

// Flat-index arithmetic (a few div/mod per vector) in 32 bits when the index space
// allows it: 64-bit division costs several times more on the GPU. Byte offsets
// are always 64-bit.
template <typename Fn>
void with_index_type(int64_t total, Fn&& fn) {
  if (total < (int64_t{1} << 31)) fn(uint32_t{});
  else fn(int64_t{});
}

// One launch of a copy kernel for the whole batch: `rows` rows of row_bytes in
// each of key and value, moved as vectors of the widest width (16 / 8 / 4 / 2 /
// 1 bytes) dividing `alignment` and row_bytes, plus `flag_threads` threads that
// only set sticky flags. Calls launch(V{}, I{}, grid, stream, nvec, copies, total)
// with V the vector type and I the index type of the flat index space.
template <typename Launch>
void launch_copies(uint64_t alignment, int64_t row_bytes, int64_t rows, int64_t flag_threads, c10::Device device,
                   Launch&& launch) {
  const uint64_t bits = alignment | static_cast<uint64_t>(row_bytes) | 16;
  const int vb = static_cast<int>(bits & (~bits + 1));
  const int64_t nvec = row_bytes / vb;
  const int64_t copies = 2 * rows * nvec;
  const int64_t total = std::max<int64_t>(copies, flag_threads);
  if (total == 0) return;
  c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  with_vector_type(vb, [&](auto vtag) {
    with_index_type(total, [&](auto itag) {
      using I = decltype(itag);
      launch(vtag, itag, num_blocks_for(total), stream, static_cast<I>(nvec), static_cast<I>(copies),
             static_cast<I>(total));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

// The next digit of a flat index: r % n, and r becomes r / n.
template <typename I>
__device__ __forceinline__ I next_digit(I& r, I n) {
  const I d = r % n;
  r /= n;
  return d;
}

template <typename I>
__device__ __forceinline__ I grid_start() {
  return static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
}
template <typename I>
__device__ __forceinline__ I grid_step() {
  return static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
}

// ---- kv_append_ --------------------------------------------------------------
// Flat index i = (((kv * B + b) * H + h) * S + s) * nvec + v (consecutive threads
// copy consecutive vectors of one row). Threads i < B also flag overflowing rows.
template <typename V, typename I>
__global__ void kv_append_kernel(const KVAppendParams P, I nvec, I copies, I total) {
  const I S = static_cast<I>(P.S), H = static_cast<I>(P.H), B = static_cast<I>(P.B);
  for (I i = grid_start<I>(); i < total; i += grid_step<I>()) {
    if (P.overflow != nullptr && i < B && !kv_append_fits(P.lengths.get(i), P.S, P.max_len)) {
      P.overflow[static_cast<int64_t>(i) * P.overflow_stride] = true;
    }
    if (i >= copies) continue;
    I r = i;
    const I v = next_digit(r, nvec), s = next_digit(r, S), h = next_digit(r, H), b = next_digit(r, B);
    const int kv = static_cast<int>(r);
    const int64_t n = P.lengths.get(b);
    if (!kv_append_fits(n, P.S, P.max_len)) continue;
    reinterpret_cast<V*>(P.cache_row(kv, b, h, n + static_cast<int64_t>(s)))[v] =
        reinterpret_cast<const V*>(P.src_row(kv, b, h, s))[v];
  }
}

void kv_append_cuda(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& new_k,
                    const at::Tensor& new_v, const at::Tensor& lengths,
                    const std::optional<at::Tensor>& overflow) {
  kv::KVAppendLaunch L = kv::prepare_kv_append(key_cache, value_cache, new_k, new_v, lengths, overflow);
  const KVAppendParams& P = L.p;
  launch_copies(pair_alignment(P.cache, P.cache_stride) | pair_alignment(P.src, P.src_stride), P.row_bytes,
                P.B * P.H * P.S, P.overflow ? P.B : 0, key_cache.device(),
                [&](auto vtag, auto itag, int64_t grid, cudaStream_t stream, auto nvec, auto copies, auto total) {
                  kv_append_kernel<decltype(vtag), decltype(itag)><<<grid, kThreads, 0, stream>>>(P, nvec, copies,
                                                                                                  total);
                });
}

// ---- kv_rollback_ ------------------------------------------------------------
__global__ void kv_rollback_kernel(const KVRollbackParams P) {
  for (int64_t b = grid_start<int64_t>(); b < P.B; b += grid_step<int64_t>()) {
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
template <typename V, typename I>
__global__ void paged_append_kernel(const PagedAppendParams P, I nvec, I copies, I total) {
  const int64_t num_slots = P.num_slots();
  const bool small_slots = num_slots < (int64_t{1} << 32);
  const I H = static_cast<I>(P.H), T = static_cast<I>(P.T);
  for (I i = grid_start<I>(); i < total; i += grid_step<I>()) {
    if (P.invalid != nullptr && i < T && classify_slot(P.slots.get(i), num_slots) == SlotKind::kInvalid) {
      *P.invalid = true;
    }
    if (i >= copies) continue;
    I r = i;
    const I v = next_digit(r, nvec), h = next_digit(r, H), t = next_digit(r, T);
    const int kv = static_cast<int>(r);
    const int64_t slot = P.slots.get(t);
    if (classify_slot(slot, num_slots) != SlotKind::kWrite) continue;
    int64_t blk, off;
    if (small_slots) {  // 32-bit division (uniform branch)
      const uint32_t s32 = static_cast<uint32_t>(slot), bs32 = static_cast<uint32_t>(P.block_size);
      blk = s32 / bs32;
      off = s32 - static_cast<uint32_t>(blk) * bs32;
    } else {
      blk = slot / P.block_size;
      off = slot % P.block_size;
    }
    reinterpret_cast<V*>(P.cache_row(kv, blk, off, h))[v] = reinterpret_cast<const V*>(P.src_row(kv, t, h))[v];
  }
}

void paged_kv_append_cuda(at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& new_k,
                          const at::Tensor& new_v, const at::Tensor& slot_mapping,
                          const std::optional<at::Tensor>& invalid) {
  kv::PagedAppendLaunch L = kv::prepare_paged_append(key_cache, value_cache, new_k, new_v, slot_mapping, invalid);
  const PagedAppendParams& P = L.p;
  launch_copies(pair_alignment(P.cache, P.cache_stride) | pair_alignment(P.src, P.src_stride), P.row_bytes,
                P.T * P.H, P.invalid ? P.T : 0, key_cache.device(),
                [&](auto vtag, auto itag, int64_t grid, cudaStream_t stream, auto nvec, auto copies, auto total) {
                  paged_append_kernel<decltype(vtag), decltype(itag)><<<grid, kThreads, 0, stream>>>(
                      P, nvec, copies, total);
                });
}

// ---- paged_kv_gather / paged_kv_gather_into_ ------------------------------------
// Flat index i = (kv * rows + r) * nvec + v with r = (b * H + h) * max_len + p.
template <typename V, typename I>
__global__ void paged_gather_kernel(const PagedGatherParams P, I nvec, I total) {
  const I H = static_cast<I>(P.H), L = static_cast<I>(P.max_len), B = static_cast<I>(P.B);
  // max_len < 2^31 here whenever I is 32-bit, and block_size <= max_len is all that matters for
  // positions p < max_len: a bigger block_size gives bi = 0 either way.
  const I BS = static_cast<I>(P.block_size < P.max_len ? P.block_size : (P.max_len > 0 ? P.max_len : 1));
  for (I i = grid_start<I>(); i < total; i += grid_step<I>()) {
    I r = i;
    const I v = next_digit(r, nvec), p = next_digit(r, L), h = next_digit(r, H), b = next_digit(r, B);
    const int kv = static_cast<int>(r);
    const I bi = p / BS, off = p - bi * BS;  // table entry, offset in the block
    const int64_t blk = static_cast<int64_t>(p) < P.clamped_length(b) ? P.table_entry(b, bi) : -1;
    V* dst = reinterpret_cast<V*>(P.out_row(kv, b, h, p)) + v;
    *dst = blk < 0 ? V{} : reinterpret_cast<const V*>(P.cache_row(kv, blk, off, h))[v];
  }
}

void launch_gather(const PagedGatherParams& P, c10::Device device) {
  launch_copies(pair_alignment(P.cache, P.cache_stride) | pair_alignment(P.out, P.out_stride), P.row_bytes,
                P.B * P.H * P.max_len, 0, device,
                [&](auto vtag, auto itag, int64_t grid, cudaStream_t stream, auto nvec, auto, auto total) {
                  paged_gather_kernel<decltype(vtag), decltype(itag)><<<grid, kThreads, 0, stream>>>(P, nvec,
                                                                                                     total);
                });
}

void paged_kv_gather_into_cuda(const at::Tensor& key_cache, const at::Tensor& value_cache,
                               const at::Tensor& block_tables, const at::Tensor& lengths, at::Tensor& keys_out,
                               at::Tensor& values_out) {
  launch_gather(kv::prepare_paged_gather_into(key_cache, value_cache, block_tables, lengths, keys_out, values_out),
                key_cache.device());
}

std::tuple<at::Tensor, at::Tensor> paged_kv_gather_cuda(const at::Tensor& key_cache, const at::Tensor& value_cache,
                                                        const at::Tensor& block_tables, const at::Tensor& lengths,
                                                        int64_t max_len) {
  return kv::gather_by_allocating(key_cache, value_cache, block_tables, lengths, max_len,
                                  &paged_kv_gather_into_cuda);
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
