// Probability inputs (the ops' probs_input mode, DType::kProbsF32): a float32 row of
// PROBABILITIES read wherever the kernels read a logit, as log(p). No separate pass and
// no converted copy: the one load of each element takes the log.
//   p > 0 -> log p;  p = 0 -> -inf (no mass);  p < 0, NaN -> NaN;  +inf -> +inf
// (the last two make the row invalid, exactly as a NaN / +inf logit does). Any positive
// scale is fine: at T = 1 the law is p / sum(p) (softmax of log p), and the filters see
// the order and the mass of p. Every kernel (CPU, CUDA, the references) reads through
// this one conversion, so they agree on the logit of every element.
#pragma once
#include <cmath>

#include "macros.h"

namespace specdec {

struct ProbAsLogit {
  float p;
  SPECDEC_HD explicit operator float() const { return logf(p); }
};
static_assert(sizeof(ProbAsLogit) == sizeof(float), "read with the float32 vector loads");

}  // namespace specdec
