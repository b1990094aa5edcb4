// Builds without oneDNN: convolution keeps its im2col + Eigen path, batch norm, pooling and
// float GEMM their own kernels (the bool functions answer "not taken").
#include "dltrain/backend/cpu.hpp"
#include "dltrain/core/error.hpp"
#include "src/backend/cpu/dnnl.hpp"

namespace dltrain::backend::cpu {

bool dnnl_available() { return false; }
const char* dnnl_version() { return ""; }
bool dnnl_conv_supported(DType) { return false; }
Tensor dnnl_conv2d_forward(const Tensor&, const Tensor&, const Tensor&, const DnnlConvShape&,
                           MemoryFormat) {
  DLTRAIN_FAIL("conv2d: this dltrain was built without oneDNN (DLTRAIN_DNNL)");
}
void dnnl_conv2d_backward(const Tensor&, const Tensor&, const Tensor&, const DnnlConvShape&,
                          MemoryFormat, Tensor*, Tensor*, Tensor*) {
  DLTRAIN_FAIL("conv2d: this dltrain was built without oneDNN (DLTRAIN_DNNL)");
}

bool dnnl_batch_norm_forward_training(const Tensor&, const Tensor&, const Tensor&, double, Tensor&,
                                      Tensor&, Tensor&) {
  return false;
}
bool dnnl_batch_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, double, Tensor&, Tensor&, Tensor&) {
  return false;
}
bool dnnl_pool2d_supported(const DnnlPoolShape&, DnnlPool, DType) { return false; }
bool dnnl_pool2d_forward(const Tensor&, const DnnlPoolShape&, DnnlPool, Tensor&, Tensor&) {
  return false;
}
bool dnnl_pool2d_backward(const Tensor&, const DnnlPoolShape&, DnnlPool, const Tensor&, Tensor&) {
  return false;
}
bool dnnl_gemm_f32(char, char, int64_t, int64_t, int64_t, const float*, int64_t, const float*,
                   int64_t, float, float*, int64_t) {
  return false;
}

}  // namespace dltrain::backend::cpu

namespace dltrain::cpu {
bool dnnl_compiled() { return false; }
const char* dnnl_isa() { return ""; }
bool dnnl_enabled() { return false; }
void set_dnnl_enabled(bool) {}
}  // namespace dltrain::cpu
