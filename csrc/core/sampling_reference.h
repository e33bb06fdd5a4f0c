// Scalar reference of one verify row and one sample row over raw float arrays:
// the readable statement of the algorithm (core/verify_math.h, filters:
// core/filter_math.h), used by cpp_tests and by the debug ops
// specdec::verify_reference / sample_reference, which tests compare the fused
// kernels with. Host only, allocates, slow.
#pragma once
#include <cstdint>
#include <limits>
#include <vector>

#include "filter_math.h"
#include "rng.h"
#include "verify_math.h"

namespace specdec {

struct ReferenceRowResult {
  int64_t num_accepted;
  bool valid;
};

// The per-row options of verify beyond its core arguments.
struct RowOptions {
  FilterSpec filter;          // off by default
  int64_t num_drafts = -1;    // drafts this row tests; -1 = all K
  bool coupled = false;       // coupled mode (draft_probs not read)
};

inline SoftmaxStats reference_stats(const float* row_logits, int64_t V, float inv_t) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t v = 0; v < V; ++v) {
    const float x = row_logits[v];
    if (x != x) return SoftmaxStats{x, 0.0f};
    m = x > m ? x : m;
  }
  float s = 0.0f;
  if (usable_max(m))
    for (int64_t v = 0; v < V; ++v) s += shifted_exp(row_logits[v], m, inv_t);
  return SoftmaxStats{m, s};
}

inline int64_t reference_argmax(const float* row, int64_t V) {
  int64_t best = 0;
  for (int64_t v = 1; v < V; ++v)
    if (row[v] > row[best]) best = v;
  return best;
}

// The row as the filtered law reads it: logits below the cutoff set to -inf (a
// copy; the row itself when no filter is on). `row` is free of NaN / +inf and
// has a finite max.
inline const float* reference_filtered(const float* row, int64_t V, float inv_t, const FilterSpec& f,
                                       std::vector<float>& buf) {
  if (!filter_on(f, V)) return row;
  const SoftmaxStats st = reference_stats(row, V, inv_t);
  const float cut = filter_cutoff_reference(row, V, st.max, inv_t, f);
  buf.assign(row, row + V);
  for (float& x : buf) x = filtered_logit(x, cut);
  return buf.data();
}

// The two-level race of one row position (see verify_math.h) over float
// arrays: weights w = max(0, p - q) with q given by q_mode (q: the dense row,
// draft: the one-hot id), falling back to p when every w is 0. Returns the
// token, or -1 when an entry of a dense q row is a bad probability.
inline int64_t reference_race(const float* row, int64_t V, float inv_t, SoftmaxStats st, QMode q_mode,
                              const float* q, int64_t draft, const RowRng& rng, uint32_t tile_stream,
                              uint32_t token_stream, uint32_t position) {
  const float inv_s = 1.0f / st.sum;
  bool bad = false;
  // weight of token v in the residual (use_p = false) or in p (use_p = true)
  auto weight = [&](int64_t v, bool use_p) {
    const float e = shifted_exp(row[v], st.max, inv_t);
    if (use_p) return e * inv_s;
    float q_v = 0.0f;
    if (q_mode == QMode::kDense) q_v = q[v];
    if (q_mode == QMode::kOneHot) q_v = v == draft ? 1.0f : 0.0f;
    bad = bad || bad_prob(q_v);
    return residual_weight(e, inv_s, q_v);
  };
  RaceBest tile_w = race_empty(), tile_p = race_empty();
  for (int64_t t = 0; t * kRaceTile < V; ++t) {
    float W = 0.0f, Pt = 0.0f;
    for (int64_t v = t * kRaceTile; v < V && v < (t + 1) * kRaceTile; ++v) {
      W += weight(v, false);
      Pt += weight(v, true);
    }
    const float E = race_exponential(rng, tile_stream, position, t);
    if (race_better(W / E, t, tile_w)) tile_w = RaceBest{W / E, t};
    if (race_better(Pt / E, t, tile_p)) tile_p = RaceBest{Pt / E, t};
  }
  if (bad) return -1;
  const bool use_p = !(tile_w.key > 0.0f);
  const int64_t t = use_p ? tile_p.index : tile_w.index;
  RaceBest best = race_empty();
  for (int64_t v = t * kRaceTile; v < V && v < (t + 1) * kRaceTile; ++v) {
    const float key = weight(v, use_p) / race_exponential(rng, token_stream, position, v);
    if (race_better(key, v, best)) best = RaceBest{key, v};
  }
  return best.index;
}

// specdec::sample's draw from one usable, non-greedy row (the filtered law): the
// race on p' with the sample streams of `rng` at position 0.
inline int64_t reference_sample_race(const float* row, int64_t V, float inv_t, const FilterSpec& f,
                                     const RowRng& rng, std::vector<float>& buf) {
  const float* fr = reference_filtered(row, V, inv_t, f, buf);
  return reference_race(fr, V, inv_t, reference_stats(fr, V, inv_t), QMode::kNone, nullptr, -1, rng,
                        kStreamSampleTile, kStreamSampleRace, 0);
}

// One verify row.
//   logits      [K+1, V] row-major, already float
//   draft_probs [K, V] or nullptr (one-hot q at the draft ids)
//   draft_ids   [K]
//   tokens      [K+1] out
inline ReferenceRowResult verify_row_reference(const float* logits, const float* draft_probs,
                                               const int64_t* draft_ids, int64_t K, int64_t V,
                                               float temperature, const RowRng& rng, int64_t* tokens,
                                               const RowOptions& opt = RowOptions{}) {
  for (int64_t i = 0; i <= K; ++i) tokens[i] = -1;
  const ReferenceRowResult invalid{0, false};
  const int64_t n = opt.num_drafts < 0 ? K : opt.num_drafts;
  if (!valid_temperature(temperature) || !valid_filter(opt.filter) || n > K) return invalid;
  for (int64_t i = 0; i < n; ++i)
    if (draft_ids[i] < 0 || draft_ids[i] >= V) return invalid;
  // Positions 0..n must be free of NaN / +inf, whether the test reaches them or not.
  for (int64_t i = 0; i <= n; ++i)
    for (int64_t v = 0; v < V; ++v)
      if (bad_logit(logits[i * V + v])) return invalid;

  const bool greedy = temperature == 0.0f;
  const float inv_t = greedy ? 1.0f : 1.0f / temperature;
  const bool coupled = opt.coupled && !greedy;
  std::vector<float> buf;
  int64_t j = n;  // first rejected position, n if all accepted
  int64_t token = -1;
  for (int64_t i = 0; i <= n; ++i) {
    const float* raw = logits + i * V;
    if (!usable_max(reference_stats(raw, V, inv_t).max)) return invalid;  // all -inf: no distribution
    if (greedy) {
      token = reference_argmax(raw, V);
      if (i < n && draft_ids[i] == token) continue;
      j = i;
      break;
    }
    if (coupled) {
      token = reference_sample_race(raw, V, inv_t, opt.filter, rng.advanced(static_cast<uint64_t>(i)), buf);
      if (i < n && draft_ids[i] == token) continue;
      j = i;
      break;
    }
    const float* row = reference_filtered(raw, V, inv_t, opt.filter, buf);
    const SoftmaxStats st = reference_stats(row, V, inv_t);
    if (i < n) {
      const int64_t x = draft_ids[i];
      const float q_x = draft_probs ? draft_probs[i * V + x] : 1.0f;
      if (bad_prob(q_x)) return invalid;
      const float e_x = shifted_exp(row[x], st.max, inv_t);
      if (ratio_test_accepts(accept_uniform(rng, static_cast<uint32_t>(i)), q_x, st.sum, e_x)) continue;
    }
    j = i;
    token = reference_race(row, V, inv_t, st, q_mode_at(i, n, draft_probs != nullptr),
                           draft_probs ? draft_probs + i * V : nullptr, i < n ? draft_ids[i] : -1, rng,
                           kStreamVerifyTile, kStreamVerifyRace, static_cast<uint32_t>(i));
    break;
  }
  if (token < 0) return invalid;
  for (int64_t i = 0; i < j; ++i) tokens[i] = draft_ids[i];
  tokens[j] = token;
  return ReferenceRowResult{j, true};
}

// One sample row: logits [V] float; probs (or nullptr) [V] out: the filtered p',
// one-hot at the argmax for T == 0, zeros for an invalid row. Returns the token,
// or -1 for an invalid row.
inline int64_t sample_row_reference(const float* logits, int64_t V, float temperature, const RowRng& rng,
                                    float* probs, const FilterSpec& f = FilterSpec{}) {
  if (probs)
    for (int64_t v = 0; v < V; ++v) probs[v] = 0.0f;
  if (!valid_temperature(temperature) || !valid_filter(f)) return -1;
  for (int64_t v = 0; v < V; ++v)
    if (bad_logit(logits[v])) return -1;
  const bool greedy = temperature == 0.0f;
  const float inv_t = greedy ? 1.0f : 1.0f / temperature;
  if (!usable_max(reference_stats(logits, V, inv_t).max)) return -1;
  if (greedy) {
    const int64_t arg = reference_argmax(logits, V);
    if (probs) probs[arg] = 1.0f;
    return arg;
  }
  std::vector<float> buf;
  const float* row = reference_filtered(logits, V, inv_t, f, buf);
  const SoftmaxStats st = reference_stats(row, V, inv_t);
  if (probs)
    for (int64_t v = 0; v < V; ++v) probs[v] = shifted_exp(row[v], st.max, inv_t) * (1.0f / st.sum);
  return reference_race(row, V, inv_t, st, QMode::kNone, nullptr, -1, rng, kStreamSampleTile, kStreamSampleRace,
                        0);
}

}  // namespace specdec
