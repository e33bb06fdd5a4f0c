// The launch sequence of specdec::verify_block, torch-free: plan (launch_plan.h:
// plan_block_verify), workspace, the filter pass (filter_cutoff_kernel over every (row,
// position), only when a filter argument was given), then verify_block_kernel: two launches
// with filters, one without. The CUDA launcher (sampling_cuda.cu) and the SIMT emulation run
// exactly this code. No host sync.
#pragma once
#include "block_kernels.cuh"
#include "sampling_launch.cuh"

namespace specdec::cuda {

// specdec::verify_block on prepared parameters (sampling_args.h: prepare_verify, coupled and
// token_logprobs off), P.B > 0.
inline void launch_verify_block(const VerifyParams& P, DType logits_dtype, DType probs_dtype, int device,
                                cudaStream_t stream, const WorkspaceAllocator& alloc) {
  dispatch_logits_probs<CudaTypes>(logits_dtype, probs_dtype, [&](auto tl, auto tq) {
    using TL = typename decltype(tl)::type;
    using TQ = typename decltype(tq)::type;
    const auto kernel = verify_block_kernel<TL, TQ>;
    const DeviceInfo dev = device_info(reinterpret_cast<const void*>(kernel), kBlockThreads, device);
    const RowBlockPlan plan = plan_block_verify(P.B, P.K, dev, P.filters.any);
    Workspace W{};  // the staged kernels' workspace: only the cutoffs and the vector-load flags are used
    W.vec_logits = vector_ok(P.logits, sizeof(TL), P.V, P.logits_stride_b, P.B, P.logits_stride_k, P.K + 1);
    W.vec_q = vector_ok(P.draft_probs, sizeof(TQ), P.V, P.probs_stride_b, P.B, P.probs_stride_k, P.K);
    if (P.filters.any) {  // one cutoff per (row, position), as verify's
      W.cutoff = reinterpret_cast<float*>(alloc(plan.workspace, kWsCutoff));
      const FilterParams F{P.logits, P.logits_stride_b, P.logits_stride_k, P.B, P.K + 1, P.V, P.temperature,
                           P.filters, P.num_drafts, P.num_drafts_stride, W.vec_logits, W.cutoff};
      launch(filter_cutoff_kernel<TL>, to_dim(P.B * (P.K + 1)), dim3(kFilterThreads), stream, F);
    }
    launch(kernel, to_dim(plan.grid), dim3(kBlockThreads), stream, P, W);
  });
}

}  // namespace specdec::cuda
