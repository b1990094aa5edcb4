// The dnn family (convolution, normalisation, pooling) of a build without CUDA (see dnn.hpp).
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/dnn.hpp"

namespace dltrain::backend::cuda {

void conv2d_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const ConvParams&) {
  unavailable("conv2d on a CUDA tensor");
}
void conv2d_backward_data(const Tensor&, const Tensor&, const Tensor&, const ConvParams&) {
  unavailable("conv2d backward on a CUDA tensor");
}
void conv2d_backward_filter(const Tensor&, const Tensor&, const Tensor&, const ConvParams&) {
  unavailable("conv2d backward on a CUDA tensor");
}
void channel_sum(const Tensor&, const Tensor&) { unavailable("a bias gradient on a CUDA tensor"); }
void batch_norm_forward_training(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&, const Tensor&, double, double, const Tensor&,
                                 const Tensor&) {
  unavailable("batch_norm on a CUDA tensor");
}
void batch_norm_forward_inference(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&, const Tensor&, double) {
  unavailable("batch_norm on a CUDA tensor");
}
void batch_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, const Tensor&, double) {
  unavailable("batch_norm backward on a CUDA tensor");
}
void batch_norm_backward_eval(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&, const Tensor&, double) {
  unavailable("batch_norm backward on a CUDA tensor");
}
void layer_norm_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&, int64_t, double) {
  unavailable("layer_norm on a CUDA tensor");
}
void layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, const Tensor&, int64_t) {
  unavailable("layer_norm backward on a CUDA tensor");
}
void max_pool2d_forward(const Tensor&, const Tensor&, const Tensor&, const PoolParams&) {
  unavailable("max_pool2d on a CUDA tensor");
}
void max_pool2d_backward(const Tensor&, const Tensor&, const Tensor&, const PoolParams&) {
  unavailable("max_pool2d backward on a CUDA tensor");
}
void avg_pool2d_forward(const Tensor&, const Tensor&, const PoolParams&, bool) {
  unavailable("avg_pool2d on a CUDA tensor");
}
void avg_pool2d_backward(const Tensor&, const Tensor&, const PoolParams&, bool) {
  unavailable("avg_pool2d backward on a CUDA tensor");
}
void adaptive_avg_pool2d_forward(const Tensor&, const Tensor&) {
  unavailable("adaptive_avg_pool2d on a CUDA tensor");
}
void adaptive_avg_pool2d_backward(const Tensor&, const Tensor&) {
  unavailable("adaptive_avg_pool2d backward on a CUDA tensor");
}

}  // namespace dltrain::backend::cuda
