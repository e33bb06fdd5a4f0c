// CUDA launchers of specdec::verify, sample, filtered_probs, mask_logits, logprobs, verify_tree and
// verify_shard / verify_shard_finish: the torch side only.
// Shared argument handling (sampling_args.cpp), the stream, and one workspace
// tensor from torch's caching allocator (kept alive until the launches are queued:
// the allocator orders its reuse on the stream); the launches themselves are
// sampling_launch.cuh, which the SIMT emulation runs too. No host sync.
// TO BE RE-MEASURED ON A GPU: eager and graph-replay time of both launch paths
// (bench verify JSON: fused_s / fused_stages_s eager, fused_graph_s /
// fused_graph_coop_s graph replay), and that a cooperative launch next to a busy
// side stream completes (test_cuda_launch_paths.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../sampling_args.h"
#include "sampling_launch.cuh"
#include "shard_launch.cuh"
#include "tree_launch.cuh"

namespace specdec::cuda {
namespace {

using OptTensor = std::optional<at::Tensor>;

// The workspace: one byte tensor on `like`'s device, carved at the layout's offsets;
// `ws` keeps it alive until the launches are queued.
WorkspaceAllocator one_tensor_workspace(const at::Tensor& like, at::Tensor& ws) {
  return [&like, &ws](const WorkspaceLayout& layout, int buffer) -> char* {
    if (!ws.defined()) ws = at::empty({layout.total()}, like.options().dtype(at::kByte));
    return static_cast<char*>(ws.mutable_data_ptr()) + layout.offset(buffer);
  };
}

cudaStream_t current_stream(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.get_device()).stream(); }

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_cuda(
    const at::Tensor& target_logits, const at::Tensor& draft_token_ids, const OptTensor& draft_probs,
    const at::Tensor& temperature, const at::Tensor& seed, const at::Tensor& offset, const OptTensor& top_k,
    const OptTensor& top_p, const OptTensor& min_p, const OptTensor& num_drafts, bool coupled, bool probs_input,
    const OptTensor& token_logprobs, bool logprobs_processed) {
  const c10::cuda::CUDAGuard guard(target_logits.device());
  VerifyLaunch L = prepare_verify(target_logits, draft_token_ids, draft_probs, temperature, seed, offset,
                                  SamplingFilters{top_k, top_p, min_p}, num_drafts, coupled, probs_input,
                                  TokenLogprobsArg{token_logprobs, logprobs_processed});
  if (L.params.B > 0) {
    at::Tensor ws;
    launch_verify(L.params, L.logits_dtype, L.probs_dtype, target_logits.get_device(), current_stream(target_logits),
                  one_tensor_workspace(target_logits, ws));
  }
  return {L.tokens, L.num_accepted, L.valid};
}

at::Tensor sample_cuda(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& seed,
                       const at::Tensor& offset, const OptTensor& probs_out, const OptTensor& top_k,
                       const OptTensor& top_p, const OptTensor& min_p, bool probs_input,
                      const OptTensor& token_logprobs, bool logprobs_processed) {
  const c10::cuda::CUDAGuard guard(logits.device());
  SampleLaunch L = prepare_sample(logits, temperature, seed, offset, probs_out, SamplingFilters{top_k, top_p, min_p},
                                  probs_input, TokenLogprobsArg{token_logprobs, logprobs_processed});
  if (L.params.B > 0) {
    at::Tensor ws;
    launch_sample(L.params, L.logits_dtype, logits.get_device(), current_stream(logits),
                  one_tensor_workspace(logits, ws));
  }
  return L.tokens;
}

at::Tensor filtered_cuda(const at::Tensor& logits, const at::Tensor& temperature, const OptTensor& top_k,
                         const OptTensor& top_p, const OptTensor& min_p, bool probs_input, FilteredOutput output) {
  const c10::cuda::CUDAGuard guard(logits.device());
  SampleLaunch L = prepare_filtered(logits, temperature, SamplingFilters{top_k, top_p, min_p}, probs_input, output);
  if (L.params.B > 0) {
    at::Tensor ws;
    launch_filtered(L.params, L.logits_dtype, logits.get_device(), current_stream(logits),
                    one_tensor_workspace(logits, ws));
  }
  return L.out;
}

at::Tensor filtered_probs_cuda(const at::Tensor& logits, const at::Tensor& temperature, const OptTensor& top_k,
                               const OptTensor& top_p, const OptTensor& min_p, bool probs_input) {
  return filtered_cuda(logits, temperature, top_k, top_p, min_p, probs_input, FilteredOutput::kProbs);
}

at::Tensor mask_logits_cuda(const at::Tensor& logits, const at::Tensor& temperature, const OptTensor& top_k,
                            const OptTensor& top_p, const OptTensor& min_p) {
  return filtered_cuda(logits, temperature, top_k, top_p, min_p, false, FilteredOutput::kMask);
}

at::Tensor softmax_cuda(const at::Tensor& logits, const at::Tensor& temperature) {
  return filtered_cuda(logits, temperature, std::nullopt, std::nullopt, std::nullopt, false, FilteredOutput::kProbs);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> logprobs_cuda(const at::Tensor& logits, const at::Tensor& tokens,
                                                          const at::Tensor& temperature, const OptTensor& top_k,
                                                          const OptTensor& top_p, const OptTensor& min_p,
                                                          int64_t num_top, bool processed, bool probs_input) {
  const c10::cuda::CUDAGuard guard(logits.device());
  LogprobLaunch L = prepare_logprobs(logits, tokens, temperature, SamplingFilters{top_k, top_p, min_p}, num_top,
                                     processed, probs_input);
  if (L.params.B * L.params.positions > 0) launch_logprobs(L.params, L.logits_dtype, current_stream(logits));
  return {L.token_logprobs, L.token_ranks, L.top_ids, L.top_logprobs};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> verify_tree_cuda(
    const at::Tensor& target_logits, const at::Tensor& tree_token_ids, const at::Tensor& parents,
    const OptTensor& draft_probs, const at::Tensor& temperature, const at::Tensor& seed, const at::Tensor& offset,
    int64_t depth, const OptTensor& top_k, const OptTensor& top_p, const OptTensor& min_p) {
  const c10::cuda::CUDAGuard guard(target_logits.device());
  TreeVerifyLaunch L = prepare_verify_tree(target_logits, tree_token_ids, parents, draft_probs, temperature, seed,
                                           offset, depth, SamplingFilters{top_k, top_p, min_p});
  if (L.params.B > 0) {
    at::Tensor ws;
    launch_verify_tree(L.params, L.logits_dtype, L.probs_dtype, target_logits.get_device(),
                       current_stream(target_logits), one_tensor_workspace(target_logits, ws));
  }
  return {L.tokens, L.path, L.num_accepted, L.valid};
}

// The tables the shard kernels read through ShardParams (the shard bounds, each gathered
// step's P pointers) copied to the device: a pinned host buffer and a non-blocking copy on the
// current stream (no host sync; the caching host allocator keeps the buffer until the copy
// ran). The returned tensor must outlive the launch being queued.
at::Tensor device_tables(ShardLaunch& L, const at::Tensor& like) {
  const int64_t P = L.params.layout.P;
  const int steps = L.params.g.plan.n;
  at::Tensor host = at::empty({P + 1 + steps * P}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  int64_t* h = host.mutable_data_ptr<int64_t>();
  for (int64_t r = 0; r <= P; ++r) h[r] = L.bounds[r];
  for (int s = 0; s < steps; ++s)
    for (int64_t r = 0; r < P; ++r)
      h[P + 1 + s * P + r] = L.gathered[s].empty() ? 0 : static_cast<int64_t>(reinterpret_cast<intptr_t>(L.gathered[s][r]));
  at::Tensor dev = host.to(like.device(), /*non_blocking=*/true);
  const int64_t* d = dev.const_data_ptr<int64_t>();
  L.params.layout.bounds = d;
  for (int s = 0; s < steps; ++s)
    if (!L.gathered[s].empty()) L.params.g.step[s] = reinterpret_cast<const void* const*>(d + P + 1 + s * P);
  return dev;
}

void run_shard(ShardLaunch& L, const at::Tensor& target_logits) {
  const at::Tensor tables = device_tables(L, target_logits);
  launch_verify_shard(L.params, L.verify.logits_dtype, L.verify.probs_dtype, current_stream(target_logits));
}

at::Tensor verify_shard_cuda(const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
                             const OptTensor& draft_probs, const at::Tensor& temperature, const at::Tensor& seed,
                             const at::Tensor& offset, const OptTensor& top_k, const OptTensor& top_p,
                             const OptTensor& min_p, const OptTensor& num_drafts, bool coupled,
                             at::IntArrayRef shard_bounds, int64_t rank, int64_t stage, at::TensorList gathered) {
  const c10::cuda::CUDAGuard guard(target_logits.device());
  ShardLaunch L;
  prepare_shard_step(L, target_logits, draft_token_ids, draft_probs, temperature, seed, offset,
                     SamplingFilters{top_k, top_p, min_p}, num_drafts, coupled, shard_bounds, rank, stage, gathered,
                     /*cuda_kernels=*/true, HostChecks::kCpuTensors);
  if (stage > 0 && L.params.v.B > 0) run_shard(L, target_logits);
  return L.out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_shard_finish_cuda(
    const at::Tensor& target_logits, const at::Tensor& draft_token_ids, const OptTensor& draft_probs,
    const at::Tensor& temperature, const at::Tensor& seed, const at::Tensor& offset, const OptTensor& top_k,
    const OptTensor& top_p, const OptTensor& min_p, const OptTensor& num_drafts, bool coupled,
    at::IntArrayRef shard_bounds, int64_t rank, at::TensorList gathered) {
  const c10::cuda::CUDAGuard guard(target_logits.device());
  ShardLaunch L;
  prepare_shard_finish(L, target_logits, draft_token_ids, draft_probs, temperature, seed, offset,
                       SamplingFilters{top_k, top_p, min_p}, num_drafts, coupled, shard_bounds, rank, gathered,
                       /*cuda_kernels=*/true, HostChecks::kCpuTensors);
  if (L.params.v.B > 0) run_shard(L, target_logits);
  return {L.verify.tokens, L.verify.num_accepted, L.verify.valid};
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("verify", &verify_cuda);
  m.impl("sample", &sample_cuda);
  m.impl("filtered_probs", &filtered_probs_cuda);
  m.impl("mask_logits", &mask_logits_cuda);
  m.impl("softmax", &softmax_cuda);
  m.impl("logprobs", &logprobs_cuda);
  m.impl("verify_tree", &verify_tree_cuda);
  m.impl("verify_shard", &verify_shard_cuda);
  m.impl("verify_shard_finish", &verify_shard_finish_cuda);
}

}  // namespace specdec::cuda
