// Rearranging ops composed from views and existing differentiable ops, so each runs on both
// devices and gets its gradient for free: repeat (expand of an interleaved view, then a copy),
// flip (index_select with reversed positions per dim), roll (cat of two narrowed views per
// dim), tril/triu (where with a position mask). nonzero is the exception: its output size
// depends on the data, so on CUDA the count is read back (one sync) and the coordinates are
// written by one kernel from the mask's cumsum (src/backend/cuda/scan.hpp).
#include <vector>

#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/indexing.hpp"
#include "dltrain/ops/reduction.hpp"
#include "dltrain/ops/shape.hpp"
#include "src/backend/cuda/scan.hpp"
#include "src/core/trace.hpp"
#include "src/ops/common.hpp"

namespace dltrain {

Tensor repeat(const Tensor& x, const Shape& repeats) {
  DLTRAIN_OP_SCOPE("repeat", x);
  const char* op = "repeat";
  detail::check_defined(op, x, "input");
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"repeats", std::vector<int64_t>(repeats)}},
                                  [&] { return repeat(x, repeats); });
    });
  const int64_t n = static_cast<int64_t>(repeats.size());
  DLTRAIN_CHECK(n >= x.dim(), op, ": repeats ", shape_str(repeats), " has fewer entries than the ",
                x.dim(), " dimensions of the input of shape ", shape_str(x.shape()),
                "; give one repeat count per dimension");
  Shape padded(static_cast<size_t>(n - x.dim()), 1);
  padded.insert(padded.end(), x.shape().begin(), x.shape().end());
  Shape inter, expanded, out;
  for (int64_t d = 0; d < n; ++d) {
    DLTRAIN_CHECK(repeats[d] >= 0, op, ": repeat counts must be >= 0 but got ", shape_str(repeats));
    inter.insert(inter.end(), {1, padded[d]});
    expanded.insert(expanded.end(), {repeats[d], padded[d]});
    out.push_back(repeats[d] * padded[d]);
  }
  return x.reshape(inter).expand(expanded).contiguous().reshape(out);
}

Tensor flip(const Tensor& x, const Shape& dims) {
  DLTRAIN_OP_SCOPE("flip", x);
  const char* op = "flip";
  detail::check_defined(op, x, "input");
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      std::vector<int64_t> axes;
      for (int64_t d : dims) axes.push_back(wrap_dim(d, x.dim(), op));
      return detail::graph_record({x}, {{"dims", axes}}, [&] { return flip(x, dims); });
    });
  Tensor r = x;
  std::vector<bool> seen(static_cast<size_t>(x.dim()), false);
  for (int64_t dim : dims) {
    const int64_t d = wrap_dim(dim, x.dim(), op);
    DLTRAIN_CHECK(!seen[d], op, ": dimension ", d, " appears more than once in ", shape_str(dims));
    seen[d] = true;
    const int64_t n = x.size(d);
    if (n <= 1) continue;
    const Tensor rev = arange(static_cast<double>(n - 1), -1.0, -1.0, DType::i64).to(x.device());
    r = index_select(r, d, rev);
  }
  return r.defined() && r.impl() == x.impl() ? x.clone() : r;
}

Tensor roll(const Tensor& x, const Shape& shifts, const Shape& dims) {
  DLTRAIN_OP_SCOPE("roll", x);
  const char* op = "roll";
  detail::check_defined(op, x, "input");
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      std::vector<int64_t> axes;
      for (int64_t d : dims) axes.push_back(wrap_dim(d, x.dim(), op));
      return detail::graph_record({x}, {{"shifts", std::vector<int64_t>(shifts)}, {"dims", axes}},
                                  [&] { return roll(x, shifts, dims); });
    });
  if (dims.empty()) {
    DLTRAIN_CHECK(shifts.size() == 1, op, ": without dims, give exactly one shift (got ",
                  shape_str(shifts), ")");
    return roll(x.reshape({-1}), shifts, {0}).reshape(x.shape());
  }
  DLTRAIN_CHECK(shifts.size() == dims.size(), op, ": shifts ", shape_str(shifts), " and dims ",
                shape_str(dims), " must have the same length");
  Tensor r = x;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], x.dim(), op);
    const int64_t n = x.size(d);
    if (n == 0) continue;
    const int64_t s = ((shifts[i] % n) + n) % n;
    if (s == 0) continue;
    r = cat({r.narrow(d, n - s, s), r.narrow(d, 0, n - s)}, d);
  }
  return r.impl() == x.impl() ? x.clone() : r;
}

namespace {

Tensor triangle(const char* op, const Tensor& x, int64_t diagonal, bool lower) {
  // A scope of its own: the profiler times it, and export_onnx refuses it (no mapping yet)
  // instead of taking its output for a constant.
  DLTRAIN_OP_SCOPE(op, x);
  detail::check_defined(op, x, "input");
  DLTRAIN_CHECK(x.dim() >= 2, op, ": input must have at least 2 dimensions but has shape ",
                shape_str(x.shape()));
  const int64_t H = x.size(-2), W = x.size(-1);
  const TensorOptions io = TensorOptions(DType::i64).with_device(x.device());
  // col - row, compared with the diagonal.
  const Tensor off = sub(arange(static_cast<double>(W), io).reshape({1, W}),
                         arange(static_cast<double>(H), io).reshape({H, 1}));
  const Tensor keep =
      lower ? le(off, static_cast<double>(diagonal)) : ge(off, static_cast<double>(diagonal));
  return where(keep, x, zeros({}, x.options()));
}

}  // namespace

Tensor tril(const Tensor& x, int64_t diagonal) { return triangle("tril", x, diagonal, true); }
Tensor triu(const Tensor& x, int64_t diagonal) { return triangle("triu", x, diagonal, false); }

Tensor nonzero(const Tensor& x) {
  DLTRAIN_OP_SCOPE("nonzero", x);
  const char* op = "nonzero";
  detail::check_defined(op, x, "input");
  const int64_t nd = x.dim();
  const TensorOptions io = TensorOptions(DType::i64).with_device(x.device());
  const Tensor mask = ne(x.detach(), 0.0).contiguous();
  if (x.device().is_cuda()) {
    const Tensor csum = cumsum(mask.reshape({-1}), 0);
    const int64_t n = mask.numel() == 0 ? 0 : csum.narrow(0, mask.numel() - 1, 1).item<int64_t>();
    Tensor out = empty({n, nd}, io);
    backend::cuda::nonzero_write(out, mask, csum, x.shape());
    return out;
  }
  const bool* m = mask.data<bool>();
  const int64_t total = mask.numel();
  int64_t n = 0;
  for (int64_t i = 0; i < total; ++i) n += m[i] ? 1 : 0;
  Tensor out = empty({n, nd}, io);
  int64_t* o = out.data<int64_t>();
  const Shape& s = x.shape();
  for (int64_t i = 0, row = 0; i < total; ++i) {
    if (!m[i]) continue;
    int64_t rem = i;
    for (int64_t d = nd - 1; d >= 0; --d) {
      o[row * nd + d] = rem % s[d];
      rem /= s[d];
    }
    ++row;
  }
  return out;
}

}  // namespace dltrain
