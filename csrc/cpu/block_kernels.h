// CPU kernel of specdec::verify_block (block verification, core/block_verify.h) over raw
// pointers, on the building blocks of sampling_kernels.h (included once per instruction set
// like it). One thread per row, positions in order:
//   position i < n: max (+ filter cutoff), filtered softmax stats, for 1 <= i the weighted
//   residual mass r_i (one pass over the position, q row read when dense), then w_{i+1};
//   position n: its stats (the bonus race needs them) when w_n > 0.
// Then the stop position tau from the stop scores and one race at tau. Once w reaches 0 the
// later positions only get verify's NaN / +inf check (nothing later can be accepted).
#pragma once
#include <cstdint>
#include <limits>
#include <vector>

#include "../core/block_verify.h"
#include "sampling_kernels.h"

namespace specdec {
namespace cpu {
namespace CPU_CAPABILITY {

// r = sum_v max(0, w * p(v) - q(v)) over a visited position (tile_weights' weights, tiles in
// token order). Returns false if a dense q entry is a bad probability.
template <typename T, typename TQ>
inline bool weighted_residual_mass(const T* row, const TQ* q_row, QMode q_mode, int64_t draft, int64_t V, float inv_t,
                                   SoftmaxStats st, float cut, float w_scale, float& r) {
  alignas(64) float w[kRaceTile];
  alignas(64) float p[kRaceTile];
  TileSumStack sum;
  for (int64_t v0 = 0; v0 < V; v0 += kRaceTile) {
    const int64_t n = std::min(kRaceTile, V - v0);
    if (cut > kNoCut && q_mode != QMode::kDense && !any_at_least(tile_as_float(row, v0, n, w), n, cut)) {
      sum.add(0.0f);
      continue;
    }
    if (!tile_weights(row, q_row, q_mode, draft, v0, n, inv_t, st, cut, w, p, w_scale)) return false;
    sum.add(vec_sum(w, n));
  }
  r = sum.total();
  return true;
}

template <typename TL, typename TQ>
void verify_block_rows(const VerifyParams& P) {
  for_each_row(P.B, [&](int64_t b) {
    const int64_t K = P.K, V = P.V;
    int64_t* tokens = P.tokens + b * (K + 1);
    for (int64_t i = 0; i <= K; ++i) tokens[i] = -1;
    P.num_accepted[b] = 0;
    P.valid[b] = false;

    const float temperature = P.temperature.get(b);
    const FilterSpec filter = P.filters.get(b);
    const int64_t n = P.drafts_of(b);
    if (!valid_temperature(temperature) || !valid_filter(filter) || n < 0 || n > K) return;
    const int64_t* draft = P.draft_ids + b * K;
    for (int64_t i = 0; i < n; ++i)
      if (draft[i] < 0 || draft[i] >= V) return;

    const bool greedy = temperature == 0.0f;
    const float inv_t = greedy ? 1.0f : 1.0f / temperature;
    const RowRng rng = make_row_rng(P.rnd, b);
    const TL* logits = static_cast<const TL*>(P.logits) + b * P.logits_stride_b;
    const TQ* probs = P.draft_probs ? static_cast<const TQ*>(P.draft_probs) + b * P.probs_stride_b : nullptr;
    auto q_row_at = [&](int64_t i) { return probs ? probs + i * P.probs_stride_k : nullptr; };

    // per position i <= n: weight w_i before draft i + 1 (w[0] = 1), stop score h[i] (i >= 1),
    // filtered stats and cutoff (read by the race at tau)
    thread_local std::vector<float> w, h, cuts;
    thread_local std::vector<SoftmaxStats> stats;
    w.assign(n + 1, 0.0f);
    h.assign(n + 1, 0.0f);
    cuts.assign(n + 1, kNoCut);
    stats.assign(n + 1, SoftmaxStats{0.0f, 1.0f});
    w[0] = 1.0f;
    bool ok = true, done = false;  // done: w reached 0 (greedy: a mismatch): later positions only checked
    int64_t tau = -1, token = -1;
    for (int64_t i = 0; i <= n && ok; ++i) {
      const TL* row = logits + i * P.logits_stride_k;
      float m, topk_cut;
      int64_t arg;
      const bool fuse = !greedy && !done && topk_cuts(filter, V);
      position_max(row, V, greedy && !done, fuse, filter, m, arg, topk_cut);
      if (done) {
        ok = !(m != m || m == std::numeric_limits<float>::infinity());
        continue;
      }
      if (!usable_max(m)) { ok = false; break; }
      if (greedy) {  // verify's longest matching prefix
        if (i == n || draft[i] != arg) { tau = i; token = arg; done = true; }
        continue;
      }
      float cut;
      const SoftmaxStats st = filtered_stats(row, V, m, inv_t, filter, cut, fuse ? &topk_cut : nullptr);
      stats[i] = st;
      cuts[i] = cut;
      if (i == n) break;
      const QMode q_mode = probs ? QMode::kDense : QMode::kOneHot;
      if (i >= 1) {
        float r = 0.0f;
        if (!weighted_residual_mass(row, q_row_at(i), q_mode, draft[i], V, inv_t, st, cut, w[i], r)) {
          ok = false;
          break;
        }
        h[i] = block_stop_score(r, w[i]);
      }
      const int64_t x = draft[i];
      const float q_x = probs ? static_cast<float>(q_row_at(i)[x]) : 1.0f;
      if (bad_prob(q_x)) { ok = false; break; }
      const float e_x = shifted_exp(filtered_logit(static_cast<float>(row[x]), cut), st.max, inv_t);
      w[i + 1] = block_weight_next(w[i], e_x / st.sum, q_x);
      if (i + 1 == n) h[n] = w[n];
      if (w[i + 1] == 0.0f) done = true;  // every later weight and stop score is 0
    }
    if (!ok) return;
    if (!greedy) {
      tau = block_stop_position(h.data(), n, [&](int64_t j) {
        return accept_uniform(rng, static_cast<uint32_t>(j - 1));
      });
      const TL* row = logits + tau * P.logits_stride_k;
      const QMode q_mode = q_mode_at(tau, n, probs != nullptr);
      ok = race_row(row, V, inv_t, stats[tau], cuts[tau], q_mode, q_mode == QMode::kDense ? q_row_at(tau) : nullptr,
                    tau < n ? draft[tau] : -1, rng, kStreamVerifyTile, kStreamVerifyRace,
                    static_cast<uint32_t>(tau), static_cast<float*>(nullptr), token,
                    tau < n ? w[tau] : 1.0f);
      if (!ok) return;
    }
    for (int64_t i = 0; i < tau; ++i) tokens[i] = draft[i];
    tokens[tau] = token;
    P.num_accepted[b] = tau;
    P.valid[b] = true;
  });
}

inline void verify_block(const VerifyParams& P, DType logits_dtype, DType probs_dtype) {
  dispatch_logits_probs<CpuTypes>(logits_dtype, probs_dtype, [&](auto tl, auto tq) {
    verify_block_rows<typename decltype(tl)::type, typename decltype(tq)::type>(P);
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace cpu
}  // namespace specdec
