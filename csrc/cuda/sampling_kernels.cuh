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

#include "../core/filter_math.h"
#include "../core/logprob_math.h"
#include "../core/rng.h"
#include "../core/sampling_params.h"
#include "../core/verify_math.h"
#include "block_reduce.cuh"
#include "filter_stage.cuh"
#include "grid_loop.cuh"
#include "launch_plan.h"
#include "race.cuh"
#include "row_stats.cuh"
#include "shared_memory.cuh"
#include "tile_stats.cuh"
#include "token_decision.cuh"
#include "token_load.cuh"

namespace specdec::cuda {

namespace cg = cooperative_groups;

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

// The merged stats of sample row r (block-wide; every thread gets them): warp 0 merges the
// row's stat blocks (merge_row_stats) into the block's shared `row_stats`; valid: the row has
// a law (usable temperature and filter, no NaN / +inf logit, a usable max). Stage 2 of the
// sample rows and of filtered_probs / mask_logits, item (r, c) of any chunk c.
struct MergedRow {
  ChunkStats st;
  bool valid;
};
template <typename TL, typename Rows>
__device__ __forceinline__ MergedRow merged_sample_row(const Rows& R, int64_t r, float t, int64_t V,
                                                       const Workspace& W, ChunkStats& row_stats) {
  if ((threadIdx.x >> 5) == 0) {
    const ChunkStats st = merge_row_stats(W.stats + r * W.stat_blocks, W.stat_blocks, stats_inv_t(t), R.row(r), V,
                                          cutoff_of(W, r));
    if (threadIdx.x == 0) row_stats = st;
  }
  __syncthreads();
  const ChunkStats st = row_stats;
  return MergedRow{st, valid_temperature(t) && R.usable(r) && !st.bad() && usable_max(st.max)};
}

// The (row r, chunk c) items of a stage that follows the stats stage, grid-strided over the
// blocks: row r's merged stats (merged_sample_row, every thread of the block), then
// body(item, r, c, t, merged row) with t row r's temperature. row_stats is reused by the
// next item, hence the barrier after each.
template <typename TL, typename Rows, typename Body>
__device__ __forceinline__ void for_each_merged_chunk(const Rows& R, int64_t V, const Workspace& W,
                                                      ChunkStats& row_stats, Body&& body) {
  const int64_t C = W.chunks;
  for (int64_t item = blockIdx.x; item < R.count() * C; item += gridDim.x) {
    const int64_t r = item / C, c = item % C;
    const float t = R.temperature(r);
    body(item, r, c, t, merged_sample_row<TL>(R, r, t, V, W, row_stats));
    __syncthreads();
  }
}

// Stage 2: item (r, c): merged stats of row r, then the coarse race over chunk c
// (writing p to probs_out), or the one-hot / zero probs_out of a greedy / invalid row.
template <typename TL, typename Rows>
__device__ void sample_decide_stage(const Rows& R, int64_t V, const Workspace& W, ChunkStats& row_stats,
                                    RacePair* race_scratch) {
  for_each_merged_chunk<TL>(R, V, W, row_stats, [&](int64_t item, int64_t r, int64_t c, float t, const MergedRow& m) {
    const bool greedy = t == 0.0f;
    const ChunkStats& st = m.st;
    const bool valid = m.valid;
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
  });
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
  const int64_t V = P.V;
  for_each_merged_chunk<TL>(R, V, W, row_stats, [&](int64_t, int64_t r, int64_t c, float t, const MergedRow& m) {
    const bool greedy = t == 0.0f;
    const ChunkStats& st = m.st;
    const bool valid = m.valid;
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
  });
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
