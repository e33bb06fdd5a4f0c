// CUDA launchers of specdec::verify and specdec::sample: shared argument
// handling (sampling_args.cpp), a small workspace from torch's caching
// allocator, the load width per tensor, and the launch; no host sync.
//
// Launch path (issue #12, "no whole-GPU requirement"). The kernels have three
// stages with a grid-wide dependency between them. Default: ONE cooperative
// launch (grid.sync between the stages), its grid capped at the co-resident
// limit from the occupancy query. Fallback: one ordinary launch per stage on the
// same stream (stream order is the barrier; still one op call, no host sync,
// capturable in a CUDA graph) when the device has no cooperative launch, the
// kernel cannot be resident, the cooperative launch is refused (e.g.
// cudaErrorCooperativeLaunchTooLarge when MPS or a green context gives us fewer
// SMs than the device has), while a CUDA graph is being captured (see
// launch_path), or SPECDEC_CUDA_LAUNCH=stages. Why not a "last block
// finishes" atomic ticket: it would hand a row's race to the one block that
// finishes its stats last (serial at B = 1) or need a second ticket level; the
// per-stage launches keep every stage fully parallel at the price of two more
// launches (~2-4 us each eagerly, far less under graph replay), and both paths
// run the same stage code, so they give bit-identical results (tested).
// Cooperative first because it saves those launches at B = 1, where the op is
// latency-bound. TO BE RE-MEASURED ON A GPU: eager and graph-replay time of
// both paths (bench verify JSON: fused_s / fused_stages_s eager, fused_graph_s /
// fused_graph_coop_s graph replay), and that a cooperative launch next to a
// busy side stream completes (test_cuda_launch_paths.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "../core/dtype_dispatch.h"
#include "../sampling_args.h"
#include "sampling_kernels.cuh"

namespace specdec::cuda {
namespace {

constexpr int kThreads = kBlockThreads;
static_assert(kThreads % 32 == 0, "whole warps");

struct Occupancy {
  int per_sm = 0;   // resident blocks per SM at kThreads (occupancy query)
  int sms = 0;
  bool coop = false;  // the device supports cooperative launches
};

// Per kernel instantiation and device; queried once (no sync involved).
Occupancy occupancy(const void* kernel, int device) {
  static std::map<std::pair<const void*, int>, Occupancy> cache;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({kernel, device});
  if (it != cache.end()) return it->second;
  Occupancy o;
  int coop = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o.per_sm, kernel, kThreads, 0));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&o.sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device));
  o.coop = coop != 0;
  return cache[{kernel, device}] = o;
}

// SPECDEC_CUDA_LAUNCH (read per call, so a test can compare the paths in one
// process): "stages" = always the per-stage launches; "cooperative" = the
// cooperative launch whenever possible, also inside a CUDA-graph capture;
// unset / anything else = cooperative for eager calls, per-stage launches while
// the stream is being captured (three plain kernel nodes are always capturable;
// a cooperative launch refused inside a capture would invalidate the capture,
// with no way back). To be re-measured on the GPU: graph replay of both.
enum class LaunchPath { kCooperative, kStages };
LaunchPath launch_path(cudaStream_t stream) {
  const char* env = std::getenv("SPECDEC_CUDA_LAUNCH");
  if (env && std::strcmp(env, "stages") == 0) return LaunchPath::kStages;
  if (env && std::strcmp(env, "cooperative") == 0) return LaunchPath::kCooperative;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status == cudaStreamCaptureStatusNone ? LaunchPath::kCooperative : LaunchPath::kStages;
}

// Chunking of stage 2 (stage 1 and 3 split by warps, independent of C): items
// (b, c), chunk length a multiple of kStatBlock (8 race tiles: one per warp of a
// block), and enough items for every block of the grid: at B = 1, V = 128256,
// C = 126 chunks of 1024 tokens, each warp races one tile. C only decides who
// does which work, never the result.
void choose_chunks(int64_t B, int64_t V, int64_t grid, Workspace& W) {
  W.stat_blocks = (V + kStatBlock - 1) / kStatBlock;
  const int64_t want = std::max<int64_t>(1, (grid + B - 1) / B);
  const int64_t C = std::min(want, W.stat_blocks);
  W.chunk_len = (W.stat_blocks + C - 1) / C * kStatBlock;
  W.chunks = (V + W.chunk_len - 1) / W.chunk_len;
}

// One byte buffer for all workspace arrays: n_cut filter cutoffs (0: no filter
// pass, W.cutoff stays null) and n_y coupled samples (0: not coupled) after the
// stage buffers.
at::Tensor make_workspace(const at::Tensor& like, int64_t n_stats, int64_t n_race, int64_t n_rows, int64_t n_cut,
                          int64_t n_y, Workspace& W) {
  auto align = [](int64_t x) { return (x + 255) / 256 * 256; };
  const int64_t s_bytes = align(n_stats * sizeof(ChunkStats));
  const int64_t r_bytes = align(n_race * sizeof(RacePair));
  const int64_t d_bytes = align(std::max<int64_t>(1, n_rows) * sizeof(RowDecision));
  const int64_t c_bytes = align(n_cut * sizeof(float));
  const int64_t y_bytes = align(n_y * sizeof(int64_t));
  at::Tensor ws = at::empty({s_bytes + r_bytes + d_bytes + c_bytes + y_bytes}, like.options().dtype(at::kByte));
  char* base = static_cast<char*>(ws.mutable_data_ptr());
  W.stats = reinterpret_cast<ChunkStats*>(base);
  W.race = reinterpret_cast<RacePair*>(base + s_bytes);
  W.rows = reinterpret_cast<RowDecision*>(base + s_bytes + r_bytes);
  W.cutoff = n_cut > 0 ? reinterpret_cast<float*>(base + s_bytes + r_bytes + d_bytes) : nullptr;
  W.coupled_y = n_y > 0 ? reinterpret_cast<int64_t*>(base + s_bytes + r_bytes + d_bytes + c_bytes) : nullptr;
  return ws;
}

// A grid of n blocks, clamped to [1, 2^31 - 1] (every kernel loops grid-stride).
dim3 to_dim(int64_t n) { return dim3(static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(n, INT32_MAX)))); }

// The filter cutoff pass (sampling_kernels.cuh, filter_cutoff_kernel): one block
// per (row, position), on the stream before the main kernel, into W.cutoff.
template <typename TL>
void launch_filter_cutoffs(FilterParams F, const Workspace& W, cudaStream_t stream) {
  F.cutoff = W.cutoff;
  F.vec = W.vec_logits;
  void* args[] = {static_cast<void*>(&F)};
  C10_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<void*>(filter_cutoff_kernel<TL>), to_dim(F.B * F.positions),
                                  dim3(kFilterThreads), args, 0, stream));
}

// What runs around the main kernel of one call (see the top of sampling_kernels.cuh):
// the filter pass before it (filters given), the coupled decision after it.
struct ExtraPasses {
  bool filters = false;  // launch filter_cutoff_kernel first (W.cutoff: one per stat row)
  bool coupled = false;  // W.coupled_y: one per race row; coupled_decide_kernel after
};
struct NoPass {
  void operator()(const Workspace&) const {}
};

// 16-byte vector loads are possible for rows at base + b * stride_b + i * stride_k
// (element strides; a stride of a size-1 dim is never used) when the base and
// every used stride are 16-byte aligned and V is a multiple of the vector width.
bool vector_ok(const void* base, int64_t elem, int64_t V, int64_t stride_b, int64_t B, int64_t stride_k, int64_t n_k) {
  if (!base) return false;
  uint64_t bits = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(base)) | static_cast<uint64_t>(V * elem);
  if (B > 1) bits |= static_cast<uint64_t>(stride_b * elem);
  if (n_k > 1) bits |= static_cast<uint64_t>(stride_k * elem);
  return (bits & 15u) == 0;
}

// Launch of `kernel` over `rows` stat rows (B * positions) of V tokens, of which
// `race_rows` race (verify: B, one race position per row; sample: B; coupled: all
// B * (K+1)): chunking, workspace (kept alive until the launches are queued: the
// caching allocator orders its reuse on the stream), `before` (the filter pass),
// the launch path (see the top of this file), `after` (the coupled decision).
template <typename Params, typename Kernel, typename Before = NoPass, typename After = NoPass>
void launch_stages(Kernel kernel, int64_t rows, int64_t race_rows, int64_t V, const at::Tensor& like, Params& P,
                   Workspace& W, int device, cudaStream_t stream, ExtraPasses extra = {}, Before before = {},
                   After after = {}) {
  const Occupancy occ = occupancy(reinterpret_cast<const void*>(kernel), device);
  const int64_t warps = kThreads / 32;
  const int64_t B = race_rows;
  const int64_t max_grid = static_cast<int64_t>(std::max(occ.per_sm, 1)) * occ.sms;
  choose_chunks(B, V, max_grid, W);
  at::Tensor ws = make_workspace(like, rows * W.stat_blocks, B * W.chunks, B, extra.filters ? rows : 0,
                                 extra.coupled ? B : 0, W);
  before(W);
  // blocks each stage can use
  const int64_t g[kStages] = {(rows * W.stat_blocks + warps - 1) / warps, B * W.chunks, (B + warps - 1) / warps};
  if (occ.coop && occ.per_sm > 0 && launch_path(stream) == LaunchPath::kCooperative) {
    const int64_t grid = std::min(max_grid, std::max({g[0], g[1], g[2]}));
    int stage = kAllStages;
    void* args[] = {static_cast<void*>(&P), static_cast<void*>(&W), static_cast<void*>(&stage)};
    const cudaError_t err =
        cudaLaunchCooperativeKernel(reinterpret_cast<void*>(kernel), to_dim(grid), dim3(kThreads), args, 0, stream);
    if (err == cudaSuccess) {
      after(W);
      return;
    }
    if (err != cudaErrorCooperativeLaunchTooLarge && err != cudaErrorNotSupported) C10_CUDA_CHECK(err);
    (void)cudaGetLastError();  // refused before anything ran: clear it and take the per-stage path
  }
  for (int stage = 0; stage < kStages; ++stage) {
    void* args[] = {static_cast<void*>(&P), static_cast<void*>(&W), static_cast<void*>(&stage)};
    C10_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<void*>(kernel), to_dim(g[stage]), dim3(kThreads), args, 0, stream));
  }
  after(W);
}

// The CUDA element types of the dtype dispatch (core/dtype_dispatch.h).
struct CudaTypes {
  using f32 = float;
  using f16 = __half;
  using bf16 = __nv_bfloat16;
};

using OptTensor = std::optional<at::Tensor>;

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_cuda(
    const at::Tensor& target_logits, const at::Tensor& draft_token_ids, const OptTensor& draft_probs,
    const at::Tensor& temperature, const at::Tensor& seed, const at::Tensor& offset, const OptTensor& top_k,
    const OptTensor& top_p, const OptTensor& min_p, const OptTensor& num_drafts, bool coupled) {
  const c10::cuda::CUDAGuard guard(target_logits.device());
  VerifyLaunch L = prepare_verify(target_logits, draft_token_ids, draft_probs, temperature, seed, offset,
                                  SamplingFilters{top_k, top_p, min_p}, num_drafts, coupled);
  VerifyParams& P = L.params;
  if (P.B == 0) return {L.tokens, L.num_accepted, L.valid};
  const int device = target_logits.get_device();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  const int64_t rows = P.B * (P.K + 1);  // stat rows: every (row, position)
  const FilterParams F{P.logits, P.logits_stride_b, P.logits_stride_k, P.B, P.K + 1, P.V, P.temperature,
                       P.filters, P.num_drafts, P.num_drafts_stride, 0, nullptr};
  if (P.coupled) {  // draft_probs is not read: dispatch on the logits only
    dispatch_dtype<CudaTypes>(L.logits_dtype, [&](auto tl) {
      using TL = typename decltype(tl)::type;
      Workspace W{};
      W.vec_logits = vector_ok(P.logits, sizeof(TL), P.V, P.logits_stride_b, P.B, P.logits_stride_k, P.K + 1);
      launch_stages(
          coupled_race_kernel<TL>, rows, rows, P.V, target_logits, P, W, device, stream,
          ExtraPasses{P.filters.any, true},
          [&](const Workspace& w) {
            if (P.filters.any) launch_filter_cutoffs<TL>(F, w, stream);
          },
          [&](const Workspace& w) {
            VerifyParams p = P;
            Workspace ww = w;
            void* args[] = {static_cast<void*>(&p), static_cast<void*>(&ww)};
            C10_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<void*>(coupled_decide_kernel),
                                            to_dim((P.B + kThreads / 32 - 1) / (kThreads / 32)), dim3(kThreads), args,
                                            0, stream));
          });
    });
    return {L.tokens, L.num_accepted, L.valid};
  }
  dispatch_dtypes<CudaTypes>(L.logits_dtype, L.probs_dtype, [&](auto tl, auto tq) {
    using TL = typename decltype(tl)::type;
    using TQ = typename decltype(tq)::type;
    Workspace W{};
    W.vec_logits = vector_ok(P.logits, sizeof(TL), P.V, P.logits_stride_b, P.B, P.logits_stride_k, P.K + 1);
    W.vec_q = vector_ok(P.draft_probs, sizeof(TQ), P.V, P.probs_stride_b, P.B, P.probs_stride_k, P.K);
    if (!P.filters.any) {  // no filter argument: exactly the launches of the unfiltered op
      launch_stages(verify_kernel<TL, TQ>, rows, P.B, P.V, target_logits, P, W, device, stream);
      return;
    }
    launch_stages(verify_kernel<TL, TQ>, rows, P.B, P.V, target_logits, P, W, device, stream,
                  ExtraPasses{true, false}, [&](const Workspace& w) { launch_filter_cutoffs<TL>(F, w, stream); });
  });
  return {L.tokens, L.num_accepted, L.valid};
}

at::Tensor sample_cuda(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& seed,
                       const at::Tensor& offset, const OptTensor& probs_out, const OptTensor& top_k,
                       const OptTensor& top_p, const OptTensor& min_p) {
  const c10::cuda::CUDAGuard guard(logits.device());
  SampleLaunch L = prepare_sample(logits, temperature, seed, offset, probs_out, SamplingFilters{top_k, top_p, min_p});
  SampleParams& P = L.params;
  if (P.B == 0) return L.tokens;
  const int device = logits.get_device();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  dispatch_dtype<CudaTypes>(L.logits_dtype, [&](auto tl) {
    using TL = typename decltype(tl)::type;
    Workspace W{};
    W.vec_logits = vector_ok(P.logits, sizeof(TL), P.V, P.logits_stride_b, P.B, 0, 1);
    // float4 stores of p where 4 tokens are in range: needs 16-byte aligned rows only
    W.vec_probs = P.probs_out && vector_ok(P.probs_out, sizeof(float), 4, P.probs_stride_b, P.B, 0, 1);
    if (!P.filters.any) {  // no filter argument: exactly the launches of the unfiltered op
      launch_stages(sample_kernel<TL>, P.B, P.B, P.V, logits, P, W, device, stream);
      return;
    }
    const FilterParams F{P.logits, P.logits_stride_b, 0, P.B, 1, P.V, P.temperature, P.filters, nullptr, 0, 0,
                         nullptr};
    launch_stages(sample_kernel<TL>, P.B, P.B, P.V, logits, P, W, device, stream, ExtraPasses{true, false},
                  [&](const Workspace& w) { launch_filter_cutoffs<TL>(F, w, stream); });
  });
  return L.tokens;
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("verify", &verify_cuda);
  m.impl("sample", &sample_cuda);
}

}  // namespace specdec::cuda
