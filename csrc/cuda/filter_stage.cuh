// Filter cutoffs (core/filter_math.h) on the device (framework-free CUDA): the block-wide
// radix passes (top-k counts, top-p masses, min-p bound) over a row position and
// filter_cutoff_kernel, which writes one logit cutoff per (row, position) before the
// sampling kernels run. The vocabulary-parallel steps (shard_kernels.cuh) run the same
// passes on a shard.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../core/filter_math.h"
#include "../core/sampling_params.h"
#include "../core/verify_math.h"
#include "block_reduce.cuh"
#include "launch_plan.h"
#include "shared_memory.cuh"
#include "tile_stats.cuh"
#include "token_load.cuh"

namespace specdec::cuda {

// ----------------------------------------------------------------------------
// Filter cutoffs (core/filter_math.h): one block per (row, position)
// ----------------------------------------------------------------------------
// Launched before the main kernel, only when a filter argument was given. Block
// (b, i) (grid-stride over B * positions): skipped (cutoff -inf) for greedy rows,
// rows with an unusable temperature / filter / n_b, positions after n_b and rows
// where no filter can remove a token (filter_on); else
//   pass 0: block max m of the raw logits (+ a NaN / +inf flag: such a position
//           makes the row invalid in the main kernel; its cutoff stays -inf),
//   top-k:  4 counting passes, top-p: 4 mass passes, min-p: 1 min pass,
// i.e. 1 + up to 9 reads of the position. Histograms live in shared memory and
// are built with INTEGER atomics (uint32 counts, 2^-40 fixed-point uint64
// masses): integer sums do not depend on the order in which threads add, so the
// digits picked (by every thread, from the same histogram) and the cutoff are
// the reference's (filter_cutoff_reference) whenever the per-token exps agree.

struct FilterParams {
  const void* logits;  // [B, positions, V] with these element strides
  int64_t stride_b, stride_k;
  int64_t B, positions, V;
  ScalarOrRow<float> temperature;
  RowFilters filters;
  const int64_t* num_drafts;  // verify: [B] (positions after n_b skipped), or nullptr
  int64_t num_drafts_stride;
  int vec;       // vector loads allowed (Workspace::vec_logits)
  float* cutoff; // [B * positions] out
};


struct MaxBad {
  float m;
  int bad;
  __device__ __forceinline__ MaxBad shfl(int k) const { return MaxBad{shfl_xor(m, k), shfl_xor(bad, k)}; }
};
struct MaxBadMerge {
  __device__ MaxBad operator()(const MaxBad& a, const MaxBad& b) const { return MaxBad{fmaxf(a.m, b.m), a.bad | b.bad}; }
};
struct MinVal {
  float v;
  __device__ __forceinline__ MinVal shfl(int k) const { return MinVal{shfl_xor(v, k)}; }
};
struct MinMerge {
  __device__ MinVal operator()(const MinVal& a, const MinVal& b) const { return MinVal{fminf(a.v, b.v)}; }
};


// Zero the histogram(s) of the next pass. The first barrier: every thread has
// finished reading the previous pass's histogram (each picks its digit from it).
__device__ __forceinline__ void clear_histogram(uint32_t* count, unsigned long long* mass) {
  __syncthreads();
  for (int d = threadIdx.x; d < kRadixBins; d += blockDim.x) {
    count[d] = 0u;
    if (mass) mass[d] = 0ull;
  }
  __syncthreads();
}

// One top-k counting pass (block-wide): count[d] = the tokens whose order key is in the
// search's bucket and has digit d. Ends with a barrier: every thread may read count.
template <typename T>
__device__ void topk_count_pass(const T* row, int64_t V, bool vec, const RadixState& s, uint32_t* count) {
  clear_histogram(count, nullptr);
  for_each_token(row, V, vec, [&](float x) {
    const uint32_t key = order_key(x);
    if (s.in_bucket(key)) atomicAdd(&count[s.digit(key)], 1u);
  });
  __syncthreads();
}

// One top-p mass pass (block-wide) over the tokens >= topk_cut (top-p runs on the top-k
// survivors): count[d] and the fixed-point mass[d] of e = shifted_exp(x, m, inv_t) of the
// tokens in the search's bucket with digit d. Ends with a barrier.
template <typename T>
__device__ void topp_mass_pass(const T* row, int64_t V, bool vec, const RadixState& s, float topk_cut, float m,
                               float inv_t, uint32_t* count, unsigned long long* mass) {
  clear_histogram(count, mass);
  for_each_token(row, V, vec, [&](float x) {
    const uint32_t key = order_key(x);
    if (x < topk_cut || !s.in_bucket(key)) return;
    const int d = s.digit(key);
    atomicAdd(&count[d], 1u);
    const uint64_t e = fixed_mass(shifted_exp(x, m, inv_t));
    if (e) atomicAdd(&mass[d], static_cast<unsigned long long>(e));
  });
  __syncthreads();
}

// min-p's bound (block-wide; every thread gets it): the smallest logit with
// shifted_exp(x, m, inv_t) >= min_p, m itself if none is smaller (the max qualifies: e = 1).
template <typename T>
__device__ float minp_bound_block(const T* row, int64_t V, bool vec, float m, float inv_t, float min_p,
                                  MinVal* scratch) {
  MinVal lo{m};
  for_each_token(row, V, vec, [&](float x) {
    if (x < lo.v && shifted_exp(x, m, inv_t) >= min_p) lo.v = x;
  });
  return block_reduce(lo, MinMerge{}, scratch).v;
}

// The cutoff of one row position with finite max m (block-wide; every thread
// returns it): filter_cutoff_reference's passes over block-wide histograms.
template <typename T>
__device__ float block_cutoff(const T* row, int64_t V, bool vec, float m, float inv_t, const FilterSpec& f,
                              uint32_t* count, unsigned long long* mass, MinVal* scratch) {
  float cut = -kInf;  // the top-k cutoff first: top-p runs on the tokens >= it (float order)
  if (f.top_k > 0 && f.top_k < V) {
    RadixState s;
    int64_t k_left = f.top_k;
    while (!s.done()) {
      topk_count_pass(row, V, vec, s, count);
      s.descend(topk_digit(count, k_left));  // the same digit in every thread (same counts)
    }
    cut = key_to_float(s.prefix);
  }
  if (f.top_p < 1.0f) {
    static_assert(sizeof(unsigned long long) == sizeof(uint64_t), "mass bins are read as uint64_t");
    const uint64_t* msum = reinterpret_cast<const uint64_t*>(mass);
    RadixState s;
    uint64_t above = 0;
    double limit = 0.0;
    while (!s.done()) {
      topp_mass_pass(row, V, vec, s, cut, m, inv_t, count, mass);
      if (s.bits == 0) {  // the first pass holds every survivor: the total mass
        uint64_t total = 0;
        for (int d = 0; d < kRadixBins; ++d) total += msum[d];
        limit = topp_limit(f.top_p, total);
      }
      s.descend(topp_digit(msum, count, above, limit));
    }
    cut = max_cutoff(cut, key_to_float(s.prefix));
  }
  if (f.min_p > 0.0f) cut = max_cutoff(cut, minp_bound_block(row, V, vec, m, inv_t, f.min_p, scratch));
  return cut;
}

template <typename T>
__global__ void __launch_bounds__(kFilterThreads) filter_cutoff_kernel(FilterParams F) {
  SPECDEC_SHARED(uint32_t[kRadixBins], count);
  SPECDEC_SHARED(unsigned long long[kRadixBins], mass);
  SPECDEC_SHARED(MaxBad[32], max_scratch);
  SPECDEC_SHARED(MinVal[32], min_scratch);
  for (int64_t item = blockIdx.x; item < F.B * F.positions; item += gridDim.x) {
    const int64_t b = item / F.positions, i = item - b * F.positions;
    const float t = F.temperature.get(b);
    const FilterSpec f = F.filters.get(b);
    const int64_t n = drafts_of_row(F.num_drafts, F.num_drafts_stride, b, F.positions - 1);
    float cut = -kInf;
    // block-uniform (depends on b, i only): the passes below contain barriers
    if (t != 0.0f && valid_temperature(t) && valid_filter(f) && filter_on(f, F.V) && n >= 0 && n < F.positions &&
        i <= n) {
      const T* row = static_cast<const T*>(F.logits) + b * F.stride_b + i * F.stride_k;
      MaxBad mb{-kInf, 0};
      for_each_token(row, F.V, F.vec != 0, [&](float x) {
        if (bad_logit(x)) mb.bad = 1;
        else mb.m = fmaxf(mb.m, x);
      });
      mb = block_reduce(mb, MaxBadMerge{}, max_scratch);
      if (!mb.bad && usable_max(mb.m))
        cut = block_cutoff(row, F.V, F.vec != 0, mb.m, 1.0f / t, f, count, mass, min_scratch);
    }
    if (threadIdx.x == 0) F.cutoff[item] = cut;
  }
}


}  // namespace specdec::cuda
