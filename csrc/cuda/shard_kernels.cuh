// CUDA kernels of the local steps of vocabulary-parallel verify / sample (core/shard_math.h,
// ShardPlan::pairs): the single-device kernels' own helpers (the canonical tile pairs of
// tile_stats.cuh, token_weights and the race keys of race.cuh, the filter passes of
// filter_stage.cuh) run on one shard [lo, hi) of the vocabulary, so that on tile-aligned
// shards every value a rank sends is the value the single-device kernel computes for the
// same tokens. No torch here; shard_launch.cuh launches them.
//
// shard_step_kernel: one 256-thread block per (row b, position i), grid-stride; every branch
// depends on (b, i) and the gathered outputs only, so it is block-uniform (barriers inside).
//   kMax    max (NaN when a NaN / +inf logit is seen), first argmax (global id), huge flag
//   filter  one radix pass: the block histogram of core/filter_math.h's reference pass (the
//           passes before it replayed from the gathered histograms: replay_cut)
//   kSums   the shard's cover of the tile tree, one (max, sum) pair per node (a node's tiles'
//           pairs pushed into a WarpTreeStack by one warp; a node of >= 8 parts split over the
//           8 warps, its 8 sub-nodes merged in their tree); on a huge row-position the
//           tiles' sums against the row max instead (huge_tile_sums); e_x and q(x) of the draft
//           the shard owns
//   kRaces  the coarse race over the shard's parts (a warp per part, chunk_coarse_race's keys)
//           and the fine race in the best part, for the residual and for p
// shard_finish_kernel: one warp per row, finish_shard_row (core/shard_math.h).
// What a single thread of the CPU kernels holds in arrays (the summed filter histograms, the
// tile-tree stacks of combine_sum) lives in shared memory (BlockHistograms) and across the
// lanes of a warp (WarpTileStack) here: no local memory.
//
// Global token ids: a part is a race tile cut at the shard bounds; lane l of a warp holds the
// tokens 128 t + 4 l .. + 3 of global tile t (16-bit stats: 128 t + 8 (l % 16) .. + 7), as the
// single-device kernels do, so the Philox keys (tile / part and token ids) are the global ones.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../core/filter_math.h"
#include "../core/rng.h"
#include "../core/shard_math.h"
#include "../core/verify_math.h"
#include "block_reduce.cuh"
#include "filter_stage.cuh"
#include "grid_loop.cuh"
#include "launch_plan.h"
#include "race.cuh"
#include "row_stats.cuh"
#include "shared_memory.cuh"
#include "tile_stats.cuh"
#include "token_load.cuh"

namespace specdec::cuda {

constexpr int kShardThreads = 256;
constexpr int kSplitLevels = 3;  // kSums: a cover node of >= 2^3 parts is split over the 8 warps
static_assert(kShardThreads / 32 == 1 << kSplitLevels, "one warp per sub-node");

// The shard [lo, hi) of one (row, position): its local row (local id = global id - lo).
template <typename T>
struct ShardRow {
  const T* row;
  int64_t lo, hi;
  bool vec;  // 16-byte loads: lo % kRaceTile == 0 and the local rows aligned (launcher)

  // The 4 tokens [v0, v0 + 4) (global ids, v0 a multiple of 4) as float; `fill` outside the shard.
  __device__ __forceinline__ void load4g(int64_t v0, float fill, float out[4]) const {
    if (v0 >= lo) {
      load4(row, v0 - lo, hi - lo, vec, fill, out);  // v0 - lo is a multiple of 4 when vec
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) out[k] = v0 + k >= lo && v0 + k < hi ? to_float(row[v0 + k - lo]) : fill;
    }
  }
  __device__ __forceinline__ float at(int64_t v) const { return to_float(row[v - lo]); }
  __device__ __forceinline__ int64_t first_tile() const { return lo / kRaceTile; }
  __device__ __forceinline__ int64_t part_start(int64_t t) const { return t * kRaceTile > lo ? t * kRaceTile : lo; }
};

// NaN / +inf -> -inf (they weigh nothing; stat_block does the same). N a compile-time constant:
// a run-time loop over x would index the registers and put x in local memory.
template <int N>
__device__ __forceinline__ void clean_bad(float* x) {
#pragma unroll
  for (int k = 0; k < N; ++k)
    if (bad_logit(x[k])) x[k] = -kInf;
}

// The canonical pairs (tile_stats.cuh) of the parts of global tiles t (a) and, for 16-bit,
// t + 1 (b: the other half-warp's tile; empty when t + 1 >= t_end; fp32: always empty),
// warp-wide, every lane gets both. Returned by value and inlined: outputs through references
// would live in local memory.
struct TwoPairs {
  TileStats a, b;
};
template <typename T>
__device__ __forceinline__ TwoPairs part_pairs(const ShardRow<T>& R, int64_t t, int64_t t_end, float inv_t, float cut) {
  const int lane = threadIdx.x & 31;
  if constexpr (sizeof(T) == 4) {
    float x[4];
    R.load4g(t * kRaceTile + 4 * lane, -kInf, x);
    clean_bad<4>(x);
    return TwoPairs{tile_stats<4, 32>(x, cut, inv_t, true, false), TileStats::empty()};
  } else {
    const int64_t tile = t + (lane >> 4);
    float x[8];
    const int64_t v0 = tile * kRaceTile + 8 * (lane & 15);
    if (tile < t_end) {
      R.load4g(v0, -kInf, x);
      R.load4g(v0 + 4, -kInf, x + 4);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) x[k] = -kInf;
    }
    clean_bad<8>(x);
    const TileStats p = tile_stats<8, 16>(x, cut, inv_t, true, false);
    return TwoPairs{p.from_lane(0), p.from_lane(16)};
  }
}

// The node of the parts [p, p + 2^L) of the shard (part indices local: 0 = the part of the
// shard's first tile), warp-wide: the parts' pairs in a WarpTreeStack, or on a huge row the
// parts' sums against the row max m (the pair's max is then m).
template <typename T>
__device__ __forceinline__ TileStats cover_node(const ShardRow<T>& R, int64_t p, int L, float inv_t, float m, float cut, bool huge) {
  const int64_t t0 = R.first_tile() + p, t_end = t0 + (int64_t(1) << L);
  if (huge) {
    WarpTreeStack<SumPair, SumPairAdd> tree(SumPairAdd{}, SumPair{0.0f, 0.0f});
    const auto at = [&R](int64_t v) { return R.at(v); };
    for (int64_t t = t0; t < t_end; ++t) tree.push(huge_tile_sums(at, t, R.lo, R.hi, m, inv_t, cut));
    return TileStats{m, tree.total(SumPair{0.0f, 0.0f}).s, 0.0f};
  }
  WarpTreeStack<TileStats, TileMerge> tree(TileMerge{inv_t, false}, TileStats::empty());
  for (int64_t t = t0; t < t_end; t += (sizeof(T) == 4 ? 1 : 2)) {
    const TwoPairs two = part_pairs(R, t, t_end, inv_t, cut);
    tree.push(two.a);
    if (sizeof(T) != 4 && t + 1 < t_end) tree.push(two.b);
  }
  return tree.total(TileStats::empty());
}

// A shard's best coarse entries and their fine winners (core/shard_math.h ShardRace), block-wide.
struct ShardRaceParams {
  QMode q_mode;
  int64_t draft;  // global id (kOneHot), -1 if none
  float inv_t, max_l, inv_s, cut;
  RowRng rng;
  uint32_t tile_stream, part_stream, token_stream, position;
};

// The fine race (warp-wide) inside the part of global tile t: argmax weight_v / E_v over the
// part's tokens of positive weight (warp_fine_race's keys, global token ids); -1 if none.
template <typename T, typename TQ>
__device__ __forceinline__ int64_t shard_fine_race(const ShardRow<T>& R, const ShardRow<TQ>& Q,
                                                   const ShardRaceParams& A, int64_t t, bool use_p) {
  const int64_t v0 = t * kRaceTile + 4 * (threadIdx.x & 31);
  float x[4], q[4] = {0.0f, 0.0f, 0.0f, 0.0f}, w[4], p[4];
  int bad = 0;
  R.load4g(v0, -kInf, x);
  if (Q.row) Q.load4g(v0, 0.0f, q);
  token_weights(x, q, A.q_mode, A.draft, v0, A.inv_t, A.max_l, A.inv_s, A.cut, w, p, bad);
  return warp_fine_winner(w, p, use_p, v0, R.lo, R.hi, A.rng, A.token_stream, A.position);
}

// The race of one (row, position) on the shard (block-wide): warps take the shard's parts,
// keys as chunk_coarse_race (W_t / E and P_t / E; E of the tile, or of the part when it starts
// inside a tile), the block's best (ties to the lower part), then warp 0's fine races.
template <typename T, typename TQ>
__device__ __forceinline__ ShardRace shard_race(const ShardRow<T>& R, const ShardRow<TQ>& Q, const ShardRaceParams& A,
                                                RacePair* scratch, ShardRace* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  float key = -1.0f, key_p = -1.0f;
  int64_t idx = INT64_MAX, idx_p = INT64_MAX;
  int bad = 0;
  const int64_t t_end = (R.hi + kRaceTile - 1) / kRaceTile;
  for (int64_t t = R.first_tile() + warp; t < t_end; t += warps) {
    const int64_t v0 = t * kRaceTile + 4 * lane, start = R.part_start(t);
    float x[4], q[4] = {0.0f, 0.0f, 0.0f, 0.0f}, w[4], p[4];
    R.load4g(v0, -kInf, x);
    if (Q.row) Q.load4g(v0, 0.0f, q);
    token_weights(x, q, A.q_mode, A.draft, v0, A.inv_t, A.max_l, A.inv_s, A.cut, w, p, bad);
    const float Wt = warp_sum((w[0] + w[1]) + (w[2] + w[3]));
    const float Pt = warp_sum((p[0] + p[1]) + (p[2] + p[3]));
    const float E = start == t * kRaceTile ? race_exponential(A.rng, A.tile_stream, A.position, t)
                                           : race_exponential(A.rng, A.part_stream, A.position, start);
    // parts come in increasing order: strictly greater keys win, ties keep the lower part
    if (Wt / E > key) { key = Wt / E; idx = start; }
    if (Pt / E > key_p) { key_p = Pt / E; idx_p = start; }
  }
  const RacePair best = block_reduce(RacePair{key, key_p, idx, idx_p, bad}, RaceMerge{}, scratch);
  if (warp == 0) {
    ShardRace r = shard_race_empty();
    r.bad_q = best.bad != 0;
    if (best.idx_p != INT64_MAX) {  // the shard has a part
      r.key_w = best.key;
      r.part_w = best.idx;
      r.token_w = shard_fine_race(R, Q, A, best.idx / kRaceTile, false);
      r.key_p = best.key_p;
      r.part_p = best.idx_p;
      r.token_p = shard_fine_race(R, Q, A, best.idx_p / kRaceTile, true);
    }
    if (lane == 0) *out = r;
  }
  __syncthreads();
  return *out;
}

// The filter histograms of a step summed over the shards (core/shard_math.h replay_cut_with),
// block-wide into shared memory: every thread of the block calls sum() (barriers inside).
struct BlockHistograms {
  uint32_t* count;  // [kRadixBins] shared
  uint64_t* mass;   // [kRadixBins] shared
  __device__ void sum(const ShardGathered& g, const ShardLayout& L, int s, int64_t b, int64_t i, bool masses) {
    __syncthreads();  // every thread has read the previous sum
    for (int d = threadIdx.x; d < kRadixBins; d += blockDim.x) {
      uint32_t c = 0;
      uint64_t m = 0;
      for (int64_t r = 0; r < L.P; ++r) {
        const int64_t* h = g.at_int(s, r, b, i);
        c += static_cast<uint32_t>(h[d]);
        if (masses) m += static_cast<uint64_t>(h[kRadixBins + d]);
      }
      count[d] = c;
      mass[d] = m;
    }
    __syncthreads();
  }
};

// The global sum of position i of row b (core/shard_math.h combine_sum) on warp-held stacks;
// warp-uniform (every lane gets it).
struct WarpSumOf {
  const ShardParams& S;
  int64_t b;
  __device__ float operator()(int64_t i, float inv_t) const {
    WarpTileStack<SoftmaxStats, PairMerge> pair(0, PairMerge{inv_t}, stats_empty());
    WarpTileStack<float, FloatAdd> sum(0, FloatAdd{}, 0.0f);
    return combine_sum_with(pair, sum, S.g, S.layout, b, i);
  }
};

template <typename TL, typename TQ>
__global__ void __launch_bounds__(kShardThreads, kMinBlocksPerSM) shard_step_kernel(ShardParams S, int vec_l, int vec_q) {
  SPECDEC_SHARED(uint32_t[kRadixBins], count);
  SPECDEC_SHARED(unsigned long long[kRadixBins], mass);
  SPECDEC_SHARED(MaxArgFlags[32], max_scratch);
  SPECDEC_SHARED(MinVal[32], min_scratch);
  SPECDEC_SHARED(RacePair[32], race_scratch);
  SPECDEC_SHARED(ShardRace, race_out);
  SPECDEC_SHARED(TileStats[1 << kSplitLevels], node_scratch);
  static_assert(sizeof(unsigned long long) == sizeof(uint64_t), "mass bins are read as uint64_t");
  BlockHistograms hist{count, reinterpret_cast<uint64_t*>(mass)};
  const VerifyParams& P = S.v;
  const int64_t K = P.K, lo = S.vocab_start(), hi = S.vocab_end();
  const ShardStep kind = S.g.plan.kind[S.step];
  const int64_t W = S.g.width[S.step];
  for (int64_t item = blockIdx.x; item < P.B * (K + 1); item += gridDim.x) {
    const int64_t b = item / (K + 1), i = item - b * (K + 1);
    const ShardRow<TL> R{static_cast<const TL*>(P.logits) + b * P.logits_stride_b + i * P.logits_stride_k, lo, hi,
                         vec_l != 0};
    if (kind == ShardStep::kMax) {  // local max and first argmax (global id) of the used positions, huge flag
      double* out = static_cast<double*>(S.out) + item * W;
      const float t = P.temperature.get(b);
      const int64_t n = P.drafts_of(b);
      MaxArgFlags mf{-kInf, 0, INT64_MAX};
      if (valid_temperature(t) && n >= 0 && n <= K && i <= n) {  // else finish says so
        for_each_token_at(R.row, hi - lo, R.vec, [&](int64_t v, float x) {
          if (bad_logit(x)) { mf.flags |= kBadLogit; return; }
          if (x != -kInf && fabsf(x) >= 0x1p127f) mf.flags |= kHugeLogit;
          if (x > mf.m || (x == mf.m && lo + v < mf.arg)) { mf.m = x; mf.arg = lo + v; }
        });
        mf = block_reduce(mf, MaxArgFlagsMerge{}, max_scratch);
      }
      if (threadIdx.x == 0) {
        store_max(out, (mf.flags & kBadLogit) ? __uint_as_float(0x7fc00000u) : mf.m,
                  mf.arg == INT64_MAX ? -1 : mf.arg);
        out[2] = (mf.flags & kHugeLogit) ? 1.0 : 0.0;
      }
      continue;
    }
    if (shard_step_is_int(kind)) {  // a filter pass
      int64_t* out = static_cast<int64_t*>(S.out) + item * W;
      const ShardRowPlan plan = plan_shard_row(S.g, S.layout, P, b, false, WarpSumOf{S, b});
      const FilterSpec f = P.filters.get(b);
      const bool topk = f.top_k > 0 && f.top_k < S.layout.vocab();
      const bool run = plan.valid && !plan.greedy && i < plan.usable &&
                       ((kind == ShardStep::kTopK && topk) || (kind == ShardStep::kTopP && f.top_p < 1.0f) ||
                        kind == ShardStep::kMinP);
      if (!run) {
        for (int64_t d = threadIdx.x; d < W; d += blockDim.x) out[d] = 0;
        continue;
      }
      float m;
      int64_t arg;
      combine_max(S.g, S.layout, b, i, m, arg);
      const ShardCutSearch c = replay_cut_with(hist, S.g, S.layout, b, i, f, S.step);
      if (kind == ShardStep::kMinP) {
        const float bound = f.min_p > 0.0f ? minp_bound_block(R.row, hi - lo, R.vec, m, plan.inv_t, f.min_p,
                                                               min_scratch)
                                           : m;
        if (threadIdx.x == 0) out[0] = order_key(bound);
        continue;
      }
      if (kind == ShardStep::kTopK) {
        topk_count_pass(R.row, hi - lo, R.vec, c.topk, count);
      } else {
        topp_mass_pass(R.row, hi - lo, R.vec, c.topp, c.topk_cut, m, plan.inv_t, count, mass);
      }
      for (int d = threadIdx.x; d < kRadixBins; d += blockDim.x) {
        out[d] = count[d];
        if (kind == ShardStep::kTopP) out[kRadixBins + d] = static_cast<int64_t>(mass[d]);
      }
      continue;
    }
    double* out = static_cast<double*>(S.out) + item * W;
    if (kind == ShardStep::kSums) {  // the cover of every position the walk may use, and the draft this shard owns
      for (int64_t d = threadIdx.x; d < W; d += blockDim.x) out[d] = 0.0;
      __syncthreads();
      const ShardRowPlan plan = plan_shard_row(S.g, S.layout, P, b, false, WarpSumOf{S, b});
      if (!plan.valid || plan.greedy || i >= plan.usable) continue;
      float m;
      int64_t arg;
      combine_max(S.g, S.layout, b, i, m, arg);
      const float cut = replay_cut_with(hist, S.g, S.layout, b, i, P.filters.get(b), S.g.plan.sums()).cut;
      const bool huge = combine_huge(S.g, S.layout, b, i);
      const int64_t parts = S.layout.part_count(S.rank), first = S.layout.first_part(S.rank);
      // the cover of the parts [first, first + parts) in the row's tree: node c at local part p.
      // A node of >= 8 parts: its 8 aligned sub-nodes, one per warp, merged in their tree (the
      // same nodes: on a huge row the pairs' maxes are all m and stats_merge adds the sums);
      // smaller nodes: one warp each, the warps in turn.
      const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
      const TileMerge merge{plan.inv_t, false};
      int64_t c = 0;
      for (int64_t p = 0; p < parts; ++c) {
        const int L = tile_cover_level(first + p, first + parts);
        if (L >= kSplitLevels) {  // block-uniform
          const int Ls = L - kSplitLevels;
          for (int w = warp; w < (1 << kSplitLevels); w += warps) {
            const TileStats sub = cover_node(R, p + (int64_t(w) << Ls), Ls, plan.inv_t, m, cut, huge);
            if (lane == 0) node_scratch[w] = sub;
          }
          __syncthreads();
          if (threadIdx.x == 0) {
            const TileStats node = merge(merge(merge(node_scratch[0], node_scratch[1]),
                                               merge(node_scratch[2], node_scratch[3])),
                                         merge(merge(node_scratch[4], node_scratch[5]),
                                               merge(node_scratch[6], node_scratch[7])));
            out[2 * c] = huge ? m : node.max;
            out[2 * c + 1] = node.sum;
          }
          __syncthreads();  // node_scratch is reused by the next big node
        } else if (c % warps == warp) {
          const TileStats node = cover_node(R, p, L, plan.inv_t, m, cut, huge);
          if (lane == 0) {
            out[2 * c] = node.max;
            out[2 * c + 1] = node.sum;
          }
        }
        p += int64_t(1) << L;
      }
      const int64_t* draft = P.draft_ids + b * K;
      if (threadIdx.x == 0 && !plan.coupled && i < plan.n && draft[i] >= lo && draft[i] < hi) {
        const TQ* probs = static_cast<const TQ*>(P.draft_probs);
        out[W - 2] = shifted_exp(filtered_logit(R.at(draft[i]), cut), m, plan.inv_t);
        out[W - 1] = probs ? to_float(probs[b * P.probs_stride_b + i * P.probs_stride_k + draft[i] - lo]) : 1.0f;
      }
      continue;
    }
    // kRaces (coupled: the target's own sample at every usable position; exact: at the stop j)
    if (threadIdx.x == 0) store_race(out, shard_race_empty());
    const ShardRowPlan plan = plan_shard_row(S.g, S.layout, P, b, true, WarpSumOf{S, b});
    if (!plan.valid || plan.greedy || (plan.coupled ? i >= plan.usable : i != plan.j)) continue;
    float m;
    int64_t arg;
    combine_max(S.g, S.layout, b, i, m, arg);
    const float sum = WarpSumOf{S, b}(i, plan.inv_t);
    const float cut = replay_cut_with(hist, S.g, S.layout, b, i, P.filters.get(b), S.g.plan.sums()).cut;
    const RowRng rng = make_row_rng(P.rnd, b);
    ShardRaceParams A{QMode::kNone, -1, plan.inv_t, m, 1.0f / sum, cut, rng, kStreamSampleTile,
                      kStreamSamplePart, kStreamSampleRace, 0};
    const bool dense = P.draft_probs != nullptr && !plan.coupled;
    ShardRow<TQ> Q{nullptr, lo, hi, vec_q != 0};
    if (plan.coupled) {
      A.rng = rng.advanced(static_cast<uint64_t>(i));
    } else {
      A.q_mode = q_mode_at(i, plan.n, dense);
      A.draft = i < plan.n ? P.draft_ids[b * K + i] : -1;
      A.tile_stream = kStreamVerifyTile;
      A.part_stream = kStreamVerifyPart;
      A.token_stream = kStreamVerifyRace;
      A.position = static_cast<uint32_t>(i);
      if (dense && i < plan.n) Q.row = static_cast<const TQ*>(P.draft_probs) + b * P.probs_stride_b + i * P.probs_stride_k;
    }
    const ShardRace r = shard_race(R, Q, A, race_scratch, &race_out);
    if (threadIdx.x == 0) store_race(out, r);
  }
}

// finish: the tokens of every row from the gathered outputs (one warp per row, lane 0 writes).
__global__ void __launch_bounds__(kShardThreads) shard_finish_kernel(ShardParams S) {
  for_each_row_per_warp(S.v.B, [&](int64_t b) { finish_shard_row(S, b, WarpSumOf{S, b}, (threadIdx.x & 31) == 0); });
}

}  // namespace specdec::cuda
