// The parameter block of skinny_linear (csrc/op_schemas.h): y = x @ weight^T (+ bias) (+ residual)
// for a few rows of x. Plain pointers and sizes, no framework types; filled by csrc/linear_args.h.
#pragma once
#include <cstdint>

namespace specdec {

struct SkinnyLinearParams {
  const float* x = nullptr;         // [M, K], element (m, k) at x[m * x_stride + k]
  const float* weight = nullptr;    // [N, K], element (n, k) at weight[n * w_stride + k]
  const float* bias = nullptr;      // [N] contiguous, or nullptr
  const float* residual = nullptr;  // [M, N], element (m, n) at residual[m * r_stride + n], or nullptr
  float* y = nullptr;               // [M, N] contiguous (written)
  int64_t M = 0, N = 0, K = 0;
  int64_t x_stride = 0, w_stride = 0, r_stride = 0;
};

}  // namespace specdec
