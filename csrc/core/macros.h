// Portability macro for the framework-free core: every function here compiles
// as plain C++ on the host and as __host__ __device__ code under nvcc.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SPECDEC_HD __host__ __device__ __forceinline__
#else
#define SPECDEC_HD inline
#endif

// A function kept out of line (a rare path that must not cost its caller registers).
// Not __noinline__ in host builds: libstdc++ spells its own attribute that way.
#if defined(__CUDACC__)
#define SPECDEC_NOINLINE __noinline__
#else
#define SPECDEC_NOINLINE __attribute__((noinline))
#endif
