// CPU kernel of specdec::logprobs (core/logprob_math.h) over raw pointers, on the
// per-position helpers of sampling_kernels.h (row max, filter cutoff, sums, k-th
// largest). Included by sampling_kernels_{default,avx2}.cpp after sampling_kernels.h, in
// the same CPU_CAPABILITY namespace. Positions are independent: one (row, position) per
// task, skipped (NaN / -1) when it has no emitted token.
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "../core/logprob_math.h"
#include "sampling_kernels.h"

namespace specdec {
namespace cpu {
namespace CPU_CAPABILITY {

template <typename TL>
void logprob_position(const LogprobParams& P, int64_t b, int64_t i) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  const int64_t V = P.V, n = P.n, item = b * P.positions + i;
  float* top_lp = P.top_logprobs + item * n;
  int64_t* top_id = P.top_ids + item * n;
  P.token_logprobs[item] = kNaN;
  P.token_ranks[item] = -1;
  std::fill(top_lp, top_lp + n, kNaN);
  std::fill(top_id, top_id + n, int64_t{-1});
  const int64_t token = P.tokens[item];
  if (token < 0) return;  // no emitted token here: the logits are not read
  const TL* row = static_cast<const TL*>(P.logits) + b * P.stride_b + i * P.stride_k;
  const float t = P.temperature.get(b);
  const FilterSpec f = P.filters.get(b);
  PositionLaw law;
  // the max, and with n < V the n-th largest logit in the same pass (kth_largest); a greedy
  // law's argmax (the first index of the max) is then the first top-n entry
  const bool kth = n > 0 && n < V;
  float m, c = -std::numeric_limits<float>::infinity(), unused;
  if (kth) c = kth_largest(row, V, n, &m);
  else position_max(row, V, true, false, f, m, law.arg, unused);
  if (!usable_max(m) || (P.processed && (!valid_temperature(t) || !valid_filter(f)))) return;  // no law: NaN
  law.m = m;
  law.greedy = P.processed && t == 0.0f;
  const FilterSpec none;
  const FilterSpec& law_filter = P.processed ? f : none;
  // a law without a cut (raw, or processed with no filter on) takes its sum in the rank / top-n
  // pass below, with row_sum_exp's operations in its order (the same bits, one read less)
  const bool fused_sum = !law.greedy && !filter_on(law_filter, V);
  if (!law.greedy) law.inv_t = P.processed ? 1.0f / t : 1.0f;
  if (!law.greedy && !fused_sum) {
    float cut;
    const SoftmaxStats st = filtered_stats(row, V, m, law.inv_t, law_filter, cut, nullptr);
    law.cut = cut;
    law.log_s = std::log(st.sum);
  }
  // one pass: the token's rank (logits >= its logit), the top-n candidates (>= c) and, for a
  // law without a cut, the sum of exp((l - m) * inv_t)
  const bool has_token = token < V;
  const float xt = has_token ? static_cast<float>(row[token]) : 0.0f;
  int64_t rank = 0;
  std::vector<std::pair<float, int64_t>> top;
  top.reserve(static_cast<size_t>(std::min(n, V)));
  alignas(64) float buf[kTile];
  if ((has_token && !law.greedy) || n > 0 || fused_sum) {
    with_unit_t(law.inv_t, [&](auto unit_t) {
      const Vec va(law.inv_t), vm(m);
      TileSumStack sum;
      for (int64_t v0 = 0; v0 < V; v0 += kTile) {
        const int64_t cnt = std::min(kTile, V - v0);
        const float* x = tile_as_float(row, v0, cnt, buf);
        if (fused_sum) add_tiles_sum_exp<decltype(unit_t)::value>(sum, x, cnt, m, law.inv_t, vm, va);
        for (int64_t k = 0; k < cnt; ++k) {
          rank += x[k] >= xt ? 1 : 0;
          if (n > 0 && x[k] >= c) top.emplace_back(x[k], v0 + k);
        }
      }
      if (fused_sum) law.log_s = std::log(sum.total());
    });
  }
  const auto before = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b2) {
    return ranks_before(a.first, a.second, b2.first, b2.second);
  };
  const size_t keep = std::min(top.size(), static_cast<size_t>(n));
  std::partial_sort(top.begin(), top.begin() + keep, top.end(), before);
  if (kth && law.greedy) law.arg = top[0].second;  // n >= 1: the largest logit, lowest id
  if (has_token) {
    P.token_logprobs[item] = law.logprob(xt, token);
    P.token_ranks[item] = law.greedy ? 1 : rank;
  }
  for (size_t k = 0; k < keep; ++k) {
    top_id[k] = top[k].second;
    top_lp[k] = law.logprob(top[k].first, top[k].second);
  }
}

template <typename TL>
void logprob_rows(const LogprobParams& P) {
  for_each_row(P.B * P.positions, [&](int64_t item) {
    logprob_position<TL>(P, item / P.positions, item % P.positions);
  });
}

inline void logprobs(const LogprobParams& P, DType logits_dtype) {
  dispatch_logits_dtype<CpuTypes>(logits_dtype, [&](auto tl) { logprob_rows<typename decltype(tl)::type>(P); });
}

}  // namespace CPU_CAPABILITY
}  // namespace cpu
}  // namespace specdec
