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
// it get a cheap max pass so NaN / +inf anywhere in the row still marks it
// invalid, exactly as in the CUDA kernel.
#pragma once
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../core/dtype_dispatch.h"
#include "../core/rng.h"
#include "../core/sampling_params.h"
#include "../core/verify_math.h"
#include "sampling_kernels_entry.h"

namespace specdec {
namespace cpu {
namespace CPU_CAPABILITY {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kTile = 1024;  // floats per tile: converted / scratch buffers stay in L1
static_assert(kTile % 4 == 0, "tiles hold whole Philox groups");

// Tile [v0, v0+n) of a row as float: the row itself for float, else converted into buf.
template <typename T>
inline const float* tile_as_float(const T* row, int64_t v0, int64_t n, float* buf) {
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

// sum_v exp((l_v - m) * inv_t) over a row; m is the row's max logit.
template <typename T>
inline float row_sum_exp(const T* row, int64_t V, float inv_t, float m) {
  return with_unit_t(inv_t, [&](auto unit_t) {
    alignas(64) float buf[kTile];
    const Vec va(inv_t), vm(m);
    Vec acc(0.0f);
    float tail = 0.0f;
    for (int64_t v0 = 0; v0 < V; v0 += kTile) {
      const int64_t n = std::min(kTile, V - v0);
      const float* x = tile_as_float(row, v0, n, buf);
      int64_t k = 0;
      for (; k + Vec::size() <= n; k += Vec::size())
        acc = acc + shifted_exp_vec<decltype(unit_t)::value>(Vec::loadu(x + k), vm, va);
      for (; k < n; ++k) tail += shifted_exp(x[k], m, inv_t);
    }
    return hsum(acc) + tail;
  });
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
// w[] = residual max(0, p - q) (QMode kNone: w = p; kOneHot: q one-hot at
// `draft`; kDense: the q row). Returns false if a dense q entry is a bad probability.
template <typename T, typename TQ>
inline bool tile_weights(const T* row, const TQ* q_row, QMode q_mode, int64_t draft, int64_t v0, int64_t n,
                         float inv_t, SoftmaxStats st, float* w, float* p) {
  alignas(64) float xbuf[kRaceTile];
  alignas(64) float qbuf[kRaceTile];
  const float* x = tile_as_float(row, v0, n, xbuf);
  const float* q = q_mode == QMode::kDense ? tile_as_float(q_row, v0, n, qbuf) : nullptr;
  const float inv_s = 1.0f / st.sum;
  const Vec va(inv_t), vm(st.max), vis(inv_s), zero(0.0f);
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
        at::vec::maximum(pv - vq, zero).store(w + k);
      } else {
        pv.store(w + k);
      }
    }
    return k;
  });
  for (; k < n; ++k) {
    const float e = shifted_exp(x[k], st.max, inv_t);
    p[k] = e * inv_s;
    if (q && bad_prob(q[k])) return false;
    w[k] = q ? residual_weight(e, inv_s, q[k]) : p[k];
  }
  if (q && (bad_prob(hmin(qmin)) || bad_prob(hmax(qmax)))) return false;
  if (q_mode == QMode::kOneHot && draft >= v0 && draft < v0 + n) w[draft - v0] = 0.0f;  // max(0, p - 1) = 0
  return true;
}

// Two-level race over one row (verify_math.h): coarse race over fixed tiles on
// the tile sums, fine race inside the winning tile. Falls back to p if the
// residual is all zero. If probs_out is given, p is written there. Returns
// false if a dense q row holds a bad probability.
template <typename T, typename TQ>
inline bool race_row(const T* row, int64_t V, float inv_t, SoftmaxStats st, QMode q_mode, const TQ* q_row,
                     int64_t draft, const RowRng& rng, uint32_t tile_stream, uint32_t token_stream,
                     uint32_t position, float* probs_out, int64_t& token) {
  alignas(64) float w[kRaceTile];
  alignas(64) float p[kRaceTile];
  RaceBest tile_w = race_empty(), tile_p = race_empty();
  for (int64_t t = 0; t * kRaceTile < V; ++t) {
    const int64_t v0 = t * kRaceTile, n = std::min(kRaceTile, V - v0);
    if (!tile_weights(row, q_row, q_mode, draft, v0, n, inv_t, st, w, p)) return false;
    if (probs_out) std::copy(p, p + n, probs_out + v0);
    const float E = race_exponential(rng, tile_stream, position, t);
    const float kw = vec_sum(w, n) / E, kp = vec_sum(p, n) / E;
    if (race_better(kw, t, tile_w)) tile_w = RaceBest{kw, t};
    if (race_better(kp, t, tile_p)) tile_p = RaceBest{kp, t};
  }
  const bool use_p = !(tile_w.key > 0.0f);
  const int64_t v0 = (use_p ? tile_p.index : tile_w.index) * kRaceTile, n = std::min(kRaceTile, V - v0);
  alignas(64) float E[kRaceTile];
  tile_weights(row, q_row, q_mode, draft, v0, n, inv_t, st, w, p);
  race_exponentials(rng, token_stream, position, v0, n, E);
  const float* weights = use_p ? p : w;
  RaceBest best = race_empty();
  for (int64_t k = 0; k < n; ++k)
    if (race_better(weights[k] / E[k], v0 + k, best)) best = RaceBest{weights[k] / E[k], v0 + k};
  token = best.index;
  return true;
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

template <typename TL, typename TQ>
void verify_rows(const VerifyParams& P) {
  for_each_row(P.B, [&](int64_t b) {
    const int64_t K = P.K, V = P.V;
    int64_t* tokens = P.tokens + b * (K + 1);
    for (int64_t i = 0; i <= K; ++i) tokens[i] = -1;
    P.num_accepted[b] = 0;
    P.valid[b] = false;

    const float temperature = P.temperature.get(b);
    if (!valid_temperature(temperature)) return;
    const int64_t* draft = P.draft_ids + b * K;
    bool ok = true;
    for (int64_t i = 0; i < K; ++i) ok = ok && draft[i] >= 0 && draft[i] < V;
    if (!ok) return;

    const bool greedy = temperature == 0.0f;
    const float inv_t = greedy ? 1.0f : 1.0f / temperature;
    const RowRng rng = make_row_rng(P.rnd, b);
    const TL* logits = static_cast<const TL*>(P.logits) + b * P.logits_stride_b;
    const TQ* probs = P.draft_probs ? static_cast<const TQ*>(P.draft_probs) + b * P.probs_stride_b
                                    : nullptr;

    int64_t j = -1;  // first rejected position (K = all accepted); -1 while undecided
    int64_t token = -1;
    for (int64_t i = 0; i <= K && ok; ++i) {
      const TL* row = logits + i * P.logits_stride_k;
      float m;
      int64_t arg;
      row_max(row, V, greedy && j < 0, m, arg);
      if (j >= 0) {  // decided already: only NaN / +inf matter here
        ok = !(m != m || m == std::numeric_limits<float>::infinity());
        continue;
      }
      if (!usable_max(m)) { ok = false; break; }
      if (greedy) {
        if (i == K || draft[i] != arg) { j = i; token = arg; }
        continue;
      }
      const SoftmaxStats st{m, row_sum_exp(row, V, inv_t, m)};
      bool accepted = false;
      if (i < K) {
        const int64_t x = draft[i];
        const float q_x = probs ? static_cast<float>(probs[i * P.probs_stride_k + x]) : 1.0f;
        if (bad_prob(q_x)) { ok = false; break; }
        const float e_x = shifted_exp(static_cast<float>(row[x]), st.max, inv_t);
        accepted = ratio_test_accepts(accept_uniform(rng, static_cast<uint32_t>(i)), q_x, st.sum, e_x);
      }
      if (accepted) continue;
      j = i;
      const QMode q_mode = q_mode_at(i, K, probs != nullptr);
      const TQ* q_row = probs ? probs + i * P.probs_stride_k : nullptr;
      const int64_t x = i < K ? draft[i] : -1;
      ok = race_row(row, V, inv_t, st, q_mode, q_row, x, rng, kStreamVerifyTile, kStreamVerifyRace,
                    static_cast<uint32_t>(i), static_cast<float*>(nullptr), token);
    }
    if (!ok) return;
    for (int64_t i = 0; i < j; ++i) tokens[i] = draft[i];
    tokens[j] = token;
    P.num_accepted[b] = j;
    P.valid[b] = true;
  });
}

template <typename TL>
void sample_rows(const SampleParams& P) {
  for_each_row(P.B, [&](int64_t b) {
    const int64_t V = P.V;
    const TL* row = static_cast<const TL*>(P.logits) + b * P.logits_stride_b;
    float* probs = P.probs_out ? P.probs_out + b * P.probs_stride_b : nullptr;
    P.tokens[b] = -1;
    const float temperature = P.temperature.get(b);
    float m;
    int64_t arg;
    const bool greedy = temperature == 0.0f;
    row_max(row, V, greedy, m, arg);
    if (!valid_temperature(temperature) || !usable_max(m)) {  // invalid row: token -1, probs 0
      if (probs) std::fill(probs, probs + V, 0.0f);
      return;
    }
    if (greedy) {
      P.tokens[b] = arg;
      if (probs) {
        std::fill(probs, probs + V, 0.0f);
        probs[arg] = 1.0f;
      }
      return;
    }
    const float inv_t = 1.0f / temperature;
    const RowRng rng = make_row_rng(P.rnd, b);
    const SoftmaxStats st{m, row_sum_exp(row, V, inv_t, m)};
    race_row<TL, float>(row, V, inv_t, st, QMode::kNone, nullptr, -1, rng, kStreamSampleTile, kStreamSampleRace, 0,
                        probs, P.tokens[b]);
  });
}

// Entry points with the dtypes resolved here (one copy per instruction set).
inline void verify(const VerifyParams& P, DType logits_dtype, DType probs_dtype) {
  dispatch_dtypes<CpuTypes>(logits_dtype, probs_dtype, [&](auto tl, auto tq) {
    verify_rows<typename decltype(tl)::type, typename decltype(tq)::type>(P);
  });
}

inline void sample(const SampleParams& P, DType logits_dtype) {
  dispatch_dtype<CpuTypes>(logits_dtype, [&](auto tl) { sample_rows<typename decltype(tl)::type>(P); });
}

}  // namespace CPU_CAPABILITY
}  // namespace cpu
}  // namespace specdec
