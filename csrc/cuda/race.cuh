// The two-level race's primitives (core/verify_math.h; framework-free CUDA): the coarse
// race's key pair and its merge, a lane's race weights (target p and residual
// max(0, scale * p - q)), the warp sum of a tile's weights and the fine race's winner inside a
// tile.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../core/filter_math.h"
#include "../core/rng.h"
#include "../core/verify_math.h"
#include "block_reduce.cuh"
#include "token_load.cuh"

namespace specdec::cuda {

struct RacePair {
  float key, key_p;      // coarse keys: residual race and race on p (used if the residual is all zero)
  int64_t idx, idx_p;    // winning TILE indices
  int bad;               // a bad draft probability was read

  __device__ __forceinline__ RacePair shfl(int m) const {
    return RacePair{shfl_xor(key, m), shfl_xor(key_p, m), shfl_xor(idx, m), shfl_xor(idx_p, m),
                    shfl_xor(bad, m)};
  }
  __device__ static RacePair empty() { return RacePair{-1.0f, -1.0f, INT64_MAX, INT64_MAX, 0}; }
};

__device__ __forceinline__ RacePair merge_race(const RacePair& a, const RacePair& b) {
  const RaceBest r = race_merge(RaceBest{a.key, a.idx}, RaceBest{b.key, b.idx});
  const RaceBest rp = race_merge(RaceBest{a.key_p, a.idx_p}, RaceBest{b.key_p, b.idx_p});
  return RacePair{r.key, rp.key, r.index, rp.index, a.bad | b.bad};
}

struct RaceMerge {
  __device__ RacePair operator()(const RacePair& a, const RacePair& b) const { return merge_race(a, b); }
};


// ----------------------------------------------------------------------------
// Race weights and the two-level race
// ----------------------------------------------------------------------------

// The logits x and (kDense) draft probabilities q of the 4 tokens v0..v0+3 of a
// lane (v0 a multiple of 4): loaded together, before any use (tokens >= V read as
// logit -inf and q 0, which weigh 0).
template <typename T, typename TQ>
__device__ __forceinline__ void load_lane_tokens(const T* row, const TQ* q_row, int64_t v0, int64_t V, bool vec_l,
                                                 bool vec_q, float x[4], float q[4]) {
  load4(row, v0, V, vec_l, -kInf, x);
  if (q_row) {
    load4(q_row, v0, V, vec_q, 0.0f, q);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) q[k] = 0.0f;
  }
}

// Weights of those 4 tokens: p = target probability, w = residual max(0, scale * p - q)
// (QMode kNone: w = scale * p; kOneHot: q one-hot at `draft`; kDense: the q row). Logits
// below the filter cutoff `cut` weigh 0 (inv_s is then 1 / the filtered sum). scale: 1 for
// verify, sample and the tree (p * 1 is exact: the bits of max(0, p - q)); block
// verification's weight w_tau in [0, 1] (core/block_verify.h), as the CPU's tile_weights.
__device__ __forceinline__ void token_weights(const float x[4], const float q[4], QMode q_mode, int64_t draft,
                                              int64_t v0, float inv_t, float max_l, float inv_s, float cut,
                                              float w[4], float p[4], int& bad, float scale = 1.0f) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float e = shifted_exp(filtered_logit(x[k], cut), max_l, inv_t);  // 0 for a token >= V (x = -inf)
    p[k] = e * inv_s;
    if (q_mode == QMode::kNone) {
      w[k] = p[k] * scale;
    } else if (q_mode == QMode::kOneHot) {
      w[k] = v0 + k == draft ? 0.0f : p[k] * scale;  // max(0, scale * p - 1) = 0 at the draft
    } else {
      if (bad_prob(q[k])) bad = 1;
      w[k] = scaled_residual_weight(e, inv_s, scale, q[k]);
    }
  }
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}


struct RaceBestShfl {
  float key;
  int64_t index;
  __device__ __forceinline__ RaceBestShfl shfl(int m) const { return RaceBestShfl{shfl_xor(key, m), shfl_xor(index, m)}; }
};
struct RaceBestMerge {
  __device__ RaceBestShfl operator()(const RaceBestShfl& a, const RaceBestShfl& b) const {
    const RaceBest r = race_merge(RaceBest{a.key, a.index}, RaceBest{b.key, b.index});
    return RaceBestShfl{r.key, r.index};
  }
};

// The fine race's winner (warp-wide): over every lane's 4 tokens v0 .. v0 + 3 (global ids)
// inside [lo, hi), with weights p (use_p) or w (the residual), the token of the largest
// weight / E_v among those of positive weight (E_v: the token's Philox exponential), ties to
// the lower token; -1 if none. Same value in every lane. (The weight is selected per element:
// a pointer to one of the two arrays would put both in local memory.)
__device__ __forceinline__ int64_t warp_fine_winner(const float w[4], const float p[4], bool use_p, int64_t v0,
                                                     int64_t lo, int64_t hi, const RowRng& rng, uint32_t token_stream,
                                                     uint32_t position) {
  const Philox4 r = rng.block(token_stream, position, static_cast<uint32_t>(v0 >> 2));
  RaceBestShfl best{0.0f, -1};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (v0 + k < lo || v0 + k >= hi) continue;
    const float key = (use_p ? p[k] : w[k]) / exponential_from_bits(r.x[k]);
    if (key > 0.0f && (best.index < 0 || race_better(key, v0 + k, RaceBest{best.key, best.index})))
      best = RaceBestShfl{key, v0 + k};
  }
  best = warp_reduce(best, [](const RaceBestShfl& a, const RaceBestShfl& b) {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    return RaceBestMerge{}(a, b);
  });
  return best.index;
}


}  // namespace specdec::cuda
