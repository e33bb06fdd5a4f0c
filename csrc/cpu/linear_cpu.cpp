// CPU launcher of skinny_linear: an adapter (op_adapters.h) on the CPU backend (cpu_backend.h:
// the instruction-set choice); the kernel is csrc/cpu/skinny_linear_kernels.h.
#include <torch/library.h>

#include "../op_adapters.h"
#include "cpu_backend.h"

namespace specdec {

TORCH_LIBRARY_IMPL(specdec, CPU, m) { ops::register_ops<cpu::Backend, ops::SkinnyLinearOp>(m); }

}  // namespace specdec
