// Entry points of the CPU kernels, and the CPU element types of the dtype dispatch
// (core/dtype_dispatch.h). The sampling kernels are compiled twice (sampling_kernels_default.cpp,
// sampling_kernels_avx2.cpp); the instruction-set tag picks the copy, and the op adapters
// (op_adapters.h) call <kernel>_kernel(tag, ...) with the tag cpu_backend.h chose.
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "../core/kv_cache.h"
#include "../core/linear_params.h"
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

struct Cpu {};               // any instruction set (the KV kernels, kv_cache_cpu.cpp)
struct Default : Cpu {};     // at::vec's DEFAULT width, any CPU
struct Avx2 : Cpu {};        // AVX2 + FMA + F16C (the default code on non-x86 builds)

// The entry points of one compiled copy (tag: Default or Avx2); the copies define them in
// sampling_kernels_entries.inc.
#define SPECDEC_CPU_ENTRY_POINTS(Tag)                                                       \
  void verify_kernel(Tag, const VerifyParams& P, DType logits_dtype, DType probs_dtype);       \
  void verify_block_kernel(Tag, const VerifyParams& P, DType logits_dtype, DType probs_dtype); \
  void sample_kernel(Tag, const SampleParams& P, DType logits_dtype);                          \
  void filtered_kernel(Tag, const SampleParams& P, DType logits_dtype); /* filtered_probs, mask_logits, softmax */ \
  void verify_tree_kernel(Tag, const TreeVerifyParams& P, DType logits_dtype, DType probs_dtype); \
  void logprobs_kernel(Tag, const LogprobParams& P, DType logits_dtype);                       \
  void verify_shard_kernel(Tag, const ShardParams& S, DType logits_dtype, DType probs_dtype);                 \
  void skinny_linear_kernel(Tag, const SkinnyLinearParams& P);
SPECDEC_CPU_ENTRY_POINTS(Default)
SPECDEC_CPU_ENTRY_POINTS(Avx2)
#undef SPECDEC_CPU_ENTRY_POINTS
bool avx2_compiled();  // false on non-x86 builds, where the Avx2 copy is the default code
}  // namespace specdec::cpu
