// DLTRAIN_CUBLAS_CHECK and DLTRAIN_CUDNN_CHECK: wrap every cuBLAS(Lt) and cuDNN call; on
// failure they raise dltrain::Error with the call, file:line and the library's own status
// name and message (for cuDNN also its last detailed error string, which usually names the
// unsupported parameter). Internal header for src/backend/cuda sources only.
#pragma once

#include <cublasLt.h>
#include <cudnn.h>

#include <string>

#include "dltrain/core/error.hpp"

namespace dltrain::backend::cuda {

/// cuDNN's detailed message for the last failed call on this thread ("" when there is none).
inline std::string cudnn_last_error() {
  char buf[1024] = {0};
  cudnnGetLastErrorString(buf, sizeof(buf));
  return buf;
}

}  // namespace dltrain::backend::cuda

#define DLTRAIN_CUBLAS_CHECK(call)                                                             \
  do {                                                                                         \
    const cublasStatus_t dltrain_st_ = (call);                                                 \
    if (dltrain_st_ != CUBLAS_STATUS_SUCCESS)                                                  \
      DLTRAIN_FAIL(#call, " failed at ", __FILE__, ":", __LINE__, ": ",                        \
                   cublasGetStatusName(dltrain_st_), " (", cublasGetStatusString(dltrain_st_), \
                   ")");                                                                       \
  } while (0)

#define DLTRAIN_CUDNN_CHECK(call)                                                         \
  do {                                                                                    \
    const cudnnStatus_t dltrain_st_ = (call);                                             \
    if (dltrain_st_ != CUDNN_STATUS_SUCCESS) {                                            \
      const std::string dltrain_detail_ = ::dltrain::backend::cuda::cudnn_last_error();   \
      DLTRAIN_FAIL(#call, " failed at ", __FILE__, ":", __LINE__, ": ",                   \
                   cudnnGetErrorString(dltrain_st_), dltrain_detail_.empty() ? "" : " (", \
                   dltrain_detail_, dltrain_detail_.empty() ? "" : ")");                  \
    }                                                                                     \
  } while (0)
