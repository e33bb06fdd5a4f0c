// CUDA kernels of specdec::verify and specdec::sample over raw pointers
// (no torch here; the launcher is sampling_cuda.cu).
//
// One cooperative launch per call. Every row (and every draft position of it)
// is split into C chunks so the GPU is busy even at B = 1; grid-wide barriers
// separate the stages, and blocks loop over work items so the grid never
// exceeds what can be co-resident:
//
//   verify:  1. item (b, i, c): softmax stats + argmax + NaN/+inf flag of chunk c
//               of position i                                 -> ws.stats
//            -- grid sync --
//            2. item (b, c): every block working on row b merges the row's stats
//               in the same fixed order (so all agree bit for bit), runs the
//               ratio tests of all positions in parallel, takes the first
//               rejection j, then runs the coarse race (verify_math.h) over the
//               tiles of chunk c of position j: one warp per tile -> ws.race
//            -- grid sync --
//            3. one warp per row: merge the C coarse winners, run the fine race
//               inside the winning tile (128 tokens), write tokens
//   sample:  1. stats per (b, c); sync; 2. coarse race per (b, c) (+ probs_out);
//            sync; 3. one warp per row: fine race
//
// Nothing of size V is written to global memory except probs_out; the
// workspace holds O(B * (K+1) * C) small records. Random numbers come from
// core/rng.h, so the CPU and CUDA kernels draw identical numbers.
#pragma once
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../core/rng.h"
#include "../core/sampling_params.h"
#include "../core/verify_math.h"
#include "block_reduce.cuh"

namespace specdec::cuda {

namespace cg = cooperative_groups;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

constexpr float kInf = __builtin_huge_valf();

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// Per-chunk softmax statistics (over y = l * inv_t) plus the first argmax.
struct ChunkStats {
  float max;      // max y (NaN-free; -inf if every entry is -inf)
  float sum;      // sum exp(y - max)
  float arg_val;  // value at argmax (y)
  int bad;        // a NaN or +inf logit was seen
  int64_t arg;    // first index of the max

  __device__ __forceinline__ ChunkStats shfl(int m) const {
    return ChunkStats{shfl_xor(max, m), shfl_xor(sum, m), shfl_xor(arg_val, m), shfl_xor(bad, m),
                      shfl_xor(arg, m)};
  }
  __device__ static ChunkStats empty() { return ChunkStats{-kInf, 0.0f, -kInf, 0, INT64_MAX}; }
};

__device__ __forceinline__ ChunkStats merge_stats(const ChunkStats& a, const ChunkStats& b) {
  const SoftmaxStats s = stats_merge(SoftmaxStats{a.max, a.sum}, SoftmaxStats{b.max, b.sum});
  const bool take_b = b.arg_val > a.arg_val || (b.arg_val == a.arg_val && b.arg < a.arg);
  return ChunkStats{s.max, s.sum, take_b ? b.arg_val : a.arg_val, a.bad | b.bad, take_b ? b.arg : a.arg};
}

// One thread folds one value y at index v (online softmax).
__device__ __forceinline__ void fold_value(ChunkStats& st, float y, int64_t v, bool want_sum) {
  if (y != y || y == kInf) {
    st.bad = 1;
    return;
  }
  if (y == -kInf) return;  // masked token: no mass, never the argmax unless all are masked
  if (y > st.arg_val || (y == st.arg_val && v < st.arg)) {
    st.arg_val = y;
    st.arg = v;
  }
  if (!want_sum) {
    st.max = st.arg_val;
    return;
  }
  if (y > st.max) {
    st.sum = st.sum * expf(st.max - y) + 1.0f;
    st.max = y;
  } else {
    st.sum += expf(y - st.max);
  }
}

struct RacePair {
  float key, key_p;      // residual race and the race on p (used if the residual is all zero)
  int64_t idx, idx_p;
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

// What stage 2 decided for a row (written by the block that handles chunk 0).
struct RowDecision {
  int64_t j;      // first rejected position, K if all accepted
  int64_t token;  // greedy rows: the token at j
  float max_y, sum;  // softmax stats of position j (for the fine race)
  int status;     // 0 invalid, 1 sampled (race winner pending), 2 greedy (token known)
};

struct Workspace {
  ChunkStats* stats;   // [B, K+1, C] (sample: [B, C])
  RacePair* race;      // [B, C]
  RowDecision* rows;   // [B]
  int64_t chunks;      // C
  int64_t chunk_len;   // a multiple of kRaceTile
};

struct FloatStatsMerge {
  __device__ ChunkStats operator()(const ChunkStats& a, const ChunkStats& b) const { return merge_stats(a, b); }
};
struct RaceMerge {
  __device__ RacePair operator()(const RacePair& a, const RacePair& b) const { return merge_race(a, b); }
};

__device__ __forceinline__ RowRng make_rng(const RowRandomness& r, int64_t b) {
  return RowRng(row_key(static_cast<uint64_t>(r.seed.get(b)), b, r.per_row_seed),
                static_cast<uint64_t>(r.offset.get(b)));
}

// Stats of chunk c of one row of length V (block-wide; result valid in all threads).
template <typename T>
__device__ ChunkStats chunk_stats(const T* row, int64_t V, int64_t c, int64_t chunk_len, float inv_t,
                                  bool want_sum, ChunkStats* scratch) {
  ChunkStats st = ChunkStats::empty();
  const int64_t begin = c * chunk_len;
  const int64_t end = imin(V, begin + chunk_len);
  for (int64_t v = begin + threadIdx.x; v < end; v += blockDim.x)
    fold_value(st, to_float(row[v]) * inv_t, v, want_sum);
  return block_reduce(st, FloatStatsMerge{}, scratch);
}

// Race weights of the 4 tokens v0..v0+3 (v0 a multiple of 4; entries >= V get
// weight 0): p = target probability, w = residual max(0, p - q). q_mode: 0 none
// (bonus / sample: w = p), 1 one-hot at `draft`, 2 dense q row.
template <typename T, typename TQ>
__device__ __forceinline__ void token_weights(const T* row, const TQ* q_row, int q_mode, int64_t draft,
                                              int64_t v0, int64_t V, float inv_t, float max_y, float inv_s,
                                              float w[4], float p[4], int& bad) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t v = v0 + k;
    p[k] = w[k] = 0.0f;
    if (v >= V) continue;
    const float e = expf(fmaf(to_float(row[v]), inv_t, -max_y));
    float q = 0.0f;
    if (q_mode == 2) {
      q = to_float(q_row[v]);
      if (bad_prob(q)) bad = 1;
    } else if (q_mode == 1) {
      q = v == draft ? 1.0f : 0.0f;
    }
    p[k] = e * inv_s;
    w[k] = q_mode == 0 ? p[k] : residual_weight(e, inv_s, q);
  }
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

// Coarse race over the tiles of chunk c (block-wide): one warp per tile of
// kRaceTile = 128 tokens, 4 per lane. Keys W_t / E_t (residual) and P_t / E_t
// (target); idx / idx_p are TILE indices. Optionally writes p to probs_out.
template <typename T, typename TQ>
__device__ RacePair chunk_coarse_race(const T* row, const TQ* q_row, int q_mode, int64_t draft, int64_t V,
                                      int64_t c, int64_t chunk_len, float inv_t, float max_y, float inv_s,
                                      const RowRng& rng, uint32_t tile_stream, uint32_t position,
                                      float* probs_out, RacePair* scratch) {
  static_assert(kRaceTile == 128, "one warp x 4 tokens per tile");
  RacePair best = RacePair::empty();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t t_begin = c * chunk_len / kRaceTile;
  const int64_t t_end = (imin(V, (c + 1) * chunk_len) + kRaceTile - 1) / kRaceTile;
  for (int64_t t = t_begin + warp; t < t_end; t += warps) {
    const int64_t v0 = t * kRaceTile + 4 * lane;
    float w[4], p[4];
    token_weights(row, q_row, q_mode, draft, v0, V, inv_t, max_y, inv_s, w, p, best.bad);
    if (probs_out)
      for (int k = 0; k < 4; ++k)
        if (v0 + k < V) probs_out[v0 + k] = p[k];
    const float W = warp_sum((w[0] + w[1]) + (w[2] + w[3]));
    const float Pt = warp_sum((p[0] + p[1]) + (p[2] + p[3]));
    const float E = race_exponential(rng, tile_stream, position, t);
    if (race_better(W / E, t, RaceBest{best.key, best.idx})) { best.key = W / E; best.idx = t; }
    if (race_better(Pt / E, t, RaceBest{best.key_p, best.idx_p})) { best.key_p = Pt / E; best.idx_p = t; }
  }
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

// Fine race (warp-wide) inside tile `tile`: token = argmax weight_v / E_v.
// Returns the same value in every lane.
template <typename T, typename TQ>
__device__ int64_t warp_fine_race(const T* row, const TQ* q_row, int q_mode, int64_t draft, int64_t V, int64_t tile,
                                  bool use_p, float inv_t, float max_y, float inv_s, const RowRng& rng,
                                  uint32_t token_stream, uint32_t position) {
  const int lane = threadIdx.x & 31;
  const int64_t v0 = tile * kRaceTile + 4 * lane;
  float w[4], p[4];
  int bad = 0;
  token_weights(row, q_row, q_mode, draft, v0, V, inv_t, max_y, inv_s, w, p, bad);
  const Philox4 r = rng.block(token_stream, position, static_cast<uint32_t>(v0 >> 2));
  RaceBestShfl best{-1.0f, INT64_MAX};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (v0 + k >= V) break;
    const float key = (use_p ? p[k] : w[k]) / exponential_from_bits(r.x[k]);
    if (race_better(key, v0 + k, RaceBest{best.key, best.index})) best = RaceBestShfl{key, v0 + k};
  }
  return warp_reduce(best, RaceBestMerge{}).index;
}

// ----------------------------------------------------------------------------
// verify
// ----------------------------------------------------------------------------

// Shared decision state of one row inside a block.
struct RowShared {
  int first_stop;    // min position whose test stops the chain (K: all accepted)
  int bad;           // row invalid regardless of j (NaN / +inf logit, draft id out of range)
  int stop_invalid;  // the stop at first_stop is an invalid one (all -inf, bad q(x))
  float max_y, sum;  // merged stats of position first_stop
  int64_t arg;       // its argmax
};

// The test of one position: merged stats, whether the chain stops here and
// whether that stop makes the row invalid. Merges run in a fixed order, so every
// block working on the row gets bit-identical results.
struct PositionTest {
  ChunkStats st;
  bool stop, invalid_stop, bad;
};

template <typename TL, typename TQ>
__device__ PositionTest test_position(const VerifyParams& P, const Workspace& W, int64_t b, int64_t i,
                                      float inv_t, bool greedy, const RowRng& rng) {
  const int64_t K = P.K, V = P.V, C = W.chunks;
  const ChunkStats* chunk = W.stats + (b * (K + 1) + i) * C;
  PositionTest r;
  r.st = chunk[0];
  for (int64_t c = 1; c < C; ++c) r.st = merge_stats(r.st, chunk[c]);
  r.bad = r.st.bad != 0;
  r.stop = i == K;
  r.invalid_stop = false;
  if (!usable_max(r.st.arg_val)) {
    r.stop = r.invalid_stop = true;
    return r;
  }
  if (i == K) return r;
  const int64_t x = P.draft_ids[b * K + i];
  if (x < 0 || x >= V) {
    r.bad = r.stop = r.invalid_stop = true;
  } else if (greedy) {
    r.stop = x != r.st.arg;
  } else {
    const TL* row = static_cast<const TL*>(P.logits) + b * P.logits_stride_b + i * P.logits_stride_k;
    const float q_x = P.draft_probs
        ? to_float(static_cast<const TQ*>(P.draft_probs)[b * P.probs_stride_b + i * P.probs_stride_k + x])
        : 1.0f;
    if (bad_prob(q_x)) {
      r.stop = r.invalid_stop = true;
    } else {
      const float e_x = expf(to_float(row[x]) * inv_t - r.st.max);
      r.stop = !ratio_test_accepts(accept_uniform(rng, static_cast<uint32_t>(i)), q_x, r.st.sum, e_x);
    }
  }
  return r;
}

// Stage 2a (block-wide): all positions are tested in parallel; the chain stops
// at the first position whose test stops it.
template <typename TL, typename TQ>
__device__ void decide_row(const VerifyParams& P, const Workspace& W, int64_t b, float inv_t, bool greedy,
                           const RowRng& rng, RowShared& sh) {
  const int64_t K = P.K;
  if (threadIdx.x == 0) {
    sh.first_stop = static_cast<int>(K);
    sh.bad = 0;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i <= K; i += blockDim.x) {
    const PositionTest r = test_position<TL, TQ>(P, W, b, i, inv_t, greedy, rng);
    if (r.bad) atomicOr(&sh.bad, 1);
    if (r.stop) atomicMin(&sh.first_stop, static_cast<int>(i));
  }
  __syncthreads();
  const int64_t j = sh.first_stop;
  if (threadIdx.x == 0) {  // publish the stats of the stop position
    const PositionTest r = test_position<TL, TQ>(P, W, b, j, inv_t, greedy, rng);
    sh.stop_invalid = r.invalid_stop;
    sh.max_y = r.st.max;
    sh.sum = r.st.sum;
    sh.arg = r.st.arg;
  }
  __syncthreads();
}

template <typename TL, typename TQ>
__global__ void verify_kernel(VerifyParams P, Workspace W) {
  __shared__ ChunkStats stats_scratch[32];
  __shared__ RacePair race_scratch[32];
  __shared__ RowShared row;
  cg::grid_group grid = cg::this_grid();
  const int64_t B = P.B, K = P.K, V = P.V, C = W.chunks;

  // Stage 1: stats of every (row, position, chunk).
  for (int64_t item = blockIdx.x; item < B * (K + 1) * C; item += gridDim.x) {
    const int64_t b = item / ((K + 1) * C), i = (item / C) % (K + 1), c = item % C;
    const float t = P.temperature.get(b);
    const bool greedy = t == 0.0f;
    ChunkStats st = ChunkStats::empty();
    if (t >= 0.0f) {
      const TL* row = static_cast<const TL*>(P.logits) + b * P.logits_stride_b + i * P.logits_stride_k;
      st = chunk_stats(row, V, c, W.chunk_len, greedy ? 1.0f : 1.0f / t, !greedy, stats_scratch);
    }
    if (threadIdx.x == 0) W.stats[item] = st;
  }
  grid.sync();

  // Stage 2: decide each row, race its rejected / bonus position.
  for (int64_t item = blockIdx.x; item < B * C; item += gridDim.x) {
    const int64_t b = item / C, c = item % C;
    const float t = P.temperature.get(b);
    const bool t_ok = t >= 0.0f;
    const bool greedy = t == 0.0f;
    const float inv_t = (greedy || !t_ok) ? 1.0f : 1.0f / t;
    const RowRng rng = make_rng(P.rnd, b);
    if (t_ok) {
      decide_row<TL, TQ>(P, W, b, inv_t, greedy, rng, row);
    } else if (threadIdx.x == 0) {
      row.bad = 1;
    }
    __syncthreads();
    const bool valid = t_ok && !row.bad && !row.stop_invalid;
    const int64_t j = row.first_stop;
    RacePair rp = RacePair::empty();
    if (valid && !greedy) {
      const TL* lrow = static_cast<const TL*>(P.logits) + b * P.logits_stride_b + j * P.logits_stride_k;
      const int q_mode = j == K ? 0 : (P.draft_probs ? 2 : 1);
      const TQ* q_row = q_mode == 2
                            ? static_cast<const TQ*>(P.draft_probs) + b * P.probs_stride_b + j * P.probs_stride_k
                            : nullptr;
      const int64_t x = j < K ? P.draft_ids[b * K + j] : -1;
      rp = chunk_coarse_race(lrow, q_row, q_mode, x, V, c, W.chunk_len, inv_t, row.max_y, 1.0f / row.sum, rng,
                             kStreamVerifyTile, static_cast<uint32_t>(j), static_cast<float*>(nullptr),
                             race_scratch);
    }
    if (threadIdx.x == 0) {
      W.race[item] = rp;
      if (c == 0) W.rows[b] = RowDecision{j, row.arg, row.max_y, row.sum, valid ? (greedy ? 2 : 1) : 0};
    }
    __syncthreads();  // `row` is reused by the next item
  }
  grid.sync();

  // Stage 3: one warp per row: fine race, then lane 0 writes the outputs.
  const int lane = threadIdx.x & 31;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); b < B;
       b += warps_total) {
    const RowDecision d = W.rows[b];
    int64_t token = d.token;
    bool valid = d.status != 0;
    if (d.status == 1) {
      RacePair r = W.race[b * C];
      for (int64_t c = 1; c < C; ++c) r = merge_race(r, W.race[b * C + c]);
      const bool use_p = !(r.key > 0.0f);
      const int64_t tile = use_p ? r.idx_p : r.idx;
      valid = !r.bad && tile >= 0 && tile * kRaceTile < V;
      if (valid) {  // warp-uniform
        const float t = P.temperature.get(b);
        const int q_mode = d.j == K ? 0 : (P.draft_probs ? 2 : 1);
        const TL* lrow = static_cast<const TL*>(P.logits) + b * P.logits_stride_b + d.j * P.logits_stride_k;
        const TQ* q_row = q_mode == 2
            ? static_cast<const TQ*>(P.draft_probs) + b * P.probs_stride_b + d.j * P.probs_stride_k
            : nullptr;
        const int64_t x = d.j < K ? P.draft_ids[b * K + d.j] : -1;
        token = warp_fine_race(lrow, q_row, q_mode, x, V, tile, use_p, 1.0f / t, d.max_y, 1.0f / d.sum,
                               make_rng(P.rnd, b), kStreamVerifyRace, static_cast<uint32_t>(d.j));
        valid = token >= 0 && token < V;
      }
    }
    if (lane == 0) {
      int64_t* out = P.tokens + b * (K + 1);
      for (int64_t i = 0; i <= K; ++i) {
        int64_t v = -1;
        if (valid) v = i < d.j ? P.draft_ids[b * K + i] : (i == d.j ? token : -1);
        out[i] = v;
      }
      P.num_accepted[b] = valid ? d.j : 0;
      P.valid[b] = valid;
    }
  }
}

// ----------------------------------------------------------------------------
// sample
// ----------------------------------------------------------------------------
template <typename TL>
__global__ void sample_kernel(SampleParams P, Workspace W) {
  __shared__ ChunkStats stats_scratch[32];
  __shared__ RacePair race_scratch[32];
  cg::grid_group grid = cg::this_grid();
  const int64_t B = P.B, V = P.V, C = W.chunks;

  for (int64_t item = blockIdx.x; item < B * C; item += gridDim.x) {
    const int64_t b = item / C, c = item % C;
    const float t = P.temperature.get(b);
    const bool greedy = t == 0.0f;
    const TL* row = static_cast<const TL*>(P.logits) + b * P.logits_stride_b;
    ChunkStats st = ChunkStats::empty();
    if (t >= 0.0f) st = chunk_stats(row, V, c, W.chunk_len, greedy ? 1.0f : 1.0f / t, !greedy, stats_scratch);
    else st.bad = 1;
    if (threadIdx.x == 0) W.stats[item] = st;
  }
  grid.sync();

  for (int64_t item = blockIdx.x; item < B * C; item += gridDim.x) {
    const int64_t b = item / C, c = item % C;
    const float t = P.temperature.get(b);
    const bool greedy = t == 0.0f;
    ChunkStats st = W.stats[b * C];
    for (int64_t k = 1; k < C; ++k) st = merge_stats(st, W.stats[b * C + k]);
    const bool valid = t >= 0.0f && !st.bad && usable_max(st.arg_val);
    const TL* row = static_cast<const TL*>(P.logits) + b * P.logits_stride_b;
    float* probs = P.probs_out ? P.probs_out + b * P.probs_stride_b : nullptr;
    const int64_t begin = c * W.chunk_len, end = imin(V, begin + W.chunk_len);
    RacePair rp = RacePair::empty();
    if (valid && !greedy) {
      rp = chunk_coarse_race(row, static_cast<const float*>(nullptr), 0, -1, V, c, W.chunk_len, 1.0f / t, st.max,
                             1.0f / st.sum, make_rng(P.rnd, b), kStreamSampleTile, 0u, probs, race_scratch);
    } else if (probs) {
      for (int64_t v = begin + threadIdx.x; v < end; v += blockDim.x)
        probs[v] = (valid && v == st.arg) ? 1.0f : 0.0f;
    }
    if (threadIdx.x == 0) {
      rp.bad = !valid;
      W.race[item] = rp;
      if (c == 0) W.rows[b] = RowDecision{0, st.arg, st.max, st.sum, valid ? (greedy ? 2 : 1) : 0};
    }
  }
  grid.sync();

  const int lane = threadIdx.x & 31;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); b < B;
       b += warps_total) {
    const RowDecision d = W.rows[b];
    int64_t token = d.status == 2 ? d.token : -1;
    if (d.status == 1) {
      RacePair r = W.race[b * C];
      for (int64_t c = 1; c < C; ++c) r = merge_race(r, W.race[b * C + c]);
      if (!r.bad && r.idx_p >= 0 && r.idx_p * kRaceTile < V) {
        const TL* row = static_cast<const TL*>(P.logits) + b * P.logits_stride_b;
        token = warp_fine_race(row, static_cast<const float*>(nullptr), 0, -1, V, r.idx_p, true,
                               1.0f / P.temperature.get(b), d.max_y, 1.0f / d.sum, make_rng(P.rnd, b),
                               kStreamSampleRace, 0u);
      }
    }
    if (lane == 0) P.tokens[b] = (token >= 0 && token < V) ? token : -1;
  }
}

}  // namespace specdec::cuda
