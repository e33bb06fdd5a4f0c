// Entry points of the two compiled copies of the CPU sampling kernels, and the
// CPU element types of the dtype dispatch (core/dtype_dispatch.h).
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "../core/logprob_math.h"
#include "../core/sampling_params.h"
#include "../core/shard_math.h"
#include "../core/tree_params.h"

namespace specdec::cpu {
struct CpuTypes {
  using f32 = float;
  using f16 = c10::Half;
  using bf16 = c10::BFloat16;
};

void verify_default(const VerifyParams& P, DType logits_dtype, DType probs_dtype);
void sample_default(const SampleParams& P, DType logits_dtype);
void filtered_default(const SampleParams& P, DType logits_dtype);  // filtered_probs / mask_logits
void verify_avx2(const VerifyParams& P, DType logits_dtype, DType probs_dtype);
void verify_block_default(const VerifyParams& P, DType logits_dtype, DType probs_dtype);
void verify_block_avx2(const VerifyParams& P, DType logits_dtype, DType probs_dtype);
void sample_avx2(const SampleParams& P, DType logits_dtype);
void filtered_avx2(const SampleParams& P, DType logits_dtype);
void verify_tree_default(const TreeVerifyParams& P, DType logits_dtype, DType probs_dtype);
void verify_tree_avx2(const TreeVerifyParams& P, DType logits_dtype, DType probs_dtype);
void logprobs_default(const LogprobParams& P, DType logits_dtype);
void verify_shard_default(const ShardParams& S, DType logits_dtype, DType probs_dtype);
void logprobs_avx2(const LogprobParams& P, DType logits_dtype);
void verify_shard_avx2(const ShardParams& S, DType logits_dtype, DType probs_dtype);
bool avx2_compiled();  // false on non-x86 builds, where *_avx2 is the default code
}  // namespace specdec::cpu
