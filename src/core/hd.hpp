// DLTRAIN_HD: marks small functions shared by host code and CUDA device code (internal
// header). Under nvcc they are __host__ __device__; elsewhere plain inline functions.
#pragma once

#if defined(__CUDACC__)
#define DLTRAIN_HD __host__ __device__ __forceinline__
#else
#define DLTRAIN_HD inline
#endif
