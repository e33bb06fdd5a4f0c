// specdec::logprobs: the log-probability of the emitted token at each position and the
// top-n (id, logprob) there, under one of two laws (LogprobParams::processed):
//   raw:       log softmax(l) at T = 1, no filter (what the model said);
//   processed: log p', the target's law at the position, which the emitted tokens follow:
//              softmax(l / T) after the filters (core/filter_math.h cutoffs), -inf outside
//              the kept set; a greedy position (T = 0) is one-hot at the first argmax (0
//              there, -inf elsewhere). (A correction token of exact verify is drawn from the
//              residual max(0, p' - q); its logprob is still the one under p'.)
// A token >= V (or < 0) at a position has no logprob and no rank (NaN, -1); the top-n of a
// position with a token >= V is still filled.
// Top-n: the n largest logits (ties: lower id first; every filter keeps a prefix of that
// order, so it is also the order of the processed law), found with top-k's cutoff
// (the n-th largest logit) and sorted by (logit desc, id asc). The token's rank: the number
// of tokens whose logit is >= its logit (itself included: vLLM's selected_token_ranks), 1
// for a greedy position's argmax under the processed law. Framework-free.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#include "filter_math.h"
#include "macros.h"
#include "sampling_params.h"
#include "verify_math.h"

namespace specdec {

// top-n per position: at most this many (shared memory of the CUDA kernel; vLLM's default
// max_logprobs is 20)
inline constexpr int64_t kMaxTopLogprobs = 128;

struct LogprobParams {
  const void* logits = nullptr;  // [B, positions, V] float32|fp16|bf16 (or float32 probabilities)
  int64_t stride_b = 0, stride_k = 0;
  int64_t B = 0, positions = 0, V = 0;
  const int64_t* tokens = nullptr;  // [B, positions] contiguous: the emitted token, < 0 = none (not read)
  ScalarOrRow<float> temperature;
  RowFilters filters;
  int64_t n = 0;             // top-n, in [0, kMaxTopLogprobs]
  bool processed = false;    // the law (above)
  float* token_logprobs = nullptr;  // [B, positions] out (NaN where no token)
  int64_t* token_ranks = nullptr;   // [B, positions] out: 1-based rank of the token (-1 where no token)
  int64_t* top_ids = nullptr;       // [B, positions, n] out (-1 past the vocabulary / no token)
  float* top_logprobs = nullptr;    // [B, positions, n] out (NaN likewise)
};

// The law of one position: logprob(x) = (filtered(x) - m) * inv_t - log_s, or the greedy
// one-hot rule. Built from the position's raw max m, its first argmax and the sum s of
// shifted_exp over the kept logits (verify_math.h's formula: the stats of the kernels).
struct PositionLaw {
  float m = 0.0f, inv_t = 1.0f, cut = -std::numeric_limits<float>::infinity(), log_s = 0.0f;
  bool greedy = false;
  int64_t arg = 0;
  SPECDEC_HD float logprob(float x, int64_t v) const {
    if (greedy) return v == arg ? 0.0f : -std::numeric_limits<float>::infinity();
    return (filtered_logit(x, cut) - m) * inv_t - log_s;
  }
};

// The logprob of the token emitted at a visited position (verify / sample's token_logprobs),
// from the stats the kernels keep for that position: x = its logit, m = the raw max, the
// position's inv_t and cutoff, s = the sum of shifted_exp over the kept logits at inv_t (the
// kernels' own sum), s1 = sum exp(l - m) over every logit (the raw law's sum; equal to s when
// inv_t == 1 and nothing is cut, e.g. on a greedy row, whose stats run at inv_t = 1). The
// formulas of PositionLaw::logprob. A greedy position's processed law is one-hot at the
// argmax it emits: 0.
SPECDEC_HD float emitted_logprob(bool processed, bool greedy, float x, float m, float inv_t, float cut, float s,
                                 float s1) {
  if (!processed) return (x - m) - logf(s1);
  if (greedy) return 0.0f;
  return (filtered_logit(x, cut) - m) * inv_t - logf(s);
}

// Whether top-n entry (xa, a) ranks before (xb, b): larger logit, then lower id.
SPECDEC_HD bool ranks_before(float xa, int64_t a, float xb, int64_t b) { return xa > xb || (xa == xb && a < b); }

}  // namespace specdec
