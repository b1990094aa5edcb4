// The CUDA backend of a build without CUDA: the one file such a build compiles in place of
// src/backend/cuda/*.cpp and kernels/*.cu (CMake's choice, src/backend/CMakeLists.txt).
//
// Its internal entry points are not written here: every backend header declares them through
// DLTRAIN_CUDA_ENTRY / DLTRAIN_CUDA_ANSWER (src/backend/cuda/entry.hpp), and with
// DLTRAIN_CUDA_DEFINE_REFUSALS defined before they are included, each declaration expands to
// its CUDA-less definition: raise "built without CUDA" naming what was asked, or answer (no
// device, no memory in use, tracing off). A new entry point in a backend header is thereby
// defined here too; a missing include below fails to link, never at run time.
//
// What is written by hand is the public API of dltrain/backend/cuda.hpp (streams, events,
// device queries), whose CUDA build lives in src/backend/cuda/runtime.cpp.
#define DLTRAIN_CUDA_DEFINE_REFUSALS 1

#if defined(__GNUC__)
// The generated refusals name their parameters (they are the declarations) and use few.
#pragma GCC diagnostic ignored "-Wunused-parameter"
#endif

#include "src/backend/cuda/amp.hpp"
#include "src/backend/cuda/blas.hpp"
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/dnn.hpp"
#include "src/backend/cuda/elementwise.hpp"
#include "src/backend/cuda/image.hpp"
#include "src/backend/cuda/indexing.hpp"
#include "src/backend/cuda/loss.hpp"
#include "src/backend/cuda/optim.hpp"
#include "src/backend/cuda/random.hpp"
#include "src/backend/cuda/reduce.hpp"
#include "src/backend/cuda/resample.hpp"
#include "src/backend/cuda/scan.hpp"
#include "src/backend/cuda/trace.hpp"

#include "dltrain/backend/cuda.hpp"
#include "dltrain/core/error.hpp"

namespace dltrain::backend::cuda {

[[noreturn]] void unavailable(const char* what) {
  DLTRAIN_FAIL(what,
               ": this dltrain was built without CUDA support; reconfigure with "
               "-DDLTRAIN_CUDA=ON on a machine with the CUDA toolkit");
}

}  // namespace dltrain::backend::cuda

// The public API (dltrain/backend/cuda.hpp).
namespace dltrain::cuda {

using backend::cuda::unavailable;

bool is_available() { return false; }
int device_count() { return 0; }
int current_device() { return 0; }
void set_device(int) { unavailable("cuda::set_device"); }
void synchronize(int) { unavailable("cuda::synchronize"); }
DeviceGuard::DeviceGuard(int) : previous_(0) { unavailable("cuda::DeviceGuard"); }
DeviceGuard::~DeviceGuard() = default;
Stream Stream::create(int, bool) { unavailable("cuda::Stream::create"); }
Stream Stream::compute(int) { unavailable("cuda::Stream::compute"); }
Stream Stream::external(void*, int) { unavailable("cuda::Stream::external"); }
void Stream::synchronize() const { unavailable("cuda::Stream::synchronize"); }
bool Stream::query() const { unavailable("cuda::Stream::query"); }
Stream current_stream(int) { unavailable("cuda::current_stream"); }
void set_current_stream(const Stream&) { unavailable("cuda::set_current_stream"); }
StreamGuard::StreamGuard(const Stream& s) : previous_(s), device_(s.device()) {}
StreamGuard::~StreamGuard() = default;
Event::Event(bool) { unavailable("cuda::Event"); }
void Event::record() { unavailable("cuda::Event::record"); }
void Event::record(const Stream&) { unavailable("cuda::Event::record"); }
void Event::wait(const Stream&) const { unavailable("cuda::Event::wait"); }
void Event::synchronize() const { unavailable("cuda::Event::synchronize"); }
bool Event::query() const { unavailable("cuda::Event::query"); }
float Event::elapsed_ms(const Event&) const { unavailable("cuda::Event::elapsed_ms"); }
size_t memory_allocated(int) { return 0; }
size_t max_memory_allocated(int) { return 0; }
void reset_peak_memory_stats(int) {}
size_t memory_reserved(int) { return 0; }
void empty_cache(int) {}
void record_stream(const Tensor&, const Stream&) { unavailable("cuda::record_stream"); }
size_t pinned_memory_allocated() { return 0; }
size_t pinned_memory_cached() { return 0; }
void set_pinned_cache_limit(size_t) {}

}  // namespace dltrain::cuda
