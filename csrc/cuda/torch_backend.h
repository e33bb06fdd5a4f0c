// The CUDA backend of the op adapters (op_adapters.h): every CPU tensor is checked on the host,
// the shard steps run the CUDA plan, the whole call runs under a device guard on the op's
// device (its first tensor argument), and the kernels are queued on that device's current
// stream. The torch side only (the launches are *_launch.cuh): checked by
// scripts/header_check.sh in host mode.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "../op_adapters.h"

namespace specdec::cuda {

// The kernel set of this backend: the op's device and its current stream, and the first
// tensor argument (the workspace is allocated on its device). sampling_cuda.cu and
// kv_cache_cuda.cu define <kernel>_kernel(const Kernels&, ...).
struct Kernels {
  const at::Tensor* like;
  int device;
  cudaStream_t stream;
};

struct Backend {
  static constexpr unsigned backend = schemas::kCuda;  // its bit in the op table
  static constexpr ops::Target target{HostChecks::kCpuTensors, /*cuda_kernels=*/true};
  static constexpr bool poisons = false;
  struct Scope {
    c10::cuda::CUDAGuard guard;
    explicit Scope(const at::Tensor& first) : guard(first.device()) {}
  };
  template <class F>
  static void run(const at::Tensor& first, F&& f) {
    f(Kernels{&first, first.get_device(), c10::cuda::getCurrentCUDAStream(first.get_device()).stream()});
  }
};

}  // namespace specdec::cuda
