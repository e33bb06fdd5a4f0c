// Per-row math of speculative verification and sampling, shared by the CPU and
// CUDA kernels, plus a scalar reference of one row over raw float arrays (used
// by cpp_tests, by the debug op specdec::verify_reference and as the readable
// statement of the algorithm).
//
// Notation for one row: logits l_i[v] at positions i = 0..K, inverse temperature
// a = 1/T, m_i = max_v l_i[v] (the max of the RAW logits), and
//     e_i[v] = exp((l_i[v] - m_i) * a),   s_i = sum_v e_i[v],   p_i[v] = e_i[v] / s_i.
// Every kernel (CPU AVX2 / default, CUDA) and the reference use exactly this
// formula (shifted_exp): the max token's shifted logit is exactly 0, so its
// e is exactly 1, s_i >= 1 and 1 / s_i is finite. Nothing overflows for any
// finite logits and any usable T: (l - m) * a is <= 0 (or -inf when the
// difference or the product overflows, giving e = 0). Computing l * a - m * a
// instead (with or without an FMA) breaks this: the max token's value need not
// be 0, and l * a itself overflows for large logits or tiny T.
//
// A row is INVALID exactly when
//   * some logit of the row is NaN or +inf (any position, used or not),
//   * every logit of a USED position is -inf (no distribution), or
//   * the temperature is unusable (valid_temperature), or
//   * a draft id is outside [0, V), or a draft probability the op reads is bad
//     (bad_prob: q(x) of every tested draft, the whole q row at the rejected
//     position).
// Finite logits with a usable temperature ALWAYS give a valid token in [0, V):
// when T is tiny (or the logits huge) the law is a point mass on the argmax
// (every other e underflows to 0) and the race picks it.
//
// * Ratio test (division-free): accept draft x at position i iff u * q * s < e,
//   i.e. u * q_i(x) < p_i(x), u ~ U(0,1). p(x) = 0 is never accepted.
// * Residual sampling by a two-level exponential race. With weights
//   w_v = max(0, p_v - q_v) and fixed tiles of kRaceTile consecutive tokens:
//     coarse: tile t* = argmax_t W_t / E'_t,  W_t = sum of w over tile t
//     fine:   token   = argmax_{v in t*} w_v / E_v
//   with independent E ~ Exp(1). The coarse race picks t with probability
//   W_t / sum(W), the fine race v with probability w_v / W_t, so v is drawn with
//   probability w_v / sum(w) exactly, without normalising, and only one tile
//   needs per-token random numbers. Tiles are fixed in token space, so the
//   result does not depend on how a row is split across threads or blocks (up
//   to float rounding of the tile sums). If every w_v is 0 (p == q up to
//   rounding) the same race runs on p.
// * Bonus token (all K accepted): the race on p_K.
// * Greedy rows (T == 0): accept iff x == argmax l_i (first index of the max);
//   correction / bonus = argmax.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#include "macros.h"
#include "rng.h"

namespace specdec {

// Running (max, sum of exp((x - max) * inv_t)) of a set of raw logits x.
struct SoftmaxStats {
  float max;  // max of the raw logits (-inf if none)
  float sum;  // sum of shifted_exp(x, max, inv_t)
};

// The one formula of the target probabilities' numerator: exp((x - m) * inv_t),
// exactly 1 at x == m, in [0, 1] for x <= m (see the notation above).
SPECDEC_HD float shifted_exp(float x, float m, float inv_t) {
#if defined(__CUDA_ARCH__)
  return expf((x - m) * inv_t);
#else
  return std::exp((x - m) * inv_t);
#endif
}

SPECDEC_HD SoftmaxStats stats_empty() {
  return SoftmaxStats{-std::numeric_limits<float>::infinity(), 0.0f};
}

// Merge two partial stats (of the same inverse temperature). Order-dependent
// only through float rounding.
SPECDEC_HD SoftmaxStats stats_merge(SoftmaxStats a, SoftmaxStats b, float inv_t) {
  if (!(a.max >= b.max)) {  // also takes b when a.max is NaN
    const SoftmaxStats t = a;
    a = b;
    b = t;
  }
  if (b.sum == 0.0f) return a;  // includes an empty b (max = -inf)
  return SoftmaxStats{a.max, a.sum + b.sum * shifted_exp(b.max, a.max, inv_t)};
}

// A logit that makes the row unusable: NaN or +inf (-inf is a masked token).
SPECDEC_HD bool bad_logit(float x) { return x != x || x == std::numeric_limits<float>::infinity(); }

// A probability that makes the row unusable: NaN, negative or +inf.
SPECDEC_HD bool bad_prob(float q) { return !(q >= 0.0f) || q == std::numeric_limits<float>::infinity(); }

// A usable temperature: 0 (greedy) or positive and finite with a finite 1/T
// (a denormal T would turn every logit into +-inf). Anything else makes the
// row invalid.
SPECDEC_HD bool valid_temperature(float t) {
  const float inf = std::numeric_limits<float>::infinity();
  return t == 0.0f || (t > 0.0f && t < inf && 1.0f / t < inf);
}

// A position's max (of the raw logits) is usable when it is finite: NaN / +inf
// mean a bad logit, -inf means every token is masked (no distribution).
SPECDEC_HD bool usable_max(float m) { return m > -std::numeric_limits<float>::infinity() &&
                                             m < std::numeric_limits<float>::infinity(); }

// The ratio test u * q(x) < p(x) with p(x) = e / s, written without division.
SPECDEC_HD bool ratio_test_accepts(float u, float q_x, float s, float e_x) { return u * q_x * s < e_x; }

// The draft distribution q at the position a race runs on.
enum class QMode : int {
  kNone = 0,    // no q: the bonus position (or sample): the race runs on p
  kOneHot = 1,  // draft_probs is None: q is one-hot at the draft id
  kDense = 2,   // a dense q row
};
SPECDEC_HD QMode q_mode_at(int64_t position, int64_t K, bool has_draft_probs) {
  return position == K ? QMode::kNone : (has_draft_probs ? QMode::kDense : QMode::kOneHot);
}

// What the decision stage concluded for a row.
enum class RowStatus : int {
  kInvalid = 0,  // no token (see "A row is INVALID" above)
  kSampled = 1,  // the race at the stop position picks the token
  kGreedy = 2,   // T == 0: the token (argmax) is known
};

// Best entry of a race: highest key, ties to the lowest index (so the winner
// does not depend on the order in which candidates are merged).
struct RaceBest {
  float key;
  int64_t index;
};

// Tokens per tile of the coarse race (a multiple of 4: one Philox block gives
// 4 token exponentials; 128 = one CUDA warp x 4 tokens).
constexpr int64_t kRaceTile = 128;

SPECDEC_HD RaceBest race_empty() { return RaceBest{-1.0f, std::numeric_limits<int64_t>::max()}; }

SPECDEC_HD bool race_better(float key, int64_t index, const RaceBest& best) {
  return key > best.key || (key == best.key && index < best.index);
}

SPECDEC_HD RaceBest race_merge(RaceBest a, RaceBest b) { return race_better(b.key, b.index, a) ? b : a; }

// Residual weight max(0, p - q) with p = e * inv_s (e from shifted_exp, so
// inv_s = 1 / s is in (0, 1]).
SPECDEC_HD float residual_weight(float e, float inv_s, float q) {
  const float w = e * inv_s - q;
  return w > 0.0f ? w : 0.0f;
}

// ---------------------------------------------------------------------------
// Scalar reference of one verify row over float arrays.
//   logits      [K+1, V] row-major, already float
//   draft_probs [K, V] or nullptr (one-hot q at the draft ids)
//   draft_ids   [K]
//   tokens      [K+1] out; returns num_accepted, or -1 for an invalid row
// ---------------------------------------------------------------------------
struct ReferenceRowResult {
  int64_t num_accepted;
  bool valid;
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

// The two-level race of one row position (see the notation above) over float
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

inline ReferenceRowResult verify_row_reference(const float* logits, const float* draft_probs,
                                               const int64_t* draft_ids, int64_t K, int64_t V,
                                               float temperature, const RowRng& rng,
                                               int64_t* tokens) {
  for (int64_t i = 0; i <= K; ++i) tokens[i] = -1;
  const ReferenceRowResult invalid{0, false};
  if (!valid_temperature(temperature)) return invalid;
  for (int64_t i = 0; i < K; ++i)
    if (draft_ids[i] < 0 || draft_ids[i] >= V) return invalid;
  // Every position must be free of NaN / +inf, used or not.
  for (int64_t i = 0; i <= K; ++i)
    for (int64_t v = 0; v < V; ++v)
      if (bad_logit(logits[i * V + v])) return invalid;

  const bool greedy = temperature == 0.0f;
  const float inv_t = greedy ? 1.0f : 1.0f / temperature;
  int64_t j = K;  // first rejected position, K if all accepted
  SoftmaxStats st{};
  for (int64_t i = 0; i <= K; ++i) {
    const float* row = logits + i * V;
    st = reference_stats(row, V, inv_t);
    if (!usable_max(st.max)) return invalid;
    if (i == K) break;
    const int64_t x = draft_ids[i];
    bool accepted;
    if (greedy) {
      accepted = x == reference_argmax(row, V);
    } else {
      const float q_x = draft_probs ? draft_probs[i * V + x] : 1.0f;
      if (bad_prob(q_x)) return invalid;
      const float e_x = shifted_exp(row[x], st.max, inv_t);
      accepted = ratio_test_accepts(accept_uniform(rng, static_cast<uint32_t>(i)), q_x, st.sum, e_x);
    }
    if (!accepted) {
      j = i;
      break;
    }
  }
  const float* row = logits + j * V;
  const int64_t token =
      greedy ? reference_argmax(row, V)
             : reference_race(row, V, inv_t, st, q_mode_at(j, K, draft_probs != nullptr),
                              draft_probs ? draft_probs + j * V : nullptr, j < K ? draft_ids[j] : -1, rng,
                              kStreamVerifyTile, kStreamVerifyRace, static_cast<uint32_t>(j));
  if (token < 0) return invalid;
  for (int64_t i = 0; i < j; ++i) tokens[i] = draft_ids[i];
  tokens[j] = token;
  return ReferenceRowResult{j, true};
}

// Scalar reference of one sample row: logits [V] float; probs (or nullptr)
// [V] out: p, one-hot at the argmax for T == 0, zeros for an invalid row.
// Returns the token, or -1 for an invalid row.
inline int64_t sample_row_reference(const float* logits, int64_t V, float temperature, const RowRng& rng,
                                    float* probs) {
  if (probs)
    for (int64_t v = 0; v < V; ++v) probs[v] = 0.0f;
  if (!valid_temperature(temperature)) return -1;
  for (int64_t v = 0; v < V; ++v)
    if (bad_logit(logits[v])) return -1;
  const bool greedy = temperature == 0.0f;
  const float inv_t = greedy ? 1.0f : 1.0f / temperature;
  const SoftmaxStats st = reference_stats(logits, V, inv_t);
  if (!usable_max(st.max)) return -1;
  if (greedy) {
    const int64_t arg = reference_argmax(logits, V);
    if (probs) probs[arg] = 1.0f;
    return arg;
  }
  if (probs)
    for (int64_t v = 0; v < V; ++v) probs[v] = shifted_exp(logits[v], st.max, inv_t) * (1.0f / st.sum);
  return reference_race(logits, V, inv_t, st, QMode::kNone, nullptr, -1, rng, kStreamSampleTile,
                        kStreamSampleRace, 0);
}

}  // namespace specdec
