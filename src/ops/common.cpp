// Argument checks shared by the ops (src/ops/common.hpp): defined, same device, CPU only,
// dimension counts, a loss target's shape, and the zero-padding of gradients.
#include "src/ops/common.hpp"

namespace dltrain::detail {

void check_defined(const char* op, const Tensor& t, const char* name) {
  DLTRAIN_CHECK(t.defined(), op, ": argument '", name, "' is an undefined tensor");
}

namespace {
// `shape` without dimension d.
Shape drop_dim(const Shape& shape, size_t d) {
  Shape out = shape;
  out.erase(out.begin() + static_cast<std::ptrdiff_t>(d));
  return out;
}
}  // namespace

void check_loss_target_shape(const char* op, const Tensor& input, const Tensor& target) {
  const Shape &is = input.shape(), &ts = target.shape();
  if (is == ts) return;
  // The likely fix: a size-1 dimension one of them has and the other lacks.
  std::string fix;
  for (size_t d = 0; d < is.size() && is.size() == ts.size() + 1; ++d)
    if (is[d] == 1 && drop_dim(is, d) == ts) {
      fix = "target.unsqueeze(" + std::to_string(d) + ") gives " + shape_str(is) +
            " (or input.squeeze(" + std::to_string(d) + ") gives " + shape_str(ts) + ")";
      break;
    }
  for (size_t d = 0; d < ts.size() && ts.size() == is.size() + 1 && fix.empty(); ++d)
    if (ts[d] == 1 && drop_dim(ts, d) == is)
      fix = "target.squeeze(" + std::to_string(d) + ") gives " + shape_str(is);
  if (fix.empty()) fix = "reshape the target (or the input) so that the shapes are equal";
  std::string broadcast;
  try {
    broadcast = "broadcasting them would give " + shape_str(broadcast_shapes(is, ts, op)) +
                " and a different loss";
  } catch (const Error&) {
    broadcast = "they do not even broadcast";
  }
  DLTRAIN_FAIL(op, ": target shape ", shape_str(ts), " differs from input shape ", shape_str(is),
               "; ", broadcast, ". Make them match: ", fix,
               "; to broadcast on purpose, pass target.expand(input.shape())");
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
