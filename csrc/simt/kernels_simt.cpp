// The CUDA kernels and their launch sequences compiled as host C++ for the SIMT
// emulator: csrc/cuda is included as it is, with __CUDA_ARCH__ defined so the device
// branches of csrc/core compile, and csrc/simt/include standing in for the CUDA
// headers. No torch in this translation unit.
#if !defined(SPECDEC_SIMT)
#error "kernels_simt.cpp is the SIMT emulation build: compile with -DSPECDEC_SIMT"
#endif
#define __CUDA_ARCH__ 900
#include <cuda_runtime.h>  // the SIMT stand-in, before csrc/core sees __CUDA_ARCH__

#include "kernels_simt.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "../cuda/block_launch.cuh"
#include "../cuda/kv_launch.cuh"
#include "../cuda/sampling_launch.cuh"
#include "../cuda/shard_launch.cuh"
#include "../cuda/tree_launch.cuh"

namespace specdec::simt_ops {
namespace {

// Every workspace buffer its own allocation of exactly the bytes the kernels may touch
// (not the 256-byte rounding of the real launcher: an overrun is an overrun), filled with
// 0xFF bytes (a read before any write sees NaN / -1), freed when the call returns (the
// emulated kernels have run by then).
struct SeparateBuffers {
  std::vector<std::unique_ptr<char, void (*)(void*)>> buffers;
  cuda::WorkspaceAllocator allocator() {
    return [this](const cuda::WorkspaceLayout& layout, int buffer) -> char* {
      const size_t n = static_cast<size_t>(layout.used[buffer]);
      char* p = static_cast<char*>(std::malloc(n));
      if (!p) throw std::bad_alloc();
      std::memset(p, 0xFF, n);
      buffers.emplace_back(p, &std::free);
      return p;
    };
  }
};

}  // namespace

void verify_kernel(Simt, const VerifyParams& P, DType logits_dtype, DType probs_dtype) {
  SeparateBuffers ws;
  cuda::launch_verify(P, logits_dtype, probs_dtype, 0, nullptr, ws.allocator());
}

void verify_block_kernel(Simt, const VerifyParams& P, DType logits_dtype, DType probs_dtype) {
  SeparateBuffers ws;
  cuda::launch_verify_block(P, logits_dtype, probs_dtype, 0, nullptr, ws.allocator());
}

void sample_kernel(Simt, const SampleParams& P, DType logits_dtype) {
  SeparateBuffers ws;
  cuda::launch_sample(P, logits_dtype, 0, nullptr, ws.allocator());
}

void filtered_kernel(Simt, const SampleParams& P, DType logits_dtype) {
  SeparateBuffers ws;
  cuda::launch_filtered(P, logits_dtype, 0, nullptr, ws.allocator());
}

void logprobs_kernel(Simt, const LogprobParams& P, DType logits_dtype) { cuda::launch_logprobs(P, logits_dtype, nullptr); }

void verify_shard_kernel(Simt, const ShardParams& S, DType logits_dtype, DType probs_dtype) {
  cuda::launch_verify_shard(S, logits_dtype, probs_dtype, nullptr);
}

void verify_tree_kernel(Simt, const TreeVerifyParams& P, DType logits_dtype, DType probs_dtype) {
  SeparateBuffers ws;
  cuda::launch_verify_tree(P, logits_dtype, probs_dtype, 0, nullptr, ws.allocator());
}

void kv_append_kernel(Simt, const KVAppendParams& P) { cuda::launch_kv_append(P, nullptr); }
void kv_rollback_kernel(Simt, const KVRollbackParams& P) { cuda::launch_kv_rollback(P, nullptr); }
void paged_append_kernel(Simt, const PagedAppendParams& P) { cuda::launch_paged_append(P, nullptr); }
void paged_gather_kernel(Simt, const PagedGatherParams& P) { cuda::launch_paged_gather(P, nullptr); }
void kv_compact_kernel(Simt, const KVCompactParams& P) { cuda::launch_kv_compact(P, nullptr); }

std::vector<int64_t> launch_counts() {
  const simt::LaunchCounts& c = simt::launch_counts();
  return {c.ordinary, c.cooperative, c.refused};
}

}  // namespace specdec::simt_ops
