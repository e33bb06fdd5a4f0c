// CUDA kernels of specdec::verify and specdec::sample over raw pointers
// (no torch here; the launcher is sampling_cuda.cu).
//
// Three stages per call. Normally ONE cooperative launch runs them with grid-wide
// barriers between them; the launcher falls back to one launch per stage on the
// same stream (stage = 0, 1, 2) when a cooperative launch is not possible (see
// sampling_cuda.cu). Work items are spread over the grid with grid-stride loops,
// so any grid size gives the same results:
//
//   verify:  1. one WARP per (row b, position i, fixed 1024-token stat block):
//               softmax stats + argmax + a NaN/+inf flag         -> ws.stats
//            -- grid sync --
//            2. item (b, c): the block merges the row's stat blocks in a fixed
//               order (so every block, whatever C, gets bit-identical results),
//               tests all positions in parallel, takes the first stop j, then
//               runs the coarse race (verify_math.h) over the 128-token tiles
//               of chunk c of position j, one warp per tile    -> ws.race
//            -- grid sync --
//            3. one warp per row: merge the C coarse winners (lanes in parallel,
//               a total order), fine race inside the winning tile, write the outputs
//   sample:  1. stat blocks per row; sync; 2. coarse race per (b, c)
//            (+ probs_out); sync; 3. one warp per row: fine race
//
// Per-row num_drafts (verify): stage 1 skips positions after n_b, stage 2 tests
// positions 0..n_b (first stop j <= n_b, bonus race at n_b); an n_b outside
// [0, K] makes the row invalid. No extra launch.
//
// Filters (top-k / top-p / min-p, core/filter_math.h), only when a filter
// argument was given: filter_cutoff_kernel runs first (one more launch, one
// block per (row, position), grid-stride) and writes ONE logit cutoff per
// (row, position) to ws.cutoff: block max of the raw logits (pass 0), then up to
// 4 top-k counting passes, 4 top-p mass passes and 1 min-p pass (<= 10 reads of
// the position), with shared-memory histograms built by integer atomics (uint32
// counts, 2^-40 fixed-point uint64 masses), so the cutoff does not depend on the
// thread count or the order of the atomics and equals the CPU / reference one
// whenever the per-token exps agree. -inf (no cut) for greedy rows, unusable
// rows, positions after n_b and rows no filter can cut. The stages then read
// every logit of the softmax sum, the ratio test's e_x, the race weights and
// probs_out through filtered_logit(x, cut); the max (and the greedy argmax) is
// unchanged: the max always survives. Without filters ws.cutoff is null and the
// launches are exactly those of the unfiltered op.
//
// Coupled verify (VerifyParams::coupled): coupled_race_kernel runs the three
// sample stages over B * (K+1) virtual rows r = (b, i) (row b's rng advanced by
// i, the sample streams at position 0: specdec::sample at offset + i, filtered
// law included) into ws.coupled_y, skipping i > n_b; coupled_decide_kernel (one
// warp per row, one more launch) then accepts draft i iff it equals y[b, i] and
// emits y at the first mismatch or at n_b. draft_probs is not read.
//
// Launches per call (cooperative path / per-stage fallback):
//   verify, sample (no filter):     1 / 3
//   + filters:                      2 / 4   (filter_cutoff_kernel first)
//   coupled verify:                 2 / 4   (+ coupled_decide_kernel after)
//   coupled verify + filters:       3 / 5
//
// Stat blocks and race tiles are fixed in token space, so results do not depend
// on C, the grid size, the launch path or the GPU model (batch invariance).
// Inside a stat block lane l owns the 16-byte vectors l, l + 32, ... (8 of them
// for fp32, 4 for fp16 / bf16: 32 tokens per lane), loads them all before using
// any (several loads in flight), then folds its 32 values (max + first argmax,
// then sum of exp against the lane max) and the warp merges lanes by a fixed
// butterfly. The scalar path (unaligned rows, V not a multiple of the vector
// width) gives each lane the SAME tokens in the same order, so both paths give
// bit-identical stats. Nothing of size V is written to global memory except
// probs_out. Random numbers come from core/rng.h: the CPU and CUDA kernels draw
// identical numbers.
#pragma once
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../core/logprob_math.h"
#include "../core/prob_input.h"
#include "../core/rng.h"
#include "../core/sampling_params.h"
#include "../core/verify_math.h"
#include "block_reduce.cuh"
#include "launch_plan.h"
#include "shared_memory.cuh"
#include "tile_stats.cuh"

namespace specdec::cuda {

namespace cg = cooperative_groups;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(ProbAsLogit x) { return static_cast<float>(x); }  // log p

static_assert(kStatBlock % kRaceTile == 0, "stat blocks hold whole race tiles");

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// Word w (0..3) of a 16-byte vector; w is a compile-time constant after unrolling.
__device__ __forceinline__ uint32_t u4_word(const uint4& u, int w) {
  return w == 0 ? u.x : w == 1 ? u.y : w == 2 ? u.z : u.w;
}

// Element k of a vector of T held in a uint4 (16 / sizeof(T) elements), as float.
template <typename T>
__device__ __forceinline__ float vec_elem(const uint4& u, int k);
template <>
__device__ __forceinline__ float vec_elem<float>(const uint4& u, int k) { return __uint_as_float(u4_word(u, k)); }
template <>
__device__ __forceinline__ float vec_elem<__half>(const uint4& u, int k) {
  const uint32_t w = u4_word(u, k >> 1);
  return __half2float(__ushort_as_half(static_cast<unsigned short>((k & 1) ? (w >> 16) : (w & 0xffffu))));
}
template <>
__device__ __forceinline__ float vec_elem<__nv_bfloat16>(const uint4& u, int k) {
  const uint32_t w = u4_word(u, k >> 1);
  return __uint_as_float((k & 1) ? (w & 0xffff0000u) : (w << 16));  // bf16 -> fp32 is exact
}
template <>
__device__ __forceinline__ float vec_elem<ProbAsLogit>(const uint4& u, int k) {
  return to_float(ProbAsLogit{__uint_as_float(u4_word(u, k))});
}

// 4 consecutive elements of T [v0, v0 + 4) as float, v0 a multiple of 4; `fill`
// for tokens >= V. vec: one 16-byte (fp32) or 8-byte (16-bit) load, which needs
// the row 16-byte aligned and V a multiple of the 16-byte vector width (the
// launcher checks); else scalar loads. No data-dependent branch around the loads.
template <typename T>
__device__ __forceinline__ void load4(const T* p, int64_t v0, int64_t V, bool vec, float fill, float out[4]) {
  if (vec) {
    uint4 u = make_uint4(0u, 0u, 0u, 0u);
    const bool in = v0 < V;  // V % 4 == 0 here: the 4 tokens are all in range or all out
    if constexpr (sizeof(T) == 4) {
      if (in) u = *reinterpret_cast<const uint4*>(p + v0);
    } else {
      if (in) {
        const uint2 h = *reinterpret_cast<const uint2*>(p + v0);
        u.x = h.x;
        u.y = h.y;
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = in ? vec_elem<T>(u, k) : fill;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = v0 + k < V ? to_float(p[v0 + k]) : fill;
  }
}

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

// Weights of those 4 tokens: p = target probability, w = residual max(0, p - q)
// (QMode kNone: w = p; kOneHot: q one-hot at `draft`; kDense: the q row). Logits
// below the filter cutoff `cut` weigh 0 (inv_s is then 1 / the filtered sum).
__device__ __forceinline__ void token_weights(const float x[4], const float q[4], QMode q_mode, int64_t draft,
                                              int64_t v0, float inv_t, float max_l, float inv_s, float cut,
                                              float w[4], float p[4], int& bad) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float e = shifted_exp(filtered_logit(x[k], cut), max_l, inv_t);  // 0 for a token >= V (x = -inf)
    p[k] = e * inv_s;
    if (q_mode == QMode::kNone) {
      w[k] = p[k];
    } else if (q_mode == QMode::kOneHot) {
      w[k] = v0 + k == draft ? 0.0f : p[k];  // max(0, p - 1) = 0 at the draft
    } else {
      if (bad_prob(q[k])) bad = 1;
      w[k] = residual_weight(e, inv_s, q[k]);
    }
  }
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
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

// Coarse race over the tiles of chunk c (block-wide): one warp per tile of
// kRaceTile = 128 tokens, 4 per lane. Keys W_t / E_t (residual) and P_t / E_t
// (target). Optionally writes p to probs_out. The next tile's logits are loaded
// before the current tile is processed (two loads in flight per lane).
template <typename T, typename TQ>
__device__ RacePair chunk_coarse_race(const T* row, const TQ* q_row, QMode q_mode, int64_t draft, int64_t V,
                                      int64_t c, int64_t chunk_len, float inv_t, float max_l, float inv_s, float cut,
                                      const RowRng& rng, uint32_t tile_stream, uint32_t position,
                                      float* probs_out, const Workspace& W, RacePair* scratch) {
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
    token_weights(x, q, q_mode, draft, v0, inv_t, max_l, inv_s, cut, w, p, bad);
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

// Fine race (warp-wide) inside tile `tile`: token = argmax weight_v / E_v over
// tokens of positive weight; -1 if none (cannot happen for a tile the coarse
// race picked). Same value in every lane.
template <typename T, typename TQ>
__device__ int64_t warp_fine_race(const T* row, const TQ* q_row, QMode q_mode, int64_t draft, int64_t V, int64_t tile,
                                  bool use_p, float inv_t, float max_l, float inv_s, float cut, const RowRng& rng,
                                  uint32_t token_stream, uint32_t position, const Workspace& W) {
  const int64_t v0 = tile * kRaceTile + 4 * (threadIdx.x & 31);
  float x[4], q[4], w[4], p[4];
  int bad = 0;
  load_lane_tokens(row, q_row, v0, V, W.vec_logits != 0, W.vec_q != 0, x, q);
  token_weights(x, q, q_mode, draft, v0, inv_t, max_l, inv_s, cut, w, p, bad);
  return warp_fine_winner(w, p, use_p, v0, 0, V, rng, token_stream, position);
}

// ----------------------------------------------------------------------------
// verify
// ----------------------------------------------------------------------------

// Shared decision state of one row inside a block.
struct RowShared {
  int first_stop;    // min position whose test stops the chain (n_b: all accepted)
  int bad;           // row invalid regardless of j (NaN / +inf logit, draft id out of range)
  int stop_invalid;  // the stop at first_stop is an invalid one (unusable stats, bad q(x))
  float max_l, sum;  // merged stats of position first_stop
  float sum1;        // its raw law's sum (raw token_logprobs)
  float cut;         // its filter cutoff
  int64_t arg;       // its argmax
};

struct PositionTest {
  bool stop, invalid_stop, bad;
};

// The logits of position i of verify row b.
template <typename TL>
__device__ __forceinline__ const TL* position_row(const VerifyParams& P, int64_t b, int64_t i) {
  return static_cast<const TL*>(P.logits) + b * P.logits_stride_b + i * P.logits_stride_k;
}

// The merged stats of position i of verify row b (merge_row_stats).
template <typename TL>
__device__ __forceinline__ ChunkStats position_stats(const VerifyParams& P, const Workspace& W, int64_t b, int64_t i,
                                                     float inv_t) {
  const int64_t r = b * (P.K + 1) + i;
  return merge_row_stats(W.stats + r * W.stat_blocks, W.stat_blocks, inv_t, position_row<TL>(P, b, i), P.V,
                   cutoff_of(W, r));
}

// The test of position i <= n of a row that tests n drafts, given its merged
// stats (one thread): does the chain stop here, and does that stop make the row
// invalid? Position n is the bonus position: it always stops (no test).
template <typename TL, typename TQ>
__device__ PositionTest test_position(const VerifyParams& P, const Workspace& W, int64_t b, int64_t i, int64_t n,
                                      const ChunkStats& st, float inv_t, bool greedy, const RowRng& rng) {
  const int64_t K = P.K, V = P.V;
  PositionTest r{i == n, false, st.bad()};
  int64_t x = -1;
  if (i < n) {
    x = P.draft_ids[b * K + i];
    if (x < 0 || x >= V) {  // checked at every tested position, like the CPU
      r.bad = r.stop = r.invalid_stop = true;
      return r;
    }
  }
  if (!usable_max(st.max)) {
    r.stop = r.invalid_stop = true;
    return r;
  }
  if (i == n) return r;
  if (greedy) {
    r.stop = x != st.arg;
    return r;
  }
  const float q_x = P.draft_probs
      ? to_float(static_cast<const TQ*>(P.draft_probs)[b * P.probs_stride_b + i * P.probs_stride_k + x])
      : 1.0f;
  if (bad_prob(q_x)) {
    r.stop = r.invalid_stop = true;
    return r;
  }
  const TL* row = position_row<TL>(P, b, i);
  // the filtered p(x): 0 when x is below the cutoff, so such a draft is always rejected
  const float e_x = shifted_exp(filtered_logit(to_float(row[x]), cutoff_of(W, b * (K + 1) + i)), st.max, inv_t);
  r.stop = !ratio_test_accepts(accept_uniform(rng, static_cast<uint32_t>(i)), q_x, st.sum, e_x);
  return r;
}

// Stage 2a (block-wide): one warp per position 0..n merges its stat blocks and
// tests it; the chain stops at the first position whose test stops it (n if none).
// write_logprobs (raw / processed token_logprobs asked, and this block handles chunk 0): the
// warp that tests position i < n also writes the logprob of draft i there from the stats it
// just merged (verify_output_stage then keeps the accepted ones, i < j, and NaNs the rest).
template <typename TL, typename TQ>
__device__ void decide_row(const VerifyParams& P, const Workspace& W, int64_t b, int64_t n, float inv_t, bool greedy,
                           const RowRng& rng, RowShared& sh, bool write_logprobs) {
  const int64_t K = P.K;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (threadIdx.x == 0) {
    sh.first_stop = static_cast<int>(n);
    sh.bad = 0;
  }
  __syncthreads();
  for (int64_t i = warp; i <= n; i += warps) {
    const ChunkStats st = position_stats<TL>(P, W, b, i, inv_t);
    if (lane == 0) {
      const PositionTest r = test_position<TL, TQ>(P, W, b, i, n, st, inv_t, greedy, rng);
      if (r.bad) atomicOr(&sh.bad, 1);
      if (r.stop) atomicMin(&sh.first_stop, static_cast<int>(i));
      const int64_t x = i < n ? P.draft_ids[b * K + i] : -1;
      if (write_logprobs && x >= 0 && x < P.V)
        P.logprobs.out[b * (K + 1) + i] =
            emitted_logprob(P.logprobs.processed, greedy, to_float(position_row<TL>(P, b, i)[x]), st.max, inv_t,
                            greedy ? -kInf : cutoff_of(W, b * (K + 1) + i), st.sum, st.sum1);
    }
  }
  __syncthreads();
  const int64_t j = sh.first_stop;
  if (warp == 0) {  // publish the stats of the stop position
    const ChunkStats st = position_stats<TL>(P, W, b, j, inv_t);
    if (lane == 0) {
      const PositionTest r = test_position<TL, TQ>(P, W, b, j, n, st, inv_t, greedy, rng);
      sh.stop_invalid = r.invalid_stop;
      sh.max_l = st.max;
      sh.sum = st.sum;
      sh.sum1 = st.sum1;
      sh.cut = greedy ? -kInf : cutoff_of(W, b * (K + 1) + j);
      sh.arg = st.arg;
    }
  }
  __syncthreads();
}

// ----------------------------------------------------------------------------
// Stages shared by both kernels
// ----------------------------------------------------------------------------

// Inverse temperature used by the stats of a row: 1 for greedy rows (and for
// an unusable T, whose row is invalid anyway).
__device__ __forceinline__ float stats_inv_t(float t) {
  return (t == 0.0f || !valid_temperature(t)) ? 1.0f : 1.0f / t;
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

// The race site of verify row b stopped at j, testing n drafts (j == n: the bonus, no q).
template <typename TL, typename TQ>
__device__ __forceinline__ RaceSite<TL, TQ> verify_site(const VerifyParams& P, int64_t b, int64_t j, int64_t n) {
  const QMode q_mode = q_mode_at(j, n, P.draft_probs != nullptr);
  return RaceSite<TL, TQ>{
      static_cast<const TL*>(P.logits) + b * P.logits_stride_b + j * P.logits_stride_k,
      q_mode == QMode::kDense ? static_cast<const TQ*>(P.draft_probs) + b * P.probs_stride_b + j * P.probs_stride_k
                              : nullptr,
      q_mode, j < n ? P.draft_ids[b * P.K + j] : -1, static_cast<uint32_t>(j)};
}

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
  const bool use_p = !(r.key > 0.0f);
  const int64_t tile = use_p ? r.idx_p : r.idx;
  const int64_t ntiles = (V + kRaceTile - 1) / kRaceTile;
  if (r.bad || tile < 0 || tile >= ntiles) return -1;
  const int64_t token = warp_fine_race(site.row, site.q_row, site.q_mode, site.draft, V, tile, use_p,
                                       1.0f / temperature, d.max_l, 1.0f / d.sum, d.cut, rng, token_stream,
                                       site.position, W);
  return (token >= 0 && token < V) ? token : -1;
}

// The token_logprobs entry of the position a row decided on (RowDecision: its stats, cutoff
// and raw sum), which emitted `token` (core/logprob_math.h emitted_logprob): one element
// read, no pass over the row.
template <typename TL>
__device__ __forceinline__ float decision_logprob(const RowDecision& d, const TL* row, float t, int64_t token,
                                                  bool processed) {
  return emitted_logprob(processed, t == 0.0f, to_float(row[token]), d.max_l, stats_inv_t(t), d.cut, d.sum, d.sum1);
}

// Coupled verify's token_logprobs row b (warp-wide; no stage merged its positions' stats):
// positions 0..j emitted draft_ids[0..j) and then `token` (valid rows), NaN elsewhere. Each
// position's stat blocks are merged as the sample stages merged them.
template <typename TL>
__device__ void write_coupled_logprobs(const VerifyParams& P, const Workspace& W, int64_t b, int64_t j,
                                       int64_t token, bool valid) {
  const int64_t K = P.K;
  float* out = P.logprobs.out + b * (K + 1);
  const float t = P.temperature.get(b), inv_t = stats_inv_t(t);
  for (int64_t i = 0; i <= K; ++i) {  // warp-uniform bounds
    float lp = __uint_as_float(0x7fc00000u);  // NaN
    if (valid && i <= j) {
      const int64_t r = b * (K + 1) + i;
      const TL* row = static_cast<const TL*>(P.logits) + b * P.logits_stride_b + i * P.logits_stride_k;
      const float cut = t == 0.0f ? -kInf : cutoff_of(W, r);
      const ChunkStats st = merge_row_stats(W.stats + r * W.stat_blocks, W.stat_blocks, inv_t, row, P.V, cut);
      const int64_t x = i < j ? P.draft_ids[b * K + i] : token;
      lp = emitted_logprob(P.logprobs.processed, t == 0.0f, to_float(row[x]), st.max, inv_t, cut, st.sum, st.sum1);
    }
    if ((threadIdx.x & 31) == 0) out[i] = lp;
  }
}

// Calls fn(b) for rows b = global warp index, + total warps, ... (one warp per row).
template <typename Fn>
__device__ __forceinline__ void for_each_row_per_warp(int64_t B, Fn&& fn) {
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); b < B;
       b += warps_total)
    fn(b);
}

// ----------------------------------------------------------------------------
// verify
// ----------------------------------------------------------------------------

// Stage 2: item (b, c): the block decides row b (decide_row: merged stats,
// positions 0..n_b tested, first stop j), then runs the coarse race over the
// tiles of chunk c of position j. The block of chunk 0 publishes the decision.
template <typename TL, typename TQ>
__device__ void verify_decide_stage(const VerifyParams& P, const Workspace& W, RowShared& row,
                                    RacePair* race_scratch) {
  const int64_t C = W.chunks;
  for (int64_t item = blockIdx.x; item < P.B * C; item += gridDim.x) {
    const int64_t b = item / C, c = item % C;
    const float t = P.temperature.get(b);
    const int64_t n = P.drafts_of(b);
    // block-uniform: a device tensor's bad temperature / filter / n_b makes the row invalid
    const bool t_ok = valid_temperature(t) && valid_filter(P.filters.get(b)) && n >= 0 && n <= P.K;
    const bool greedy = t == 0.0f;
    const float inv_t = stats_inv_t(t);
    const RowRng rng = make_row_rng(P.rnd, b);
    if (t_ok) {
      decide_row<TL, TQ>(P, W, b, n, inv_t, greedy, rng, row, P.logprobs.out != nullptr && c == 0);
    } else {
      if (threadIdx.x == 0) row = RowShared{0, 1, 1, 0.0f, 0.0f, 0.0f, -kInf, 0};
      __syncthreads();
    }
    const bool valid = t_ok && !row.bad && !row.stop_invalid;
    const int64_t j = row.first_stop;
    RacePair rp = RacePair::empty();
    if (valid && !greedy) {
      const RaceSite<TL, TQ> site = verify_site<TL, TQ>(P, b, j, n);
      rp = chunk_coarse_race(site.row, site.q_row, site.q_mode, site.draft, P.V, c, W.chunk_len, inv_t, row.max_l,
                             1.0f / row.sum, row.cut, rng, kStreamVerifyTile, site.position,
                             static_cast<float*>(nullptr), W, race_scratch);
    }
    if (threadIdx.x == 0) {
      W.race[item] = rp;
      if (c == 0)
        W.rows[b] = RowDecision{j, row.arg, row.max_l, row.sum, row.sum1,
                                valid ? (greedy ? RowStatus::kGreedy : RowStatus::kSampled) : RowStatus::kInvalid,
                                row.cut};
    }
    __syncthreads();  // `row` is reused by the next item
  }
}

// Stage 3: one warp per row: its token, then lane 0 writes the outputs. n_b is
// only read for a decided (valid) row, where it is in [0, K].
template <typename TL, typename TQ>
__device__ void verify_output_stage(const VerifyParams& P, const Workspace& W) {
  const int64_t K = P.K;
  for_each_row_per_warp(P.B, [&](int64_t b) {
    const RowDecision d = W.rows[b];
    const int64_t n = d.status == RowStatus::kSampled ? P.drafts_of(b) : K;
    const int64_t token = final_token(d, W.race + b * W.chunks, W.chunks, verify_site<TL, TQ>(P, b, d.j, n), P.V,
                                      P.temperature.get(b), make_row_rng(P.rnd, b), kStreamVerifyRace, W);
    if ((threadIdx.x & 31) == 0) {
      const bool valid = token >= 0;
      int64_t* out = P.tokens + b * (K + 1);
      for (int64_t i = 0; i <= K; ++i) out[i] = !valid ? -1 : i < d.j ? P.draft_ids[b * K + i] : i == d.j ? token : -1;
      P.num_accepted[b] = valid ? d.j : 0;
      P.valid[b] = valid;
      if (P.logprobs.out) {  // accepted drafts (i < j): written by decide_row; the token at j from d
        float* lp = P.logprobs.out + b * (K + 1);
        for (int64_t i = valid ? d.j : 0; i <= K; ++i)
          lp[i] = valid && i == d.j ? decision_logprob(d, position_row<TL>(P, b, d.j), P.temperature.get(b), token,
                                                       P.logprobs.processed)
                                    : __uint_as_float(0x7fc00000u);
      }
    }
  });
}

// stage == kAllStages: a cooperative launch runs the three stages with grid syncs;
// else one stage per launch (0, 1, 2 in stream order). Same work either way.
// With filters, filter_cutoff_kernel ran before (W.cutoff).
template <typename TL, typename TQ>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM) verify_kernel(VerifyParams P, Workspace W,
                                                                                int stage) {
  SPECDEC_SHARED(RacePair[32], race_scratch);
  SPECDEC_SHARED(RowShared, row);
  const bool all = stage == kAllStages;
  if (all || stage == 0)
    stats_stage<TL>(P.logits, P.logits_stride_b, P.logits_stride_k, P.K + 1, P.temperature, P.num_drafts,
                    P.num_drafts_stride, P.B, P.V, W, P.logprobs.raw());
  if (all) cg::this_grid().sync();
  if (all || stage == 1) verify_decide_stage<TL, TQ>(P, W, row, race_scratch);
  if (all) cg::this_grid().sync();
  if (all || stage == 2) verify_output_stage<TL, TQ>(P, W);
}

// ----------------------------------------------------------------------------
// sample, and the per-position samples of coupled verify
// ----------------------------------------------------------------------------

// The rows the sample stages run on. SampleRows: specdec::sample's B rows.
// CoupledRows: coupled verify's B * (K+1) virtual rows, r = b * (K+1) + i = the
// target's own sample at position i of row b (row b's rng advanced by i, the
// sample streams at position 0: exactly specdec::sample at offset + i); rows
// with i > n_b (or an unusable n_b / filter) are invalid and never read.
// Both index the stats, cutoffs and race workspace by r.
template <typename TL>
struct SampleRows {
  const SampleParams& P;
  __device__ __forceinline__ int64_t count() const { return P.B; }
  __device__ __forceinline__ float temperature(int64_t r) const { return P.temperature.get(r); }
  __device__ __forceinline__ bool usable(int64_t r) const { return valid_filter(P.filters.get(r)); }
  __device__ __forceinline__ const TL* row(int64_t r) const {
    return static_cast<const TL*>(P.logits) + r * P.logits_stride_b;
  }
  __device__ __forceinline__ RowRng rng(int64_t r) const { return make_row_rng(P.rnd, r); }
  __device__ __forceinline__ float* probs(int64_t r) const {
    return P.probs_out ? P.probs_out + r * P.probs_stride_b : nullptr;
  }
  __device__ __forceinline__ void put(int64_t r, int64_t token) const { P.tokens[r] = token; }
  // by value: a pointer into the kernel's parameter struct would make the compiler copy the
  // whole struct to local memory
  __device__ __forceinline__ EmittedLogprobs logprobs() const { return P.logprobs; }
};

template <typename TL>
struct CoupledRows {
  const VerifyParams& P;
  int64_t* y;  // [B, K+1]
  __device__ __forceinline__ int64_t count() const { return P.B * (P.K + 1); }
  __device__ __forceinline__ float temperature(int64_t r) const { return P.temperature.get(r / (P.K + 1)); }
  __device__ __forceinline__ bool usable(int64_t r) const {
    const int64_t b = r / (P.K + 1), i = r - b * (P.K + 1), n = P.drafts_of(b);
    return valid_filter(P.filters.get(b)) && n >= 0 && n <= P.K && i <= n;
  }
  __device__ __forceinline__ const TL* row(int64_t r) const {
    const int64_t b = r / (P.K + 1), i = r - b * (P.K + 1);
    return static_cast<const TL*>(P.logits) + b * P.logits_stride_b + i * P.logits_stride_k;
  }
  __device__ __forceinline__ RowRng rng(int64_t r) const {
    const int64_t b = r / (P.K + 1);
    return make_row_rng(P.rnd, b).advanced(static_cast<uint64_t>(r - b * (P.K + 1)));
  }
  __device__ __forceinline__ float* probs(int64_t) const { return nullptr; }
  __device__ __forceinline__ void put(int64_t r, int64_t token) const { y[r] = token; }
  // coupled verify writes its token_logprobs in coupled_decide_kernel (only it knows j)
  __device__ __forceinline__ EmittedLogprobs logprobs() const { return EmittedLogprobs{}; }
};

// Stage 2: item (r, c): merged stats of row r, then the coarse race over chunk c
// (writing p to probs_out), or the one-hot / zero probs_out of a greedy / invalid row.
template <typename TL, typename Rows>
__device__ void sample_decide_stage(const Rows& R, int64_t V, const Workspace& W, ChunkStats& row_stats,
                                    RacePair* race_scratch) {
  const int64_t C = W.chunks, NB = W.stat_blocks;
  for (int64_t item = blockIdx.x; item < R.count() * C; item += gridDim.x) {
    const int64_t r = item / C, c = item % C;
    const float t = R.temperature(r);
    const bool greedy = t == 0.0f;
    if ((threadIdx.x >> 5) == 0) {
      const ChunkStats st = merge_row_stats(W.stats + r * NB, NB, stats_inv_t(t), R.row(r), V, cutoff_of(W, r));
      if (threadIdx.x == 0) row_stats = st;
    }
    __syncthreads();
    const ChunkStats st = row_stats;
    const bool valid = valid_temperature(t) && R.usable(r) && !st.bad() && usable_max(st.max);
    float* probs = R.probs(r);
    const int64_t begin = c * W.chunk_len, end = imin(V, begin + W.chunk_len);
    const float cut = valid && !greedy ? cutoff_of(W, r) : -kInf;
    RacePair rp = RacePair::empty();
    if (valid && !greedy) {
      rp = chunk_coarse_race(R.row(r), static_cast<const float*>(nullptr), QMode::kNone, -1, V, c, W.chunk_len,
                             1.0f / t, st.max, 1.0f / st.sum, cut, R.rng(r), kStreamSampleTile, 0u, probs, W,
                             race_scratch);
    } else if (probs) {
      for (int64_t v = begin + threadIdx.x; v < end; v += blockDim.x)
        probs[v] = (valid && v == st.arg) ? 1.0f : 0.0f;
    }
    if (threadIdx.x == 0) {
      rp.bad = !valid;
      W.race[item] = rp;
      if (c == 0)
        W.rows[r] = RowDecision{0, st.arg, st.max, st.sum, st.sum1,
                                valid ? (greedy ? RowStatus::kGreedy : RowStatus::kSampled) : RowStatus::kInvalid,
                                cut};
    }
    __syncthreads();  // row_stats is reused by the next item
  }
}

// Stage 3: one warp per row: the fine race, lane 0 writes the token (-1: invalid).
template <typename TL, typename Rows>
__device__ void sample_output_stage(const Rows& R, int64_t V, const Workspace& W) {
  for_each_row_per_warp(R.count(), [&](int64_t r) {
    const RaceSite<TL, float> site{R.row(r), nullptr, QMode::kNone, -1, 0u};
    const int64_t token = final_token(W.rows[r], W.race + r * W.chunks, W.chunks, site, V, R.temperature(r),
                                      R.rng(r), kStreamSampleRace, W);
    if ((threadIdx.x & 31) == 0) R.put(r, token);
    const EmittedLogprobs L = R.logprobs();  // sample's token_logprobs
    if (L.out && (threadIdx.x & 31) == 0)
      L.out[r] = token >= 0 ? decision_logprob(W.rows[r], R.row(r), R.temperature(r), token, L.processed)
                            : __uint_as_float(0x7fc00000u);
  });
}

template <typename TL>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM) sample_kernel(SampleParams P, Workspace W,
                                                                                int stage) {
  SPECDEC_SHARED(RacePair[32], race_scratch);
  SPECDEC_SHARED(ChunkStats, row_stats);
  const SampleRows<TL> R{P};
  const bool all = stage == kAllStages;
  if (all || stage == 0)
    stats_stage<TL>(P.logits, P.logits_stride_b, 0, 1, P.temperature, nullptr, 0, P.B, P.V, W, P.logprobs.raw());
  if (all) cg::this_grid().sync();
  if (all || stage == 1) sample_decide_stage<TL>(R, P.V, W, row_stats, race_scratch);
  if (all) cg::this_grid().sync();
  if (all || stage == 2) sample_output_stage<TL>(R, P.V, W);
}

// ----------------------------------------------------------------------------
// filtered_probs / mask_logits: sample's stats stage, then the outputs, no draw
// ----------------------------------------------------------------------------
// Stage 1, item (r, c): the merged stats of row r exactly as sample_decide_stage
// merges them, then chunk c of the output. probs: p = shifted_exp(filtered x) * (1 / s)
// with sample's operands (token_weights), so the bits are those sample writes to
// probs_out; one-hot at the argmax for a greedy row, 0 for an invalid one. mask: the
// logit's bits where x >= the cutoff (the argmax only, greedy), -inf elsewhere, NaN for
// an invalid row. Stage 2 does nothing (no race).

// -inf and NaN of a logits dtype, as raw bits (mask_logits copies kept logits bit for bit).
template <typename T>
struct MaskBits;
template <>
struct MaskBits<float> {
  using U = uint32_t;
  static constexpr U kNegInf = 0xff800000u, kNaN = 0x7fc00000u;
};
template <>
struct MaskBits<__half> {
  using U = uint16_t;
  static constexpr U kNegInf = 0xfc00u, kNaN = 0x7e00u;
};
template <>
struct MaskBits<__nv_bfloat16> {
  using U = uint16_t;
  static constexpr U kNegInf = 0xff80u, kNaN = 0x7fc0u;
};

template <typename TL, bool kMask>
__device__ void filtered_write_stage(const SampleParams& P, const Workspace& W, ChunkStats& row_stats) {
  const SampleRows<TL> R{P};
  const int64_t C = W.chunks, NB = W.stat_blocks, V = P.V;
  for (int64_t item = blockIdx.x; item < P.B * C; item += gridDim.x) {
    const int64_t r = item / C, c = item % C;
    const float t = R.temperature(r);
    const bool greedy = t == 0.0f;
    if ((threadIdx.x >> 5) == 0) {
      const ChunkStats st = merge_row_stats(W.stats + r * NB, NB, stats_inv_t(t), R.row(r), V, cutoff_of(W, r));
      if (threadIdx.x == 0) row_stats = st;
    }
    __syncthreads();
    const ChunkStats st = row_stats;
    const bool valid = valid_temperature(t) && R.usable(r) && !st.bad() && usable_max(st.max);
    const bool sampled = valid && !greedy;
    const float cut = sampled ? cutoff_of(W, r) : -kInf;
    const int64_t begin = c * W.chunk_len, end = imin(V, begin + W.chunk_len);
    const TL* row = R.row(r);
    if constexpr (kMask) {
      using U = typename MaskBits<TL>::U;
      const U* in = reinterpret_cast<const U*>(row);
      U* out = static_cast<U*>(P.masked_out) + r * V;
      for (int64_t v = begin + threadIdx.x; v < end; v += blockDim.x) {
        const bool kept = sampled ? to_float(row[v]) >= cut : valid && v == st.arg;
        out[v] = !valid ? MaskBits<TL>::kNaN : kept ? in[v] : MaskBits<TL>::kNegInf;
      }
    } else {
      float* out = P.probs_out + r * P.probs_stride_b;
      const float inv_t = sampled ? 1.0f / t : 1.0f, inv_s = 1.0f / st.sum;
      const bool vec_l = W.vec_logits != 0, vec_p = W.vec_probs != 0;
      for (int64_t v0 = begin + 4 * threadIdx.x; v0 < end; v0 += 4 * blockDim.x) {
        float x[4], p[4];
        load4(row, v0, V, vec_l, -kInf, x);
#pragma unroll
        for (int k = 0; k < 4; ++k)
          p[k] = sampled ? shifted_exp(filtered_logit(x[k], cut), st.max, inv_t) * inv_s
                         : (valid && v0 + k == st.arg ? 1.0f : 0.0f);
        if (vec_p && v0 + 3 < V) {
          *reinterpret_cast<float4*>(out + v0) = make_float4(p[0], p[1], p[2], p[3]);
        } else {
#pragma unroll
          for (int k = 0; k < 4; ++k)
            if (v0 + k < V) out[v0 + k] = p[k];
        }
      }
    }
    __syncthreads();  // row_stats is reused by the next item
  }
}

template <typename TL, bool kMask>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM) filtered_kernel(SampleParams P, Workspace W,
                                                                                  int stage) {
  SPECDEC_SHARED(ChunkStats, row_stats);
  const bool all = stage == kAllStages;
  if (all || stage == 0)
    stats_stage<TL>(P.logits, P.logits_stride_b, 0, 1, P.temperature, nullptr, 0, P.B, P.V, W, false);
  if (all) cg::this_grid().sync();
  if (all || stage == 1) filtered_write_stage<TL, kMask>(P, W, row_stats);
}

// ----------------------------------------------------------------------------
// coupled verify (VerifyParams::coupled)
// ----------------------------------------------------------------------------
// The token at position i of row b is specdec::sample's draw from the filtered
// law at (b, i) keyed by offset + i, for every i <= n_b: coupled_race_kernel runs
// the three sample stages over the B * (K+1) virtual rows (CoupledRows) into
// W.coupled_y, then coupled_decide_kernel (one more launch: the decision needs
// every position of a row, i.e. a grid-wide dependency) accepts draft i iff it
// equals y[b, i] and emits y at the first mismatch or at n_b. Greedy rows go
// the same way: their "sample" is the argmax (kGreedy), which is the greedy
// rule. Every position 0..n_b is sampled whether or not the chain reaches it
// (the price of one parallel pass instead of a sequential one).

template <typename TL>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM) coupled_race_kernel(VerifyParams P, Workspace W,
                                                                                      int stage) {
  SPECDEC_SHARED(RacePair[32], race_scratch);
  SPECDEC_SHARED(ChunkStats, row_stats);
  const CoupledRows<TL> R{P, W.coupled_y};
  const bool all = stage == kAllStages;
  if (all || stage == 0)
    stats_stage<TL>(P.logits, P.logits_stride_b, P.logits_stride_k, P.K + 1, P.temperature, P.num_drafts,
                    P.num_drafts_stride, P.B, P.V, W, P.logprobs.raw());
  if (all) cg::this_grid().sync();
  if (all || stage == 1) sample_decide_stage<TL>(R, P.V, W, row_stats, race_scratch);
  if (all) cg::this_grid().sync();
  if (all || stage == 2) sample_output_stage<TL>(R, P.V, W);
}

// One warp per row b: validity (temperature, filter, n_b, draft ids of positions
// < n_b, NaN / +inf in positions 0..n_b from the stat blocks' flags), the first
// i < n_b with y[b, i] != draft i (n_b if none), the outputs. y[b, j] < 0 means
// position j has no distribution (all -inf): invalid, as in the reference, while
// an unusable position after j does not matter.
template <typename TL>
__global__ void __launch_bounds__(kBlockThreads) coupled_decide_kernel(VerifyParams P, Workspace W) {
  const int64_t K = P.K, NB = W.stat_blocks;
  for_each_row_per_warp(P.B, [&](int64_t b) {
    const int lane = threadIdx.x & 31;
    const float t = P.temperature.get(b);
    const int64_t n = P.drafts_of(b);
    const int64_t* draft = P.draft_ids + b * K;
    const int64_t* y = W.coupled_y + b * (K + 1);
    bool ok = valid_temperature(t) && valid_filter(P.filters.get(b)) && n >= 0 && n <= K;  // warp-uniform
    int64_t j = n;
    if (ok) {
      int bad = 0;
      for (int64_t i = lane; i < n; i += 32) bad |= (draft[i] < 0 || draft[i] >= P.V) ? 1 : 0;
      const ChunkStats* st = W.stats + b * (K + 1) * NB;  // positions 0..n are stat rows b*(K+1) + i
      for (int64_t k = lane; k < (n + 1) * NB; k += 32) bad |= st[k].flags & kBadLogit;
      ok = !__any_sync(0xffffffffu, bad);
      for (int64_t i0 = 0; i0 < n; i0 += 32) {  // first mismatch, 32 positions per step
        const int64_t i = i0 + lane;
        const unsigned miss = __ballot_sync(0xffffffffu, i < n && y[i] != draft[i]);
        if (miss) {
          j = i0 + __ffs(static_cast<int>(miss)) - 1;
          break;
        }
      }
    }
    const int64_t token = ok ? y[j] : -1;
    const bool valid = ok && token >= 0 && token < P.V;
    int64_t* out = P.tokens + b * (K + 1);
    for (int64_t i = lane; i <= K; i += 32) out[i] = !valid ? -1 : i < j ? draft[i] : i == j ? token : -1;
    if (lane == 0) {
      P.num_accepted[b] = valid ? j : 0;
      P.valid[b] = valid;
    }
    if (P.logprobs.out) write_coupled_logprobs<TL>(P, W, b, j, token, valid);  // y[i] == draft[i] for i < j
  });
}

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

// fn(v, x) for every token v of a row position, x its logit as float (block-wide: thread
// t takes the groups of 4 tokens t, t + blockDim, ...; one 16-byte / 8-byte load each when
// vec; a thread sees its tokens in increasing order).
template <typename T, typename Fn>
__device__ __forceinline__ void for_each_token_at(const T* row, int64_t V, bool vec, Fn&& fn) {
  for (int64_t v0 = 4 * static_cast<int64_t>(threadIdx.x); v0 < V; v0 += 4 * static_cast<int64_t>(blockDim.x)) {
    float x[4];
    load4(row, v0, V, vec, -kInf, x);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (v0 + k < V) fn(v0 + k, x[k]);
  }
}

// fn(x) for every token of a row position (for_each_token_at without the index).
template <typename T, typename Fn>
__device__ __forceinline__ void for_each_token(const T* row, int64_t V, bool vec, Fn&& fn) {
  for_each_token_at(row, V, vec, [&](int64_t, float x) { fn(x); });
}

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

// ----------------------------------------------------------------------------
// logprobs (core/logprob_math.h): one block per (row, position) with an emitted token
// ----------------------------------------------------------------------------
// Pass 1: the raw max with its first argmax (NaN / +inf: no law, outputs NaN); with the
// processed law and filters the cutoff (block_cutoff: filter_cutoff_kernel's passes);
// pass 2: the sum of shifted_exp over the kept logits. The token's logprob from these
// stats. Top-n: the n-th largest logit by top-k's counting passes, the logits strictly
// above it gathered in shared memory, the ties at it added in id order, then sorted by
// (logit desc, id asc) by one thread (n <= kMaxTopLogprobs). The token's rank: one
// counting pass.

struct LogprobShared {
  uint32_t count[kRadixBins];
  unsigned long long mass[kRadixBins];
  MinVal min_scratch[32];
  MaxArg max_scratch[32];
  OrFlag bad_scratch[32];
  SumF sum_scratch[32];
  SumI64 rank_scratch[32];
  int warp_ties[32];
  int top_count;
  float top_x[kMaxTopLogprobs];
  int64_t top_v[kMaxTopLogprobs];
};

template <typename T>
__global__ void __launch_bounds__(kFilterThreads) logprobs_kernel(LogprobParams P, int vec_i) {
  SPECDEC_SHARED(LogprobShared, sh);
  const bool vec = vec_i != 0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t V = P.V, n = P.n;
  for (int64_t item = blockIdx.x; item < P.B * P.positions; item += gridDim.x) {
    const int64_t b = item / P.positions, i = item - b * P.positions;
    const int64_t token = P.tokens[item];
    const float t = P.temperature.get(b);
    const FilterSpec f = P.filters.get(b);
    const T* row = static_cast<const T*>(P.logits) + b * P.stride_b + i * P.stride_k;
    // block-uniform from here (token, t, f and the reductions are the same in every thread)
    bool ok = token >= 0;
    PositionLaw law;
    if (ok) {
      MaxArg ma{-kInf, INT64_MAX};
      OrFlag bad{0};
      for_each_token_at(row, V, vec, [&](int64_t v, float x) {
        if (bad_logit(x)) bad.v = 1;
        else if (x > ma.m) ma = MaxArg{x, v};  // a thread sees its tokens in increasing order
      });
      ma = block_reduce(ma, MaxArgMerge{}, sh.max_scratch);
      bad = block_reduce(bad, OrMerge{}, sh.bad_scratch);
      ok = !bad.v && usable_max(ma.m) && (!P.processed || (valid_temperature(t) && valid_filter(f)));
      law.m = ma.m;
      law.arg = ma.arg;
      law.greedy = P.processed && t == 0.0f;
    }
    if (ok && !law.greedy) {
      law.inv_t = P.processed ? 1.0f / t : 1.0f;
      if (P.processed && filter_on(f, V))
        law.cut = block_cutoff(row, V, vec, law.m, law.inv_t, f, sh.count, sh.mass, sh.min_scratch);
      SumF s{0.0f};
      for_each_token(row, V, vec, [&](float x) { s.v += shifted_exp(filtered_logit(x, law.cut), law.m, law.inv_t); });
      law.log_s = logf(block_reduce(s, SumMerge{}, sh.sum_scratch).v);
    }
    const bool has_token = ok && token < V;
    const float xt = has_token ? to_float(row[token]) : 0.0f;
    SumI64 rank{law.greedy ? 1 : 0};
    if (has_token && !law.greedy) {  // tokens at or above it (vLLM's selected_token_ranks)
      for_each_token(row, V, vec, [&](float x) { rank.v += x >= xt ? 1 : 0; });
      rank = block_reduce(rank, SumI64Merge{}, sh.rank_scratch);
    }
    if (threadIdx.x == 0) {
      P.token_logprobs[item] = has_token ? law.logprob(xt, token) : __uint_as_float(0x7fc00000u);
      P.token_ranks[item] = has_token ? rank.v : -1;
      sh.top_count = 0;
    }
    if (ok && n > 0) {
      FilterSpec top;
      top.top_k = n;
      const float c = n < V ? block_cutoff(row, V, vec, law.m, 1.0f, top, sh.count, sh.mass, sh.min_scratch) : -kInf;
      __syncthreads();  // top_count = 0 is seen
      for_each_token_at(row, V, vec, [&](int64_t v, float x) {
        if (x > c) {  // fewer than n of them: c is the n-th largest
          const int slot = atomicAdd(&sh.top_count, 1);
          sh.top_x[slot] = x;
          sh.top_v[slot] = v;
        }
      });
      __syncthreads();
      // the ties at c, in id order, until n entries
      for (int64_t base = 0; base < V && sh.top_count < n; base += blockDim.x) {
        const int64_t v = base + threadIdx.x;
        const bool tie = v < V && to_float(row[v]) == c;
        const unsigned bal = __ballot_sync(0xffffffffu, tie);
        if (lane == 0) sh.warp_ties[warp] = __popc(bal);
        __syncthreads();
        int before = __popc(bal & ((1u << lane) - 1u)), total = 0;
        for (int w = 0; w < warps; ++w) {
          before += w < warp ? sh.warp_ties[w] : 0;
          total += sh.warp_ties[w];
        }
        const int have = sh.top_count;
        if (tie && have + before < n) {
          sh.top_x[have + before] = c;
          sh.top_v[have + before] = v;
        }
        __syncthreads();
        if (threadIdx.x == 0) sh.top_count = static_cast<int>(have + total < n ? have + total : n);
        __syncthreads();
      }
      if (threadIdx.x == 0) {  // insertion sort: (logit desc, id asc)
        const int cnt = sh.top_count;
        for (int a = 1; a < cnt; ++a) {
          const float x = sh.top_x[a];
          const int64_t v = sh.top_v[a];
          int k = a - 1;
          for (; k >= 0 && ranks_before(x, v, sh.top_x[k], sh.top_v[k]); --k) {
            sh.top_x[k + 1] = sh.top_x[k];
            sh.top_v[k + 1] = sh.top_v[k];
          }
          sh.top_x[k + 1] = x;
          sh.top_v[k + 1] = v;
        }
      }
      __syncthreads();
    }
    const int cnt = ok && n > 0 ? sh.top_count : 0;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      const bool have = k < cnt;
      P.top_ids[item * n + k] = have ? sh.top_v[k] : -1;
      P.top_logprobs[item * n + k] = have ? law.logprob(sh.top_x[k], sh.top_v[k]) : __uint_as_float(0x7fc00000u);
    }
    __syncthreads();  // the shared top-n is reused by the next item
  }
}

}  // namespace specdec::cuda
