#include "src/ops/common.hpp"

namespace dltrain::detail {

void check_defined(const char* op, const Tensor& t, const char* name) {
  DLTRAIN_CHECK(t.defined(), op, ": argument '", name, "' is an undefined tensor");
}

void check_same_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t || !t->defined()) continue;
    if (!first) {
      first = t;
      continue;
    }
    DLTRAIN_CHECK(t->device() == first->device(), op,
                  ": expected all tensors on one device but got ", first->device(), " and ",
                  t->device(), "; move them with .to(device)");
  }
}

void require_cpu(const char* op, std::initializer_list<const Tensor*> ts) {
  check_same_device(op, ts);
  for (const Tensor* t : ts)
    DLTRAIN_CHECK(!t || !t->defined() || t->device().is_cpu(), op,
                  ": this build has no CUDA kernel for ", op, " (tensor on ", t->device(),
                  "); run it on CPU with .to(Device::cpu())");
}

void check_dim(const char* op, const Tensor& t, int64_t n, const char* name) {
  DLTRAIN_CHECK(t.dim() == n, op, ": expected '", name, "' to have ", n,
                " dimensions but got shape ", shape_str(t.shape()));
}

Tensor zero_pad_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  Tensor out = zeros(shape, g.options());
  Tensor view = out;
  for (int64_t k = 0; k < g.dim(); ++k) view = view.narrow(k, 0, g.size(k));
  view.copy_(g);
  return out;
}

}  // namespace dltrain::detail
