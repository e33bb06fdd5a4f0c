// CUDA kernel of specdec::verify_tree over raw pointers (no torch here; the launch
// sequence is tree_launch.cuh). The walk is core/tree_params.h.
//
// One block per row (grid-stride over rows); every step of the walk is block-wide
// and block-uniform (each thread holds the same walk state, derived only from
// block-reduced values), so the barriers inside the reductions are reached by all
// threads:
//   check:  the row's temperature / filter, every node's parent entry, depth and
//           token id, and a NaN / +inf pass over every node's logits (one OR)
//   node:   max (+ first argmax) of the raw logits; greedy rows stop here
//           (the first child holding the argmax, else the argmax). Else the
//           filtered sum s (cutoff from filter_cutoff_kernel, launched first when a
//           filter was given), then the children in index order: the first one on
//           p' (ratio test), later ones on the residual r = w / Z held in the
//           block's buffer (TreeWorkspace::residual, two rows of V floats per block:
//           a candidate residual of mass 0 leaves r as it was)
//   emit:   the two-level race of verify_math.h over the buffer (coarse: one warp per
//           128-token tile, tiles strided over the warps, merged in a fixed order;
//           fine: inside the winning tile, computed by every warp alike)
// Float sums are taken in a fixed order (per thread, then the butterfly and the
// warp order of block_reduce), so results do not depend on the thread schedule;
// they may differ from the CPU kernel's in the last bits (a near-tie can flip).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../core/filter_math.h"
#include "../core/rng.h"
#include "../core/tree_params.h"
#include "../core/verify_math.h"
#include "block_reduce.cuh"
#include "launch_plan.h"
#include "race.cuh"
#include "shared_memory.cuh"
#include "tile_stats.cuh"
#include "token_load.cuh"

namespace specdec::cuda {

struct TreeWorkspace {
  const float* cutoff;  // [B * N] filter cutoffs (filter_cutoff_kernel), or nullptr: no filter
  float* residual;      // [gridDim.x, 2, V]: the residual buffers of each block
  int vec_logits;       // vector loads of the logits rows (vector_ok)
};

// The block-shared reduction scratch of the tree kernel.
struct TreeScratch {
  OrFlag* flag;
  SumF* sum;
  MaxArg* max;
  RaceBestShfl* race;
};

// Whether row b of the tree can be walked (block-wide, every thread gets it): usable
// temperature and filter, a well-formed parents row of depth <= D, node tokens in
// [0, V), and no NaN / +inf logit at any node.
template <typename TL>
__device__ bool tree_row_usable(const TreeVerifyParams& P, const TreeWorkspace& W, int64_t b, const TreeScratch& S) {
  const int64_t* parents = P.parents_of(b);
  const int64_t* ids = P.token_ids + b * P.N;
  int bad = !valid_temperature(P.temperature.get(b)) || !valid_filter(P.filters.get(b));
  for (int64_t n = threadIdx.x; n < P.N; n += blockDim.x) {
    bool ok = true;  // a node's depth walks up through its ancestors: check them first
    for (int64_t a = n; ok && a > 0; a = parents[a]) ok = valid_parent(parents, a);
    ok = ok && valid_parent(parents, n) && node_depth(parents, n) <= P.depth;
    if (!ok || (n > 0 && (ids[n] < 0 || ids[n] >= P.V))) bad = 1;
  }
  const TL* logits = static_cast<const TL*>(P.logits) + b * P.logits_stride_b;
  for (int64_t n = 0; n < P.N; ++n)
    for_each_token(logits + n * P.logits_stride_n, P.V, W.vec_logits != 0, [&](float x) {
      if (bad_logit(x)) bad = 1;
    });
  return block_reduce(OrFlag{bad}, OrMerge{}, S.flag).v == 0;
}

// The two-level race over the weights w[V] >= 0 (verify's race streams at `position`):
// the token, or -1 when every tile weighs 0. Block-wide, every thread gets the result.
__device__ int64_t block_race(const float* w, int64_t V, const RowRng& rng, uint32_t position, const TreeScratch& S) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  RaceBestShfl best{-1.0f, INT64_MAX};
  for (int64_t t = warp; t * kRaceTile < V; t += warps) {
    float part = 0.0f;
    const int64_t v0 = t * kRaceTile + 4 * lane;
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (v0 + k < V) part += w[v0 + k];
    const float key = warp_sum(part) / race_exponential(rng, kStreamVerifyTile, position, t);
    if (race_better(key, t, RaceBest{best.key, best.index})) best = RaceBestShfl{key, t};
  }
  best = block_reduce(best, RaceBestMerge{}, S.race);
  if (!(best.key > 0.0f)) return -1;
  // fine race inside the tile, by every warp alike
  const int64_t v0 = best.index * kRaceTile + 4 * lane;
  const Philox4 r = rng.block(kStreamVerifyRace, position, static_cast<uint32_t>(v0 >> 2));
  RaceBestShfl fine{-1.0f, INT64_MAX};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (v0 + k >= V) break;
    const float key = w[v0 + k] / exponential_from_bits(r.x[k]);
    if (race_better(key, v0 + k, RaceBest{fine.key, fine.index})) fine = RaceBestShfl{key, v0 + k};
  }
  return warp_reduce(fine, RaceBestMerge{}).index;
}

// One visited, non-greedy node of row b: its filtered law p' = e / s and its q row.
template <typename TL, typename TQ>
struct TreeNodeDev {
  const TL* row;
  const TQ* q;  // q_n, or nullptr (deterministic children)
  int64_t V;
  bool vec;
  float m, inv_t, cut, s;

  // out[v] = p'(v); returns sum(out) (block-wide).
  __device__ float fill_p(float* out, const TreeScratch& S) const {
    const float inv_s = 1.0f / s;
    float part = 0.0f;
    for_each_token_at(row, V, vec, [&](int64_t v, float x) {
      out[v] = shifted_exp(filtered_logit(x, cut), m, inv_t) * inv_s;
      part += out[v];
    });
    return block_reduce(SumF{part}, SumMerge{}, S.sum).v;
  }
};

// Rejects child token x: the candidate residual in `next` (max(0, r - q), or r with x
// zeroed), taken when its mass is positive. Returns false for a bad q entry (block-wide).
template <typename TL, typename TQ>
__device__ bool tree_reject(const TreeNodeDev<TL, TQ>& nd, int64_t x, float*& cur, float*& next, float& Z,
                            bool& held, const TreeScratch& S) {
  const float inv_s = 1.0f / nd.s, scale = held ? 1.0f / Z : 1.0f;
  float part = 0.0f;
  int bad = 0;
  for_each_token_at(nd.row, nd.V, nd.vec, [&](int64_t v, float xl) {
    float r = held ? cur[v] * scale : shifted_exp(filtered_logit(xl, nd.cut), nd.m, nd.inv_t) * inv_s;
    if (nd.q) {
      const float q = to_float(nd.q[v]);
      if (bad_prob(q)) bad = 1;
      r = r - q > 0.0f ? r - q : 0.0f;
    } else if (held) {
      r = cur[v];  // deterministic children: r keeps its scale, x is zeroed
    }
    if (v == x && !nd.q) r = 0.0f;
    next[v] = r;
    part += r;
  });
  const float Zn = block_reduce(SumF{part}, SumMerge{}, S.sum).v;
  if (block_reduce(OrFlag{bad}, OrMerge{}, S.flag).v) return false;
  if (Zn > 0.0f) {
    float* t = cur;
    cur = next;
    next = t;
    Z = Zn;
  } else if (!held) {  // r == q: keep r = p'
    Z = nd.fill_p(cur, S);
  }
  held = true;
  return true;
}

// One row's walk (block-wide). Thread 0 writes the outputs.
template <typename TL, typename TQ>
__device__ void tree_row(const TreeVerifyParams& P, const TreeWorkspace& W, int64_t b, const TreeScratch& S) {
  const int64_t N = P.N, V = P.V, D1 = P.depth + 1;
  int64_t* tokens = P.tokens + b * D1;
  int64_t* path = P.path + b * D1;
  const bool vec = W.vec_logits != 0;
  int64_t depth = 0, token = -1;
  bool ok = tree_row_usable<TL>(P, W, b, S);
  if (ok) {
    const int64_t* parents = P.parents_of(b);
    const int64_t* ids = P.token_ids + b * N;
    const bool greedy = P.temperature.get(b) == 0.0f;
    const RowRng rng = make_row_rng(P.rnd, b);
    const TL* logits = static_cast<const TL*>(P.logits) + b * P.logits_stride_b;
    float* cur = W.residual + static_cast<int64_t>(blockIdx.x) * 2 * V;
    float* next = cur + V;
    int64_t node = 0;
    if (threadIdx.x == 0) path[0] = 0;
    while (ok && token < 0) {
      const TL* row = logits + node * P.logits_stride_n;
      MaxArg ma{-kInf, INT64_MAX};
      for_each_token_at(row, V, vec, [&](int64_t v, float x) {
        if (x > ma.m) ma = MaxArg{x, v};  // increasing v per thread: the first index of the max
      });
      ma = block_reduce(ma, MaxArgMerge{}, S.max);
      if (!usable_max(ma.m)) { ok = false; break; }
      int64_t accepted = -1;
      if (greedy) {
        for (int64_t c = next_child(parents, N, node, node); c >= 0 && accepted < 0; c = next_child(parents, N, node, c))
          if (ids[c] == ma.arg) accepted = c;
        if (accepted < 0) token = ma.arg;
      } else {
        // 1 / T and the q row are derived here, per node: kept live across the whole walk they
        // were spilled around the division slow-path calls (8 bytes of stack)
        const float inv_t = 1.0f / P.temperature.get(b);
        const TQ* probs = P.draft_probs ? static_cast<const TQ*>(P.draft_probs) + b * P.probs_stride_b : nullptr;
        TreeNodeDev<TL, TQ> nd{row, probs ? probs + node * P.probs_stride_n : nullptr, V, vec, ma.m, inv_t,
                               W.cutoff ? W.cutoff[b * N + node] : -kInf, 0.0f};
        float part = 0.0f;
        for_each_token_at(row, V, vec, [&](int64_t, float x) { part += shifted_exp(filtered_logit(x, nd.cut), nd.m, inv_t); });
        nd.s = block_reduce(SumF{part}, SumMerge{}, S.sum).v;
        float Z = 0.0f;
        bool held = false;
        for (int64_t c = next_child(parents, N, node, node); c >= 0; c = next_child(parents, N, node, c)) {
          const int64_t x = ids[c];
          const float q_x = nd.q ? to_float(nd.q[x]) : 1.0f;
          if (bad_prob(q_x)) { ok = false; break; }
          const float u = accept_uniform(rng, child_position(c));
          const bool acc = held ? residual_test_accepts(u, q_x, Z, cur[x])
                                : ratio_test_accepts(u, q_x, nd.s,
                                                     shifted_exp(filtered_logit(to_float(row[x]), nd.cut), nd.m, inv_t));
          if (acc) { accepted = c; break; }
          if (!tree_reject(nd, x, cur, next, Z, held, S)) { ok = false; break; }
        }
        if (ok && accepted < 0) {  // the correction from r, or the bonus from p' at a leaf
          if (!held) nd.fill_p(cur, S);
          token = block_race(cur, V, rng, static_cast<uint32_t>(node), S);
          if (token < 0) {  // every weight rounded to 0: the race on p'
            nd.fill_p(cur, S);
            token = block_race(cur, V, rng, static_cast<uint32_t>(node), S);
          }
          ok = token >= 0;
        }
      }
      if (ok && accepted >= 0) {
        if (threadIdx.x == 0) {
          tokens[depth] = ids[accepted];
          path[depth + 1] = accepted;
        }
        ++depth;
        node = accepted;
      }
    }
  }
  if (threadIdx.x == 0) {
    if (ok) tokens[depth] = token;
    for (int64_t i = ok ? depth + 1 : 0; i < D1; ++i) {
      tokens[i] = -1;
      path[i] = -1;
    }
    P.num_accepted[b] = ok ? depth : 0;
    P.valid[b] = ok;
  }
  __syncthreads();  // the next row reuses the buffers and scratch
}

template <typename TL, typename TQ>
__global__ void __launch_bounds__(kBlockThreads) verify_tree_kernel(TreeVerifyParams P, TreeWorkspace W) {
  SPECDEC_SHARED(OrFlag[32], flag);
  SPECDEC_SHARED(SumF[32], sum);
  SPECDEC_SHARED(MaxArg[32], max);
  SPECDEC_SHARED(RaceBestShfl[32], race);
  const TreeScratch S{flag, sum, max, race};
  for (int64_t b = blockIdx.x; b < P.B; b += gridDim.x) tree_row<TL, TQ>(P, W, b, S);
}

}  // namespace specdec::cuda
