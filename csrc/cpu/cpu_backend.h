// The CPU backend of the op adapters (op_adapters.h): the per-row tensors are checked on the
// host, nothing is poisoned, and the one place where the instruction set is chosen.
#pragma once
#include <ATen/core/Tensor.h>

#include "../op_adapters.h"
#include "sampling_kernels_entry.h"

namespace specdec::cpu {

// The AVX2 copy when the CPU has AVX2 + FMA + F16C, unless SPECDEC_CPU_CAPABILITY=default
// (read per call so tests can compare the two copies in one process). sampling_cpu.cpp.
bool use_avx2();

struct Backend {
  static constexpr unsigned backend = schemas::kCpu;  // its bit in the op table
  static constexpr ops::Target target{HostChecks::kCpuTensors, /*cuda_kernels=*/false};
  static constexpr bool poisons = false;
  struct Scope {
    explicit Scope(const at::Tensor&) {}
  };
  template <class F>
  static void run(const at::Tensor&, F&& f) {
    if (use_avx2()) f(Avx2{});
    else f(Default{});
  }
};

}  // namespace specdec::cpu
