// Tensor-facing argument handling of skinny_linear (csrc/op_schemas.h): every user error is
// raised (args/common.h: ValueError / TypeError) naming the argument, and the result is the
// output tensor and a pointer parameter block (core/linear_params.h). Header-only: included by
// csrc/op_adapters.h.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <optional>

#include "args/common.h"
#include "core/linear_params.h"

namespace specdec {
namespace linear {

struct SkinnyLinearLaunch {
  SkinnyLinearParams p;
  at::Tensor y;
  at::Tensor keep[4];  // x, weight, bias, residual as read (copies where a layout was refused)
};

inline void check_float32(const at::Tensor& t, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
}

inline void prepare_skinny_linear(SkinnyLinearLaunch& L, const at::Tensor& x, const at::Tensor& weight,
                                  const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual) {
  check_float32(x, "x");
  check_float32(weight, "weight");
  TORCH_CHECK_VALUE(x.dim() == 2, "x must be [M, K], got shape ", x.sizes());
  const int64_t M = x.size(0), K = x.size(1);
  // A 3-D weight is packed (core/linear_params.h): [N / 16, K, 16], read front to back.
  const bool packed = weight.dim() == 3;
  TORCH_CHECK_VALUE(weight.dim() == 2 || packed, "weight must be [N, K] or packed [N / ", kSkinnyPanel, ", K, ",
                    kSkinnyPanel, "], got shape ", weight.sizes());
  if (packed) {
    TORCH_CHECK_VALUE(weight.size(1) == K && weight.size(2) == kSkinnyPanel, "packed weight must be [N / ",
                      kSkinnyPanel, ", K, ", kSkinnyPanel, "] with K = ", K, " (x's last dim), got shape ",
                      weight.sizes());
  } else {
    TORCH_CHECK_VALUE(weight.size(1) == K, "weight must be [N, K] with K = ", K, " (x's last dim), got shape ",
                      weight.sizes());
  }
  const int64_t N = packed ? weight.size(0) * kSkinnyPanel : weight.size(0);
  L.keep[0] = args::unit_stride_last(x);
  L.keep[1] = packed ? weight.contiguous() : args::unit_stride_last(weight);
  if (bias.has_value()) {
    check_float32(*bias, "bias");
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == N, "bias must be [N] with N = ", N,
                      " (the weight's outputs), got shape ", bias->sizes());
    L.keep[2] = bias->contiguous();
  }
  if (residual.has_value()) {
    check_float32(*residual, "residual");
    TORCH_CHECK_VALUE(residual->dim() == 2 && residual->size(0) == M && residual->size(1) == N,
                      "residual must be [M, N] = [", M, ", ", N, "], got shape ", residual->sizes());
    L.keep[3] = args::unit_stride_last(*residual);
  }
  L.y = at::empty({M, N}, x.options());
  SkinnyLinearParams& p = L.p;
  p.M = M, p.N = N, p.K = K;
  p.x = L.keep[0].const_data_ptr<float>(), p.x_stride = M > 1 ? L.keep[0].stride(0) : K;
  p.weight = L.keep[1].const_data_ptr<float>(), p.w_packed = packed;
  p.w_stride = packed ? 0 : N > 1 ? L.keep[1].stride(0) : K;  // packed: implied by K
  p.bias = bias.has_value() ? L.keep[2].const_data_ptr<float>() : nullptr;
  if (residual.has_value()) p.residual = L.keep[3].const_data_ptr<float>(), p.r_stride = M > 1 ? L.keep[3].stride(0) : N;
  p.y = L.y.mutable_data_ptr<float>();
}

}  // namespace linear
}  // namespace specdec
