// Portability macro for the framework-free core: every function here compiles
// as plain C++ on the host and as __host__ __device__ code under nvcc.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SPECDEC_HD __host__ __device__ __forceinline__
#else
#define SPECDEC_HD inline
#endif

