// Batch normalisation on cuDNN (see dnn.hpp): training forward, inference forward and the
// training backward, in CUDNN_BATCHNORM_SPATIAL mode (per-channel statistics over N, H, W),
// for NCHW and NHWC inputs. cuDNN's running-statistics update is the CPU's: running =
// (1 - factor) * running + factor * batch statistic, the variance unbiased (N / (N - 1)), so
// `momentum` is passed as the exponential average factor unchanged (the cumulative average of
// nn::BatchNorm arrives here as momentum = 1 / num_batches_tracked). The per-channel tensors
// are f32 (f64 for f64 inputs), as cuDNN requires; the caller converts. Descriptors are built
// per call: a handful of host-side structs, cheaper than a cache lookup would save.
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/dnn.hpp"
#include "src/backend/cuda/handles.hpp"
#include "src/backend/cuda/lib_check.hpp"
#include "src/backend/cuda/runtime.hpp"

namespace dltrain::backend::cuda {

namespace {

constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL;

// The x and per-channel descriptors of one batch-norm call, destroyed with it.
struct BnDescs {
  cudnnTensorDescriptor_t x = nullptr, param = nullptr;
  BnDescs() = default;
  BnDescs(const BnDescs&) = delete;
  BnDescs& operator=(const BnDescs&) = delete;
  ~BnDescs() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (param) cudnnDestroyTensorDescriptor(param);
  }
};

bool nhwc_only(const Tensor& t) {
  return t.is_contiguous(MemoryFormat::ChannelsLast) && !t.is_contiguous();
}

// Checks that the 4-d operands share one dense layout and device, and describes x.
void describe(const char* op, BnDescs& d, std::initializer_list<const Tensor*> data,
              std::initializer_list<const Tensor*> params) {
  const Tensor& x = **data.begin();
  DLTRAIN_CHECK(x.dim() == 4 && x.device().is_cuda(), op,
                " on CUDA: internal error: expected a 4-d CUDA input but got ",
                shape_str(x.shape()), " on ", x.device());
  const bool nhwc = nhwc_only(x);
  for (const Tensor* t : data) {
    if (!t->defined()) continue;
    DLTRAIN_CHECK(t->shape() == x.shape() && t->dtype() == x.dtype() && t->device() == x.device() &&
                      (nhwc ? t->is_contiguous(MemoryFormat::ChannelsLast) : t->is_contiguous()),
                  op, " on CUDA: internal error: operands of shape ", shape_str(t->shape()),
                  " must share x's shape ", shape_str(x.shape()), ", dtype and dense layout");
  }
  const DType pt = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  for (const Tensor* t : params) {
    if (!t->defined()) continue;
    DLTRAIN_CHECK(t->dtype() == pt && t->numel() == x.size(1) && t->is_contiguous() &&
                      t->device() == x.device(),
                  op, " on CUDA: internal error: per-channel tensors must be contiguous [",
                  x.size(1), "] ", pt, " on ", x.device());
  }
  for (int i = 0; i < 4; ++i)
    DLTRAIN_CHECK(x.size(i) <= INT32_MAX, op, " on CUDA: dimension ", i, " of ",
                  shape_str(x.shape()), " exceeds cuDNN's 32-bit limit");
  DLTRAIN_CHECK(x.numel() <= INT32_MAX, op, " on CUDA: an input of ", shape_str(x.shape()),
                " has more than 2^31-1 elements, beyond cuDNN's limit; split the batch");
  DLTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d.x));
  DLTRAIN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(
      d.x, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, cudnn_data_type(x.dtype(), op),
      static_cast<int>(x.size(0)), static_cast<int>(x.size(1)), static_cast<int>(x.size(2)),
      static_cast<int>(x.size(3))));
  DLTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d.param));
  DLTRAIN_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(d.param, d.x, kMode));
}

// Host scaling factors 1 and 0 in the type cuDNN expects for x's dtype.
struct Scalars {
  float f1 = 1.0f, f0 = 0.0f;
  double d1 = 1.0, d0 = 0.0;
  bool dbl;
  explicit Scalars(DType t) : dbl(t == DType::f64) {}
  const void* one() const { return dbl ? static_cast<const void*>(&d1) : &f1; }
  const void* zero() const { return dbl ? static_cast<const void*>(&d0) : &f0; }
};

void* ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// cuDNN rejects zero-sized dimensions: an empty input (N = 0 in evaluation, or C = 0) has
// nothing to normalise and leaves the running statistics as they are, as on the CPU.
bool empty_input(const Tensor& x) { return x.numel() == 0; }

void check_eps(const char* op, double eps) {
  DLTRAIN_CHECK(eps >= CUDNN_BN_MIN_EPSILON, op, " on CUDA: eps = ", eps,
                " is below cuDNN's minimum ", CUDNN_BN_MIN_EPSILON);
}

}  // namespace

void batch_norm_forward_training(const Tensor& y, const Tensor& x, const Tensor& weight,
                                 const Tensor& bias, const Tensor& running_mean,
                                 const Tensor& running_var, double momentum, double eps,
                                 const Tensor& save_mean, const Tensor& save_invstd) {
  const char* op = "batch_norm";
  check_eps(op, eps);
  if (empty_input(x)) return;
  BnDescs d;
  describe(op, d, {&x, &y},
           {&weight, &bias, &running_mean, &running_var, &save_mean, &save_invstd});
  DLTRAIN_CHECK(running_mean.defined() == running_var.defined(), op,
                " on CUDA: internal error: running_mean and running_var go together");
  const int dev = x.device().index;
  Guard guard(dev);
  const Scalars s(x.dtype());
  DLTRAIN_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
      cudnn_handle(dev), kMode, s.one(), s.zero(), d.x, x.data_ptr(), d.x, y.data_ptr(), d.param,
      weight.data_ptr(), bias.data_ptr(), momentum, ptr_or_null(running_mean),
      ptr_or_null(running_var), eps, save_mean.data_ptr(), save_invstd.data_ptr()));
}

void batch_norm_forward_inference(const Tensor& y, const Tensor& x, const Tensor& weight,
                                  const Tensor& bias, const Tensor& running_mean,
                                  const Tensor& running_var, double eps) {
  const char* op = "batch_norm";
  check_eps(op, eps);
  if (empty_input(x)) return;
  BnDescs d;
  describe(op, d, {&x, &y}, {&weight, &bias, &running_mean, &running_var});
  const int dev = x.device().index;
  Guard guard(dev);
  const Scalars s(x.dtype());
  DLTRAIN_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
      cudnn_handle(dev), kMode, s.one(), s.zero(), d.x, x.data_ptr(), d.x, y.data_ptr(), d.param,
      weight.data_ptr(), bias.data_ptr(), running_mean.data_ptr(), running_var.data_ptr(), eps));
}

void batch_norm_backward(const Tensor& gx, const Tensor& gweight, const Tensor& gbias,
                         const Tensor& gy, const Tensor& x, const Tensor& weight,
                         const Tensor& save_mean, const Tensor& save_invstd, double eps) {
  const char* op = "batch_norm backward";
  check_eps(op, eps);
  if (empty_input(x)) {  // no values: zero parameter gradients
    for (const Tensor* t : {&gweight, &gbias})
      if (t->defined() && t->numel() > 0)
        fill(t->data_ptr(), t->dtype(), t->numel(), 0.0, t->device());
    return;
  }
  BnDescs d;
  describe(op, d, {&x, &gy, &gx}, {&weight, &gweight, &gbias, &save_mean, &save_invstd});
  const int dev = x.device().index;
  Guard guard(dev);
  const Scalars s(x.dtype());
  DLTRAIN_CUDNN_CHECK(cudnnBatchNormalizationBackward(
      cudnn_handle(dev), kMode, s.one(), s.zero(), s.one(), s.zero(), d.x, x.data_ptr(), d.x,
      gy.data_ptr(), d.x, gx.data_ptr(), d.param, weight.data_ptr(), gweight.data_ptr(),
      gbias.data_ptr(), eps, save_mean.data_ptr(), save_invstd.data_ptr()));
}

}  // namespace dltrain::backend::cuda
