// How the CUDA backend's entry points are declared (internal header). Every function that the
// rest of the library calls on the CUDA backend is declared once, in the header of its op
// family (elementwise.hpp, dnn.hpp, ...), through one of two macros:
//
//   DLTRAIN_CUDA_ENTRY(ret, name, (params), what);     a CUDA-less build raises the
//                                                     "built without CUDA" error naming `what`
//   DLTRAIN_CUDA_ANSWER(ret, name, (params), value);   a CUDA-less build returns `value`
//                                                     (nothing for void): queries and no-ops
//
// In a CUDA build both are plain declarations, defined in src/backend/cuda/*.cpp and
// kernels/*.cu. src/backend/no_cuda/no_cuda.cpp, the one file a CUDA-less build compiles in
// their place, defines DLTRAIN_CUDA_DEFINE_REFUSALS and includes every entry header: each
// declaration becomes its CUDA-less definition. The signatures are written once; there is no
// second list to keep in step (issue 27, step 3). `what` may use the parameters
// (e.g. op_name(op)).
#pragma once

namespace dltrain::backend::cuda {
/// Raises the "built without CUDA" error naming `what` (defined in a CUDA-less build only).
[[noreturn]] void unavailable(const char* what);
}  // namespace dltrain::backend::cuda

#ifdef DLTRAIN_CUDA_DEFINE_REFUSALS
#define DLTRAIN_CUDA_ENTRY(ret, name, params, what) \
  ret name params { ::dltrain::backend::cuda::unavailable(what); }
#define DLTRAIN_CUDA_ANSWER(ret, name, params, ...) \
  ret name params { return ret(__VA_ARGS__); }
#else
#define DLTRAIN_CUDA_ENTRY(ret, name, params, what) ret name params
#define DLTRAIN_CUDA_ANSWER(ret, name, params, ...) ret name params
#endif
