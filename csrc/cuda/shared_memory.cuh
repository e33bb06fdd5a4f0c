// Block-shared memory declarations that build both with nvcc and in the SIMT
// emulation (csrc/simt): SPECDEC_SHARED(type, name) inside a kernel declares
//   __shared__ type name;                       (nvcc)
// or a reference to the emulated block's copy (SIMT), which the emulator fills
// with a poison pattern at the start of every block (an initcheck analog).
// `type` may be an array type: SPECDEC_SHARED(RacePair[32], scratch).
#pragma once
#include <cstddef>

namespace specdec::cuda {
template <typename T>
using shared_type = T;
}  // namespace specdec::cuda

#if defined(SPECDEC_SIMT)
#define SPECDEC_SHARED(type, name)                                                                       \
  static char name##_simt_key; /* one per declaration and template instantiation */                   \
  ::specdec::cuda::shared_type<type>& name = *static_cast<::specdec::cuda::shared_type<type>*>(         \
      ::simt::block_shared(&name##_simt_key, sizeof(::specdec::cuda::shared_type<type>),               \
                           alignof(::specdec::cuda::shared_type<type>)))
#else
#define SPECDEC_SHARED(type, name) __shared__ ::specdec::cuda::shared_type<type> name
#endif
