// The launch sequence of specdec::verify_tree, torch-free: plan (launch_plan.h:
// plan_tree), workspace, the filter pass (filter_cutoff_kernel over every (row,
// node), only when a filter argument was given), then verify_tree_kernel: two
// launches with filters, one without. The CUDA launcher (sampling_cuda.cu) and the
// SIMT emulation run exactly this code. No host sync.
#pragma once
#include "sampling_launch.cuh"
#include "tree_kernels.cuh"

namespace specdec::cuda {

// specdec::verify_tree on prepared parameters (sampling_args.h: prepare_verify_tree), P.B > 0.
inline void launch_verify_tree(const TreeVerifyParams& P, DType logits_dtype, DType probs_dtype, int device,
                               cudaStream_t stream, const WorkspaceAllocator& alloc) {
  dispatch_dtypes<CudaTypes>(logits_dtype, probs_dtype, [&](auto tl, auto tq) {
    using TL = typename decltype(tl)::type;
    using TQ = typename decltype(tq)::type;
    const auto kernel = verify_tree_kernel<TL, TQ>;
    const DeviceInfo dev = device_info(reinterpret_cast<const void*>(kernel), kBlockThreads, device);
    const TreePlan plan = plan_tree(P.B, P.N, P.V, dev, P.filters.any);
    TreeWorkspace W{};
    W.vec_logits = vector_ok(P.logits, sizeof(TL), P.V, P.logits_stride_b, P.B, P.logits_stride_n, P.N);
    W.residual = reinterpret_cast<float*>(alloc(plan.workspace, kWsResidual));
    if (P.filters.any) {
      float* cutoff = reinterpret_cast<float*>(alloc(plan.workspace, kWsCutoff));
      const FilterParams F{P.logits, P.logits_stride_b, P.logits_stride_n, P.B, P.N, P.V, P.temperature,
                           P.filters, nullptr, 0, W.vec_logits, cutoff};
      launch(filter_cutoff_kernel<TL>, to_dim(P.B * P.N), dim3(kFilterThreads), stream, F);
      W.cutoff = cutoff;
    }
    launch(kernel, to_dim(plan.grid), dim3(kBlockThreads), stream, P, W);
  });
}

}  // namespace specdec::cuda
