// The one dtype dispatch of the sampling launchers (CPU and CUDA): DType ->
// the backend's C++ element type, given by a per-backend type map
//   struct TypeMap { using f32 = ...; using f16 = ...; using bf16 = ...; };
// (CPU: float / c10::Half / c10::BFloat16; CUDA: float / __half / __nv_bfloat16).
//
//   dispatch_dtype<TypeMap>(dtype, [&](auto tag) { using T = typename decltype(tag)::type; ... });
#pragma once
#include "prob_input.h"
#include "sampling_params.h"

namespace specdec {

template <typename T>
struct TypeTag {
  using type = T;
};

template <typename TypeMap, typename Fn>
void dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: fn(TypeTag<typename TypeMap::f32>{}); return;
    case DType::kFloat16: fn(TypeTag<typename TypeMap::f16>{}); return;
    case DType::kBFloat16: fn(TypeTag<typename TypeMap::bf16>{}); return;
    case DType::kProbsF32: return;  // never a dtype here: the args layer sets it for logits only
  }
}

// The LOGITS of the fused ops: the three dtypes, or float32 probabilities read as
// log(p) (DType::kProbsF32 -> ProbAsLogit, the same on every backend).
template <typename TypeMap, typename Fn>
void dispatch_logits_dtype(DType dtype, Fn&& fn) {
  if (dtype == DType::kProbsF32) {
    fn(TypeTag<ProbAsLogit>{});
    return;
  }
  dispatch_dtype<TypeMap>(dtype, fn);
}

// Two dtypes at once (logits, draft probabilities).
template <typename TypeMap, typename Fn>
void dispatch_dtypes(DType a, DType b, Fn&& fn) {
  dispatch_dtype<TypeMap>(a, [&](auto ta) { dispatch_dtype<TypeMap>(b, [&](auto tb) { fn(ta, tb); }); });
}

// Logits (dispatch_logits_dtype) and draft probabilities (dispatch_dtype) at once.
template <typename TypeMap, typename Fn>
void dispatch_logits_probs(DType a, DType b, Fn&& fn) {
  dispatch_logits_dtype<TypeMap>(a, [&](auto ta) { dispatch_dtype<TypeMap>(b, [&](auto tb) { fn(ta, tb); }); });
}

}  // namespace specdec
