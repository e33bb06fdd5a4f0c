// Entry points of the two compiled copies of the CPU sampling kernels.
#pragma once
#include "../core/sampling_params.h"

namespace specdec::cpu {
void verify_default(const VerifyParams& P, DType logits_dtype, DType probs_dtype);
void sample_default(const SampleParams& P, DType logits_dtype);
void verify_avx2(const VerifyParams& P, DType logits_dtype, DType probs_dtype);
void sample_avx2(const SampleParams& P, DType logits_dtype);
bool avx2_compiled();  // false on non-x86 builds, where *_avx2 is the default code
}  // namespace specdec::cpu
