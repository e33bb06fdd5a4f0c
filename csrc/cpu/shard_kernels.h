// CPU kernels of the local steps of vocabulary-parallel verify / sample (core/shard_math.h):
// the single-device kernel's own helpers (sampling_kernels.h: row_max, tile_sum_exp,
// tile_weights, fine_race, minp_bound) run on one shard, so that on tile-aligned shards
// every value a rank sends is the value the single-device kernel computes for the same tokens.
// Included once per instruction set, after sampling_kernels.h.
#pragma once

#include "../core/shard_math.h"
#include "sampling_kernels.h"

namespace specdec {
namespace cpu {
namespace CPU_CAPABILITY {

// Whether the n floats x (one part) hold a survivor of `cut` (always, with no cut).
inline bool part_has_survivor(const float* x, int64_t n, float cut) {
  return !(cut > kNoCut) || any_at_least(x, n, cut);
}

// race_row on one shard: the coarse race over the shard's parts (residual weights and p),
// then the fine race (sampling_kernels.h fine_race) in the best part of each. st: the GLOBAL
// (max, sum); cut: the cutoff.
template <typename T, typename TQ>
inline ShardRace race_shard(const T* row, int64_t start, int64_t end, float inv_t, SoftmaxStats st, float cut,
                            QMode q_mode, const TQ* q_row, int64_t draft, const RowRng& rng, uint32_t tile_stream,
                            uint32_t part_stream, uint32_t token_stream, uint32_t position) {
  alignas(64) float w[kRaceTile];
  alignas(64) float p[kRaceTile];
  ShardRace out = shard_race_empty();
  RaceBest bw = race_empty(), bp = race_empty();
  for (int64_t v = start; v < end; v = part_end(v, end)) {
    const int64_t n = part_end(v, end) - v;
    // as race_row: a part without survivors weighs 0 (a dense q row is still read)
    if (q_mode != QMode::kDense && !part_has_survivor(tile_as_float(row, v - start, n, w), n, cut)) continue;
    if (!tile_weights(row, q_row, q_mode, draft - start, v - start, n, inv_t, st, cut, w, p)) {
      out.bad_q = true;
      return out;
    }
    const float E = v % kRaceTile == 0 ? race_exponential(rng, tile_stream, position, v / kRaceTile)
                                       : race_exponential(rng, part_stream, position, v);
    const float kw = vec_sum(w, n) / E, kp = vec_sum(p, n) / E;
    if (race_better(kw, v, bw)) bw = RaceBest{kw, v};
    if (race_better(kp, v, bp)) bp = RaceBest{kp, v};
  }
  if (bp.key < 0.0f) return out;  // no survivor on this shard
  out.key_w = bw.key;
  out.part_w = bw.index;
  out.token_w = fine_race(row, q_row, q_mode, draft, start, bw.index, part_end(bw.index, end) - bw.index, inv_t, st,
                          cut, rng, token_stream, position, false);
  out.key_p = bp.key;
  out.part_p = bp.index;
  out.token_p = fine_race(row, q_row, q_mode, draft, start, bp.index, part_end(bp.index, end) - bp.index, inv_t, st,
                          cut, rng, token_stream, position, true);
  return out;
}

// kSums of one position: the shard's cover of the row sum against the global max m and
// cutoff (row_sum_exp's tile values, in core/tile_sum.h's tree), cover_size values into out.
template <typename T>
inline void shard_sum_cover(const T* row, int64_t start, int64_t end, int64_t first_part, float m, float inv_t,
                            float cut, double* out) {
  with_unit_t(inv_t, [&](auto unit_t) {
    alignas(64) float buf[kTile];
    const Vec va(inv_t), vm(m);
    TileSumStack sum(first_part);
    for (int64_t v = start; v < end; v = part_end(v, end)) {
      const int64_t n = part_end(v, end) - v;
      if (!part_has_survivor(tile_as_float(row, v - start, n, buf), n, cut)) {
        sum.add(0.0f);  // row_sum_exp's skipped tiles: an exact 0
        continue;
      }
      sum.add(tile_sum_exp<decltype(unit_t)::value>(tile_as_float(row, v - start, n, buf, cut), n, m, inv_t, vm, va));
    }
    for (int d = 0; d < sum.depth; ++d) out[d] = sum.value[d];
  });
}

// A top-k pass on one shard: count[d] of the keys in the search's bucket with digit d.
template <typename T>
inline void shard_topk_pass(const T* row, int64_t V, const RadixState& s, int64_t* count) {
  alignas(64) float buf[kTile];
  for (int64_t v0 = 0; v0 < V; v0 += kTile) {
    const int64_t n = std::min(kTile, V - v0);
    const float* x = tile_as_float(row, v0, n, buf);
    for (int64_t k = 0; k < n; ++k) {
      const uint32_t key = order_key(x[k]);
      if (s.in_bucket(key)) ++count[s.digit(key)];
    }
  }
}

// A top-p pass on one shard: count[d] and mass[d] (fixed point) of the tokens >= topk_cut in
// the search's bucket. e per token as the single-device kernel takes it for top-p: the scalar
// shifted_exp when top-k cuts the row (filter_cutoff's candidate path), else
// filter_cutoff's vectorised pass (shifted_exp_vec a vector at a time, the scalar formula for
// the chunk's tail), so on aligned shards the masses, hence the cutoff, are the same.
template <typename T>
inline void shard_topp_pass(const T* row, int64_t V, float m, float inv_t, bool topk, float topk_cut,
                            const RadixState& s, int64_t* count, int64_t* mass) {
  alignas(64) float buf[kTile];
  alignas(64) float e[kTile];
  const Vec va(inv_t), vm(m);
  for (int64_t v0 = 0; v0 < V; v0 += kTile) {
    const int64_t n = std::min(kTile, V - v0);
    const float* x = tile_as_float(row, v0, n, buf);
    int64_t k = 0;
    if (!topk)
      for (; k + Vec::size() <= n; k += Vec::size()) shifted_exp_vec<false>(Vec::loadu(x + k), vm, va).store(e + k);
    for (; k < n; ++k) e[k] = shifted_exp(x[k], m, inv_t);
    for (k = 0; k < n; ++k) {
      const uint32_t key = order_key(x[k]);
      if (x[k] < topk_cut || !s.in_bucket(key)) continue;
      const int d = s.digit(key);
      ++count[d];
      mass[d] = static_cast<int64_t>(static_cast<uint64_t>(mass[d]) + fixed_mass(e[k]));
    }
  }
}

template <typename TL, typename TQ>
void shard_step_rows(const ShardParams& S) {
  const VerifyParams& P = S.v;
  const int64_t K = P.K, V = P.V, start = S.vocab_start(), end = S.vocab_end();
  const ShardStep kind = S.g.plan.kind[S.step];
  const int64_t W = S.g.width[S.step];
  for_each_row(P.B, [&](int64_t b) {
    const TL* logits = static_cast<const TL*>(P.logits) + b * P.logits_stride_b;
    if (kind == ShardStep::kMax) {  // local max and first argmax (global id) of the used positions
      double* out = static_cast<double*>(S.out) + b * (K + 1) * W;
      for (int64_t i = 0; i <= K; ++i) store_max(out + i * W, -std::numeric_limits<float>::infinity(), -1);
      const float temperature = P.temperature.get(b);
      const int64_t n = P.drafts_of(b);
      if (!valid_temperature(temperature) || n < 0 || n > K) return;  // finish says so
      for (int64_t i = 0; i <= n; ++i) {
        float m;
        int64_t arg;
        row_max(logits + i * P.logits_stride_k, V, temperature == 0.0f, m, arg);
        store_max(out + i * W, m, start + arg);
      }
      return;
    }
    if (shard_step_is_int(kind)) {  // a filter pass
      int64_t* out = static_cast<int64_t*>(S.out) + b * (K + 1) * W;
      std::fill(out, out + (K + 1) * W, int64_t{0});
      const ShardRowPlan plan = plan_shard_row(S.g, S.layout, P, b, false);
      if (!plan.valid || plan.greedy) return;
      const FilterSpec f = P.filters.get(b);
      for (int64_t i = 0; i < plan.usable; ++i) {
        const TL* row = logits + i * P.logits_stride_k;
        int64_t* o = out + i * W;
        float m;
        int64_t arg;
        combine_max(S.g, S.layout, b, i, m, arg);
        const ShardCutSearch c = replay_cut(S.g, S.layout, b, i, f, S.step);
        const bool topk = f.top_k > 0 && f.top_k < S.layout.vocab();
        if (kind == ShardStep::kTopK && topk) shard_topk_pass(row, V, c.topk, o);
        if (kind == ShardStep::kTopP && f.top_p < 1.0f)
          shard_topp_pass(row, V, m, plan.inv_t, topk, c.topk_cut, c.topp, o, o + kRadixBins);
        if (kind == ShardStep::kMinP) o[0] = order_key(f.min_p > 0.0f ? minp_bound(row, V, m, plan.inv_t, f.min_p) : m);
      }
      return;
    }
    double* out = static_cast<double*>(S.out) + b * (K + 1) * W;
    const TQ* probs = P.draft_probs && !P.coupled ? static_cast<const TQ*>(P.draft_probs) + b * P.probs_stride_b
                                                  : nullptr;
    const int64_t* draft = P.draft_ids + b * K;
    std::fill(out, out + (K + 1) * W, 0.0);
    if (kind == ShardStep::kRaces)
      for (int64_t i = 0; i <= K; ++i) store_race(out + i * W, shard_race_empty());
    const ShardRowPlan plan = plan_shard_row(S.g, S.layout, P, b, kind == ShardStep::kRaces);
    if (!plan.valid || plan.greedy) return;
    auto max_of = [&](int64_t i) {
      float m;
      int64_t arg;
      combine_max(S.g, S.layout, b, i, m, arg);
      return m;
    };
    if (kind == ShardStep::kSums) {  // covers of every position the walk may use, and the drafts this shard owns
      for (int64_t i = 0; i < plan.usable; ++i) {
        const float m = max_of(i), cut = S.cutoff(b, i);
        const TL* row = logits + i * P.logits_stride_k;
        shard_sum_cover(row, start, end, S.layout.first_part(S.rank), m, plan.inv_t, cut, out + i * W);
        if (!plan.coupled && i < plan.n && draft[i] >= start && draft[i] < end) {
          const int64_t x = draft[i] - start;
          out[i * W + W - 2] = shifted_exp(filtered_logit(static_cast<float>(row[x]), cut), m, plan.inv_t);
          out[i * W + W - 1] = probs ? static_cast<float>(probs[i * P.probs_stride_k + x]) : 1.0f;
        }
      }
      return;
    }
    // kRaces (coupled: the target's own sample at every usable position)
    const RowRng rng = make_row_rng(P.rnd, b);
    auto stats = [&](int64_t i) { return SoftmaxStats{max_of(i), combine_sum(S.g, S.layout, b, i, plan.inv_t)}; };
    if (plan.coupled) {
      for (int64_t i = 0; i < plan.usable; ++i)
        store_race(out + i * W, race_shard<TL, float>(logits + i * P.logits_stride_k, start, end, plan.inv_t,
                                                      stats(i), S.cutoff(b, i), QMode::kNone, nullptr, -1,
                                                      rng.advanced(static_cast<uint64_t>(i)), kStreamSampleTile,
                                                      kStreamSamplePart, kStreamSampleRace, 0));
      return;
    }
    const int64_t j = plan.j;
    store_race(out + j * W, race_shard(logits + j * P.logits_stride_k, start, end, plan.inv_t, stats(j),
                                       S.cutoff(b, j), q_mode_at(j, plan.n, probs != nullptr),
                                       probs ? probs + j * P.probs_stride_k : nullptr, j < plan.n ? draft[j] : -1,
                                       rng, kStreamVerifyTile, kStreamVerifyPart, kStreamVerifyRace,
                                       static_cast<uint32_t>(j)));
  });
}

// Entry point: step S.step on this rank's shard, or finish (the tokens, from the gathered outputs).
inline void verify_shard(const ShardParams& S, DType logits_dtype, DType probs_dtype) {
  if (S.step == S.g.plan.n) {
    for_each_row(S.v.B, [&](int64_t b) { finish_shard_row(S, b); });
    return;
  }
  dispatch_logits_probs<CpuTypes>(logits_dtype, probs_dtype, [&](auto tl, auto tq) {
    shard_step_rows<typename decltype(tl)::type, typename decltype(tq)::type>(S);
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace cpu
}  // namespace specdec
