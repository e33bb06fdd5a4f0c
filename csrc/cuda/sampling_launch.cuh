// The launch sequence of specdec::verify and specdec::sample, torch-free: planning
// (launch_plan.h), workspace binding, and the launches through the launch layer
// (launch.h). The CUDA launcher (sampling_cuda.cu) and the SIMT emulation
// (csrc/simt/kernels_simt.cpp) run exactly this code; only the backend of
// launch.h and the workspace allocator differ.
//
// Launch path (see sampling_kernels.cuh for the stages). Default: ONE cooperative
// launch (grid.sync between the stages), its grid capped at the co-resident limit
// from the occupancy query. Fallback: one ordinary launch per stage on the same
// stream (stream order is the barrier; still one op call, no host sync, capturable
// in a CUDA graph) when the device has no cooperative launch, the kernel cannot be
// resident, the cooperative launch is refused (e.g. cudaErrorCooperativeLaunchTooLarge
// when MPS or a green context gives us fewer SMs than the device has), while a CUDA
// graph is being captured, or SPECDEC_CUDA_LAUNCH=stages (launch_plan.h). Why not a
// "last block finishes" atomic ticket: it would hand a row's race to the one block
// that finishes its stats last (serial at B = 1) or need a second ticket level; the
// per-stage launches keep every stage fully parallel at the price of two more
// launches, and both paths run the same stage code, so they give bit-identical
// results (tested).
#pragma once
#include <cstdlib>
#include <functional>
#include <type_traits>

#include "../core/dtype_dispatch.h"
#include "launch.h"
#include "sampling_kernels.cuh"

namespace specdec::cuda {

// Returns the device memory of workspace buffer `buffer` (WorkspaceBuffer): at least
// layout.used[buffer] bytes (the CUDA launcher carves layout.bytes[buffer] from one
// allocation of layout.total() at layout.offset(buffer); the SIMT build allocates each
// buffer on its own, exactly used[buffer] bytes).
using WorkspaceAllocator = std::function<char*(const WorkspaceLayout& layout, int buffer)>;

// The CUDA element types of the dtype dispatch (core/dtype_dispatch.h).
struct CudaTypes {
  using f32 = float;
  using f16 = __half;
  using bf16 = __nv_bfloat16;
};

// What runs around the main kernel of one call (see the top of sampling_kernels.cuh):
// the filter pass before it (filters given), the coupled decision after it.
struct ExtraPasses {
  bool filters = false;  // filter_cutoff_kernel first (W.cutoff: one per stat row)
  bool coupled = false;  // W.coupled_y: one per race row; coupled_decide_kernel after
};

// Launch of the staged `kernel` over `rows` stat rows (B * positions) of V tokens, of
// which `race_rows` race: plan, workspace, the filter pass (F, when extra.filters), the
// launch path, the coupled decision (when extra.coupled).
template <typename TL, typename Params>
void launch_staged(void (*kernel)(Params, Workspace, int), int64_t rows, int64_t race_rows, int64_t V,
                   const Params& P, Workspace& W, const FilterParams* F, ExtraPasses extra, int device,
                   cudaStream_t stream, const WorkspaceAllocator& alloc) {
  const DeviceInfo dev = device_info(reinterpret_cast<const void*>(kernel), kBlockThreads, device);
  const LaunchPath path = choose_launch_path(std::getenv("SPECDEC_CUDA_LAUNCH"), dev.cooperative,
                                             [&] { return stream_is_capturing(stream); });
  const StagePlan plan = plan_stages(rows, race_rows, V, dev, path, extra.filters, extra.coupled, W);
  bind_workspace(plan.workspace, alloc, W);
  if (extra.filters) {  // one block per (row, position), before the main kernel
    FilterParams f = *F;
    f.cutoff = W.cutoff;
    f.vec = W.vec_logits;
    launch(filter_cutoff_kernel<TL>, to_dim(f.B * f.positions), dim3(kFilterThreads), stream, f);
  }
  bool done = false;
  if (plan.cooperative)
    done = launch_cooperative(kernel, to_dim(plan.coop_grid), dim3(kBlockThreads), stream, P, W, kAllStages) ==
           CoopLaunch::kLaunched;
  for (int stage = 0; !done && stage < kStages; ++stage)
    launch(kernel, to_dim(plan.grid[stage]), dim3(kBlockThreads), stream, P, W, stage);
  if constexpr (std::is_same_v<Params, VerifyParams>) {
    if (extra.coupled) launch(coupled_decide_kernel<TL>, to_dim(warp_per_row_grid(P.B)), dim3(kBlockThreads), stream, P, W);
  }
}

// specdec::verify on prepared parameters (sampling_args.h: prepare_verify), P.B > 0.
inline void launch_verify(const VerifyParams& P, DType logits_dtype, DType probs_dtype, int device,
                          cudaStream_t stream, const WorkspaceAllocator& alloc) {
  const int64_t rows = P.B * (P.K + 1);  // stat rows: every (row, position)
  const FilterParams F{P.logits, P.logits_stride_b, P.logits_stride_k, P.B, P.K + 1, P.V, P.temperature,
                       P.filters, P.num_drafts, P.num_drafts_stride, 0, nullptr};
  if (P.coupled) {  // draft_probs is not read: dispatch on the logits only
    dispatch_logits_dtype<CudaTypes>(logits_dtype, [&](auto tl) {
      using TL = typename decltype(tl)::type;
      Workspace W{};
      W.vec_logits = vector_ok(P.logits, sizeof(TL), P.V, P.logits_stride_b, P.B, P.logits_stride_k, P.K + 1);
      launch_staged<TL>(coupled_race_kernel<TL>, rows, rows, P.V, P, W, &F, ExtraPasses{P.filters.any, true},
                        device, stream, alloc);
    });
    return;
  }
  dispatch_logits_probs<CudaTypes>(logits_dtype, probs_dtype, [&](auto tl, auto tq) {
    using TL = typename decltype(tl)::type;
    using TQ = typename decltype(tq)::type;
    Workspace W{};
    W.vec_logits = vector_ok(P.logits, sizeof(TL), P.V, P.logits_stride_b, P.B, P.logits_stride_k, P.K + 1);
    W.vec_q = vector_ok(P.draft_probs, sizeof(TQ), P.V, P.probs_stride_b, P.B, P.probs_stride_k, P.K);
    // no filter argument: exactly the launches of the unfiltered op
    launch_staged<TL>(verify_kernel<TL, TQ>, rows, P.B, P.V, P, W, &F, ExtraPasses{P.filters.any, false}, device,
                      stream, alloc);
  });
}

// specdec::sample on prepared parameters (sampling_args.h: prepare_sample), P.B > 0.
inline void launch_sample(const SampleParams& P, DType logits_dtype, int device, cudaStream_t stream,
                          const WorkspaceAllocator& alloc) {
  const FilterParams F{P.logits, P.logits_stride_b, 0, P.B, 1, P.V, P.temperature, P.filters, nullptr, 0, 0,
                       nullptr};
  dispatch_logits_dtype<CudaTypes>(logits_dtype, [&](auto tl) {
    using TL = typename decltype(tl)::type;
    Workspace W{};
    W.vec_logits = vector_ok(P.logits, sizeof(TL), P.V, P.logits_stride_b, P.B, 0, 1);
    // float4 stores of p where 4 tokens are in range: needs 16-byte aligned rows only
    W.vec_probs = P.probs_out && vector_ok(P.probs_out, sizeof(float), 4, P.probs_stride_b, P.B, 0, 1);
    launch_staged<TL>(sample_kernel<TL>, P.B, P.B, P.V, P, W, &F, ExtraPasses{P.filters.any, false}, device, stream,
                      alloc);
  });
}

// specdec::filtered_probs (P.probs_out) / mask_logits (P.masked_out) on prepared
// parameters (sampling_args.h: prepare_filtered), P.B > 0: sample's launches with
// filtered_kernel (its stage 2 is empty: no race).
inline void launch_filtered(const SampleParams& P, DType logits_dtype, int device, cudaStream_t stream,
                            const WorkspaceAllocator& alloc) {
  const FilterParams F{P.logits, P.logits_stride_b, 0, P.B, 1, P.V, P.temperature, P.filters, nullptr, 0, 0,
                       nullptr};
  auto run = [&](auto tl, auto mask) {
    using TL = typename decltype(tl)::type;
    Workspace W{};
    W.vec_logits = vector_ok(P.logits, sizeof(TL), P.V, P.logits_stride_b, P.B, 0, 1);
    W.vec_probs = P.probs_out && vector_ok(P.probs_out, sizeof(float), 4, P.probs_stride_b, P.B, 0, 1);
    launch_staged<TL>(filtered_kernel<TL, decltype(mask)::value>, P.B, P.B, P.V, P, W, &F,
                      ExtraPasses{P.filters.any, false}, device, stream, alloc);
  };
  if (P.masked_out) dispatch_dtype<CudaTypes>(logits_dtype, [&](auto tl) { run(tl, std::true_type{}); });
  else dispatch_logits_dtype<CudaTypes>(logits_dtype, [&](auto tl) { run(tl, std::false_type{}); });
}

// specdec::logprobs on prepared parameters (sampling_args.h: prepare_logprobs), B * P > 0:
// one launch, one block per (row, position) (no workspace, no host sync).
inline void launch_logprobs(const LogprobParams& P, DType logits_dtype, cudaStream_t stream) {
  dispatch_logits_dtype<CudaTypes>(logits_dtype, [&](auto tl) {
    using TL = typename decltype(tl)::type;
    const int vec = vector_ok(P.logits, sizeof(TL), P.V, P.stride_b, P.B, P.stride_k, P.positions);
    launch(logprobs_kernel<TL>, to_dim(P.B * P.positions), dim3(kFilterThreads), stream, P, vec);
  });
}

}  // namespace specdec::cuda
