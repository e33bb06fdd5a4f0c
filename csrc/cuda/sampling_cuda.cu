// CUDA launchers of specdec::verify, verify_block, sample, filtered_probs, mask_logits, softmax, logprobs,
// verify_tree and verify_shard / verify_shard_finish: the torch side only. The ops are
// adapters (op_adapters.h) on the CUDA backend (torch_backend.h: device guard, stream);
// here each kernel's launch, with one workspace
// tensor from torch's caching allocator (kept alive until the launches are queued:
// the allocator orders its reuse on the stream); the launches themselves are
// sampling_launch.cuh, which the SIMT emulation runs too. No host sync.
// TO BE RE-MEASURED ON A GPU: eager and graph-replay time of both launch paths
// (bench verify JSON: fused_s / fused_stages_s eager, fused_graph_s /
// fused_graph_coop_s graph replay), and that a cooperative launch next to a busy
// side stream completes (test_cuda_launch_paths.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "../op_adapters.h"
#include "block_launch.cuh"
#include "sampling_launch.cuh"
#include "shard_launch.cuh"
#include "torch_backend.h"
#include "tree_launch.cuh"

namespace specdec::cuda {

// The workspace: one byte tensor on `like`'s device, carved at the layout's offsets;
// `ws` keeps it alive until the launches are queued.
static WorkspaceAllocator one_tensor_workspace(const at::Tensor& like, at::Tensor& ws) {
  return [&like, &ws](const WorkspaceLayout& layout, int buffer) -> char* {
    if (!ws.defined()) ws = at::empty({layout.total()}, like.options().dtype(at::kByte));
    return static_cast<char*>(ws.mutable_data_ptr()) + layout.offset(buffer);
  };
}

// The kernels of the op adapters (found by argument-dependent lookup on Kernels).
static void verify_kernel(const Kernels& k, const VerifyParams& P, DType tl, DType tq) {
  at::Tensor ws;
  launch_verify(P, tl, tq, k.device, k.stream, one_tensor_workspace(*k.like, ws));
}
static void verify_block_kernel(const Kernels& k, const VerifyParams& P, DType tl, DType tq) {
  at::Tensor ws;
  launch_verify_block(P, tl, tq, k.device, k.stream, one_tensor_workspace(*k.like, ws));
}
static void sample_kernel(const Kernels& k, const SampleParams& P, DType tl) {
  at::Tensor ws;
  launch_sample(P, tl, k.device, k.stream, one_tensor_workspace(*k.like, ws));
}
static void filtered_kernel(const Kernels& k, const SampleParams& P, DType tl) {
  at::Tensor ws;
  launch_filtered(P, tl, k.device, k.stream, one_tensor_workspace(*k.like, ws));
}
static void logprobs_kernel(const Kernels& k, const LogprobParams& P, DType tl) { launch_logprobs(P, tl, k.stream); }
static void verify_tree_kernel(const Kernels& k, const TreeVerifyParams& P, DType tl, DType tq) {
  at::Tensor ws;
  launch_verify_tree(P, tl, tq, k.device, k.stream, one_tensor_workspace(*k.like, ws));
}
static void verify_shard_kernel(const Kernels& k, const ShardParams& S, DType tl, DType tq) {
  launch_verify_shard(S, tl, tq, k.stream);
}

// The tables the shard kernels read through ShardParams (the shard bounds, each gathered
// step's P pointers) copied to the device: a pinned host buffer and a non-blocking copy on the
// current stream (no host sync; the caching host allocator keeps the buffer until the copy
// ran). The returned tensor must outlive the launch being queued.
static at::Tensor shard_tables(const Kernels& k, ShardLaunch& L) {
  const int64_t P = L.params.layout.P;
  const int steps = L.params.g.plan.n;
  at::Tensor host = at::empty({P + 1 + steps * P}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  int64_t* h = host.mutable_data_ptr<int64_t>();
  for (int64_t r = 0; r <= P; ++r) h[r] = L.bounds[r];
  for (int s = 0; s < steps; ++s)
    for (int64_t r = 0; r < P; ++r)
      h[P + 1 + s * P + r] = L.gathered[s].empty() ? 0 : static_cast<int64_t>(reinterpret_cast<intptr_t>(L.gathered[s][r]));
  at::Tensor dev = host.to(k.like->device(), /*non_blocking=*/true);
  const int64_t* d = dev.const_data_ptr<int64_t>();
  L.params.layout.bounds = d;
  for (int s = 0; s < steps; ++s)
    if (!L.gathered[s].empty()) L.params.g.step[s] = reinterpret_cast<const void* const*>(d + P + 1 + s * P);
  return dev;
}

}  // namespace specdec::cuda

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  using namespace specdec::ops;
  register_ops<specdec::cuda::Backend, VerifyOp, VerifyBlockOp, SampleOp, FilteredProbsOp, MaskLogitsOp, SoftmaxOp, LogprobsOp,
               VerifyTreeOp, VerifyShardOp, VerifyShardFinishOp>(m);
}
