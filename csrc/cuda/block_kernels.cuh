// CUDA kernel of specdec::verify_block (block verification, core/block_verify.h) over raw
// pointers (no torch here; the launch sequence is block_launch.cuh). The rule is the CPU
// kernel's (csrc/cpu/block_kernels.h), with the same Philox numbers, so both emit the same
// tokens except where float rounding flips a near-tie.
//
// One block of 256 threads per row (grid-stride over rows, as verify_tree_kernel): the draft
// positions are visited in order because w_{j+1} needs w_j, so the parallelism is inside each
// position: every pass over its V logits is block-wide (16-byte loads where vector_ok allows)
// and every decision is taken from block-reduced values, so all threads hold the same walk
// state and reach the same barriers. Per visited position i <= n:
//   max + first argmax and a NaN / +inf flag (one pass); greedy rows stop at the first
//   mismatch (verify's longest matching prefix, then the argmax);
//   the filtered sum s_i (cutoff from filter_cutoff_kernel, launched first when a filter
//   argument was given);
//   1 <= i < n: the weighted residual mass r_i = sum_v max(0, w_i p_i(v) - q_i(v)) (one pass,
//   the q row read when dense: token_weights with scale w_i) and the stop score h_i;
//   i = n: h_n = w_n;
//   i < n: w_{i+1} from draft i's p and q.
// The stop position tau is the largest j with u_j < h_j: kept while walking forward (the
// uniforms are stateless Philox draws, so the order they are taken in does not matter),
// together with what the race at tau needs: that position's (max, sum, cutoff) and w_tau.
// Once w reaches 0 (greedy: after the mismatch) later positions get only the NaN / +inf pass.
// The correction / bonus is the two-level race of verify (chunk_coarse_race over the whole
// row, one warp per tile, then race_token's fine race in the winning tile, by every warp
// alike) on max(0, w_tau p - q) at position tau (scale 1 at the bonus position n).
// Float sums are taken in a fixed order (per thread, then the butterfly and the warp order
// of block_reduce), so results do not depend on the schedule or the grid.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../core/block_verify.h"
#include "../core/filter_math.h"
#include "../core/rng.h"
#include "../core/sampling_params.h"
#include "../core/verify_math.h"
#include "block_reduce.cuh"
#include "launch_plan.h"
#include "race.cuh"
#include "shared_memory.cuh"
#include "tile_stats.cuh"
#include "token_decision.cuh"
#include "token_load.cuh"

namespace specdec::cuda {

// The block-shared reduction scratch of the block kernel.
struct BlockVerifyScratch {
  OrFlag* flag;
  SumF* sum;
  MaxArg* max;
  RacePair* race;
};

// The raw max of one position with its first index, and whether the position holds a NaN /
// +inf logit (block-wide, every thread gets both).
struct PositionMax {
  MaxArg ma;
  bool bad;
};
template <typename TL>
__device__ PositionMax position_max(const TL* row, int64_t V, bool vec, const BlockVerifyScratch& S) {
  MaxArg ma{-kInf, INT64_MAX};
  int bad = 0;
  for_each_token_at(row, V, vec, [&](int64_t v, float x) {
    if (bad_logit(x)) bad = 1;
    if (x > ma.m) ma = MaxArg{x, v};  // increasing v per thread: the first index of the max
  });
  ma = block_reduce(ma, MaxArgMerge{}, S.max);
  return PositionMax{ma, block_reduce(OrFlag{bad}, OrMerge{}, S.flag).v != 0};
}

// The filtered softmax sum s = sum_v exp((cut(x_v) - m) / T) of one position (block-wide).
template <typename TL>
__device__ float position_sum(const TL* row, int64_t V, bool vec, float m, float inv_t, float cut,
                              const BlockVerifyScratch& S) {
  float part = 0.0f;
  for_each_token(row, V, vec, [&](float x) { part += shifted_exp(filtered_logit(x, cut), m, inv_t); });
  return block_reduce(SumF{part}, SumMerge{}, S.sum).v;
}

// r = sum_v max(0, scale * p(v) - q(v)) over one position (block-wide; token_weights' weights,
// 4 tokens per thread and step). bad: a dense q entry is a bad probability.
template <typename TL, typename TQ>
__device__ float weighted_residual_mass(const TL* row, const TQ* q_row, QMode q_mode, int64_t draft, int64_t V,
                                        float inv_t, float m, float inv_s, float cut, float scale, const Workspace& W,
                                        const BlockVerifyScratch& S, bool& bad) {
  float part = 0.0f;
  int bad_q = 0;
  for (int64_t v0 = 4 * static_cast<int64_t>(threadIdx.x); v0 < V; v0 += 4 * static_cast<int64_t>(blockDim.x)) {
    float x[4], q[4], w[4], p[4];
    load_lane_tokens(row, q_row, v0, V, W.vec_logits != 0, W.vec_q != 0, x, q);
    token_weights(x, q, q_mode, draft, v0, inv_t, m, inv_s, cut, w, p, bad_q, scale);
    part += (w[0] + w[1]) + (w[2] + w[3]);
  }
  const float r = block_reduce(SumF{part}, SumMerge{}, S.sum).v;
  bad = block_reduce(OrFlag{bad_q}, OrMerge{}, S.flag).v != 0;
  return r;
}

// Where the race of a row runs: the stop position tau with its filtered stats, cutoff and
// block weight w_tau (1 at the bonus position).
struct BlockStop {
  int64_t tau;
  float m, s, cut, w;
};

// One row (block-wide). Thread 0 writes the outputs.
template <typename TL, typename TQ>
__device__ void block_verify_row(const VerifyParams& P, const Workspace& W, int64_t b, const BlockVerifyScratch& S) {
  const int64_t K = P.K, V = P.V, n = P.drafts_of(b);
  const float temperature = P.temperature.get(b);
  const int64_t* draft = P.draft_ids + b * K;
  const bool vec = W.vec_logits != 0;
  bool ok = valid_temperature(temperature) && valid_filter(P.filters.get(b)) && n >= 0 && n <= K;
  for (int64_t i = 0; ok && i < n; ++i) ok = draft[i] >= 0 && draft[i] < V;  // same reads in every thread
  const bool greedy = temperature == 0.0f;
  BlockStop stop{0, 0.0f, 1.0f, -kInf, 1.0f};
  int64_t token = -1;
  if (ok) {
    const RowRng rng = make_row_rng(P.rnd, b);
    const TL* logits = static_cast<const TL*>(P.logits) + b * P.logits_stride_b;
    float w = 1.0f;     // w_i: the block weight before draft i (0-based), w_0 = 1
    bool done = false;  // w reached 0 (greedy: the mismatch was found): later positions only checked
    for (int64_t i = 0; i <= n; ++i) {
      const TL* row = logits + i * P.logits_stride_k;
      const PositionMax pm = position_max(row, V, vec, S);
      if (pm.bad || (!done && !usable_max(pm.ma.m))) { ok = false; break; }
      if (done) continue;
      if (greedy) {  // verify's longest matching prefix
        if (i == n || draft[i] != pm.ma.arg) { stop.tau = i; token = pm.ma.arg; done = true; }
        continue;
      }
      // 1 / T and the q row are derived per position (as in tree_row: fewer values live
      // across the walk's division slow paths)
      const float inv_t = 1.0f / temperature, cut = cutoff_of(W, b * (K + 1) + i);
      const TQ* probs = P.draft_probs ? static_cast<const TQ*>(P.draft_probs) + b * P.probs_stride_b : nullptr;
      const TQ* q_row = probs ? probs + i * P.probs_stride_k : nullptr;
      const float m = pm.ma.m, s = position_sum(row, V, vec, m, inv_t, cut, S);
      float h = i == 0 ? 1.0f : w;  // position 0 is the fallback stop (tau = 0: w_0 = 1); h_n = w_n
      if (i >= 1 && i < n) {
        bool bad = false;
        const float r = weighted_residual_mass(row, q_row, probs ? QMode::kDense : QMode::kOneHot, draft[i], V, inv_t,
                                               m, 1.0f / s, cut, w, W, S, bad);
        if (bad) { ok = false; break; }
        h = block_stop_score(r, w);
      }
      // tau = the largest j with u_j < h_j (u_j: the accept uniform of draft j, at position j - 1)
      if (i == 0 || accept_uniform(rng, static_cast<uint32_t>(i - 1)) < h) stop = BlockStop{i, m, s, cut, w};
      if (i == n) break;
      const int64_t x = draft[i];
      const float q_x = q_row ? to_float(q_row[x]) : 1.0f;
      if (bad_prob(q_x)) { ok = false; break; }
      const float e_x = shifted_exp(filtered_logit(to_float(row[x]), cut), m, inv_t);
      w = block_weight_next(w, e_x / s, q_x);
      if (w == 0.0f) done = true;  // every later weight and stop score is 0
    }
    if (ok && !greedy) {  // the correction from the weighted residual at tau, or the bonus at n
      const int64_t tau = stop.tau;
      const QMode q_mode = q_mode_at(tau, n, P.draft_probs != nullptr);
      const TQ* probs = P.draft_probs ? static_cast<const TQ*>(P.draft_probs) + b * P.probs_stride_b : nullptr;
      const RaceSite<TL, TQ> site{logits + tau * P.logits_stride_k,
                                  q_mode == QMode::kDense ? probs + tau * P.probs_stride_k : nullptr, q_mode,
                                  tau < n ? draft[tau] : -1, static_cast<uint32_t>(tau)};
      const float inv_t = 1.0f / temperature, inv_s = 1.0f / stop.s, scale = tau < n ? stop.w : 1.0f;
      // one chunk of V tokens: the whole row, one warp per tile
      const RacePair r = chunk_coarse_race(site.row, site.q_row, site.q_mode, site.draft, V, 0, V, inv_t, stop.m,
                                           inv_s, stop.cut, rng, kStreamVerifyTile, site.position, nullptr, W, S.race,
                                           scale);
      token = race_token(r, site, V, inv_t, stop.m, inv_s, stop.cut, rng, kStreamVerifyRace, W, scale);
      ok = token >= 0;
    }
  }
  if (threadIdx.x == 0) {
    int64_t* tokens = P.tokens + b * (K + 1);
    const int64_t tau = ok ? stop.tau : -1;
    for (int64_t i = 0; i <= K; ++i) tokens[i] = i < tau ? draft[i] : i == tau ? token : -1;
    P.num_accepted[b] = ok ? tau : 0;
    P.valid[b] = ok;
  }
  __syncthreads();  // the next row reuses the scratch
}

template <typename TL, typename TQ>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM) verify_block_kernel(VerifyParams P, Workspace W) {
  SPECDEC_SHARED(OrFlag[32], flag);
  SPECDEC_SHARED(SumF[32], sum);
  SPECDEC_SHARED(MaxArg[32], max);
  SPECDEC_SHARED(RacePair[32], race);
  const BlockVerifyScratch S{flag, sum, max, race};
  for (int64_t b = blockIdx.x; b < P.B; b += gridDim.x) block_verify_row<TL, TQ>(P, W, b, S);
}

}  // namespace specdec::cuda
