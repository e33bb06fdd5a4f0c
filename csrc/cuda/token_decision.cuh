// The workspace of the single-device verify / sample kernels and the steps their stages
// share (framework-free CUDA): stage 1 (stats_stage: one warp per stat block), the coarse
// race over a chunk's tiles (chunk_coarse_race), and stage 3's final token of a row from
// its decision (merge of the chunks' coarse winners, fine race in the winning tile), with
// the logprob of the decided token.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../core/logprob_math.h"
#include "../core/rng.h"
#include "../core/sampling_params.h"
#include "../core/verify_math.h"
#include "block_reduce.cuh"
#include "race.cuh"
#include "row_stats.cuh"
#include "token_load.cuh"

namespace specdec::cuda {

// What stage 2 decided for a row (written by the block that handles chunk 0).
struct RowDecision {
  int64_t j;         // first stop position (K if all accepted)
  int64_t token;     // greedy rows: the token at j
  float max_l, sum;  // softmax stats of position j (for the fine race)
  float sum1;        // and the raw law's sum (raw token_logprobs; ChunkStats::sum1)
  RowStatus status;
  float cut;         // filter cutoff of position j (-inf: none)
};

struct Workspace {
  ChunkStats* stats;   // [B, K+1, NB] (sample: [B, NB]), NB = ceil(V / kStatBlock)
  RacePair* race;      // [B, C]
  RowDecision* rows;   // [B]
  int64_t chunks;      // C: chunks per row (work split only; results do not depend on it)
  int64_t chunk_len;   // a multiple of kStatBlock
  int64_t stat_blocks; // NB
  int vec_logits;      // logits rows 16-byte aligned and V % (16 / sizeof(TL)) == 0: vector loads
  int vec_q;           // the same for the dense draft rows
  int vec_probs;       // probs_out rows 16-byte aligned (float4 stores where 4 tokens are in range)
  float* cutoff;       // [B * positions] filter cutoff per (row, position), written by filter_cutoff_kernel
                       // before the main kernel and only read by it; nullptr when no filter was given
  int64_t* coupled_y;  // coupled verify: [B, K+1] the target's own sample per position (else nullptr)
};

// The filter cutoff of stat row r = b * positions + i (-inf when no filter was given;
// filter_cutoff_kernel writes -inf for greedy / invalid rows and unused positions).
__device__ __forceinline__ float cutoff_of(const Workspace& W, int64_t r) { return W.cutoff ? W.cutoff[r] : -kInf; }


// Coarse race over the tiles of chunk c (block-wide): one warp per tile of
// kRaceTile = 128 tokens, 4 per lane. Keys W_t / E_t (residual) and P_t / E_t
// (target). Optionally writes p to probs_out. The next tile's logits are loaded
// before the current tile is processed (two loads in flight per lane). scale: the residual
// is max(0, scale * p - q) (token_weights; 1 but for block verification's w_tau), the
// target's key P_t stays unscaled (the race on p where the residual is all zero).
template <typename T, typename TQ>
__device__ RacePair chunk_coarse_race(const T* row, const TQ* q_row, QMode q_mode, int64_t draft, int64_t V,
                                      int64_t c, int64_t chunk_len, float inv_t, float max_l, float inv_s, float cut,
                                      const RowRng& rng, uint32_t tile_stream, uint32_t position,
                                      float* probs_out, const Workspace& W, RacePair* scratch,
                                      float scale = 1.0f) {
  static_assert(kRaceTile == 128, "one warp x 4 tokens per tile");
  // best keys with 32-bit tile indices (registers: t < 2^31 for any V < 2^38)
  float key = -1.0f, key_p = -1.0f;
  int idx = INT32_MAX, idx_p = INT32_MAX, bad = 0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const bool vec_l = W.vec_logits != 0, vec_q = W.vec_q != 0, vec_p = W.vec_probs != 0;
  const int64_t t_begin = c * chunk_len / kRaceTile;
  const int64_t t_end = (imin(V, (c + 1) * chunk_len) + kRaceTile - 1) / kRaceTile;
  float x[4];
  int64_t t = t_begin + warp;
  if (t < t_end) load4(row, t * kRaceTile + 4 * lane, V, vec_l, -kInf, x);
  for (; t < t_end; t += warps) {
    const int64_t v0 = t * kRaceTile + 4 * lane;
    // this tile's q and the next tile's logits are loaded together (the logits of
    // this tile are in flight since the previous iteration)
    float q[4], xn[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (q_row) {
      load4(q_row, v0, V, vec_q, 0.0f, q);
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) q[k] = 0.0f;
    }
    if (t + warps < t_end) load4(row, v0 + warps * kRaceTile, V, vec_l, -kInf, xn);
    float w[4], p[4];
    token_weights(x, q, q_mode, draft, v0, inv_t, max_l, inv_s, cut, w, p, bad, scale);
    if (probs_out) {
      if (vec_p && v0 + 3 < V) {
        *reinterpret_cast<float4*>(probs_out + v0) = make_float4(p[0], p[1], p[2], p[3]);
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k)
          if (v0 + k < V) probs_out[v0 + k] = p[k];
      }
    }
    const float Wt = warp_sum((w[0] + w[1]) + (w[2] + w[3]));
    const float Pt = warp_sum((p[0] + p[1]) + (p[2] + p[3]));
    const float E = race_exponential(rng, tile_stream, position, t);
    // tiles come in increasing t: strictly greater keys win, ties keep the lower tile
    if (Wt / E > key) { key = Wt / E; idx = static_cast<int>(t); }
    if (Pt / E > key_p) { key_p = Pt / E; idx_p = static_cast<int>(t); }
#pragma unroll
    for (int k = 0; k < 4; ++k) x[k] = xn[k];
  }
  const RacePair best{key, key_p, idx == INT32_MAX ? INT64_MAX : idx, idx_p == INT32_MAX ? INT64_MAX : idx_p, bad};
  return block_reduce(best, RaceMerge{}, scratch);
}


// Fine race (warp-wide) inside tile `tile`: token = argmax weight_v / E_v over
// tokens of positive weight; -1 if none (cannot happen for a tile the coarse
// race picked). Same value in every lane. scale: as in chunk_coarse_race.
template <typename T, typename TQ>
__device__ int64_t warp_fine_race(const T* row, const TQ* q_row, QMode q_mode, int64_t draft, int64_t V, int64_t tile,
                                  bool use_p, float inv_t, float max_l, float inv_s, float cut, const RowRng& rng,
                                  uint32_t token_stream, uint32_t position, const Workspace& W, float scale = 1.0f) {
  const int64_t v0 = tile * kRaceTile + 4 * (threadIdx.x & 31);
  float x[4], q[4], w[4], p[4];
  int bad = 0;
  load_lane_tokens(row, q_row, v0, V, W.vec_logits != 0, W.vec_q != 0, x, q);
  token_weights(x, q, q_mode, draft, v0, inv_t, max_l, inv_s, cut, w, p, bad, scale);
  return warp_fine_winner(w, p, use_p, v0, 0, V, rng, token_stream, position);
}


// Where a row's race runs: its logits row, the draft distribution there and
// the draft position (verify: the stop position j; sample: 0, no q).
template <typename TL, typename TQ>
struct RaceSite {
  const TL* row;
  const TQ* q_row;  // kDense only
  QMode q_mode;
  int64_t draft;    // kOneHot: the draft id
  uint32_t position;
};


// Stage 1: stats of every (row, position, stat block): one warp per stat block,
// global warp index w takes items w, w + all warps, ... (every warp of the grid
// has work as long as there are stat blocks: B = 1, K = 5, V = 128256 has 756).
// `positions` = K + 1 (verify) or 1 (sample). num_drafts (verify, may be null):
// positions after n_b are not read (their stats are never used), and an n_b
// outside [0, positions) makes the row invalid like an unusable temperature.
// raw_sums (raw token_logprobs): every visited position also takes the raw law's sum
// (stat_block's want_raw), greedy rows included.
template <typename TL>
__device__ void stats_stage(const void* logits, int64_t stride_b, int64_t stride_k, int64_t positions,
                            const ScalarOrRow<float>& temperature, const int64_t* num_drafts, int64_t nd_stride,
                            int64_t B, int64_t V, const Workspace& W, bool raw_sums) {
  const int64_t NB = W.stat_blocks, total = B * positions * NB;
  const int64_t warps = blockDim.x >> 5;
  for (int64_t item = blockIdx.x * warps + (threadIdx.x >> 5); item < total; item += gridDim.x * warps) {
    const int64_t r = item / NB, blk = item - r * NB, b = r / positions, i = r - b * positions;
    const float t = temperature.get(b);
    const int64_t n = drafts_of_row(num_drafts, nd_stride, b, positions - 1);
    ChunkStats st = ChunkStats::empty();
    st.flags = kBadLogit;  // an unusable temperature / n_b: the row is invalid, its logits are not read
    if (valid_temperature(t) && n >= 0 && n < positions) {
      st.flags = 0;
      if (i <= n) {
        const TL* row = static_cast<const TL*>(logits) + b * stride_b + i * stride_k;
        st = stat_block(row, V, blk, stats_inv_t(t), t != 0.0f || raw_sums, W.vec_logits != 0, cutoff_of(W, r),
                        raw_sums);
      }
    }
    if ((threadIdx.x & 31) == 0) W.stats[item] = st;  // item == (b * positions + i) * NB + blk
  }
}


// The token of a row from its coarse race's result r (warp-wide; the same in every lane): the
// fine race inside the winning tile, on the residual (scale as in chunk_coarse_race), or on
// p if the residual is all zero. -1 when a bad draft probability was read or no tile won.
template <typename TL, typename TQ>
__device__ __forceinline__ int64_t race_token(const RacePair& r, const RaceSite<TL, TQ>& site, int64_t V, float inv_t,
                                              float max_l, float inv_s, float cut, const RowRng& rng,
                                              uint32_t token_stream, const Workspace& W, float scale = 1.0f) {
  const bool use_p = !(r.key > 0.0f);
  const int64_t tile = use_p ? r.idx_p : r.idx;
  const int64_t ntiles = (V + kRaceTile - 1) / kRaceTile;
  if (r.bad || tile < 0 || tile >= ntiles) return -1;
  const int64_t token = warp_fine_race(site.row, site.q_row, site.q_mode, site.draft, V, tile, use_p, inv_t, max_l,
                                       inv_s, cut, rng, token_stream, site.position, W, scale);
  return (token >= 0 && token < V) ? token : -1;
}


// Stage 3 of both kernels, for one row (warp-wide; every branch is
// warp-uniform): the row's token from its decision. Greedy: already known.
// Sampled: merge the C coarse winners in chunk order, then the fine race inside
// the winning tile (on the residual, or on p if the residual is all zero).
// Returns -1 when the row has no token.
template <typename TL, typename TQ>
__device__ int64_t final_token(const RowDecision& d, const RacePair* race, int64_t C, const RaceSite<TL, TQ>& site,
                               int64_t V, float temperature, const RowRng& rng, uint32_t token_stream,
                               const Workspace& W) {
  if (d.status == RowStatus::kGreedy) return d.token;
  if (d.status != RowStatus::kSampled) return -1;
  // The C coarse winners: lane l merges entries l, l + 32, ..., then the butterfly.
  // merge_race is a total order (highest key, ties to the lowest tile; bad ORed),
  // so this equals the serial merge in chunk order, bit for bit.
  RacePair r = RacePair::empty();
  for (int64_t c = threadIdx.x & 31; c < C; c += 32) r = merge_race(r, race[c]);
  r = warp_reduce(r, RaceMerge{});
  return race_token(r, site, V, 1.0f / temperature, d.max_l, 1.0f / d.sum, d.cut, rng, token_stream, W);
}


// The token_logprobs entry of the position a row decided on (RowDecision: its stats, cutoff
// and raw sum), which emitted `token` (core/logprob_math.h emitted_logprob): one element
// read, no pass over the row.
template <typename TL>
__device__ __forceinline__ float decision_logprob(const RowDecision& d, const TL* row, float t, int64_t token,
                                                  bool processed) {
  return emitted_logprob(processed, t == 0.0f, to_float(row[token]), d.max_l, stats_inv_t(t), d.cut, d.sum, d.sum1);
}


}  // namespace specdec::cuda
