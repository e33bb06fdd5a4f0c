// Per-row math of BLOCK verification (Sun, Mendlovic, Leviathan et al., "Block Verification
// Accelerates Speculative Decoding", ICLR 2025), shared by the CPU and CUDA kernels of
// specdec::verify_block. The draft block is verified jointly instead of token by token: the
// emitted tokens follow the target's law exactly (as token-wise verification), and the
// expected number of accepted drafts is never below token-wise verification's.
//
// Notation for one row testing n drafts x_1..x_n (draft j sits at position j - 1 of the
// logits; position n is the bonus position), with p_j / q_j the target / draft laws at the
// position of draft j (after temperature and filters, core/verify_math.h):
//   weights      w_0 = 1,  w_j = min(1, w_{j-1} * p_j(x_j) / q_j(x_j))        (block_weight_next)
//   stop scores  for 1 <= j < n: r_j = sum_v max(0, w_j * p_{j+1}(v) - q_{j+1}(v)),
//                h_j = r_j / (r_j + 1 - w_j) (0 when that is 0)               (block_stop_score)
//                h_n = w_n
//   decision     tau = the LARGEST j in [1, n] with u_j < h_j, 0 if none (u_j ~ U(0,1) the
//                accept uniform of draft j, i.e. of position j - 1): scanned from j = n down
//   output       x_1..x_tau, then y ~ p_{n+1} (the bonus) when tau = n, else y ~ the WEIGHTED
//                residual max(0, w_tau * p_{tau+1} - q_{tau+1}) normalised (w_0 = 1: the
//                token-wise residual at position 0), drawn by verify's two-level race at
//                position tau with p scaled by w_tau (falls back to p if it is all 0).
// r_j needs one more pass over the position of draft j + 1 (reading its q row when q is
// dense). Once w_j reaches 0 every later w and h is 0: later positions are only checked for
// NaN / +inf (row validity), as verify does after its stop.
//
// Greedy rows (T == 0) are verify's: the longest matching prefix, then the argmax.
// One-hot q (draft_probs None): the ratio is p_j(x_j) and r_j = w_j * (1 - p_{j+1}(x_{j+1}));
// the law of the emitted tokens then EQUALS token-wise verification's (checked by exact
// enumeration), so block verification gains only with drafts that carry their probabilities.
#pragma once
#include <cstdint>

#include "macros.h"

namespace specdec {

// w_j from w_{j-1} and the draft's target / draft probabilities p(x), q(x) (q(x) >= 0 finite,
// p(x) in [0, 1]): min(1, w * p / q), 0 when w * p is 0 (also for q(x) = 0), 1 when w * p >= q.
SPECDEC_HD float block_weight_next(float w, float p_x, float q_x) {
  const float wp = w * p_x;
  if (!(wp > 0.0f)) return 0.0f;
  if (wp >= q_x) return 1.0f;
  return wp / q_x;
}

// h_j = r / (r + 1 - w) from the weighted residual mass r = r_j >= 0 and w = w_j in [0, 1].
SPECDEC_HD float block_stop_score(float r, float w) {
  const float d = r + (1.0f - w);
  if (!(d > 0.0f) || !(r > 0.0f)) return 0.0f;
  const float h = r / d;
  return h < 1.0f ? h : 1.0f;
}

// tau from the stop scores h[1..n] and the uniforms u(j) of draft j (position j - 1): the
// largest j with u(j) < h[j], 0 if none.
template <typename Uniform>
SPECDEC_HD int64_t block_stop_position(const float* h, int64_t n, Uniform&& u) {
  for (int64_t j = n; j >= 1; --j)
    if (u(j) < h[j]) return j;
  return 0;
}

}  // namespace specdec
