// The CPU sampling kernels for any x86-64 / other CPU (at::vec's DEFAULT width).
#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT
#include "sampling_kernels.h"
#include "block_kernels.h"
#include "tree_kernels.h"
#include "logprob_kernels.h"
#include "shard_kernels.h"
#include "sampling_kernels_entry.h"

namespace specdec::cpu {
void verify_kernel(Default, const VerifyParams& P, DType tl, DType tq) { DEFAULT::verify(P, tl, tq); }
void verify_block_kernel(Default, const VerifyParams& P, DType tl, DType tq) { DEFAULT::verify_block(P, tl, tq); }
void sample_kernel(Default, const SampleParams& P, DType tl) { DEFAULT::sample(P, tl); }
void filtered_kernel(Default, const SampleParams& P, DType tl) { DEFAULT::filtered(P, tl); }
void verify_tree_kernel(Default, const TreeVerifyParams& P, DType tl, DType tq) { DEFAULT::verify_tree(P, tl, tq); }
void logprobs_kernel(Default, const LogprobParams& P, DType tl) { DEFAULT::logprobs(P, tl); }
void verify_shard_kernel(Default, const ShardParams& S, DType tl, DType tq) { DEFAULT::verify_shard(S, tl, tq); }
}  // namespace specdec::cpu
