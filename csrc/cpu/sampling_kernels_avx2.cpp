// The CPU sampling kernels compiled for AVX2 + FMA (8-wide at::vec, fast exp/log).
// Chosen at run time only on CPUs that have AVX2, FMA and F16C (sampling_cpu.cpp).
//
// Headers with code shared by both copies are included BEFORE the target pragma,
// so their inline functions are compiled for the baseline ISA and can never
// reach a non-AVX2 CPU through the linker's choice of one COMDAT copy.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <type_traits>

#include "../core/dtype_dispatch.h"
#include "../core/rng.h"
#include "../core/sampling_params.h"
#include "../core/shard_math.h"
#include "../core/verify_math.h"
#include "sampling_kernels_entry.h"

#if defined(__x86_64__) || defined(_M_X64)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
// sleef.h declares its 8-wide functions only under these macros, which the
// target pragma (unlike -mavx2) does not define. Everything included from here
// on is compiled for AVX2 anyway.
#ifndef __AVX__
#define __AVX__ 1
#endif
#ifndef __AVX2__
#define __AVX2__ 1
#endif
#ifndef __FMA__
#define __FMA__ 1
#endif
#ifndef __F16C__
#define __F16C__ 1
#endif
#else
#define CPU_CAPABILITY NOAVX2
#define CPU_CAPABILITY_DEFAULT
#endif
#include "sampling_kernels.h"
#include "block_kernels.h"
#include "tree_kernels.h"
#include "logprob_kernels.h"
#include "shard_kernels.h"
#include "skinny_linear_kernels.h"

#define SPECDEC_CPU_TAG Avx2
#include "sampling_kernels_entries.inc"

namespace specdec::cpu {
bool avx2_compiled() {
#if defined(CPU_CAPABILITY_AVX2)
  static_assert(at::vec::CPU_CAPABILITY::Vectorized<float>::size() == 8, "AVX2 vectors expected");
  return true;
#else
  return false;
#endif
}
}  // namespace specdec::cpu

#if defined(__x86_64__) || defined(_M_X64)
#pragma GCC pop_options
#endif
