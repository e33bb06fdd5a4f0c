// Per-row math of speculative verification and sampling, shared by the CPU and
// CUDA kernels (the scalar reference of one row, the readable statement of the
// algorithm, is core/sampling_reference.h; filters are core/filter_math.h).
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
//   correction / bonus = argmax. Filters never apply to greedy rows.
// * Filters (top-k / top-p / min-p, core/filter_math.h) turn every logit below
//   the position's cutoff into -inf before any of the above: the max is kept, so
//   m, the ratio test and the races run unchanged on the filtered law p'.
// * Per-row draft counts: row b tests drafts 0..n_b - 1 (n_b = num_drafts[b] in
//   [0, K], else the row is invalid) and its bonus comes from position n_b;
//   positions after n_b are never read and their tokens are -1.
// * Coupled mode: the token the target "samples" at position i is the race of
//   specdec::sample on p'_i keyed by the row's sample streams at offset + i (the
//   row rng advanced by i). Draft i is accepted iff it equals that token; the
//   first mismatch (or position n_b) emits it. Every emitted token is the
//   target's own sample, so the text equals target-only sampling with the same
//   seed and offsets, whatever K, the drafts or draft_probs (not read) are.
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

// Block verification's weighted residual max(0, scale * p - q) (core/block_verify.h), p as in
// residual_weight; scale == 1 gives residual_weight's bits (p * 1 is exact).
SPECDEC_HD float scaled_residual_weight(float e, float inv_s, float scale, float q) {
  const float w = (e * inv_s) * scale - q;
  return w > 0.0f ? w : 0.0f;
}

}  // namespace specdec
