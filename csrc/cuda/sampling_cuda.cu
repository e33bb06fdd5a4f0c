// CUDA launchers of specdec::verify and specdec::sample: shared argument
// handling (sampling_args.cpp), a small workspace from torch's caching
// allocator, and ONE cooperative kernel launch per call; no host sync.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <mutex>

#include "../sampling_args.h"
#include "sampling_kernels.cuh"

namespace specdec::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMinChunk = 4 * kThreads;  // tokens per work item at least
static_assert(kMinChunk % kRaceTile == 0, "chunks hold whole race tiles");
constexpr int kMaxDevices = 64;

// Largest grid that can be co-resident (a requirement of grid.sync), per
// kernel and device; queried once (no sync involved).
template <typename Kernel>
int max_coresident_blocks(Kernel kernel, int device) {
  static std::array<int, kMaxDevices> cache{};
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  TORCH_CHECK(device < kMaxDevices, "specdec: device index ", device, " is not supported");
  if (cache[device] == 0) {
    int per_sm = 0, sms = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    int coop = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device));
    TORCH_CHECK(coop, "specdec: device ", device, " does not support cooperative launches");
    cache[device] = std::max(1, per_sm * sms);
  }
  return cache[device];
}

// Split V into C chunks so that rows * C work items fill the grid, with at
// least kMinChunk tokens per item; chunk length is a multiple of kRaceTile so
// the coarse race's tiles never straddle two chunks.
void choose_chunks(int64_t rows, int64_t V, int64_t max_grid, Workspace& W) {
  const int64_t want = std::max<int64_t>(1, (2 * max_grid + rows - 1) / rows);
  const int64_t cap = std::max<int64_t>(1, (V + kMinChunk - 1) / kMinChunk);
  const int64_t C = std::min(want, cap);
  W.chunk_len = ((V + C - 1) / C + kRaceTile - 1) / kRaceTile * kRaceTile;
  W.chunks = (V + W.chunk_len - 1) / W.chunk_len;
}

// One byte buffer for all workspace arrays.
at::Tensor make_workspace(const at::Tensor& like, int64_t n_stats, int64_t n_race, int64_t n_rows, Workspace& W) {
  auto align = [](int64_t x) { return (x + 255) / 256 * 256; };
  const int64_t s_bytes = align(n_stats * sizeof(ChunkStats));
  const int64_t r_bytes = align(n_race * sizeof(RacePair));
  const int64_t d_bytes = align(std::max<int64_t>(1, n_rows) * sizeof(RowDecision));
  at::Tensor ws = at::empty({s_bytes + r_bytes + d_bytes}, like.options().dtype(at::kByte));
  char* base = static_cast<char*>(ws.mutable_data_ptr());
  W.stats = reinterpret_cast<ChunkStats*>(base);
  W.race = reinterpret_cast<RacePair*>(base + s_bytes);
  W.rows = reinterpret_cast<RowDecision*>(base + s_bytes + r_bytes);
  return ws;
}

template <typename Params, typename Kernel>
void launch_cooperative(Kernel kernel, int64_t grid, Params& P, Workspace& W, cudaStream_t stream) {
  void* args[] = {static_cast<void*>(&P), static_cast<void*>(&W)};
  C10_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(kernel), dim3(static_cast<unsigned>(grid)),
                                             dim3(kThreads), args, 0, stream));
}

#define SPECDEC_CUDA_DISPATCH(dtype, NAME, ...)               \
  switch (dtype) {                                            \
    case ::specdec::DType::kFloat32: {                        \
      using NAME = float;                                     \
      __VA_ARGS__;                                            \
    } break;                                                  \
    case ::specdec::DType::kFloat16: {                        \
      using NAME = __half;                                    \
      __VA_ARGS__;                                            \
    } break;                                                  \
    case ::specdec::DType::kBFloat16: {                       \
      using NAME = __nv_bfloat16;                             \
      __VA_ARGS__;                                            \
    } break;                                                  \
  }

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_cuda(
    const at::Tensor& target_logits, const at::Tensor& draft_token_ids,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& temperature,
    const at::Tensor& seed, const at::Tensor& offset) {
  const c10::cuda::CUDAGuard guard(target_logits.device());
  VerifyLaunch L = prepare_verify(target_logits, draft_token_ids, draft_probs, temperature, seed, offset);
  VerifyParams& P = L.params;
  if (P.B == 0) return {L.tokens, L.num_accepted, L.valid};
  const int device = target_logits.get_device();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  SPECDEC_CUDA_DISPATCH(L.logits_dtype, TL, {
    SPECDEC_CUDA_DISPATCH(L.probs_dtype, TQ, {
      auto kernel = verify_kernel<TL, TQ>;
      const int64_t max_grid = max_coresident_blocks(kernel, device);
      Workspace W{};
      const int64_t rows = P.B * (P.K + 1);
      choose_chunks(rows, P.V, max_grid, W);
      at::Tensor ws = make_workspace(target_logits, rows * W.chunks, P.B * W.chunks, P.B, W);
      const int64_t grid = std::min<int64_t>(max_grid, rows * W.chunks);
      launch_cooperative(kernel, grid, P, W, stream);
    });
  });
  return {L.tokens, L.num_accepted, L.valid};
}

at::Tensor sample_cuda(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& seed,
                       const at::Tensor& offset, const std::optional<at::Tensor>& probs_out) {
  const c10::cuda::CUDAGuard guard(logits.device());
  SampleLaunch L = prepare_sample(logits, temperature, seed, offset, probs_out);
  SampleParams& P = L.params;
  if (P.B == 0) return L.tokens;
  const int device = logits.get_device();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  SPECDEC_CUDA_DISPATCH(L.logits_dtype, TL, {
    auto kernel = sample_kernel<TL>;
    const int64_t max_grid = max_coresident_blocks(kernel, device);
    Workspace W{};
    choose_chunks(P.B, P.V, max_grid, W);
    at::Tensor ws = make_workspace(logits, P.B * W.chunks, P.B * W.chunks, P.B, W);
    const int64_t grid = std::min<int64_t>(max_grid, P.B * W.chunks);
    launch_cooperative(kernel, grid, P, W, stream);
  });
  return L.tokens;
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("verify", &verify_cuda);
  m.impl("sample", &sample_cuda);
}

}  // namespace specdec::cuda
