// DLTRAIN_CUDA_CHECK: wraps every CUDA runtime call; on failure raises
// dltrain::Error with the call, file:line and CUDA's own error string.
#pragma once

#include <cuda_runtime_api.h>

#include "dltrain/core/error.hpp"

#define DLTRAIN_CUDA_CHECK(call)                                                                 \
  do {                                                                                           \
    const cudaError_t dltrain_err_ = (call);                                                     \
    if (dltrain_err_ != cudaSuccess)                                                             \
      DLTRAIN_FAIL(#call, " failed at ", __FILE__, ":", __LINE__, ": ",                          \
                   cudaGetErrorName(dltrain_err_), " (", cudaGetErrorString(dltrain_err_), ")"); \
  } while (0)
