// The math switches of dltrain::cuda (TF32, cuDNN benchmark and deterministic modes, cuDNN's
// bf16 batch norm): plain flags, compiled in every build (with or without CUDA), read by the
// cuBLASLt and cuDNN callers.
#include <atomic>
#include <cstdlib>
#include <string>

#include "dltrain/backend/cuda.hpp"
#include "dltrain/core/error.hpp"

namespace dltrain::cuda {

namespace {
std::atomic<bool> g_tf32{true};
std::atomic<bool> g_benchmark{false};
std::atomic<bool> g_deterministic{false};

// DLTRAIN_CUDNN_BF16_BN: "1" or "0" (unset: off).
bool bf16_bn_from_env() {
  const char* v = std::getenv("DLTRAIN_CUDNN_BF16_BN");
  if (v == nullptr || *v == '\0') return false;
  const std::string s(v);
  DLTRAIN_CHECK(s == "0" || s == "1", "DLTRAIN_CUDNN_BF16_BN='", s,
                "' is not 0 or 1; set it to 1 for cuDNN's direct bf16 batch norm, 0 (or unset "
                "it) for the f32 copies");
  return s == "1";
}
std::atomic<bool>& bf16_bn() {
  static std::atomic<bool> on{bf16_bn_from_env()};
  return on;
}
}  // namespace

void set_allow_tf32(bool allow) { g_tf32 = allow; }
bool allow_tf32() { return g_tf32; }
void set_cudnn_benchmark(bool on) { g_benchmark = on; }
bool cudnn_benchmark() { return g_benchmark; }
void set_cudnn_deterministic(bool on) { g_deterministic = on; }
bool cudnn_deterministic() { return g_deterministic; }
void set_cudnn_bf16_batch_norm(bool on) { bf16_bn() = on; }
bool cudnn_bf16_batch_norm() { return bf16_bn(); }

}  // namespace dltrain::cuda
