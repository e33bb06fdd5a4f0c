// The CUDA kernels' canonical softmax statistics: one (max, sum) pair per race tile
// (kRaceTile = 128 tokens), combined in core/tile_sum.h's tile tree. Framework-free.
//
// Why canonical: vocabulary-parallel verify (core/shard_math.h, shard_kernels.cuh) splits a
// row over P ranks at tile boundaries; for its tokens to be verify's on the gathered logits,
// bit for bit, every rank must be able to compute the tree nodes inside its shard and the
// combination must rebuild the single-device sum. So the single-device kernels take the sum
// in a fixed tree over tiles too:
//   * a tile's pair: the tile max (raw logits, NaN / +inf excluded) over the lanes that hold
//     it, then each lane's sum of shifted_exp(filtered logit, tile max) over its tokens in
//     token order, then the lanes' sums added by the ascending butterfly (masks 1, 2, 4, ...).
//     fp32: lane l holds the tokens 4l .. 4l+3 of the tile (32 lanes); 16-bit: 8l .. 8l+7 of
//     one half-warp (16 lanes). A shard computes its tiles with this same code.
//   * tiles, then stat blocks (8 tiles), merge in the dyadic tree (stats_merge: exact identity
//     (-inf, 0), commutative bit for bit, so a butterfly over lanes computes the tree nodes).
// A row-position with a finite logit of |l| >= 2^127 (kHugeLogit) takes its sum against the
// row max instead (huge_tile_sums), in the same tree of tiles.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../core/filter_math.h"
#include "../core/verify_math.h"
#include "block_reduce.cuh"

namespace specdec::cuda {

constexpr float kInf = __builtin_huge_valf();

__device__ __forceinline__ float shfl_from(float v, int src) { return __shfl_sync(0xffffffffu, v, src); }
__device__ __forceinline__ int shfl_from(int v, int src) { return __shfl_sync(0xffffffffu, v, src); }
__device__ __forceinline__ int64_t shfl_from(int64_t v, int src) {
  return static_cast<int64_t>(__shfl_sync(0xffffffffu, static_cast<long long>(v), src));
}

// (max, sum, sum1) of a set of tokens: the raw max, the sum of shifted_exp(filtered logit,
// max, 1 / T), and (raw token_logprobs only, else 0) the raw law's sum at T = 1.
struct TileStats {
  float max, sum, sum1;
  __device__ __forceinline__ TileStats shfl(int m) const {
    return TileStats{shfl_xor(max, m), shfl_xor(sum, m), shfl_xor(sum1, m)};
  }
  __device__ __forceinline__ TileStats from_lane(int src) const {
    return TileStats{shfl_from(max, src), shfl_from(sum, src), shfl_from(sum1, src)};
  }
  __device__ static TileStats empty() { return TileStats{-kInf, 0.0f, 0.0f}; }
};

struct TileMerge {
  float inv_t;
  bool raw;  // sum1 is merged too
  __device__ TileStats operator()(const TileStats& a, const TileStats& b) const {
    const SoftmaxStats s = stats_merge(SoftmaxStats{a.max, a.sum}, SoftmaxStats{b.max, b.sum}, inv_t);
    const float s1 = raw ? stats_merge(SoftmaxStats{a.max, a.sum1}, SoftmaxStats{b.max, b.sum1}, 1.0f).sum : 0.0f;
    return TileStats{s.max, s.sum, s1};
  }
};

// The pair of one tile held by groups of `Lanes` lanes (32: the warp, 16: each half-warp),
// N tokens per lane in x (NaN / +inf already replaced by -inf: they weigh nothing). cut: the
// filter cutoff (-inf: none). want_sum and want_raw are warp-uniform.
template <int N, int Lanes>
__device__ __forceinline__ TileStats tile_stats(const float* x, float cut, float inv_t, bool want_sum, bool want_raw) {
  float m = -kInf;
#pragma unroll
  for (int k = 0; k < N; ++k) m = fmaxf(m, x[k]);
#pragma unroll
  for (int mask = 1; mask < Lanes; mask <<= 1) m = fmaxf(m, shfl_xor(m, mask));
  float s = 0.0f, s1 = 0.0f;
  if (want_sum && m != -kInf) {
#pragma unroll
    for (int k = 0; k < N; ++k) s += shifted_exp(filtered_logit(x[k], cut), m, inv_t);
    if (want_raw && (inv_t != 1.0f || cut != -kInf)) {
#pragma unroll
      for (int k = 0; k < N; ++k) s1 += shifted_exp(x[k], m, 1.0f);
    } else if (want_raw) {
      s1 = s;
    }
  }
  if (want_sum)
#pragma unroll
    for (int mask = 1; mask < Lanes; mask <<= 1) s += shfl_xor(s, mask);
  if (want_raw)
#pragma unroll
    for (int mask = 1; mask < Lanes; mask <<= 1) s1 += shfl_xor(s1, mask);
  return TileStats{m, s, s1};
}

// The dyadic tree over the 32 lanes' values, lane order (ascending butterfly: the merge of
// masks 1, 2, 4, ... builds the level-1, 2, 3, ... nodes; every lane gets the root).
template <typename T, typename Merge>
__device__ __forceinline__ T warp_tree(T v, Merge merge) {
#pragma unroll
  for (int mask = 1; mask < 32; mask <<= 1) v = merge(v, v.shfl(mask));
  return v;
}

// core/tile_sum.h's TileTreeStack kept by a whole warp: the pending node of level d lives in
// lane d (no per-thread array, so no local memory). push() adds the next node of a fixed
// level (all lanes pass the same value); total() is the tree over every node pushed (the
// blocks left folded from the right, as TileTreeStack::total). Warp-uniform.
template <typename T, typename Merge>
struct WarpTreeStack {
  Merge merge;
  T acc;              // lane d: the pending node of level d (when bit d of count is set)
  uint32_t count = 0; // nodes pushed

  __device__ WarpTreeStack(Merge m, T empty) : merge(m), acc(empty) {}

  __device__ __forceinline__ void push(T node) {
    int d = 0;
    while ((count >> d) & 1u) {  // merges with its left siblings
      node = merge(acc.from_lane(d), node);
      ++d;
    }
    if ((threadIdx.x & 31) == d) acc = node;
    ++count;
  }
  __device__ __forceinline__ T total(T empty) const {
    T t = empty;
    for (int d = 0; d < 32; ++d)
      if ((count >> d) & 1u) t = merge(acc.from_lane(d), t);
    return t;
  }
};

// core/tile_sum.h's TileTreeStack (blocks of any level, started at any tile) kept by a whole
// warp: entry d of the stack lives in lane d (value and level), so no thread holds an array
// (which would be local memory). The same add_block / total as TileTreeStack, warp-uniform;
// depth <= 32, while a row's stack from tile 0 holds <= log2(tiles) + 1 <= 18 entries.
__device__ __forceinline__ SoftmaxStats shfl_value(const SoftmaxStats& v, int src) {
  return SoftmaxStats{shfl_from(v.max, src), shfl_from(v.sum, src)};
}
__device__ __forceinline__ float shfl_value(float v, int src) { return shfl_from(v, src); }

template <typename T, typename Merge>
struct WarpTileStack {
  Merge merge;
  T empty, value;  // lane d: entry d
  int level = 0;   // lane d: entry d's level
  int depth = 0;
  int64_t next;

  __device__ WarpTileStack(int64_t first_tile, Merge m, T e) : merge(m), empty(e), value(e), next(first_tile) {}

  __device__ __forceinline__ void add_block(T s, int L) {
    next += int64_t(1) << L;
    while (depth > 0 && shfl_from(level, depth - 1) == L && (next & ((int64_t(2) << L) - 1)) == 0) {
      s = merge(shfl_value(value, depth - 1), s);
      --depth;
      ++L;
    }
    if ((threadIdx.x & 31) == depth) {
      value = s;
      level = L;
    }
    ++depth;
  }
  __device__ __forceinline__ T total() const {
    if (depth == 0) return empty;
    T s = shfl_value(value, depth - 1);
    for (int d = depth - 2; d >= 0; --d) s = merge(shfl_value(value, d), s);
    return s;
  }
};

// Two sums carried together (huge_tile_sums: the law's sum and the raw law's).
struct SumPair {
  float s, s1;
  __device__ __forceinline__ SumPair shfl(int m) const { return SumPair{shfl_xor(s, m), shfl_xor(s1, m)}; }
  __device__ __forceinline__ SumPair from_lane(int src) const { return SumPair{shfl_from(s, src), shfl_from(s1, src)}; }
};
struct SumPairAdd {
  __device__ SumPair operator()(const SumPair& a, const SumPair& b) const { return SumPair{a.s + b.s, a.s1 + b.s1}; }
};

// The huge path's value of tile t (warp-wide): sum over the tile's tokens v in [lo, hi) of
// shifted_exp(filtered logit, row max m, 1 / T) (and of shifted_exp(logit, m, 1) as s1),
// lane l taking the tokens 128 t + 4 l .. + 3 in order (scalar loads), then the ascending
// butterfly. `at(v)` reads token v's logit as float.
template <typename At>
__device__ SumPair huge_tile_sums(At&& at, int64_t t, int64_t lo, int64_t hi, float m, float inv_t, float cut) {
  const int64_t v0 = t * kRaceTile + 4 * (threadIdx.x & 31);
  SumPair s{0.0f, 0.0f};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (v0 + k < lo || v0 + k >= hi) continue;
    const float x = at(v0 + k);
    s.s += shifted_exp(filtered_logit(x, cut), m, inv_t);
    s.s1 += shifted_exp(x, m, 1.0f);
  }
#pragma unroll
  for (int mask = 1; mask < 32; mask <<= 1) s = SumPairAdd{}(s, s.shfl(mask));
  return s;
}

}  // namespace specdec::cuda
