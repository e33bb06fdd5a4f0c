// CPU kernel of specdec::logprobs (core/logprob_math.h) over raw pointers, on the
// per-position helpers of sampling_kernels.h (row max, filter cutoff, sums, k-th
// largest). Included by sampling_kernels_{default,avx2}.cpp after sampling_kernels.h, in
// the same CPU_CAPABILITY namespace.
//
// Work: positions (B * positions items) are independent and skipped (NaN / -1) when they
// have no emitted token. When there are fewer items than threads, each item's vocabulary
// is split into S shards at kTile boundaries (each >= kMinShardTiles tiles), and the
// threads run the shards: pass 1 (max, first argmax, each shard's top-n candidates), the
// item's law (the filtered stats, for a processed law with a cut, on one thread), pass 2
// (the token's rank and, for a law without a cut, the sum of exponentials as the shard's
// cover of core/tile_sum.h's tree). What the shards find combines exactly (max, first
// argmax, integer counts, the top-n under the total order (logit desc, id asc), the tile
// tree rebuilt from the covers), so every output is the same bits for any S and any
// thread count (the max is taken as m + 0: a -0 max reads as +0 whichever lane found it).
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

// The smallest vocabulary shard (in kTile tiles) worth a thread of its own.
constexpr int64_t kMinShardTiles = 8;

using TopEntry = std::pair<float, int64_t>;  // (logit, id)

inline void sort_top(std::vector<TopEntry>& top, int64_t n) {
  const auto before = [](const TopEntry& a, const TopEntry& b) { return ranks_before(a.first, a.second, b.first, b.second); };
  const size_t keep = std::min(top.size(), static_cast<size_t>(n));
  std::partial_sort(top.begin(), top.begin() + keep, top.end(), before);
  top.resize(keep);
}

// One item (position): its law and what its shards found.
struct LogprobItem {
  bool live = false;  // has a token and a law: passes run
  bool has_token = false, fused_sum = false, need_pass2 = false;
  int64_t token = -1;
  float xt = 0.0f;
  PositionLaw law;
};

// One vocabulary shard [start, end) of one item.
struct LogprobShard {
  int64_t start = 0, end = 0;
  float m = -std::numeric_limits<float>::infinity();
  int64_t arg = 0;
  std::vector<TopEntry> top;  // the shard's top-n, sorted
  int64_t rank = 0;
  TileSumStack sum;
};

template <typename TL>
const TL* logprob_row(const LogprobParams& P, int64_t item) {
  return static_cast<const TL*>(P.logits) + (item / P.positions) * P.stride_b + (item % P.positions) * P.stride_k;
}

// Outputs to "none" (NaN / -1) and the item's token; live once it has one.
template <typename TL>
void logprob_prepare(const LogprobParams& P, int64_t item, LogprobItem& it) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  const int64_t n = P.n;
  P.token_logprobs[item] = kNaN;
  P.token_ranks[item] = -1;
  std::fill(P.top_logprobs + item * n, P.top_logprobs + (item + 1) * n, kNaN);
  std::fill(P.top_ids + item * n, P.top_ids + (item + 1) * n, int64_t{-1});
  it.token = P.tokens[item];
  it.live = it.token >= 0;  // no emitted token here: the logits are not read
  it.has_token = it.live && it.token < P.V;
  if (it.has_token) it.xt = static_cast<float>(logprob_row<TL>(P, item)[it.token]);
}

// Pass 1 on a shard: its max (and first argmax when n = 0) and its top-n candidates.
template <typename TL>
void logprob_pass1(const LogprobParams& P, int64_t item, LogprobShard& s) {
  const TL* row = logprob_row<TL>(P, item) + s.start;
  const int64_t len = s.end - s.start, n = P.n;
  s.top.clear();
  if (n == 0) {
    row_max(row, len, true, s.m, s.arg);
    s.arg += s.start;
    return;
  }
  int64_t unused;
  if (n < len) {  // one pass: the max and every token >= the shard's n-th largest
    kth_largest(row, len, n, &s.m);
    for (const Candidate& c : topk_candidates()) s.top.emplace_back(c.x, s.start + c.v);
  } else {  // a shard no longer than n: every token is a candidate
    row_max(row, len, false, s.m, unused);
    alignas(64) float buf[kTile];
    for (int64_t v0 = 0; v0 < len; v0 += kTile) {
      const int64_t cnt = std::min(kTile, len - v0);
      const float* x = tile_as_float(row, v0, cnt, buf);
      for (int64_t k = 0; k < cnt; ++k) s.top.emplace_back(x[k], s.start + v0 + k);
    }
  }
  sort_top(s.top, n);
}

// The item's law from its shards' pass 1 (shards[0 .. S)); not live if it has none. The
// merged top-n goes to shards[0].top.
template <typename TL>
void logprob_law(const LogprobParams& P, int64_t item, LogprobItem& it, LogprobShard* shards, int64_t S) {
  float m = -std::numeric_limits<float>::infinity();
  int64_t arg = 0;
  bool nan = false;
  for (int64_t j = 0; j < S; ++j) {
    const float ms = shards[j].m;
    if (ms != ms) nan = true;
    else if (ms > m) m = ms, arg = shards[j].arg;  // the first shard holding the max
  }
  if (nan) m = std::numeric_limits<float>::quiet_NaN();
  m = m + 0.0f;
  std::vector<TopEntry>& top = shards[0].top;
  for (int64_t j = 1; j < S; ++j) top.insert(top.end(), shards[j].top.begin(), shards[j].top.end());
  sort_top(top, P.n);
  const float t = P.temperature.get(item / P.positions);
  const FilterSpec f = P.filters.get(item / P.positions);
  if (!usable_max(m) || (P.processed && (!valid_temperature(t) || !valid_filter(f)))) {  // no law: NaN
    it.live = false;
    return;
  }
  PositionLaw& law = it.law;
  law.m = m;
  law.greedy = P.processed && t == 0.0f;
  law.arg = P.n > 0 ? top[0].second : arg;  // the largest logit, lowest id
  const FilterSpec none;
  const FilterSpec& law_filter = P.processed ? f : none;
  // a law without a cut (raw, or processed with no filter on) takes its sum in pass 2, with
  // row_sum_exp's operations in its order (the same bits, one read less)
  it.fused_sum = !law.greedy && !filter_on(law_filter, P.V);
  if (!law.greedy) law.inv_t = P.processed ? 1.0f / t : 1.0f;
  if (!law.greedy && !it.fused_sum) {
    float cut;
    const SoftmaxStats st = filtered_stats(logprob_row<TL>(P, item), P.V, m, law.inv_t, law_filter, cut, nullptr);
    law.cut = cut;
    law.log_s = std::log(st.sum);
  }
  it.need_pass2 = (it.has_token && !law.greedy) || it.fused_sum;
}

// Pass 2 on a shard: the count of logits >= the token's and, for a law without a cut, the
// shard's cover of the sum of exp((l - m) * inv_t).
template <typename TL>
void logprob_pass2(const LogprobParams& P, int64_t item, const LogprobItem& it, LogprobShard& s) {
  const TL* row = logprob_row<TL>(P, item);
  const PositionLaw& law = it.law;
  const bool count = it.has_token && !law.greedy;
  s.rank = 0;
  s.sum = TileSumStack(s.start / kRaceTile);
  alignas(64) float buf[kTile];
  with_unit_t(law.inv_t, [&](auto unit_t) {
    const Vec va(law.inv_t), vm(law.m), vt(it.xt);
    for (int64_t v0 = s.start; v0 < s.end; v0 += kTile) {
      const int64_t cnt = std::min(kTile, s.end - v0);
      const float* x = tile_as_float(row, v0, cnt, buf);
      if (it.fused_sum) add_tiles_sum_exp<decltype(unit_t)::value>(s.sum, x, cnt, law.m, law.inv_t, vm, va);
      if (count) {
        int64_t k = 0;
        for (; k + Vec::size() <= cnt; k += Vec::size())
          s.rank += __builtin_popcount(lanes_at_least(Vec::loadu(x + k), vt));
        for (; k < cnt; ++k) s.rank += x[k] >= it.xt ? 1 : 0;
      }
    }
  });
}

// The item's outputs from its law and its shards.
inline void logprob_finish(const LogprobParams& P, int64_t item, LogprobItem& it, const LogprobShard* shards,
                           int64_t S) {
  PositionLaw& law = it.law;
  int64_t rank = 0;
  if (it.need_pass2) {
    TileSumStack sum;  // the covers, shard after shard from tile 0: the whole row's tree
    for (int64_t j = 0; j < S; ++j) {
      rank += shards[j].rank;
      for (int d = 0; d < shards[j].sum.depth; ++d) sum.add_block(shards[j].sum.value[d], shards[j].sum.level[d]);
    }
    if (it.fused_sum) law.log_s = std::log(sum.total());
  }
  if (it.has_token) {
    P.token_logprobs[item] = law.logprob(it.xt, it.token);
    P.token_ranks[item] = law.greedy ? 1 : rank;
  }
  const std::vector<TopEntry>& top = shards[0].top;
  for (size_t k = 0; k < top.size(); ++k) {
    P.top_ids[item * P.n + k] = top[k].second;
    P.top_logprobs[item * P.n + k] = law.logprob(top[k].first, top[k].second);
  }
}

// Shards per item: 1 when the items keep every thread busy (or the row is short).
inline int64_t logprob_shards(const LogprobParams& P) {
  const int64_t items = P.B * P.positions, threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  const int64_t tiles = (P.V + kTile - 1) / kTile;
  if (items == 0 || items >= threads) return 1;
  return std::max<int64_t>(1, std::min((threads + items - 1) / items, tiles / kMinShardTiles));
}

template <typename TL>
void logprob_rows(const LogprobParams& P) {
  const int64_t items = P.B * P.positions, S = logprob_shards(P);
  const int64_t tiles = (P.V + kTile - 1) / kTile;
  std::vector<LogprobItem> its(items);
  std::vector<LogprobShard> sh(items * S);
  for (int64_t i = 0; i < items; ++i)
    for (int64_t j = 0; j < S; ++j) {
      sh[i * S + j].start = std::min(P.V, tiles * j / S * kTile);
      sh[i * S + j].end = std::min(P.V, tiles * (j + 1) / S * kTile);
    }
  auto law = [&](int64_t i) {
    if (its[i].live) logprob_law<TL>(P, i, its[i], &sh[i * S], S);
  };
  auto finish = [&](int64_t i) {
    if (its[i].live) logprob_finish(P, i, its[i], &sh[i * S], S);
  };
  if (S == 1) {  // one thread per item, every step in one task
    for_each_row(items, [&](int64_t i) {
      logprob_prepare<TL>(P, i, its[i]);
      if (!its[i].live) return;
      logprob_pass1<TL>(P, i, sh[i]);
      law(i);
      if (its[i].live && its[i].need_pass2) logprob_pass2<TL>(P, i, its[i], sh[i]);
      finish(i);
    });
    return;
  }
  for (int64_t i = 0; i < items; ++i) logprob_prepare<TL>(P, i, its[i]);
  for_each_row(items * S, [&](int64_t task) {
    if (its[task / S].live) logprob_pass1<TL>(P, task / S, sh[task]);
  });
  for_each_row(items, law);
  for_each_row(items * S, [&](int64_t task) {
    const LogprobItem& it = its[task / S];
    if (it.live && it.need_pass2) logprob_pass2<TL>(P, task / S, it, sh[task]);
  });
  for (int64_t i = 0; i < items; ++i) finish(i);
}

inline void logprobs(const LogprobParams& P, DType logits_dtype) {
  dispatch_logits_dtype<CpuTypes>(logits_dtype, [&](auto tl) { logprob_rows<typename decltype(tl)::type>(P); });
}

}  // namespace CPU_CAPABILITY
}  // namespace cpu
}  // namespace specdec
