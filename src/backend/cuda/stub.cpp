// The CUDA backend of a build without CUDA: zero devices, and a clear error
// for anything that would need one.
#include "dltrain/core/error.hpp"
#include "src/backend/cuda/cuda_backend.hpp"

namespace dltrain::backend::cuda {

namespace {
[[noreturn]] void unavailable(const char* what) {
  DLTRAIN_FAIL(what,
               ": this dltrain was built without CUDA support; reconfigure with "
               "-DDLTRAIN_CUDA=ON on a machine with the CUDA toolkit");
}
}  // namespace

bool compiled() { return false; }
int device_count() { return 0; }
void* allocate(size_t, Device) { unavailable("allocating CUDA memory"); }
void deallocate(void*, Device) {}
void copy_bytes(void*, Device, const void*, Device, size_t) {
  unavailable("copying to a CUDA device");
}
void fill(void*, DType, int64_t, double, Device) { unavailable("filling a CUDA tensor"); }

}  // namespace dltrain::backend::cuda
