// View ops (Tensor methods) and cat/stack/split/chunk.
//
// A view shares its base's storage and records a node whose backward maps the
// gradient back to the base's shape: reshape for view/squeeze/unsqueeze/flatten,
// the inverse permutation for permute/transpose, sum_to for expand, and a
// zero tensor with the gradient copied into the same window for narrow/slice/select.
#include <numeric>
#include <optional>

#include "dltrain/autograd/node.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/reduction.hpp"
#include "dltrain/ops/shape.hpp"
#include "src/amp/dispatch.hpp"
#include "src/core/layout.hpp"
#include "src/core/trace.hpp"

namespace dltrain {

namespace {

using detail::make_view;

Shape infer_shape(const Shape& shape, int64_t numel, const char* op, const Shape& from) {
  Shape r = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r[i] == -1) {
      DLTRAIN_CHECK(infer < 0, op, ": only one dimension can be -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      DLTRAIN_CHECK(r[i] >= 0, op, ": invalid size ", r[i], " in ", shape_str(shape));
      known *= r[i];
    }
  }
  if (infer >= 0) {
    DLTRAIN_CHECK(known != 0 && numel % known == 0, op, ": cannot infer -1 in ", shape_str(shape),
                  " for a tensor of shape ", shape_str(from), " (", numel, " elements)");
    r[static_cast<size_t>(infer)] = numel / known;
  }
  DLTRAIN_CHECK(shape_numel(r) == numel, op, ": shape ", shape_str(shape),
                " is invalid for a tensor of shape ", shape_str(from), " (", numel, " elements)");
  return r;
}

// Strides for viewing (old shape, old strides) as new shape without copying, if possible.
std::optional<Shape> view_strides(const Shape& os, const Shape& ost, const Shape& ns) {
  if (os.empty() || shape_numel(os) == 0) return contiguous_strides(ns);
  Shape nst(ns.size());
  int64_t view_d = static_cast<int64_t>(ns.size()) - 1;
  int64_t chunk_base = ost.back(), tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(os.size()) - 1; d >= 0; --d) {
    tensor_numel *= os[d];
    if (d == 0 || (os[d - 1] != 1 && ost[d - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || ns[view_d] == 1)) {
        nst[view_d] = view_numel * chunk_base;
        view_numel *= ns[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base = ost[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return nst;
}

void record_reshape_back(const char* name, const Tensor& in, const Tensor& out) {
  const Shape s = in.shape();
  autograd::record(
      name, {in}, {out},
      [s](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].reshape(s)}; },
      autograd::HigherOrder::Supported);
}

}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  DLTRAIN_OP_SCOPE("view", *this);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({*this}, {}, [&] { return view(shape); }); });
  checked();
  const Shape ns = infer_shape(shape, numel(), "view", this->shape());
  auto st = view_strides(this->shape(), strides(), ns);
  DLTRAIN_CHECK(
      st.has_value(), "view: cannot view a tensor of shape ", shape_str(this->shape()),
      " and strides ", shape_str(strides()), " as ", shape_str(ns),
      " without copying; use reshape() (which copies when needed) or call contiguous() first");
  Tensor out = make_view(*this, ns, *st, storage_offset());
  record_reshape_back("view", *this, out);
  return out;
}

Tensor Tensor::reshape(const Shape& shape) const {
  DLTRAIN_OP_SCOPE("reshape", *this);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({*this}, {}, [&] { return reshape(shape); }); });
  checked();
  const Shape ns = infer_shape(shape, numel(), "reshape", this->shape());
  if (view_strides(this->shape(), strides(), ns)) return view(ns);
  return contiguous().view(ns);
}

Tensor Tensor::permute(const Shape& dims) const {
  DLTRAIN_OP_SCOPE("permute", *this);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({*this}, {{"dims", dims}}, [&] { return permute(dims); });
    });
  checked();
  const int64_t n = dim();
  DLTRAIN_CHECK(static_cast<int64_t>(dims.size()) == n, "permute: got ", dims.size(),
                " dims for a tensor with ", n, " dimensions (shape ", shape_str(shape()), ")");
  Shape ns(n), nst(n), inv(n);
  std::vector<bool> seen(n, false);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t d = wrap_dim(dims[i], n, "permute");
    DLTRAIN_CHECK(!seen[d], "permute: dimension ", d, " repeated in ", shape_str(dims));
    seen[d] = true;
    ns[i] = shape()[d];
    nst[i] = strides()[d];
    inv[d] = i;
  }
  Tensor out = make_view(*this, ns, nst, storage_offset());
  autograd::record(
      "permute", {*this}, {out},
      [inv](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].permute(inv)}; },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  DLTRAIN_OP_SCOPE("transpose", *this);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({*this}, {{"dim0", d0}, {"dim1", d1}},
                                  [&] { return transpose(d0, d1); });
    });
  const int64_t n = dim();
  Shape p(n);
  std::iota(p.begin(), p.end(), 0);
  if (n == 0) return *this;
  std::swap(p[wrap_dim(d0, n, "transpose")], p[wrap_dim(d1, n, "transpose")]);
  return permute(p);
}

Tensor Tensor::t() const {
  DLTRAIN_OP_SCOPE("t", *this);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({*this}, {}, [&] { return t(); }); });
  DLTRAIN_CHECK(dim() <= 2, "t(): expects a tensor with <= 2 dimensions but got shape ",
                shape_str(shape()), "; use transpose(d0, d1)");
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  DLTRAIN_OP_SCOPE("slice", *this);
  checked();
  d = wrap_dim(d, dim(), "slice");
  DLTRAIN_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t n = shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({*this},
                                  {{"dim", d}, {"start", start}, {"end", end}, {"step", step}},
                                  [&] { return slice(d, start, end, step); });
    });
  Shape ns = shape(), nst = strides();
  ns[d] = (end - start + step - 1) / step;
  nst[d] *= step;
  Tensor out = make_view(*this, ns, nst, storage_offset() + start * strides()[d]);
  const Shape in_shape = shape();
  const TensorOptions o = options();
  autograd::record(
      "slice", {*this}, {out},
      [=](const std::vector<Tensor>& g) {
        Tensor gi = zeros(in_shape, o);
        {
          NoGradGuard no_grad;
          gi.slice(d, start, end, step).copy_(g[0]);
        }
        // Padding by zeros is linear in g; its adjoint is this slice again.
        return std::vector<Tensor>{autograd::linear_backward(
            "slice_backward", g[0], gi,
            [=](const Tensor& gg) { return gg.slice(d, start, end, step); })};
      },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  DLTRAIN_OP_SCOPE("narrow", *this);
  d = wrap_dim(d, dim(), "narrow");
  const int64_t n = shape()[d];
  if (start < 0) start += n;
  DLTRAIN_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow: range [", start, ", ",
                start + length, ") is outside dimension ", d, " of size ", n);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record(
          {*this}, {{"dim", d}, {"start", start}, {"end", start + length}, {"step", 1}},
          [&] { return narrow(d, start, length); });
    });
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  DLTRAIN_OP_SCOPE("select", *this);
  d = wrap_dim(d, dim(), "select");
  const int64_t n = shape()[d];
  DLTRAIN_CHECK(index >= -n && index < n, "select: index ", index,
                " is out of range for dimension ", d, " of size ", n);
  if (index < 0) index += n;
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({*this}, {{"dim", d}, {"index", index}},
                                  [&] { return select(d, index); });
    });
  return narrow(d, index, 1).squeeze(d);
}

Tensor Tensor::expand(const Shape& shape) const {
  DLTRAIN_OP_SCOPE("expand", *this);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({*this}, {}, [&] { return expand(shape); }); });
  checked();
  const int64_t n = static_cast<int64_t>(shape.size()), m = dim();
  DLTRAIN_CHECK(n >= m, "expand: target ", shape_str(shape),
                " has fewer dimensions than the tensor's ", shape_str(this->shape()));
  Shape ns(n), nst(n);
  for (int64_t i = n - 1; i >= 0; --i) {
    const int64_t j = i - (n - m);
    const int64_t cur = j >= 0 ? this->shape()[j] : 1;
    const int64_t target = shape[i] == -1 ? cur : shape[i];
    DLTRAIN_CHECK(j >= 0 || shape[i] != -1, "expand: -1 is not allowed for new leading dims");
    DLTRAIN_CHECK(cur == target || cur == 1, "expand: size ", cur, " at dim ", i,
                  " cannot expand to ", target, " (tensor shape ", shape_str(this->shape()),
                  ", target ", shape_str(shape), "); only size-1 dims expand");
    ns[i] = target;
    nst[i] = (j >= 0 && cur == target) ? strides()[j] : 0;
  }
  Tensor out = make_view(*this, ns, nst, storage_offset());
  const Shape in_shape = this->shape();
  autograd::record(
      "expand", {*this}, {out},
      [in_shape](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{sum_to(g[0], in_shape)};
      },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor Tensor::squeeze() const {
  DLTRAIN_OP_SCOPE("squeeze", *this);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({*this}, {}, [&] { return squeeze(); }); });
  Shape ns;
  for (int64_t s : shape())
    if (s != 1) ns.push_back(s);
  return reshape(ns);
}

Tensor Tensor::squeeze(int64_t d) const {
  DLTRAIN_OP_SCOPE("squeeze", *this);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({*this}, {}, [&] { return squeeze(d); }); });
  if (dim() == 0) return *this;
  d = wrap_dim(d, dim(), "squeeze");
  if (shape()[d] != 1) return *this;
  Shape ns = shape(), nst = strides();
  ns.erase(ns.begin() + d);
  nst.erase(nst.begin() + d);
  Tensor out = make_view(*this, ns, nst, storage_offset());
  record_reshape_back("squeeze", *this, out);
  return out;
}

Tensor Tensor::unsqueeze(int64_t d) const {
  DLTRAIN_OP_SCOPE("unsqueeze", *this);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({*this}, {}, [&] { return unsqueeze(d); }); });
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape ns = shape(), nst = strides();
  const int64_t st = d < dim() ? shape()[d] * strides()[d] : 1;
  ns.insert(ns.begin() + d, 1);
  nst.insert(nst.begin() + d, st);
  Tensor out = make_view(*this, ns, nst, storage_offset());
  record_reshape_back("unsqueeze", *this, out);
  return out;
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  DLTRAIN_OP_SCOPE("flatten", *this);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({*this}, {{"start_dim", start_dim}, {"end_dim", end_dim}},
                                  [&] { return flatten(start_dim, end_dim); });
    });
  if (dim() == 0) return reshape({1});
  start_dim = wrap_dim(start_dim, dim(), "flatten");
  end_dim = wrap_dim(end_dim, dim(), "flatten");
  DLTRAIN_CHECK(start_dim <= end_dim, "flatten: start_dim ", start_dim, " is after end_dim ",
                end_dim);
  Shape ns(shape().begin(), shape().begin() + start_dim);
  int64_t p = 1;
  for (int64_t i = start_dim; i <= end_dim; ++i) p *= shape()[i];
  ns.push_back(p);
  ns.insert(ns.end(), shape().begin() + end_dim + 1, shape().end());
  return reshape(ns);
}

// --- cat / stack / split / chunk --------------------------------------------------

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  DLTRAIN_OP_SCOPE("cat");
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record(std::vector<Tensor>(tensors), {{"dim", dim}},
                                  [&] { return cat(tensors, dim); });
    });
  if (auto ac = amp::detail::autocast_args(amp::Op::cat, tensors)) return cat(ac->args(), dim);
  DLTRAIN_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  const Tensor& first = tensors[0];
  const int64_t nd = first.dim();
  DLTRAIN_CHECK(nd > 0, "cat: zero-dimensional tensors cannot be concatenated; use stack()");
  dim = wrap_dim(dim, nd, "cat");
  Shape out_shape = first.shape();
  out_shape[dim] = 0;
  DType dt = first.dtype();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    DLTRAIN_CHECK(t.dim() == nd, "cat: tensor ", i, " has shape ", shape_str(t.shape()),
                  " but tensor 0 has shape ", shape_str(first.shape()), "; ranks must match");
    DLTRAIN_CHECK(t.device() == first.device(), "cat: tensor ", i, " is on ", t.device(),
                  " but tensor 0 is on ", first.device(), "; move them to one device");
    for (int64_t d = 0; d < nd; ++d)
      DLTRAIN_CHECK(d == dim || t.shape()[d] == first.shape()[d], "cat: tensor ", i, " has shape ",
                    shape_str(t.shape()), " but tensor 0 has shape ", shape_str(first.shape()),
                    "; sizes must match except in dimension ", dim);
    out_shape[dim] += t.shape()[dim];
    dt = promote_types(dt, t.dtype());
  }
  Tensor out = empty(out_shape, TensorOptions(dt).with_device(first.device()));
  std::vector<int64_t> sizes;
  {
    NoGradGuard g;
    int64_t off = 0;
    for (const Tensor& t : tensors) {
      out.narrow(dim, off, t.shape()[dim]).copy_(t);
      off += t.shape()[dim];
      sizes.push_back(t.shape()[dim]);
    }
  }
  std::vector<DType> dts;
  for (const Tensor& t : tensors) dts.push_back(t.dtype());
  autograd::record(
      "cat", tensors, {out},
      [sizes, dim, dts](const std::vector<Tensor>& g) {
        std::vector<Tensor> r;
        int64_t off = 0;
        for (size_t i = 0; i < sizes.size(); ++i) {
          r.push_back(g[0].narrow(dim, off, sizes[i]).to(dts[i]));
          off += sizes[i];
        }
        return r;
      },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  DLTRAIN_OP_SCOPE("stack");
  if (auto ac = amp::detail::autocast_args(amp::Op::stack, tensors)) return stack(ac->args(), dim);
  DLTRAIN_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  dim = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record(std::vector<Tensor>(tensors), {{"dim", dim}},
                                  [&] { return stack(tensors, dim); });
    });
  std::vector<Tensor> u;
  for (size_t i = 0; i < tensors.size(); ++i) {
    DLTRAIN_CHECK(tensors[i].shape() == tensors[0].shape(), "stack: tensor ", i, " has shape ",
                  shape_str(tensors[i].shape()), " but tensor 0 has shape ",
                  shape_str(tensors[0].shape()), "; all must match");
    u.push_back(tensors[i].unsqueeze(dim));
  }
  return cat(u, dim);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  DLTRAIN_OP_SCOPE("split", x);
  dim = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    DLTRAIN_CHECK(s >= 0, "split: negative size ", s);
    total += s;
  }
  DLTRAIN_CHECK(total == x.shape()[dim], "split: sizes sum to ", total, " but dimension ", dim,
                " has size ", x.shape()[dim]);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"dim", dim}, {"sizes", sizes}},
                                  [&] { return split(x, sizes, dim); });
    });
  std::vector<Tensor> r;
  int64_t off = 0;
  for (int64_t s : sizes) {
    r.push_back(x.narrow(dim, off, s));
    off += s;
  }
  return r;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  DLTRAIN_OP_SCOPE("split", x);
  DLTRAIN_CHECK(split_size > 0, "split: split_size must be positive, got ", split_size);
  dim = wrap_dim(dim, x.dim(), "split");
  const int64_t n = x.shape()[dim];
  std::vector<int64_t> sizes;
  for (int64_t off = 0; off < n; off += split_size) sizes.push_back(std::min(split_size, n - off));
  if (sizes.empty()) sizes.push_back(0);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"dim", dim}, {"sizes", sizes}},
                                  [&] { return split(x, sizes, dim); });
    });
  return split(x, sizes, dim);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  DLTRAIN_OP_SCOPE("chunk", x);
  DLTRAIN_CHECK(chunks > 0, "chunk: number of chunks must be positive, got ", chunks);
  dim = wrap_dim(dim, x.dim(), "chunk");
  const int64_t n = x.shape()[dim];
  const int64_t size = std::max<int64_t>((n + chunks - 1) / chunks, 1);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      std::vector<int64_t> sizes;
      for (int64_t off = 0; off < n; off += size) sizes.push_back(std::min(size, n - off));
      if (sizes.empty()) sizes.push_back(0);
      return detail::graph_record({x}, {{"dim", dim}, {"sizes", sizes}},
                                  [&] { return split(x, size, dim); });
    });
  return split(x, size, dim);
}

}  // namespace dltrain
