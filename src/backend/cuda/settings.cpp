// The math switches of dltrain::cuda (TF32, cuDNN benchmark and deterministic modes): plain
// flags, compiled in every build (with or without CUDA), read by the cuBLASLt and cuDNN callers.
#include <atomic>

#include "dltrain/backend/cuda.hpp"

namespace dltrain::cuda {

namespace {
std::atomic<bool> g_tf32{true};
std::atomic<bool> g_benchmark{false};
std::atomic<bool> g_deterministic{false};
}  // namespace

void set_allow_tf32(bool allow) { g_tf32 = allow; }
bool allow_tf32() { return g_tf32; }
void set_cudnn_benchmark(bool on) { g_benchmark = on; }
bool cudnn_benchmark() { return g_benchmark; }
void set_cudnn_deterministic(bool on) { g_deterministic = on; }
bool cudnn_deterministic() { return g_deterministic; }

}  // namespace dltrain::cuda
