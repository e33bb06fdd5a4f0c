// The parameter block of skinny_linear (csrc/op_schemas.h): y = x @ weight^T (+ bias) (+ residual)
// for a few rows of x. Plain pointers and sizes, no framework types; filled by csrc/linear_args.h.
#pragma once
#include <cstdint>

namespace specdec {

// Outputs per panel of a packed skinny_linear weight (specdec_ext/ops/linear.py
// pack_linear_weight): 64 bytes, two AVX2 vectors, one cache line.
inline constexpr int kSkinnyPanel = 16;

struct SkinnyLinearParams {
  const float* x = nullptr;         // [M, K], element (m, k) at x[m * x_stride + k]
  const float* weight = nullptr;    // [N, K], element (n, k) at weight[n * w_stride + k] (row-major), or
                                    // packed (w_packed): [N / kSkinnyPanel, K, kSkinnyPanel] contiguous,
                                    // element (n, k) at weight[(n / 16 * K + k) * 16 + n % 16]
  const float* bias = nullptr;      // [N] contiguous, or nullptr
  const float* residual = nullptr;  // [M, N], element (m, n) at residual[m * r_stride + n], or nullptr
  float* y = nullptr;               // [M, N] contiguous (written)
  int64_t M = 0, N = 0, K = 0;
  int64_t x_stride = 0, w_stride = 0, r_stride = 0;
  bool w_packed = false;            // which of the two weight layouts above (and so which kernel)
};

}  // namespace specdec
