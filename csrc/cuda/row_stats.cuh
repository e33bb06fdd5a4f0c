// Softmax statistics of a row position (framework-free CUDA): a stat block's max, first
// argmax, flags and canonical tile-tree sum (stat_block, one warp per kStatBlock tokens),
// the merge of a row position's stat blocks (merge_stat_blocks / merge_row_stats) and the
// inverse temperature the stats use.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../core/verify_math.h"
#include "block_reduce.cuh"
#include "launch_plan.h"
#include "tile_stats.cuh"
#include "token_load.cuh"

namespace specdec::cuda {

static_assert(kStatBlock % kRaceTile == 0, "stat blocks hold whole race tiles");


// Softmax statistics of a set of tokens (verify_math.h: max of the RAW logits,
// sum of exp((l - max) * inv_t)) plus the first argmax.
// ChunkStats::flags
constexpr int kBadLogit = 1;   // a NaN or +inf logit was seen: the row is invalid
constexpr int kHugeLogit = 2;  // a finite logit has |l| >= 2^127 (merge_row_stats)

struct ChunkStats {
  float max;    // max logit over the finite and -inf logits (-inf if none)
  float sum;    // sum of shifted_exp(l, max, inv_t)
  float sum1;   // raw token_logprobs only (else 0): sum of shifted_exp(l, max, 1) over every logit
  int flags;    // kBadLogit | kHugeLogit
  int64_t arg;  // first index of the max

  __device__ __forceinline__ ChunkStats shfl(int m) const {
    return ChunkStats{shfl_xor(max, m), shfl_xor(sum, m), shfl_xor(sum1, m), shfl_xor(flags, m), shfl_xor(arg, m)};
  }
  __device__ __forceinline__ ChunkStats from_lane(int src) const {
    return ChunkStats{shfl_from(max, src), shfl_from(sum, src), shfl_from(sum1, src), shfl_from(flags, src),
                      shfl_from(arg, src)};
  }
  __device__ static ChunkStats empty() { return ChunkStats{-kInf, 0.0f, 0.0f, 0, INT64_MAX}; }
  __device__ __forceinline__ bool bad() const { return (flags & kBadLogit) != 0; }
};

__device__ __forceinline__ ChunkStats merge_stats(const ChunkStats& a, const ChunkStats& b, float inv_t) {
  const SoftmaxStats s = stats_merge(SoftmaxStats{a.max, a.sum}, SoftmaxStats{b.max, b.sum}, inv_t);
  const SoftmaxStats s1 = stats_merge(SoftmaxStats{a.max, a.sum1}, SoftmaxStats{b.max, b.sum1}, 1.0f);
  const bool take_b = b.max > a.max || (b.max == a.max && b.arg < a.arg);
  return ChunkStats{s.max, s.sum, s1.sum, a.flags | b.flags, take_b ? b.arg : a.arg};
}

struct StatsMerge {
  float inv_t;
  __device__ ChunkStats operator()(const ChunkStats& a, const ChunkStats& b) const { return merge_stats(a, b, inv_t); }
};

// Max, first argmax and flags of a lane's tokens (MaxArg with the flags ORed).
struct MaxArgFlags {
  float m;
  int flags;
  int64_t arg;
  __device__ __forceinline__ MaxArgFlags shfl(int k) const {
    return MaxArgFlags{shfl_xor(m, k), shfl_xor(flags, k), shfl_xor(arg, k)};
  }
};
struct MaxArgFlagsMerge {
  __device__ MaxArgFlags operator()(const MaxArgFlags& a, const MaxArgFlags& b) const {
    const bool take_b = b.m > a.m || (b.m == a.m && b.arg < a.arg);
    return MaxArgFlags{take_b ? b.m : a.m, a.flags | b.flags, take_b ? b.arg : a.arg};
  }
};

// The node of a stat block's 8 race tiles (tile_stats.cuh: the canonical tile pairs merged in
// the dyadic tree), from the lane's N * W tokens as stat_block holds them (NaN / +inf already
// -inf). fp32 (W = 4): the tokens of vector j of every lane are tile j; 16-bit (W = 8):
// vector j of lanes 0-15 is tile 2j, of lanes 16-31 tile 2j + 1. Warp-wide.
template <int N, int W>
__device__ __forceinline__ TileStats stat_block_node(const float* x, float inv_t, float cut, bool want_sum,
                                                      bool want_raw) {
  const TileMerge merge{inv_t, want_raw};
  constexpr int kPerLevel = W == 4 ? 1 : 2;  // tiles per step j
  constexpr int kLevels = (W == 4 ? 3 : 2);  // levels above the steps' nodes: 8 = 2^3 tiles, 4 = 2^2 pairs
  TileStats pending[kLevels];
  TileStats node = TileStats::empty();
#pragma unroll
  for (int j = 0; j < N; ++j) {
    TileStats v;
    if constexpr (kPerLevel == 1) {
      v = tile_stats<W, 32>(x + j * W, cut, inv_t, want_sum, want_raw);
    } else {
      const TileStats t = tile_stats<W, 16>(x + j * W, cut, inv_t, want_sum, want_raw);
      v = merge(t, t.shfl(16));  // tiles 2j and 2j + 1 (merge commutes: both halves get the node)
    }
#pragma unroll
    for (int d = 0; d < kLevels; ++d) {  // j is a compile-time constant: no run-time index
      if (!((j >> d) & 1)) {
        pending[d] = v;
        break;
      }
      v = merge(pending[d], v);
    }
    if (j == N - 1) node = v;
  }
  return node;
}

// Stats of stat block `blk` of one row (warp-wide; every lane gets the result).
// Lane l owns vectors j * 32 + l (j < N) of 16 / sizeof(T) tokens: all its loads
// are issued before the first use. Then, per lane, in increasing token order:
// NaN / +inf -> bad (and no mass), -inf -> masked; max of the raw logits with the
// first index of the max (the warp merges those by a butterfly); the sum is the canonical
// node of the block's tiles (stat_block_node). vec: 16-byte loads (the launcher checked
// alignment and V % (16 / sizeof(T)) == 0); else scalar loads of the same tokens.
// cut: the position's filter cutoff (-inf = none): logits below it weigh 0 in the sum
// (filtered_logit); the max and argmax are those of the raw logits (the max survives).
// want_raw (raw token_logprobs): sum1, the raw law's sum, in the same loop over the values
// in registers (the sum itself when inv_t == 1 and nothing is cut).
template <typename T>
__device__ __forceinline__ ChunkStats stat_block(const T* row, int64_t V, int64_t blk, float inv_t, bool want_sum,
                                                 bool vec, float cut, bool want_raw) {
  constexpr int W = 16 / sizeof(T);              // tokens per 16-byte vector
  constexpr int N = kStatBlock / (32 * W);       // vectors per lane: 8 (fp32), 4 (16-bit)
  static_assert(N * W * 32 == kStatBlock, "a stat block is whole vectors of every lane");
  static_assert(W * 32 == kRaceTile || W * 16 == kRaceTile, "a tile is one vector of 32 lanes or of 16");
  const int lane = threadIdx.x & 31;
  const int64_t base = blk * kStatBlock;
  float x[N * W];
  if (vec) {
    const uint4* p = reinterpret_cast<const uint4*>(row + base);
    uint4 raw[N];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      raw[j] = make_uint4(0u, 0u, 0u, 0u);
      if (base + static_cast<int64_t>(j * 32 + lane) * W < V) raw[j] = p[j * 32 + lane];
    }
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const bool in = base + static_cast<int64_t>(j * 32 + lane) * W < V;
#pragma unroll
      for (int k = 0; k < W; ++k) x[j * W + k] = in ? vec_elem<T>(raw[j], k) : -kInf;
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j)
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const int64_t v = base + static_cast<int64_t>(j * 32 + lane) * W + k;
        x[j * W + k] = v < V ? to_float(row[v]) : -kInf;  // out of range = masked: no mass, never the max
      }
  }
  int flags = 0, arg = -1;
  float m = -kInf;
#pragma unroll
  for (int k = 0; k < N * W; ++k) {
    float xk = x[k];
    if (xk != xk || xk == kInf) {
      flags = kBadLogit;
      xk = -kInf;
    }
    if (xk != -kInf && fabsf(xk) >= 0x1p127f) flags |= kHugeLogit;
    x[k] = xk;
    if (xk > m) {  // strict: a tie keeps the earlier token
      m = xk;
      arg = k;
    }
  }
  const int64_t tok = arg < 0 ? INT64_MAX : base + static_cast<int64_t>((arg / W) * 32 + lane) * W + arg % W;
  const MaxArgFlags mf = warp_reduce(MaxArgFlags{m, flags, tok}, MaxArgFlagsMerge{});
  const TileStats node = stat_block_node<N, W>(x, inv_t, cut, want_sum, want_raw);
  return ChunkStats{mf.m, node.sum, node.sum1, mf.flags, mf.arg};
}

// Merge the stat blocks [0, nblk) of one row-position (warp-wide): the dyadic tree over the
// blocks (the tiles' tree one level up), as groups of 32 blocks merged by the ascending
// butterfly (missing blocks empty: an exact identity) and the groups' nodes in a
// WarpTreeStack.
__device__ __forceinline__ ChunkStats merge_stat_blocks(const ChunkStats* blocks, int64_t nblk, float inv_t) {
  const int lane = threadIdx.x & 31;
  WarpTreeStack<ChunkStats, StatsMerge> tree(StatsMerge{inv_t}, ChunkStats::empty());
  for (int64_t g = 0; g * 32 < nblk; ++g) {
    const int64_t k = g * 32 + lane;
    tree.push(warp_tree(k < nblk ? blocks[k] : ChunkStats::empty(), StatsMerge{inv_t}));
  }
  return tree.total(ChunkStats::empty());
}


// The merged stats of one row-position (warp-wide; every lane gets them): the tile tree of
// pairs (merge_stat_blocks), that is the documented s = sum exp((x - m) * inv_t)
// (verify_math.h) up to rounding, EXCEPT where x - m overflows float (logits more than
// FLT_MAX apart; it matters at T >~ 3e36): the formula then gives exp(-inf) = 0, a pair
// rescaled to the row max a positive term. That needs a finite logit with |l| >= 2^127
// (kHugeLogit): such a row-position takes s from the logits with the formula itself, per
// tile against the row max and the tiles in the same tree (huge_tile_sums; a shard computes
// the same), a rare, slower path (one warp reads the row once more, scalar loads), never
// taken for |logits| < 2^127.
template <typename T>
__device__ ChunkStats merge_row_stats(const ChunkStats* blocks, int64_t nblk, float inv_t, const T* row, int64_t V,
                                      float cut) {
  ChunkStats st = merge_stat_blocks(blocks, nblk, inv_t);
  if (st.flags == kHugeLogit && st.sum > 0.0f) {  // warp-uniform
    WarpTreeStack<SumPair, SumPairAdd> tree(SumPairAdd{}, SumPair{0.0f, 0.0f});
    const auto at = [row](int64_t v) { return to_float(row[v]); };
#pragma unroll 1
    for (int64_t t = 0; t * kRaceTile < V; ++t) tree.push(huge_tile_sums(at, t, 0, V, st.max, inv_t, cut));
    const SumPair s = tree.total(SumPair{0.0f, 0.0f});
    st.sum = s.s;
    if (st.sum1 > 0.0f) st.sum1 = s.s1;  // raw token_logprobs asked (sum1 is >= 1 then)
  }
  return st;
}


// Inverse temperature used by the stats of a row: 1 for greedy rows (and for
// an unusable T, whose row is invalid anyway).
__device__ __forceinline__ float stats_inv_t(float t) {
  return (t == 0.0f || !valid_temperature(t)) ? 1.0f : 1.0f / t;
}


}  // namespace specdec::cuda
