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
#include <map>
#include <mutex>
#include <utility>

#include "../core/dtype_dispatch.h"
#include "../sampling_args.h"
#include "sampling_kernels.cuh"

namespace specdec::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMinChunk = 4 * kThreads;  // tokens per work item at least
static_assert(kMinChunk % kStatBlock == 0, "chunks hold whole stat blocks");

// Largest grid that can be co-resident (a requirement of grid.sync), per
// kernel instantiation and device; queried once (no sync involved).
int max_coresident_blocks(const void* kernel, int device) {
  static std::map<std::pair<const void*, int>, int> cache;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({kernel, device});
  if (it != cache.end()) return it->second;
  int per_sm = 0, sms = 0, coop = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device));
  TORCH_CHECK(coop, "specdec: device ", device, " does not support cooperative launches");
  TORCH_CHECK(per_sm > 0, "specdec: kernel cannot be resident with ", kThreads, " threads per block");
  return cache[{kernel, device}] = per_sm * sms;
}

// Split V into C chunks so that rows * C work items fill the grid, with at
// least kMinChunk tokens per item. Chunk length is a multiple of kStatBlock (and
// so of kRaceTile): stat blocks and race tiles never straddle two chunks, and C
// only decides who does which work, never the result.
void choose_chunks(int64_t rows, int64_t V, int64_t max_grid, Workspace& W) {
  const int64_t want = std::max<int64_t>(1, (2 * max_grid + rows - 1) / rows);
  const int64_t cap = std::max<int64_t>(1, (V + kMinChunk - 1) / kMinChunk);
  const int64_t C = std::min(want, cap);
  W.chunk_len = ((V + C - 1) / C + kStatBlock - 1) / kStatBlock * kStatBlock;
  W.stat_blocks = (V + kStatBlock - 1) / kStatBlock;
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

// One cooperative launch of `kernel` over B rows of `positions` positions of V
// tokens: chunking, workspace (kept alive until the launch is queued: the
// caching allocator orders its reuse on the stream), grid.
template <typename Params, typename Kernel>
void launch_cooperative(Kernel kernel, int64_t B, int64_t positions, int64_t V, const at::Tensor& like, Params& P,
                        int device, cudaStream_t stream) {
  const int64_t max_grid = max_coresident_blocks(reinterpret_cast<const void*>(kernel), device);
  Workspace W{};
  const int64_t rows = B * positions;
  choose_chunks(rows, V, max_grid, W);
  at::Tensor ws = make_workspace(like, rows * W.stat_blocks, B * W.chunks, B, W);
  const int64_t grid = std::min<int64_t>(max_grid, rows * W.chunks);
  void* args[] = {static_cast<void*>(&P), static_cast<void*>(&W)};
  C10_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(kernel), dim3(static_cast<unsigned>(grid)),
                                             dim3(kThreads), args, 0, stream));
}

// The CUDA element types of the dtype dispatch (core/dtype_dispatch.h).
struct CudaTypes {
  using f32 = float;
  using f16 = __half;
  using bf16 = __nv_bfloat16;
};

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
  dispatch_dtypes<CudaTypes>(L.logits_dtype, L.probs_dtype, [&](auto tl, auto tq) {
    auto kernel = verify_kernel<typename decltype(tl)::type, typename decltype(tq)::type>;
    launch_cooperative(kernel, P.B, P.K + 1, P.V, target_logits, P, device, stream);
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
  dispatch_dtype<CudaTypes>(L.logits_dtype, [&](auto tl) {
    launch_cooperative(sample_kernel<typename decltype(tl)::type>, P.B, 1, P.V, logits, P, device, stream);
  });
  return L.tokens;
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("verify", &verify_cuda);
  m.impl("sample", &sample_cuda);
}

}  // namespace specdec::cuda
