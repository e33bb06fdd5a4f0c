// The launch sequence of verify_shard / verify_shard_finish (vocabulary-parallel verify and
// sample, core/shard_math.h with ShardPlan::pairs), torch-free: ONE launch per step or finish,
// no workspace, no host sync. The CUDA launcher (sampling_cuda.cu) hands it parameters whose
// tables (shard bounds, gathered pointers) are in device memory; the SIMT emulation
// (csrc/simt/kernels_simt.cpp) runs this same code on host memory.
#pragma once
#include <algorithm>

#include "../core/dtype_dispatch.h"
#include "launch.h"
#include "sampling_launch.cuh"
#include "shard_kernels.cuh"

namespace specdec::cuda {

// Step S.step of this rank, or finish (S.step == S.g.plan.n), P.B > 0.
inline void launch_verify_shard(const ShardParams& S, DType logits_dtype, DType probs_dtype, cudaStream_t stream) {
  const VerifyParams& P = S.v;
  if (S.step == S.g.plan.n) {
    launch(shard_finish_kernel, to_dim(warp_per_row_grid(P.B)), dim3(kShardThreads), stream, S);
    return;
  }
  // 16-byte loads where the single-device kernel's lanes would load the same vectors: the
  // shard starts on a race tile (global and local vectors coincide) and the rows are aligned
  const bool tile_aligned = S.vocab_start() % kRaceTile == 0;
  dispatch_dtypes<CudaTypes>(logits_dtype, probs_dtype, [&](auto tl, auto tq) {  // no probs_input here
    using TL = typename decltype(tl)::type;
    using TQ = typename decltype(tq)::type;
    const int vec_l = tile_aligned && vector_ok(P.logits, sizeof(TL), P.V, P.logits_stride_b, P.B,
                                                P.logits_stride_k, P.K + 1);
    const int vec_q = tile_aligned && vector_ok(P.draft_probs, sizeof(TQ), P.V, P.probs_stride_b, P.B,
                                                P.probs_stride_k, P.K);
    const int64_t items = P.B * (P.K + 1);
    launch(shard_step_kernel<TL, TQ>, to_dim(std::min<int64_t>(items, 65535)), dim3(kShardThreads), stream, S,
           vec_l, vec_q);
  });
}

}  // namespace specdec::cuda
