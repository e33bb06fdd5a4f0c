// CPU kernels of specdec::verify and specdec::sample over raw pointers.
//
// Included once per instruction set (sampling_kernels_default.cpp,
// sampling_kernels_avx2.cpp) with CPU_CAPABILITY set, so at::vec picks its
// vector width and everything here lands in a namespace of that name (no ODR
// clash between the two copies). Rows are independent: at::parallel_for splits
// the batch (rows pulled from a shared counter: for_each_row), and each row is
// processed by one thread in a fixed order, so a row's result depends only on
// its own inputs, seed and offset.
//
// Work per row: positions are visited in order and stop at the first
// rejection (the ratio test needs the full softmax stats of the position, the
// race needs one more pass over the rejected position only). Positions after
// it (up to the row's num_drafts) get a cheap max pass so NaN / +inf anywhere
// in them still marks the row invalid, exactly as in the CUDA kernel. With
// filters, a visited position first gets its cutoff (filter_cutoff: radix
// passes over a shrinking, compacted bucket), and every tile is then read with
// the logits below the cutoff as -inf (tile_as_float's `cut`).
#pragma once
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <functional>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "../core/dtype_dispatch.h"
#include "../core/filter_math.h"
#include "../core/logprob_math.h"
#include "../core/rng.h"
#include "../core/sampling_params.h"
#include "../core/tile_sum.h"
#include "../core/verify_math.h"
#include "sampling_kernels_entry.h"

namespace specdec {
namespace cpu {
namespace CPU_CAPABILITY {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kTile = 1024;  // floats per tile: converted / scratch buffers stay in L1
static_assert(kTile % 4 == 0, "tiles hold whole Philox groups");

constexpr float kNoCut = -std::numeric_limits<float>::infinity();

// Tile [v0, v0+n) of a row as float: the row itself for float, else converted into
// buf; with a filter cutoff (cut > -inf) the logits below it read as -inf (in buf).
template <typename T>
inline const float* tile_as_float(const T* row, int64_t v0, int64_t n, float* buf, float cut = kNoCut) {
  if (cut > kNoCut) {  // filtered_logit, a vector at a time
    const float* x = tile_as_float(row, v0, n, buf);
    const Vec vc(cut), ninf(kNoCut);
    int64_t k = 0;
    for (; k + Vec::size() <= n; k += Vec::size()) {
      const Vec xv = Vec::loadu(x + k);
      Vec::blendv(ninf, xv, xv >= vc).store(buf + k);
    }
    for (; k < n; ++k) buf[k] = filtered_logit(x[k], cut);
    return buf;
  }
  if constexpr (std::is_same_v<T, float>) {
    return row + v0;
  } else {
    for (int64_t k = 0; k < n; ++k) buf[k] = static_cast<float>(row[v0 + k]);
    return buf;
  }
}

inline float hmax(const Vec& v) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, v);
}
inline float hmin(const Vec& v) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::minimum(a, b); }, v);
}
inline float hsum(const Vec& v) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, v);
}

// The lanes a[0 .. Vec::size()) added in a fixed pairwise tree ((a0 + a1) + (a2 + a3)) + ...:
// the order of a tile value's vector accumulator (tile_lanes_sum), which topk_sum_exp rebuilds
// from the survivors alone. Overwrites a.
inline float lane_tree_sum(float* a) {
  for (int64_t w = Vec::size(); w > 1; w /= 2)
    for (int64_t l = 0; l < w / 2; ++l) a[l] = a[2 * l] + a[2 * l + 1];
  return a[0];
}

inline float tile_lanes_sum(const Vec& v) {
  alignas(64) float a[Vec::size()];
  v.store(a);
  return lane_tree_sum(a);
}

// max over a row (NaN propagates) and the first index holding it.
template <typename T>
inline void row_max(const T* row, int64_t V, bool want_argmax, float& max_out, int64_t& argmax_out) {
  alignas(64) float buf[kTile];
  float m = -std::numeric_limits<float>::infinity();
  int64_t arg = 0;
  for (int64_t v0 = 0; v0 < V; v0 += kTile) {
    const int64_t n = std::min(kTile, V - v0);
    const float* x = tile_as_float(row, v0, n, buf);
    Vec vm(-std::numeric_limits<float>::infinity());
    int64_t k = 0;
    for (; k + Vec::size() <= n; k += Vec::size()) vm = at::vec::maximum(vm, Vec::loadu(x + k));
    float tm = hmax(vm);
    for (; k < n; ++k) tm = (x[k] != x[k] || x[k] > tm) ? x[k] : tm;
    if (tm != tm) {  // NaN: the row is bad, nothing else matters
      max_out = tm;
      argmax_out = 0;
      return;
    }
    if (tm > m) {
      m = tm;
      if (want_argmax)
        for (int64_t t = 0; t < n; ++t)
          if (x[t] == tm) { arg = v0 + t; break; }
    }
  }
  max_out = m;
  argmax_out = arg;
}

// e = exp((l - m) * inv_t) for a vector of logits: the formula of verify_math.h
// (shifted_exp), never fused into an FMA, so e == 1 exactly at l == m. kUnitT:
// inv_t == 1, where the multiply is skipped ((l - m) * 1 is exact: same result,
// one vector op less per element, the cost of the exact formula over an FMA).
template <bool kUnitT>
inline Vec shifted_exp_vec(const Vec& x, const Vec& vm, const Vec& va) {
  if constexpr (kUnitT) return (x - vm).exp_u20();
  else return ((x - vm) * va).exp_u20();
}

// fn(std::true_type{}) when inv_t == 1, else fn(std::false_type{}): picks shifted_exp_vec's variant.
template <typename Fn>
inline decltype(auto) with_unit_t(float inv_t, Fn&& fn) {
  return inv_t == 1.0f ? fn(std::true_type{}) : fn(std::false_type{});
}

// Lanes of a vector of logits with x >= bound: a bit mask (lane l -> bit l).
inline int lanes_at_least(const Vec& x, const Vec& bound) {
  return ~(x >= bound).zero_mask() & ((1 << Vec::size()) - 1);
}

// Whether any of the n floats x[0, n) is >= cut. A filtered row skips the tiles where
// none is: their tokens weigh exactly 0, so sums and races are unchanged (x + 0 == x,
// and a race key of 0 never beats the positive key some other tile has).
inline bool any_at_least(const float* x, int64_t n, float cut) {
  const Vec vc(cut);
  int64_t k = 0;
  for (; k + Vec::size() <= n; k += Vec::size())
    if (lanes_at_least(Vec::loadu(x + k), vc)) return true;
  for (; k < n; ++k)
    if (x[k] >= cut) return true;
  return false;
}

// sum_k exp((x_k - m) * inv_t) over the n <= kRaceTile floats of one race tile, in a fixed
// order (one vector accumulator, its lanes in lane_tree_sum's tree, then the scalar tail): a
// tile value of core/tile_sum.h's canonical tree.
template <bool kUnitT>
inline float tile_sum_exp(const float* x, int64_t n, float m, float inv_t, const Vec& vm, const Vec& va) {
  Vec acc(0.0f);
  int64_t k = 0;
  for (; k + Vec::size() <= n; k += Vec::size()) acc = acc + shifted_exp_vec<kUnitT>(Vec::loadu(x + k), vm, va);
  float s = tile_lanes_sum(acc);
  for (; k < n; ++k) s += shifted_exp(x[k], m, inv_t);
  return s;
}

// Adds the race tiles of the n floats x (a multiple of kRaceTile from the row's start, so
// tile-aligned) to the canonical sum: tile_sum_exp of each.
template <bool kUnitT>
inline void add_tiles_sum_exp(TileSumStack& sum, const float* x, int64_t n, float m, float inv_t, const Vec& vm,
                              const Vec& va) {
  for (int64_t r = 0; r < n; r += kRaceTile)
    sum.add(tile_sum_exp<kUnitT>(x + r, std::min(kRaceTile, n - r), m, inv_t, vm, va));
}

// sum_v exp((l_v - m) * inv_t) over a row (logits below `cut` excluded); m is the row's max
// logit. Summed per race tile, the tiles in core/tile_sum.h's canonical order: the same bits
// as the sum of a row cut into shards at tile boundaries (a skipped tile adds 0: exact).
template <typename T>
inline float row_sum_exp(const T* row, int64_t V, float inv_t, float m, float cut) {
  static_assert(kTile % kRaceTile == 0, "tiles hold whole race tiles");
  return with_unit_t(inv_t, [&](auto unit_t) {
    alignas(64) float buf[kTile];
    const Vec va(inv_t), vm(m);
    TileSumStack sum;
    for (int64_t v0 = 0; v0 < V; v0 += kTile) {
      const int64_t n = std::min(kTile, V - v0);
      if (cut > kNoCut && !any_at_least(tile_as_float(row, v0, n, buf), n, cut)) {
        for (int64_t r = 0; r < n; r += kRaceTile) sum.add(0.0f);
        continue;
      }
      add_tiles_sum_exp<decltype(unit_t)::value>(sum, tile_as_float(row, v0, n, buf, cut), n, m, inv_t, vm, va);
    }
    return sum.total();
  });
}

// row_sum_exp(row, V, inv_t, m, cut) (the same values summed in the same order, so the same
// bits) and, in the same pass, the raw law's sum_v exp(l_v - m) over EVERY logit (raw_sum:
// verify / sample's raw token_logprobs on a row whose own law differs from the raw one),
// also in the canonical order.
template <typename T>
inline float row_sum_exp_and_raw(const T* row, int64_t V, float inv_t, float m, float cut, float& raw_sum) {
  alignas(64) float buf[kTile];
  const Vec va(inv_t), vm(m), vc(cut), ninf(kNoCut);
  TileSumStack sum, sum1;
  for (int64_t v0 = 0; v0 < V; v0 += kTile) {
    const int64_t n = std::min(kTile, V - v0);
    const float* x = tile_as_float(row, v0, n, buf);
    for (int64_t r = 0; r < n; r += kRaceTile) {
      const int64_t nt = std::min(kRaceTile, n - r);
      const float* xt = x + r;
      Vec acc(0.0f), acc1(0.0f);
      int64_t k = 0;
      for (; k + Vec::size() <= nt; k += Vec::size()) {
        const Vec xv = Vec::loadu(xt + k);
        acc1 = acc1 + shifted_exp_vec<true>(xv, vm, va);
        acc = acc + shifted_exp_vec<false>(Vec::blendv(ninf, xv, xv >= vc), vm, va);
      }
      float s = tile_lanes_sum(acc), s1 = tile_lanes_sum(acc1);
      for (; k < nt; ++k) {
        s1 += shifted_exp(xt[k], m, 1.0f);
        s += shifted_exp(filtered_logit(xt[k], cut), m, inv_t);
      }
      sum.add(s);
      sum1.add(s1);
    }
  }
  raw_sum = sum1.total();
  return sum.total();
}

// Exponentials E_v for v in [v0, v0 + n), v0 a multiple of 4, n <= kTile.
inline void race_exponentials(const RowRng& rng, uint32_t stream, uint32_t position, int64_t v0,
                              int64_t n, float* out) {
  alignas(64) uint32_t bits[kTile + 4];
  const int64_t groups = (n + 3) / 4;
  const uint32_t g0 = static_cast<uint32_t>(v0 >> 2);
  for (int64_t g = 0; g < groups; ++g) {
    const Philox4 r = rng.block(stream, position, g0 + static_cast<uint32_t>(g));
    for (int k = 0; k < 4; ++k) bits[4 * g + k] = r.x[k];
  }
  for (int64_t k = 0; k < n; ++k) out[k] = uniform_open01(bits[k]);
  int64_t k = 0;
  for (; k + Vec::size() <= n; k += Vec::size()) (-Vec::loadu(out + k).log()).store(out + k);
  for (; k < n; ++k) out[k] = -std::log(out[k]);
}

inline float vec_sum(const float* a, int64_t n) {
  Vec acc(0.0f);
  int64_t k = 0;
  for (; k + Vec::size() <= n; k += Vec::size()) acc = acc + Vec::loadu(a + k);
  float tail = 0.0f;
  for (; k < n; ++k) tail += a[k];
  return hsum(acc) + tail;
}

// Race weights of tokens [v0, v0 + n), n <= kRaceTile: p[] = target probability,
// w[] = residual max(0, p_scale * p - q) (QMode kNone: w = p_scale * p; kOneHot: q one-hot at
// `draft`; kDense: the q row). p_scale: 1 for verify and sample (a multiply by 1 is exact: the
// same bits as max(0, p - q)), block verification's weight w_tau (core/block_verify.h).
// Returns false if a dense q entry is a bad probability.
template <typename T, typename TQ>
inline bool tile_weights(const T* row, const TQ* q_row, QMode q_mode, int64_t draft, int64_t v0, int64_t n,
                         float inv_t, SoftmaxStats st, float cut, float* w, float* p, float p_scale = 1.0f) {
  alignas(64) float xbuf[kRaceTile];
  alignas(64) float qbuf[kRaceTile];
  const float* x = tile_as_float(row, v0, n, xbuf, cut);
  const float* q = q_mode == QMode::kDense ? tile_as_float(q_row, v0, n, qbuf) : nullptr;
  const float inv_s = 1.0f / st.sum;
  const Vec va(inv_t), vm(st.max), vis(inv_s), vscale(p_scale), zero(0.0f);
  Vec qmin(0.0f), qmax(0.0f);
  int64_t k = with_unit_t(inv_t, [&](auto unit_t) {
    int64_t k = 0;
    for (; k + Vec::size() <= n; k += Vec::size()) {
      const Vec pv = shifted_exp_vec<decltype(unit_t)::value>(Vec::loadu(x + k), vm, va) * vis;
      pv.store(p + k);
      if (q) {
        const Vec vq = Vec::loadu(q + k);
        qmin = at::vec::minimum(qmin, vq);
        qmax = at::vec::maximum(qmax, vq);
        at::vec::maximum(pv * vscale - vq, zero).store(w + k);
      } else {
        (pv * vscale).store(w + k);
      }
    }
    return k;
  });
  for (; k < n; ++k) {
    const float e = shifted_exp(x[k], st.max, inv_t);
    p[k] = e * inv_s;
    if (q && bad_prob(q[k])) return false;
    w[k] = q ? scaled_residual_weight(e, inv_s, p_scale, q[k]) : p[k] * p_scale;
  }
  if (q && (bad_prob(hmin(qmin)) || bad_prob(hmax(qmax)))) return false;
  if (q_mode == QMode::kOneHot && draft >= v0 && draft < v0 + n) w[draft - v0] = 0.0f;  // max(0, p - 1) = 0
  return true;
}

// The fine race inside the n <= kRaceTile tokens [v, v + n) of one race tile (or of a part of
// one, on a vocabulary shard), where row[k], q_row[k] and `draft` count from token `base`:
// argmax_k w_k / E_k (p_k / E_k when use_p), ties to the lower id. The token exponentials are
// keyed by global token id (race_exponentials from v rounded down to its Philox group).
template <typename T, typename TQ>
inline int64_t fine_race(const T* row, const TQ* q_row, QMode q_mode, int64_t draft, int64_t base, int64_t v,
                         int64_t n, float inv_t, SoftmaxStats st, float cut, const RowRng& rng, uint32_t token_stream,
                         uint32_t position, bool use_p, float p_scale = 1.0f) {
  alignas(64) float w[kRaceTile];
  alignas(64) float p[kRaceTile];
  alignas(64) float E[kRaceTile + 4];
  const int64_t lead = v & 3;
  tile_weights(row, q_row, q_mode, draft - base, v - base, n, inv_t, st, cut, w, p, p_scale);
  race_exponentials(rng, token_stream, position, v - lead, n + lead, E);
  const float* weights = use_p ? p : w;
  RaceBest best = race_empty();
  for (int64_t k = 0; k < n; ++k)
    if (race_better(weights[k] / E[lead + k], v + k, best)) best = RaceBest{weights[k] / E[lead + k], v + k};
  return best.index;
}

// Two-level race over one row (verify_math.h): coarse race over fixed tiles on
// the tile sums, fine race inside the winning tile. Falls back to p if the
// residual is all zero. If probs_out is given, p is written there. Logits below
// `cut` weigh 0 (st must be the filtered stats). Returns false if a dense q row
// holds a bad probability. p_scale: as in tile_weights (the residual is max(0, p_scale * p - q)).
template <typename T, typename TQ>
inline bool race_row(const T* row, int64_t V, float inv_t, SoftmaxStats st, float cut, QMode q_mode, const TQ* q_row,
                     int64_t draft, const RowRng& rng, uint32_t tile_stream, uint32_t token_stream,
                     uint32_t position, float* probs_out, int64_t& token, float p_scale = 1.0f) {
  alignas(64) float w[kRaceTile];
  alignas(64) float p[kRaceTile];
  RaceBest tile_w = race_empty(), tile_p = race_empty();
  for (int64_t t = 0; t * kRaceTile < V; ++t) {
    const int64_t v0 = t * kRaceTile, n = std::min(kRaceTile, V - v0);
    // a tile without survivors weighs 0 (a dense q row is still read: its bad entries invalidate the row)
    if (cut > kNoCut && q_mode != QMode::kDense && !any_at_least(tile_as_float(row, v0, n, w), n, cut)) {
      if (probs_out) std::fill(probs_out + v0, probs_out + v0 + n, 0.0f);
      continue;
    }
    if (!tile_weights(row, q_row, q_mode, draft, v0, n, inv_t, st, cut, w, p, p_scale)) return false;
    if (probs_out) std::copy(p, p + n, probs_out + v0);
    const float E = race_exponential(rng, tile_stream, position, t);
    const float kw = vec_sum(w, n) / E, kp = vec_sum(p, n) / E;
    if (race_better(kw, t, tile_w)) tile_w = RaceBest{kw, t};
    if (race_better(kp, t, tile_p)) tile_p = RaceBest{kp, t};
  }
  const bool use_p = !(tile_w.key > 0.0f);
  const int64_t v0 = (use_p ? tile_p.index : tile_w.index) * kRaceTile;
  token = fine_race(row, q_row, q_mode, draft, 0, v0, std::min(kRaceTile, V - v0), inv_t, st, cut, rng,
                    token_stream, position, use_p, p_scale);
  return true;
}

// ---- Filter cutoffs (core/filter_math.h) ----
// The cutoff filter_cutoff_reference defines, found with fewer reads of the row
// (top-k: one candidate pass; top-p: one binned pass, then radix passes over one
// bin or over the top-k candidates). Every decision uses float order and integer
// fixed-point sums, so the cutoff equals the reference's whenever the per-token e
// values do (the kernel's vectorised exp may differ from std::exp in the last bit).

// A token of kth_largest's candidate buffer: its logit and id (V < 2^23: int32).
struct Candidate {
  float x;
  int32_t v;
};

// The candidate buffer of this thread's last kth_largest: every token >= its result
// (so every survivor of a cutoff at or above it).
inline std::vector<Candidate>& topk_candidates() {
  thread_local std::vector<Candidate> cand;
  return cand;
}

// The k-th largest logit of a row (0 < k < V), in ONE vectorised pass: tokens
// >= a running threshold tau go to a candidate buffer; when it fills, tau rises
// to the buffer's k-th largest and the buffer keeps only tokens >= tau. Every
// token >= the final tau is in the buffer, and at least k of them, so its k-th
// largest is the row's (the value the reference's radix passes find; in float
// order, where -0 == +0, which is how the cutoff is applied). max_out, if given,
// gets the row max of the same pass (NaN if the row holds one), as row_max would.
template <typename T>
inline float kth_largest(const T* row, int64_t V, int64_t k, float* max_out = nullptr) {
  std::vector<Candidate>& cand = topk_candidates();
  Vec vmax(-std::numeric_limits<float>::infinity());  // max_out: the row max in the same pass (NaN propagates)
  float tail_max = -std::numeric_limits<float>::infinity();
  // A small first buffer: tau starts rising after 4k tokens (k = 5, the logprobs op's top-n:
  // 64 scalar pushes and a tiny nth_element instead of 2048 and a large one), and the buffer
  // doubles whenever a shrink leaves it half full (many ties at tau), so shrinks stay amortised.
  size_t cap = static_cast<size_t>(std::max<int64_t>(4 * k, 64));
  cand.clear();
  alignas(64) float buf[kTile];
  float tau = -std::numeric_limits<float>::infinity();
  auto shrink = [&] {
    std::nth_element(cand.begin(), cand.begin() + (k - 1), cand.end(),
                     [](const Candidate& a, const Candidate& b) { return a.x > b.x; });
    tau = cand[k - 1].x;
    cand.erase(std::remove_if(cand.begin(), cand.end(), [&](const Candidate& c) { return c.x < tau; }), cand.end());
    cap = std::max(cap, 2 * cand.size());
  };
  for (int64_t v0 = 0; v0 < V; v0 += kTile) {
    const int64_t n = std::min(kTile, V - v0);
    const float* x = tile_as_float(row, v0, n, buf);
    const Vec vt(tau);
    int64_t j = 0;
    for (; j + Vec::size() <= n; j += Vec::size()) {
      const Vec xv = Vec::loadu(x + j);
      vmax = at::vec::maximum(vmax, xv);
      for (int bits = lanes_at_least(xv, vt); bits; bits &= bits - 1) {
        const int64_t l = j + __builtin_ctz(bits);
        cand.push_back(Candidate{x[l], static_cast<int32_t>(v0 + l)});
      }
    }
    for (; j < n; ++j) {
      tail_max = (x[j] != x[j] || x[j] > tail_max) ? x[j] : tail_max;
      if (x[j] >= tau) cand.push_back(Candidate{x[j], static_cast<int32_t>(v0 + j)});
    }
    if (cand.size() >= cap) shrink();
  }
  if (max_out) {
    const float vm = hmax(vmax);
    *max_out = (vm != vm || tail_max != tail_max) ? std::numeric_limits<float>::quiet_NaN()
                                                  : (vm > tail_max ? vm : tail_max);
  }
  if (cand.size() < static_cast<size_t>(k)) return -std::numeric_limits<float>::infinity();  // NaN row: unused
  shrink();
  return tau;
}

// Whether top-k cuts a V-token row (then kth_largest runs, fused with the row max).
inline bool topk_cuts(const FilterSpec& f, int64_t V) { return f.top_k > 0 && f.top_k < V; }

// The top-p cutoff key of the items (keys[i], mass[i]), i < n: the smallest key
// whose strictly-higher mass (plus `above`, the mass of items above them all) is
// < limit. Arrays are overwritten.
inline uint32_t radix_topp(uint32_t* keys, uint64_t* mass, int64_t n, double limit, uint64_t above) {
  RadixState s;
  while (!s.done()) {
    uint32_t count[kRadixBins] = {};
    uint64_t msum[kRadixBins] = {};
    for (int64_t i = 0; i < n; ++i) {
      const int d = s.digit(keys[i]);
      ++count[d];
      msum[d] += mass[i];
    }
    const int d = topp_digit(msum, count, above, limit);
    int64_t m = 0;
    for (int64_t i = 0; i < n; ++i)
      if (s.digit(keys[i]) == d) {
        keys[m] = keys[i];
        mass[m++] = mass[i];
      }
    n = m;
    s.descend(d);
  }
  return s.prefix;
}

// The min-p bound of a row (or of a shard of one, with the whole row's max m): the smallest
// logit x with shifted_exp(x, m, inv_t) >= min_p, m if there is none below it.
template <typename T>
inline float minp_bound(const T* row, int64_t V, float m, float inv_t, float min_p) {
  alignas(64) float buf[kTile];
  // e >= min_p needs (x - m) * inv_t >= log(min_p): only tokens near that bound
  // (a vectorised test with slack) get the exact scalar exp test
  const float bound = (std::log(min_p) - 1e-3f) * (1.0f + 1e-3f);
  const Vec vb(bound), vm(m), va(inv_t);
  float lo = m;
  auto consider = [&](float x) {
    if (x < lo && shifted_exp(x, m, inv_t) >= min_p) lo = x;
  };
  for (int64_t v0 = 0; v0 < V; v0 += kTile) {
    const int64_t n = std::min(kTile, V - v0);
    const float* x = tile_as_float(row, v0, n, buf);
    int64_t j = 0;
    for (; j + Vec::size() <= n; j += Vec::size())
      for (int bits = lanes_at_least((Vec::loadu(x + j) - vm) * va, vb); bits; bits &= bits - 1)
        consider(x[j + __builtin_ctz(bits)]);
    for (; j < n; ++j)
      if ((x[j] - m) * inv_t >= bound) consider(x[j]);
  }
  return lo;
}

// The cutoff of one row position (finite max m, usable inv_t): every logit below
// it is filtered out; kNoCut when nothing is.
template <typename T>
inline float filter_cutoff(const T* row, int64_t V, float m, float inv_t, const FilterSpec& f,
                           const float* topk_cut = nullptr) {
  thread_local std::vector<uint32_t> keys;
  thread_local std::vector<uint64_t> mass;
  thread_local std::vector<float> ebufs;
  alignas(64) float buf[kTile];
  float cut = kNoCut;  // the top-k cutoff first: top-p runs on the tokens >= it
  if (topk_cuts(f, V)) cut = topk_cut ? *topk_cut : kth_largest(row, V, f.top_k);
  if (f.top_p < 1.0f && topk_cuts(f, V)) {
    // top-p on the top-k survivors: they are all in the candidate buffer (k-ish tokens)
    const std::vector<Candidate>& cand = topk_candidates();
    keys.resize(cand.size());
    mass.resize(cand.size());
    int64_t n = 0;
    uint64_t total = 0;
    for (const Candidate& c : cand) {
      const float x = c.x;
      if (x < cut) continue;
      keys[n] = order_key(x);
      mass[n] = fixed_mass(shifted_exp(x, m, inv_t));
      total += mass[n++];
    }
    cut = max_cutoff(cut, key_to_float(radix_topp(keys.data(), mass.data(), n, topp_limit(f.top_p, total), 0)));
  } else if (f.top_p < 1.0f) {
    // Pass 1 bins the survivors of top-k by z = (m - l) * inv_t (monotone in l: bins
    // are contiguous key ranges, highest logits first) in steps of 1/8 nat, with
    // their fixed-point masses; tokens past the last bin have e < 2^-46, mass 0,
    // and are never kept (their strictly-higher mass is the whole mass > limit).
    // topp_digit picks the bin holding the cutoff; only that bin's keys go on to
    // the radix passes. Same cutoff as the reference (a function of integer sums).
    constexpr int kBins = kRadixBins;
    constexpr float kBinsPerNat = 8.0f;
    // 4 interleaved copies of the histogram: neighbouring tokens mostly share a bin,
    // and one copy would make every update wait for the previous one's store
    uint32_t count4[4][kBins] = {};
    uint64_t msum4[4][kBins] = {};
    ebufs.resize(V);
    const Vec va(inv_t), vm(m), vscale(kBinsPerNat), vcut(cut);
    // z of a vector of logits, with the scalar formula's operations in its order (so the
    // bins of both passes agree); lanes below the top-k cutoff get z = kBins (no bin)
    auto z_of = [&](const Vec& xv) {
      const Vec z = ((vm - xv) * va) * vscale;
      return Vec::blendv(Vec(static_cast<float>(kBins)), z, xv >= vcut);
    };
    alignas(64) float zbuf[kTile];
    for (int64_t v0 = 0; v0 < V; v0 += kTile) {
      const int64_t cnt = std::min(kTile, V - v0);
      const float* x = tile_as_float(row, v0, cnt, buf);
      float* e = ebufs.data() + v0;
      int64_t k = 0;
      for (; k + Vec::size() <= cnt; k += Vec::size()) {
        const Vec xv = Vec::loadu(x + k);
        shifted_exp_vec<false>(xv, vm, va).store(e + k);
        z_of(xv).store(zbuf + k);
      }
      for (; k < cnt; ++k) {
        e[k] = shifted_exp(x[k], m, inv_t);
        zbuf[k] = x[k] >= cut ? (m - x[k]) * inv_t * kBinsPerNat : static_cast<float>(kBins);
      }
      for (k = 0; k < cnt; ++k) {
        const float z = zbuf[k];
        if (!(z < static_cast<float>(kBins))) continue;
        const int bin = kBins - 1 - static_cast<int>(z);  // digit order: higher = higher logit
        ++count4[k & 3][bin];
        msum4[k & 3][bin] += fixed_mass(e[k]);
      }
    }
    uint32_t count[kBins];
    uint64_t msum[kBins];
    uint64_t total = 0;
    for (int d = 0; d < kBins; ++d) {
      count[d] = count4[0][d] + count4[1][d] + count4[2][d] + count4[3][d];
      msum[d] = msum4[0][d] + msum4[1][d] + msum4[2][d] + msum4[3][d];  // integer: any order is exact
      total += msum[d];
    }
    const double limit = topp_limit(f.top_p, total);
    uint64_t above = 0;
    const int pick = topp_digit(msum, count, above, limit);
    keys.resize(V);
    mass.resize(V);
    int64_t n = 0;
    // pass 2: the tokens of bin `pick`, i.e. floor(z) == kBins - 1 - pick (z >= 0, so
    // z in [lo, lo + 1) exactly), found a vector at a time
    const float lo = static_cast<float>(kBins - 1 - pick);
    const Vec vlo(lo), vhi(lo + 1.0f);
    auto take = [&](int64_t v, float x) {
      keys[n] = order_key(x);
      mass[n++] = fixed_mass(ebufs[v]);
    };
    for (int64_t v0 = 0; v0 < V; v0 += kTile) {
      const int64_t cnt = std::min(kTile, V - v0);
      const float* x = tile_as_float(row, v0, cnt, buf);
      int64_t k = 0;
      for (; k + Vec::size() <= cnt; k += Vec::size()) {
        const Vec z = z_of(Vec::loadu(x + k));
        for (int bits = lanes_at_least(z, vlo) & ~lanes_at_least(z, vhi); bits; bits &= bits - 1) {
          const int l = __builtin_ctz(bits);
          take(v0 + k + l, x[k + l]);
        }
      }
      for (; k < cnt; ++k) {
        const float z = x[k] >= cut ? (m - x[k]) * inv_t * kBinsPerNat : static_cast<float>(kBins);
        if (z >= lo && z < lo + 1.0f) take(v0 + k, x[k]);
      }
    }
    cut = max_cutoff(cut, key_to_float(radix_topp(keys.data(), mass.data(), n, limit, above)));
  }
  if (f.min_p > 0.0f) cut = max_cutoff(cut, minp_bound(row, V, m, inv_t, f.min_p));
  return cut;
}

// Rows to threads: every worker pulls the next row from a shared counter. Rows
// cost very different amounts (a row rejected at position 0 needs ~2 exp passes,
// one that accepts all K drafts K + 2), so a static split of B rows leaves one
// thread idle while the other still has work. A row is still processed by one
// thread in a fixed order, so its result does not depend on the schedule.
template <typename Fn>
inline void for_each_row(int64_t B, Fn&& fn) {
  const int64_t workers = std::min<int64_t>(B, at::get_num_threads());
  if (workers <= 1 || at::in_parallel_region()) {
    for (int64_t b = 0; b < B; ++b) fn(b);
    return;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    for (int64_t b = next.fetch_add(1, std::memory_order_relaxed); b < B;
         b = next.fetch_add(1, std::memory_order_relaxed))
      fn(b);
  });
}

// The raw max of one position (its first argmax when want_argmax). When top-k cuts
// the position (`fuse`: a non-greedy row), the same pass also finds the top-k cutoff
// (kth_largest), stored in topk_cut: one read of the row instead of two.
template <typename T>
inline void position_max(const T* row, int64_t V, bool want_argmax, bool fuse, const FilterSpec& f, float& m,
                         int64_t& arg, float& topk_cut) {
  arg = 0;
  if (fuse) topk_cut = kth_largest(row, V, f.top_k, &m);
  else row_max(row, V, want_argmax, m, arg);
}

// row_sum_exp(row, V, inv_t, m, cut) (the same bits) for a cutoff at or above the last
// kth_largest's result, from the survivors alone (they are all in the candidate buffer, with
// their ids): a tile value is tile_sum_exp's, whose every other token adds an exact 0, so each
// survivor's e goes to its lane's accumulator in id order (e from shifted_exp_vec: the same
// elementwise function), the lanes add up in lane_tree_sum's tree and the tail tokens in
// order; every tile without a survivor adds 0 to core/tile_sum.h's tree. O(k), no read of the row.
inline float topk_sum_exp(int64_t V, float inv_t, float m, float cut) {
  thread_local std::vector<Candidate> kept;
  kept.clear();
  for (const Candidate& c : topk_candidates())
    if (c.x >= cut) kept.push_back(c);
  std::sort(kept.begin(), kept.end(), [](const Candidate& a, const Candidate& b) { return a.v < b.v; });
  return with_unit_t(inv_t, [&](auto unit_t) {
    const Vec va(inv_t), vm(m);
    TileSumStack sum;
    int64_t next = 0;  // the next tile of the row to add
    for (size_t i = 0; i < kept.size();) {
      const int64_t t = kept[i].v / kRaceTile, v0 = t * kRaceTile;
      const int64_t n = std::min(kRaceTile, V - v0), n_vec = n - n % Vec::size();
      for (; next < t; ++next) sum.add(0.0f);
      alignas(64) float lanes[Vec::size()] = {};
      size_t j = i;
      for (; j < kept.size() && kept[j].v < v0 + n_vec; ++j) {
        alignas(64) float e[Vec::size()];
        shifted_exp_vec<decltype(unit_t)::value>(Vec(kept[j].x), vm, va).store(e);
        lanes[(kept[j].v - v0) % Vec::size()] += e[0];
      }
      float s = lane_tree_sum(lanes);
      for (; j < kept.size() && kept[j].v < v0 + n; ++j) s += shifted_exp(kept[j].x, m, inv_t);
      sum.add(s);
      next = t + 1;
      i = j;
    }
    for (const int64_t tiles = (V + kRaceTile - 1) / kRaceTile; next < tiles; ++next) sum.add(0.0f);
    return sum.total();
  });
}

// The filtered softmax stats of one visited, non-greedy position with raw max m:
// the filter cutoff (kNoCut when no filter is on) and the sum over the survivors.
// topk_cut: the top-k cutoff when position_max found it, else nullptr. With top-k
// every survivor is in the candidate buffer, with its id, so the sum is rebuilt from them
// (topk_sum_exp: row_sum_exp's bits) instead of in another pass over the row.
// raw_sum (raw token_logprobs asked, else nullptr): also the raw law's sum over every
// logit at T = 1: the stats sum itself when nothing differs, else taken in the sum pass
// (row_sum_exp_and_raw); a top-k row, whose sum comes from the candidates, takes it in the
// one exp pass an unfiltered row makes.
template <typename T>
inline SoftmaxStats filtered_stats(const T* row, int64_t V, float m, float inv_t, const FilterSpec& f,
                                   float& cut, const float* topk_cut, float* raw_sum = nullptr) {
  cut = filter_on(f, V) ? filter_cutoff(row, V, m, inv_t, f, topk_cut) : kNoCut;
  const bool own_is_raw = inv_t == 1.0f && cut == kNoCut;
  if (!topk_cuts(f, V)) {
    const float s = raw_sum && !own_is_raw ? row_sum_exp_and_raw(row, V, inv_t, m, cut, *raw_sum)
                                           : row_sum_exp(row, V, inv_t, m, cut);
    if (raw_sum && own_is_raw) *raw_sum = s;
    return SoftmaxStats{m, s};
  }
  const float s = topk_sum_exp(V, inv_t, m, cut);
  if (raw_sum) *raw_sum = row_sum_exp(row, V, 1.0f, m, kNoCut);
  return SoftmaxStats{m, s};
}

// The token_logprobs entry of a visited position that emits `token` (core/logprob_math.h
// emitted_logprob): from its stats (st, cut, and raw_sum for the raw law). A greedy
// position has no stats: its raw law needs the sum at T = 1 (one exp pass; the processed
// law is 0 at the argmax it emits).
template <typename T>
inline float position_logprob(const EmittedLogprobs& L, const T* row, int64_t V, int64_t token, bool greedy,
                              float m, float inv_t, float cut, float sum, float raw_sum) {
  if (greedy && !L.processed) raw_sum = row_sum_exp(row, V, 1.0f, m, kNoCut);
  return emitted_logprob(L.processed, greedy, static_cast<float>(row[token]), m, inv_t, cut, sum, raw_sum);
}

template <typename TL, typename TQ>
void verify_rows(const VerifyParams& P) {
  for_each_row(P.B, [&](int64_t b) {
    const int64_t K = P.K, V = P.V;
    int64_t* tokens = P.tokens + b * (K + 1);
    for (int64_t i = 0; i <= K; ++i) tokens[i] = -1;
    float* lp = P.logprobs.out ? P.logprobs.out + b * (K + 1) : nullptr;  // token_logprobs, NaN until emitted
    if (lp) std::fill(lp, lp + K + 1, std::numeric_limits<float>::quiet_NaN());
    P.num_accepted[b] = 0;
    P.valid[b] = false;

    const float temperature = P.temperature.get(b);
    const FilterSpec filter = P.filters.get(b);
    const int64_t n = P.drafts_of(b);  // drafts this row tests
    if (!valid_temperature(temperature) || !valid_filter(filter) || n < 0 || n > K) return;
    const int64_t* draft = P.draft_ids + b * K;
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) ok = ok && draft[i] >= 0 && draft[i] < V;
    if (!ok) return;

    const bool greedy = temperature == 0.0f;
    const bool coupled = P.coupled && !greedy;
    const float inv_t = greedy ? 1.0f : 1.0f / temperature;
    const RowRng rng = make_row_rng(P.rnd, b);
    const TL* logits = static_cast<const TL*>(P.logits) + b * P.logits_stride_b;
    const TQ* probs = P.draft_probs && !coupled ? static_cast<const TQ*>(P.draft_probs) + b * P.probs_stride_b
                                                : nullptr;

    int64_t j = -1;  // first rejected position (n = all accepted); -1 while undecided
    int64_t token = -1;
    for (int64_t i = 0; i <= n && ok; ++i) {
      const TL* row = logits + i * P.logits_stride_k;
      float m, topk_cut;
      int64_t arg;
      const bool fuse = !greedy && j < 0 && topk_cuts(filter, V);
      position_max(row, V, greedy && j < 0, fuse, filter, m, arg, topk_cut);
      if (j >= 0) {  // decided already: only NaN / +inf matter here
        ok = !(m != m || m == std::numeric_limits<float>::infinity());
        continue;
      }
      if (!usable_max(m)) { ok = false; break; }
      if (greedy) {
        if (i == n || draft[i] != arg) { j = i; token = arg; }
        if (lp) lp[i] = position_logprob(P.logprobs, row, V, arg, true, m, 1.0f, kNoCut, 0.0f, 0.0f);
        continue;
      }
      float cut, raw_sum = 0.0f;
      const SoftmaxStats st = filtered_stats(row, V, m, inv_t, filter, cut, fuse ? &topk_cut : nullptr,
                                             P.logprobs.raw() ? &raw_sum : nullptr);
      // the logprob of the token emitted here: the draft while accepted, else the race's
      auto emit_logprob = [&](int64_t x) {
        if (lp) lp[i] = position_logprob(P.logprobs, row, V, x, false, m, inv_t, cut, st.sum, raw_sum);
      };
      if (coupled) {  // the target's own sample at this position (specdec::sample's race, offset + i)
        race_row<TL, float>(row, V, inv_t, st, cut, QMode::kNone, nullptr, -1,
                            rng.advanced(static_cast<uint64_t>(i)), kStreamSampleTile, kStreamSampleRace, 0,
                            nullptr, token);
        if (i == n || draft[i] != token) j = i;
        emit_logprob(token);
        continue;
      }
      bool accepted = false;
      if (i < n) {
        const int64_t x = draft[i];
        const float q_x = probs ? static_cast<float>(probs[i * P.probs_stride_k + x]) : 1.0f;
        if (bad_prob(q_x)) { ok = false; break; }
        const float e_x = shifted_exp(filtered_logit(static_cast<float>(row[x]), cut), st.max, inv_t);
        accepted = ratio_test_accepts(accept_uniform(rng, static_cast<uint32_t>(i)), q_x, st.sum, e_x);
      }
      if (accepted) {
        emit_logprob(draft[i]);
        continue;
      }
      j = i;
      const QMode q_mode = q_mode_at(i, n, probs != nullptr);
      const TQ* q_row = probs ? probs + i * P.probs_stride_k : nullptr;
      const int64_t x = i < n ? draft[i] : -1;
      ok = race_row(row, V, inv_t, st, cut, q_mode, q_row, x, rng, kStreamVerifyTile, kStreamVerifyRace,
                    static_cast<uint32_t>(i), static_cast<float*>(nullptr), token);
      if (ok) emit_logprob(token);
    }
    if (!ok) {
      if (lp) std::fill(lp, lp + K + 1, std::numeric_limits<float>::quiet_NaN());
      return;
    }
    for (int64_t i = 0; i < j; ++i) tokens[i] = draft[i];
    tokens[j] = token;
    P.num_accepted[b] = j;
    P.valid[b] = true;
  });
}

// The law of one sample / filtered_probs / mask_logits row up to the draw: invalid (NaN /
// +inf / all -inf logits, an unusable temperature or filter), greedy (the first argmax), or
// sampled (its cutoff and filtered stats; raw_sum too when raw token_logprobs are asked).
struct SampleRowLaw {
  enum Kind { kInvalid, kGreedy, kSampled } kind = kInvalid;
  float m = 0.0f, inv_t = 1.0f, cut = kNoCut, raw_sum = 0.0f;
  int64_t arg = 0;
  SoftmaxStats st{};
};

template <typename TL>
SampleRowLaw sample_row_law(const SampleParams& P, int64_t b, const TL* row) {
  SampleRowLaw L;
  const float temperature = P.temperature.get(b);
  const FilterSpec filter = P.filters.get(b);
  float topk_cut;
  const bool greedy = temperature == 0.0f;
  const bool fuse = !greedy && valid_filter(filter) && topk_cuts(filter, P.V);
  position_max(row, P.V, greedy, fuse, filter, L.m, L.arg, topk_cut);
  if (!valid_temperature(temperature) || !valid_filter(filter) || !usable_max(L.m)) return L;
  if (greedy) {
    L.kind = SampleRowLaw::kGreedy;
    return L;
  }
  L.kind = SampleRowLaw::kSampled;
  L.inv_t = 1.0f / temperature;
  L.st = filtered_stats(row, P.V, L.m, L.inv_t, filter, L.cut, fuse ? &topk_cut : nullptr,
                        P.logprobs.raw() ? &L.raw_sum : nullptr);
  return L;
}

// The probabilities of a row without a sampled law: one-hot at `arg` (greedy), all 0 (arg < 0: invalid).
inline void point_probs(float* probs, int64_t V, int64_t arg) {
  std::fill(probs, probs + V, 0.0f);
  if (arg >= 0) probs[arg] = 1.0f;
}

template <typename TL>
void sample_rows(const SampleParams& P) {
  for_each_row(P.B, [&](int64_t b) {
    const int64_t V = P.V;
    const TL* row = static_cast<const TL*>(P.logits) + b * P.logits_stride_b;
    float* probs = P.probs_out ? P.probs_out + b * P.probs_stride_b : nullptr;
    P.tokens[b] = -1;
    if (P.logprobs.out) P.logprobs.out[b] = std::numeric_limits<float>::quiet_NaN();
    const SampleRowLaw L = sample_row_law(P, b, row);
    if (L.kind == SampleRowLaw::kInvalid) {  // invalid: -1, probs 0
      if (probs) point_probs(probs, V, -1);
      return;
    }
    if (L.kind == SampleRowLaw::kGreedy) {
      P.tokens[b] = L.arg;
      if (probs) point_probs(probs, V, L.arg);
    } else {
      race_row<TL, float>(row, V, L.inv_t, L.st, L.cut, QMode::kNone, nullptr, -1, make_row_rng(P.rnd, b),
                          kStreamSampleTile, kStreamSampleRace, 0, probs, P.tokens[b]);
    }
    if (P.logprobs.out)
      P.logprobs.out[b] = position_logprob(P.logprobs, row, V, P.tokens[b], L.kind == SampleRowLaw::kGreedy, L.m,
                                           L.inv_t, L.cut, L.st.sum, L.raw_sum);
  });
}

// filtered_probs / mask_logits: sample_rows up to the draw. probs_out gets exactly the
// p sample writes there (race_row's tile_weights; one-hot for a greedy row, 0 for an
// invalid one); masked_out the row's logits where they are >= the cutoff (the argmax
// only for a greedy row), -inf elsewhere, all NaN for an invalid row.
template <typename TL>
void filtered_rows(const SampleParams& P) {
  for_each_row(P.B, [&](int64_t b) {
    const int64_t V = P.V;
    const TL* row = static_cast<const TL*>(P.logits) + b * P.logits_stride_b;
    float* probs = P.probs_out ? P.probs_out + b * P.probs_stride_b : nullptr;
    // mask_logits takes logits only (the args layer): its output has their dtype
    using Out = std::conditional_t<std::is_same_v<TL, ProbAsLogit>, float, TL>;
    Out* masked = P.masked_out ? static_cast<Out*>(P.masked_out) + b * V : nullptr;
    auto logit_at = [&](int64_t v) -> Out {
      if constexpr (std::is_same_v<TL, ProbAsLogit>) return static_cast<float>(row[v]);
      else return row[v];
    };
    const SampleRowLaw L = sample_row_law(P, b, row);
    const Out kNegInf(-std::numeric_limits<float>::infinity());
    if (L.kind == SampleRowLaw::kInvalid) {
      if (probs) point_probs(probs, V, -1);
      if (masked) std::fill(masked, masked + V, Out(std::numeric_limits<float>::quiet_NaN()));
      return;
    }
    if (L.kind == SampleRowLaw::kGreedy) {
      if (probs) point_probs(probs, V, L.arg);
      if (masked) {
        std::fill(masked, masked + V, kNegInf);
        masked[L.arg] = logit_at(L.arg);
      }
      return;
    }
    if (masked) {
      alignas(64) float buf[kTile];
      for (int64_t v0 = 0; v0 < V; v0 += kTile) {
        const int64_t n = std::min(kTile, V - v0);
        const float* x = tile_as_float(row, v0, n, buf);
        for (int64_t k = 0; k < n; ++k) masked[v0 + k] = x[k] >= L.cut ? logit_at(v0 + k) : kNegInf;
      }
    }
    if (probs) {
      alignas(64) float w[kRaceTile];
      for (int64_t v0 = 0; v0 < V; v0 += kRaceTile) {
        const int64_t n = std::min(kRaceTile, V - v0);
        if (L.cut > kNoCut && !any_at_least(tile_as_float(row, v0, n, w), n, L.cut)) {
          std::fill(probs + v0, probs + v0 + n, 0.0f);
          continue;
        }
        tile_weights<TL, float>(row, nullptr, QMode::kNone, -1, v0, n, L.inv_t, L.st, L.cut, w, probs + v0);
      }
    }
  });
}

// Entry points with the dtypes resolved here (one copy per instruction set).
inline void verify(const VerifyParams& P, DType logits_dtype, DType probs_dtype) {
  dispatch_logits_probs<CpuTypes>(logits_dtype, probs_dtype, [&](auto tl, auto tq) {
    verify_rows<typename decltype(tl)::type, typename decltype(tq)::type>(P);
  });
}

inline void sample(const SampleParams& P, DType logits_dtype) {
  dispatch_logits_dtype<CpuTypes>(logits_dtype, [&](auto tl) { sample_rows<typename decltype(tl)::type>(P); });
}

inline void filtered(const SampleParams& P, DType logits_dtype) {
  dispatch_logits_dtype<CpuTypes>(logits_dtype, [&](auto tl) { filtered_rows<typename decltype(tl)::type>(P); });
}

}  // namespace CPU_CAPABILITY
}  // namespace cpu
}  // namespace specdec
