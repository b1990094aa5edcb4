// Op tracing's CUDA side in a build without CUDA (see trace.hpp): nothing to time.
#include "src/backend/cuda/trace.hpp"

namespace dltrain::backend::cuda::trace {

bool usable() { return false; }
int current_device() { return 0; }
void range_push(const char*) {}
void range_pop() {}
Mark mark() { return nullptr; }
double elapsed_ms(Mark, Mark) { return -1; }
void recycle(Mark) {}

}  // namespace dltrain::backend::cuda::trace
