// torch.ops.specdec_simt.*: every op that has a CUDA kernel, under the same name and
// schema (csrc/op_schemas.h), running the CUDA kernel source in the SIMT emulator on
// CPU tensors. The ops are the CUDA launchers' adapters (op_adapters.h), with the CPU
// tensors standing for device tensors: [B] per-row values are not checked on the host (a
// bad value makes its row invalid, as on a GPU).
// Test and debugging use only: python -m specdec_ext.testing.simt builds it.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "../op_adapters.h"
#include "../op_schemas.h"
#include "kernels_simt.h"

namespace specdec::simt_ops {

// The SIMT backend of the op adapters (op_adapters.h): only 0-dim CPU tensors are read on the
// host, the shard steps run the CUDA plan, every output is poisoned before the kernels run.
struct Backend {
  static constexpr unsigned backend = schemas::kCuda;  // its bit in the op table
  static constexpr ops::Target target{HostChecks::kScalarsOnly, /*cuda_kernels=*/true};
  static constexpr bool poisons = true;
  struct Scope {
    explicit Scope(const at::Tensor&) {}
  };
  template <class F>
  static void run(const at::Tensor&, F&& f) {
    f(Simt{});
  }
};

}  // namespace specdec::simt_ops

TORCH_LIBRARY(specdec_simt, m) {
  for (const auto& op : specdec::schemas::kOps)
    if (op.backends & specdec::schemas::kCuda) m.def(op.schema);
  // Emulator only: [ordinary, cooperative, refused cooperative] launches since the library
  // was loaded (simt::launch_counts), so tests can see which launch path a call took.
  m.def("launch_counts() -> int[]", &specdec::simt_ops::launch_counts);
}

TORCH_LIBRARY_IMPL(specdec_simt, CPU, m) {
  using namespace specdec::ops;
  register_all_ops<specdec::simt_ops::Backend, VerifyOp, VerifyBlockOp, SampleOp, FilteredProbsOp, MaskLogitsOp,
                   SoftmaxOp, LogprobsOp, VerifyTreeOp, VerifyShardOp, VerifyShardFinishOp, KvAppendOp, KvRollbackOp,
                   PagedKvAppendOp, PagedKvGatherOp, PagedKvGatherIntoOp, KvCompactOp, PagedKvCompactOp>(m);
}
