// CUDA kernels of the KV-cache ops over raw pointers (no torch here; the launch
// sequence is kv_launch.cuh, the torch launcher kv_cache_cuda.cu). One launch per op
// for the whole batch (key and value together); each thread moves one vector of
// V bytes (16 / 8 / 4 / 2 / 1, launch_plan.h: plan_copies), per position it compacts. No
// host sync: an invalid row or slot is skipped and reported through the optional sticky flags.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../core/kv_cache.h"

namespace specdec::cuda {

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

// ---- kv_compact_ / paged_kv_compact_ ---------------------------------------------
// Flat index i = ((kv * B + b) * H + h) * nvec + v: each thread owns one vector of one
// (row, head) and walks j = 0 .. count[b]-1 in order (core/kv_cache.h, KVCompactParams:
// no position is overwritten before it is read, and no other thread touches these bytes).
// Every thread checks its row first and writes nothing to an invalid one; threads i < B
// flag invalid rows.
template <typename V, typename I>
__global__ void kv_compact_kernel(const KVCompactParams P, I nvec, I copies, I total) {
  const I H = static_cast<I>(P.H), B = static_cast<I>(P.B);
  for (I i = grid_start<I>(); i < total; i += grid_step<I>()) {
    if (P.invalid != nullptr && i < B && P.check_row(i).error != CompactError::kNone) {
      P.invalid[static_cast<int64_t>(i) * P.invalid_stride] = true;
    }
    if (i >= copies) continue;
    I r = i;
    const I v = next_digit(r, nvec), h = next_digit(r, H), b = next_digit(r, B);
    const int kv = static_cast<int>(r);
    if (P.check_row(b).error != CompactError::kNone) continue;
    const int64_t n = P.lengths.get(b), count = P.count.get(b);
    for (int64_t j = 0; j < count; ++j) {
      const int64_t s = P.src.get(b, j);
      if (s == j) continue;  // already in place
      reinterpret_cast<V*>(P.position_row(kv, b, n + j, h))[v] =
          reinterpret_cast<const V*>(P.position_row(kv, b, n + s, h))[v];
    }
  }
}

// ---- paged_kv_gather / paged_kv_gather_into_ ------------------------------------
// Flat index i = (kv * rows + r) * nvec + v with r = (b * H + h) * max_len + p.
template <typename V, typename I>
__global__ void paged_gather_kernel(const PagedGatherParams P, I nvec, I total) {
  const I H = static_cast<I>(P.H), L = static_cast<I>(P.max_len), B = static_cast<I>(P.B);
  // max_len < 2^31 here whenever I is 32-bit, and block_size <= max_len is all that matters for
  // positions p < max_len: a bigger block_size gives bi = 0 either way.
  const int64_t bs = P.table.block_size;
  const I BS = static_cast<I>(bs < P.max_len ? bs : (P.max_len > 0 ? P.max_len : 1));
  for (I i = grid_start<I>(); i < total; i += grid_step<I>()) {
    I r = i;
    const I v = next_digit(r, nvec), p = next_digit(r, L), h = next_digit(r, H), b = next_digit(r, B);
    const int kv = static_cast<int>(r);
    const I bi = p / BS, off = p - bi * BS;  // table entry, offset in the block
    const int64_t blk = static_cast<int64_t>(p) < P.clamped_length(b) ? P.table.entry(b, bi) : -1;
    V* dst = reinterpret_cast<V*>(P.out_row(kv, b, h, p)) + v;
    *dst = blk < 0 ? V{} : reinterpret_cast<const V*>(P.cache_row(kv, blk, off, h))[v];
  }
}

}  // namespace specdec::cuda
