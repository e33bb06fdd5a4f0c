// The CUDA ops' launch sequences (csrc/cuda/*_launch.cuh) run in the SIMT emulator:
// the interface between the torch-free kernels translation unit (kernels_simt.cpp)
// and the torch glue (ops_simt.cpp). Parameter blocks as prepared for the CUDA
// launchers, pointing into CPU memory; every call returns when the kernels have run.
#pragma once
#include <vector>

#include "../core/kv_cache.h"
#include "../core/logprob_math.h"
#include "../core/sampling_params.h"
#include "../core/shard_math.h"
#include "../core/tree_params.h"

namespace specdec::simt_ops {

// The kernel-set tag of the SIMT backend (ops_simt.cpp, op_adapters.h: <kernel>_kernel(tag, ...)).
struct Simt {};

// sampling_launch.cuh: launch_verify / launch_sample (P.B > 0). The workspace buffers
// are separate heap allocations (an overrun from one into the next is an overrun).
void verify_kernel(Simt, const VerifyParams& P, DType logits_dtype, DType probs_dtype);
// block_launch.cuh: launch_verify_block (P.B > 0)
void verify_block_kernel(Simt, const VerifyParams& P, DType logits_dtype, DType probs_dtype);
void sample_kernel(Simt, const SampleParams& P, DType logits_dtype);
// launch_filtered: filtered_probs / mask_logits / softmax
void filtered_kernel(Simt, const SampleParams& P, DType logits_dtype);
void logprobs_kernel(Simt, const LogprobParams& P, DType logits_dtype);  // launch_logprobs (B * P > 0)
// shard_launch.cuh: launch_verify_shard (P.v.B > 0): a step of verify_shard, or finish
void verify_shard_kernel(Simt, const ShardParams& S, DType logits_dtype, DType probs_dtype);
// tree_launch.cuh: launch_verify_tree (P.B > 0)
void verify_tree_kernel(Simt, const TreeVerifyParams& P, DType logits_dtype, DType probs_dtype);

// kv_launch.cuh
void kv_append_kernel(Simt, const KVAppendParams& P);
void kv_rollback_kernel(Simt, const KVRollbackParams& P);
void paged_append_kernel(Simt, const PagedAppendParams& P);
void paged_gather_kernel(Simt, const PagedGatherParams& P);
void kv_compact_kernel(Simt, const KVCompactParams& P);  // kv_compact_ and paged_kv_compact_

// [ordinary, cooperative, refused cooperative] launches since the library was loaded.
std::vector<int64_t> launch_counts();

}  // namespace specdec::simt_ops
