// The CUDA runtime of a build without CUDA: zero devices, queries that answer 0, and a
// clear error for anything that would need a device. The op families have their own
// stub_*.cpp beside this file.

#include "dltrain/backend/cuda.hpp"
#include "dltrain/core/error.hpp"
#include "src/backend/cuda/cuda_backend.hpp"

namespace dltrain::backend::cuda {

[[noreturn]] void unavailable(const char* what) {
  DLTRAIN_FAIL(what,
               ": this dltrain was built without CUDA support; reconfigure with "
               "-DDLTRAIN_CUDA=ON on a machine with the CUDA toolkit");
}

bool compiled() { return false; }
int device_count() { return 0; }
std::shared_ptr<void> allocate(size_t, Device) { unavailable("allocating CUDA memory"); }
std::shared_ptr<void> allocate_pinned(size_t) { unavailable("allocating pinned host memory"); }
void record_stream(const std::shared_ptr<void>&, const dltrain::cuda::Stream&) {
  unavailable("record_stream");
}
void copy_bytes(void*, Device, const void*, Device, size_t, bool) {
  unavailable("copying to a CUDA device");
}
void fill(void*, DType, int64_t, double, Device) { unavailable("filling a CUDA tensor"); }

}  // namespace dltrain::backend::cuda

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
