// CUDA launchers of the KV-cache ops: the torch side only (the ops are adapters,
// op_adapters.h, on the CUDA backend, torch_backend.h: device guard, stream); the launches are kv_launch.cuh, which the SIMT
// emulation runs too. No host sync: an invalid row or slot is skipped and reported
// through the optional sticky flag tensors (see the schemas in csrc/ops.cpp).
#include <torch/library.h>

#include "../op_adapters.h"
#include "kv_launch.cuh"
#include "torch_backend.h"

namespace specdec::cuda {

// The kernels of the op adapters (found by argument-dependent lookup on Kernels).
static void kv_append_kernel(const Kernels& k, const KVAppendParams& P) { launch_kv_append(P, k.stream); }
static void kv_rollback_kernel(const Kernels& k, const KVRollbackParams& P) { launch_kv_rollback(P, k.stream); }
static void paged_append_kernel(const Kernels& k, const PagedAppendParams& P) { launch_paged_append(P, k.stream); }
static void paged_gather_kernel(const Kernels& k, const PagedGatherParams& P) { launch_paged_gather(P, k.stream); }
static void kv_compact_kernel(const Kernels& k, const KVCompactParams& P) { launch_kv_compact(P, k.stream); }

}  // namespace specdec::cuda

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  using namespace specdec::ops;
  register_ops<specdec::cuda::Backend, KvAppendOp, KvRollbackOp, PagedKvAppendOp, PagedKvGatherOp, PagedKvGatherIntoOp,
               KvCompactOp, PagedKvCompactOp>(m);
}
