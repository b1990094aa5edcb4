// Gathering and scattering by index, with their gradients.
//
// Index tensors are read once into int64 vectors (int32 accepted) and every
// value is bounds-checked before any kernel runs, so a bad index raises
// dltrain::Error naming the value, its position and the valid range. Two
// kernels do the row work: take_rows copies slices [outer, idx[k], inner] and
// index_add_rows accumulates them back; scatter_into does the general
// (torch.scatter_add) case. Accumulating kernels are parallel only over
// disjoint output regions and loop over repeated indices in order, so the
// results are deterministic and race-free. Outputs are contiguous.
//
// CUDA tensors run the same structure on the device (src/backend/cuda/indexing.hpp) with
// index tensors kept there as contiguous int64: reading them back to check ranges would
// sync the host, so out-of-range indices are not raised on CUDA (a gather reads NaN or 0, a
// scatter drops the element), and accumulations use atomics (repeated indices add in an
// unspecified order). one_hot without num_classes needs the maximum on the host and syncs.
#include "dltrain/ops/indexing.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "src/backend/cpu/cast.hpp"
#include "src/backend/cuda/indexing.hpp"
#include "src/core/trace.hpp"
#include "src/ops/common.hpp"
#include "src/ops/index_util.hpp"

namespace dltrain {

using backend::cpu::cast;
using detail::check_index;
using detail::check_index_shape;
using detail::check_range;
using detail::device_index;
using detail::read_index;

namespace {

// The upstream gradient in the input's dtype.
Tensor grad_as(const Tensor& g, DType dt) { return g.dtype() == dt ? g : g.to(dt); }

using detail::Lines;
using detail::lines_of;

// out[o, k, :] = x[o, idx[k], :] for contiguous x [outer, L, inner]; out contiguous [outer, K,
// inner].
void take_rows(const Tensor& xc, const Lines& s, const std::vector<int64_t>& idx,
               const Tensor& out) {
  const int64_t K = static_cast<int64_t>(idx.size());
  const size_t es = xc.element_size();
  const size_t row = static_cast<size_t>(s.inner) * es;
  const char* src = static_cast<const char*>(xc.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  parallel_for(0, s.outer * K, std::max<int64_t>(1, 16384 / std::max<int64_t>(s.inner, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t u = b; u < e; ++u) {
                   const int64_t o = u / K, k = u % K;
                   std::memcpy(dst + static_cast<size_t>(u) * row,
                               src + static_cast<size_t>(o * s.L + idx[k]) * row, row);
                 }
               });
}

// dst[o, idx[k], :] += src[o, k, :] (both contiguous), skipping idx[k] == skip.
void index_add_rows(const Tensor& dst, const Lines& s, const std::vector<int64_t>& idx,
                    const Tensor& src, int64_t skip = -1, const char* op = "index_add") {
  const int64_t K = static_cast<int64_t>(idx.size());
  const int64_t B = 256;
  const int64_t nbj = (s.inner + B - 1) / B;
  dispatch_numeric(dst.dtype(), op, [&]<class T>() {
    using A = acc_t<T>;
    T* d = dst.data<T>();
    const T* sp = src.data<T>();
    const int64_t cost = std::max<int64_t>(1, K * std::min(s.inner, B));
    parallel_for(0, s.outer * nbj, std::max<int64_t>(1, 16384 / cost), [&](int64_t b, int64_t e) {
      for (int64_t u = b; u < e; ++u) {
        const int64_t o = u / nbj, j0 = (u % nbj) * B, j1 = std::min(s.inner, j0 + B);
        for (int64_t k = 0; k < K; ++k) {
          if (idx[k] == skip) continue;
          T* drow = d + (o * s.L + idx[k]) * s.inner;
          const T* srow = sp + (o * K + k) * s.inner;
          for (int64_t j = j0; j < j1; ++j) drow[j] = cast<T>(cast<A>(drow[j]) + cast<A>(srow[j]));
        }
      }
    });
  });
}

void unravel(int64_t pos, const Shape& shape, std::vector<int64_t>& c) {
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    c[d] = shape[d] == 0 ? 0 : pos % shape[d];
    pos = shape[d] == 0 ? 0 : pos / shape[d];
  }
}

// out[i] = x[i with coordinate dim replaced by idx[i]] over the positions of `ishape`.
Tensor gather_raw(const Tensor& x, int64_t dim, const std::vector<int64_t>& idx,
                  const Shape& ishape) {
  Tensor out = empty(ishape, x.options());
  const int64_t n = shape_numel(ishape), nd = static_cast<int64_t>(ishape.size());
  const Shape xs = x.strides();
  dispatch_all(x.dtype(), [&]<class T>() {
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = out.data<T>();
    parallel_for(0, n, 16384, [&](int64_t b, int64_t e) {
      std::vector<int64_t> c(static_cast<size_t>(nd), 0);
      unravel(b, ishape, c);
      for (int64_t i = b; i < e; ++i) {
        int64_t off = 0;
        for (int64_t d = 0; d < nd; ++d) off += (d == dim ? idx[i] : c[d]) * xs[d];
        op[i] = xp[off];
        for (int64_t d = nd - 1; d >= 0; --d) {
          if (++c[d] < ishape[d]) break;
          c[d] = 0;
        }
      }
    });
  });
  return out;
}

// dst (contiguous) [.., idx[c], ..] += src[c] for every position c of `ishape` (src any strides).
// Work is split over positions that differ outside `dim`, which never collide in dst.
void scatter_into(const Tensor& dst, int64_t dim, const std::vector<int64_t>& idx,
                  const Shape& ishape, const Tensor& src, const char* op) {
  const int64_t nd = static_cast<int64_t>(ishape.size());
  Shape outer_shape = ishape;
  outer_shape[dim] = 1;
  const int64_t units = shape_numel(outer_shape), K = ishape[dim];
  if (units == 0 || K == 0) return;
  const Shape ds = dst.strides(), ss = src.strides(), is = contiguous_strides(ishape);
  dispatch_numeric(dst.dtype(), op, [&]<class T>() {
    using A = acc_t<T>;
    T* dp = dst.data<T>();
    const T* sp = static_cast<const T*>(src.data_ptr());
    parallel_for(0, units, std::max<int64_t>(1, 16384 / K), [&](int64_t b, int64_t e) {
      std::vector<int64_t> c(static_cast<size_t>(nd), 0);
      for (int64_t u = b; u < e; ++u) {
        unravel(u, outer_shape, c);
        int64_t so = 0, dso = 0, io = 0;
        for (int64_t d = 0; d < nd; ++d) {
          if (d == dim) continue;
          so += c[d] * ss[d];
          dso += c[d] * ds[d];
          io += c[d] * is[d];
        }
        for (int64_t k = 0; k < K; ++k) {
          T& t = dp[dso + idx[io + k * is[dim]] * ds[dim]];
          t = cast<T>(cast<A>(t) + cast<A>(sp[so + k * ss[dim]]));
        }
      }
    });
  });
}

// create_graph backward of the index ops: their gradients written with the differentiable
// counterpart op (index_add <-> index_select, scatter_add <-> gather).
Tensor embedding_grad_ops(const Tensor& g, const Tensor& indices, const Lines& s, int64_t pad,
                          const TensorOptions& opt) {
  const Tensor flat = indices.reshape({-1});
  Tensor gr = g.to(opt.dtype).reshape({flat.numel(), s.inner});
  if (pad >= 0) gr = mul(gr, ne(flat, static_cast<double>(pad)).to(opt.dtype).unsqueeze(1));
  return index_add(zeros({s.L, s.inner}, opt), 0, flat, gr);
}

// out = the rows `index` of x seen as Lines s (out[o, j, i] = x[o, index[j], i]), on x's
// device (the index moved to it, or read once to the host and range-checked), with the
// backward recorded: the gradient's rows added back at their indices, skipping row `pad`
// (-1: none), or `higher(g)` under create_graph. embedding and index_select.
Tensor take_rows_recorded(const char* op, const Tensor& x, const Tensor& index,
                          const char* index_name, const Lines& s, const Shape& out_shape,
                          int64_t pad, const char* range_what,
                          std::function<Tensor(const Tensor&)> higher) {
  Tensor out = empty(out_shape, x.options());
  Tensor dev_idx;
  std::vector<int64_t> host_idx;
  if (x.device().is_cuda()) {
    dev_idx = device_index(op, index, index_name);
    backend::cuda::take_rows(out, x.detach().contiguous(), dev_idx, s.outer, s.L, s.inner);
  } else {
    host_idx = read_index(op, index, index_name);
    check_range(op, host_idx, s.L, range_what);
    take_rows(x.detach().contiguous(), s, host_idx, out);
  }
  autograd::record(
      op, {x}, {out},
      [dev_idx, host_idx, s, pad, higher = std::move(higher), shape = x.shape(), opt = x.options(),
       name = std::string(op) + "_backward"](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled())  // create_graph: the differentiable formula
          return std::vector<Tensor>{higher(g[0])};
        Tensor dx = zeros(shape, opt);
        const Tensor gc = grad_as(g[0], opt.dtype).contiguous();
        if (dev_idx.defined())
          backend::cuda::index_add_rows(dx, gc, dev_idx, s.outer, s.L, s.inner, pad);
        else
          index_add_rows(dx, s, host_idx, gc, pad, name.c_str());
        return std::vector<Tensor>{dx};
      },
      autograd::HigherOrder::Supported);
  return out;
}

std::vector<Tensor> scatter_add_higher(const Tensor& g, const Tensor& index, int64_t d,
                                       const Shape& sshape, DType sdt, bool rx, bool rs) {
  DLTRAIN_CHECK(!rs || index.shape() == sshape,
                "scatter_add: double backward needs index and src of one shape (index ",
                shape_str(index.shape()), ", src ", shape_str(sshape), ")");
  return {rx ? g : Tensor(), rs ? gather(g, d, index).to(sdt) : Tensor()};
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx) {
  DLTRAIN_OP_SCOPE("embedding", weight, indices);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({weight, indices}, {},
                                  [&] { return embedding(weight, indices, padding_idx); });
    });
  const char* op = "embedding";
  detail::check_defined(op, weight, "weight");
  detail::check_same_device(op, {&weight, &indices});
  DLTRAIN_CHECK(weight.dim() == 2, op,
                ": weight must be [num_embeddings, embedding_dim] but has shape ",
                shape_str(weight.shape()));
  const int64_t num = weight.size(0), D = weight.size(1);
  check_index(op, indices, "indices");
  int64_t pad = -1;
  if (padding_idx) {
    pad = *padding_idx < 0 ? *padding_idx + num : *padding_idx;
    DLTRAIN_CHECK(pad >= 0 && pad < num, op, ": padding_idx ", *padding_idx,
                  " is out of range for ", num, " embeddings; valid range is [", -num, ", ", num,
                  ")");
  }
  const Lines s{1, num, D};
  Shape out_shape = indices.shape();
  out_shape.push_back(D);
  return take_rows_recorded(
      op, weight, indices, "indices", s, out_shape, pad, "weight rows",
      [it = indices.detach(), s, pad, opt = weight.options()](const Tensor& g) {
        return embedding_grad_ops(g, it, s, pad, opt);
      });
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  DLTRAIN_OP_SCOPE("index_select", x, index);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x, index}, {{"dim", dim}},
                                  [&] { return index_select(x, dim, index); });
    });
  const char* op = "index_select";
  detail::check_defined(op, x, "input");
  detail::check_same_device(op, {&x, &index});
  DLTRAIN_CHECK(x.dim() >= 1, op, ": input must have at least one dimension but is 0-d");
  const int64_t d = wrap_dim(dim, x.dim(), op);
  check_index(op, index, "index");
  DLTRAIN_CHECK(index.dim() <= 1, op, ": index must be 1-d but has shape ",
                shape_str(index.shape()), "; flatten it with .reshape({-1})");
  Shape out_shape = x.shape();
  out_shape[d] = index.numel();
  return take_rows_recorded(
      op, x, index, "index", lines_of(x.shape(), d), out_shape, -1, "the selected dimension",
      [it = index.detach(), d, shape = x.shape(), opt = x.options()](const Tensor& g) {
        return index_add(zeros(shape, opt), d, it, g.to(opt.dtype));
      });
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  DLTRAIN_OP_SCOPE("gather", x, index);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x, index}, {{"dim", dim}},
                                  [&] { return gather(x, dim, index); });
    });
  const char* op = "gather";
  detail::check_defined(op, x, "input");
  detail::check_same_device(op, {&x, &index});
  DLTRAIN_CHECK(x.dim() >= 1, op, ": input must have at least one dimension but is 0-d");
  const int64_t d = wrap_dim(dim, x.dim(), op);
  check_index(op, index, "index");
  check_index_shape(op, x, d, index);
  if (x.device().is_cuda()) {
    Tensor idx = device_index(op, index, "index");
    Tensor out = empty(index.shape(), x.options());
    backend::cuda::gather_dim(out, x.detach(), d, idx);
    autograd::record(
        op, {x}, {out},
        [it = index.detach(), idx, d, shape = x.shape(),
         opt = x.options()](const std::vector<Tensor>& g) {
          if (autograd::grad_mode_enabled())  // create_graph: scatter_add, differentiable in g
            return std::vector<Tensor>{scatter_add(zeros(shape, opt), d, it, g[0].to(opt.dtype))};

          Tensor dx = zeros(shape, opt);
          backend::cuda::scatter_add_dim(dx, d, idx, grad_as(g[0], opt.dtype));
          return std::vector<Tensor>{dx};
        },
        autograd::HigherOrder::Supported);
    return out;
  }
  const std::vector<int64_t> idx = read_index(op, index, "index");
  check_range(op, idx, x.size(d), "the gathered dimension");
  Tensor out = gather_raw(x.detach(), d, idx, index.shape());
  autograd::record(
      op, {x}, {out},
      [it = index.detach(), idx, d, ishape = index.shape(), shape = x.shape(),
       opt = x.options()](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled())  // create_graph: scatter_add, differentiable in g
          return std::vector<Tensor>{scatter_add(zeros(shape, opt), d, it, g[0].to(opt.dtype))};

        Tensor dx = zeros(shape, opt);
        Tensor gc = g[0].dtype() == opt.dtype ? g[0] : g[0].to(opt.dtype);
        scatter_into(dx, d, idx, ishape, gc, "gather_backward");
        return std::vector<Tensor>{dx};
      },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  DLTRAIN_OP_SCOPE("scatter_add", x, index, src);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x, index, src}, {{"dim", dim}},
                                  [&] { return scatter_add(x, dim, index, src); });
    });
  if (auto ac = amp::detail::autocast_args(amp::Op::scatter_add, {&x, &index, &src}))
    return scatter_add((*ac)[0], dim, (*ac)[1], (*ac)[2]);
  const char* op = "scatter_add";
  detail::check_defined(op, x, "input");
  detail::check_defined(op, src, "src");
  detail::check_same_device(op, {&x, &index, &src});
  DLTRAIN_CHECK(x.dim() >= 1, op, ": input must have at least one dimension but is 0-d");
  const int64_t d = wrap_dim(dim, x.dim(), op);
  check_index(op, index, "index");
  DLTRAIN_CHECK(src.dtype() == x.dtype(), op, ": src has dtype ", src.dtype(),
                " but the input has ", x.dtype(), "; convert src with .to(", x.dtype(), ")");
  check_index_shape(op, x, d, index);
  DLTRAIN_CHECK(src.dim() == index.dim(), op, ": src of shape ", shape_str(src.shape()),
                " must have as many dimensions as index ", shape_str(index.shape()));
  for (int64_t k = 0; k < index.dim(); ++k)
    DLTRAIN_CHECK(index.size(k) <= src.size(k), op, ": index of shape ", shape_str(index.shape()),
                  " is larger than src of shape ", shape_str(src.shape()), " in dimension ", k);
  if (x.device().is_cuda()) {
    Tensor idx = device_index(op, index, "index");
    Tensor out = empty(x.shape(), x.options());
    {
      NoGradGuard ng;
      out.copy_(x.detach());
    }
    backend::cuda::scatter_add_dim(out, d, idx, src.detach());
    autograd::record(
        op, {x, src}, {out},
        [it = index.detach(), idx, d, ishape = index.shape(), sshape = src.shape(),
         sopt = src.options(), rx = x.requires_grad(),
         rs = src.requires_grad()](const std::vector<Tensor>& g) {
          if (autograd::grad_mode_enabled())
            return scatter_add_higher(g[0], it, d, sshape, sopt.dtype, rx, rs);

          Tensor gx, gs;
          if (rx) gx = g[0];
          if (rs) {
            gs = empty(ishape, sopt);
            backend::cuda::gather_dim(gs, grad_as(g[0], sopt.dtype), d, idx);
            gs = detail::zero_pad_to(gs, sshape);
          }
          return std::vector<Tensor>{gx, gs};
        },
        autograd::HigherOrder::Supported);
    return out;
  }
  const std::vector<int64_t> idx = read_index(op, index, "index");
  check_range(op, idx, x.size(d), "the scattered dimension");
  Tensor out = empty(x.shape(), x.options());
  {
    NoGradGuard ng;
    out.copy_(x.detach());
  }
  scatter_into(out, d, idx, index.shape(), src.detach(), op);
  autograd::record(
      op, {x, src}, {out},
      [it = index.detach(), idx, d, ishape = index.shape(), sshape = src.shape(),
       sopt = src.options(), rx = x.requires_grad(),
       rs = src.requires_grad()](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled())
          return scatter_add_higher(g[0], it, d, sshape, sopt.dtype, rx, rs);

        Tensor gx, gs;
        if (rx) gx = g[0];
        if (rs) {
          gs = gather_raw(g[0].dtype() == sopt.dtype ? g[0] : g[0].to(sopt.dtype), d, idx, ishape);
          gs = detail::zero_pad_to(gs, sshape);
        }
        return std::vector<Tensor>{gx, gs};
      },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor segment_sum(const Tensor& src, const Tensor& segment_ids, int64_t num_segments) {
  DLTRAIN_OP_SCOPE("segment_sum", src, segment_ids);
  const char* op = "segment_sum";
  detail::check_defined(op, src, "src");
  detail::check_same_device(op, {&src, &segment_ids});
  DLTRAIN_CHECK(src.dim() >= 1, op, ": src must be [E, ...] but is 0-d");
  check_index(op, segment_ids, "segment_ids");
  DLTRAIN_CHECK(segment_ids.dim() == 1 && segment_ids.size(0) == src.size(0), op,
                ": segment_ids must be [", src.size(0), "] (one id per row of src of shape ",
                shape_str(src.shape()), ") but has shape ", shape_str(segment_ids.shape()));
  DLTRAIN_CHECK(num_segments >= 0, op, ": num_segments must be >= 0 but is ", num_segments);
  Shape out_shape = src.shape();
  out_shape[0] = num_segments;
  const Lines s{1, num_segments, shape_numel(Shape(src.shape().begin() + 1, src.shape().end()))};
  if (src.device().is_cuda()) {
    Tensor ids = device_index(op, segment_ids, "segment_ids");
    Tensor out = zeros(out_shape, src.options());
    backend::cuda::index_add_rows(out, src.detach().contiguous(), ids, s.outer, s.L, s.inner, -1);
    autograd::record(
        op, {src}, {out},
        [it = segment_ids.detach(), ids, s, shape = src.shape(),
         opt = src.options()](const std::vector<Tensor>& g) {
          if (autograd::grad_mode_enabled())  // create_graph: index_select, differentiable in g
            return std::vector<Tensor>{index_select(g[0], 0, it).to(opt.dtype)};

          Tensor ds = empty(shape, opt);
          backend::cuda::take_rows(ds, grad_as(g[0], opt.dtype).contiguous(), ids, s.outer, s.L,
                                   s.inner);
          return std::vector<Tensor>{ds};
        },
        autograd::HigherOrder::Supported);
    return out;
  }
  const std::vector<int64_t> ids = read_index(op, segment_ids, "segment_ids");
  check_range(op, ids, num_segments, "num_segments");
  Tensor out = zeros(out_shape, src.options());
  index_add_rows(out, s, ids, src.detach().contiguous(), -1, op);
  autograd::record(
      op, {src}, {out},
      [it = segment_ids.detach(), ids, s, shape = src.shape(),
       opt = src.options()](const std::vector<Tensor>& g) {
        if (autograd::grad_mode_enabled())  // create_graph: index_select, differentiable in g
          return std::vector<Tensor>{index_select(g[0], 0, it).to(opt.dtype)};

        Tensor gc = (g[0].dtype() == opt.dtype ? g[0] : g[0].to(opt.dtype)).contiguous();
        Tensor ds = empty(shape, opt);
        take_rows(gc, s, ids, ds);
        return std::vector<Tensor>{ds};
      },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor segment_mean(const Tensor& src, const Tensor& segment_ids, int64_t num_segments) {
  DLTRAIN_OP_SCOPE("segment_mean", src, segment_ids);
  const char* op = "segment_mean";
  detail::check_defined(op, src, "src");
  DLTRAIN_CHECK(is_floating(src.dtype()), op, ": src must be floating-point but has dtype ",
                src.dtype(), "; convert it with .to(DType::f32)");
  Tensor total = segment_sum(src, segment_ids, num_segments);
  Shape cshape(static_cast<size_t>(src.dim()), 1);
  cshape[0] = num_segments;
  if (src.device().is_cuda()) {
    Tensor count = empty(cshape, src.options());
    backend::cuda::segment_counts(count, device_index(op, segment_ids, "segment_ids"),
                                  num_segments);
    return div(total, count);
  }
  const std::vector<int64_t> ids = segment_ids.detach().to_vector<int64_t>();
  std::vector<double> count(static_cast<size_t>(num_segments), 0.0);
  for (int64_t i : ids) count[i] += 1.0;
  for (double& c : count) c = std::max(c, 1.0);
  return div(total, from_vector<double>(count, cshape).to(src.dtype()));
}

Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                 double alpha) {
  DLTRAIN_OP_SCOPE("index_add", x, index, src);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x, index, src}, {{"dim", dim}, {"alpha", alpha}},
                                  [&] { return index_add(x, dim, index, src, alpha); });
    });
  const char* op = "index_add";
  detail::check_defined(op, x, "input");
  detail::check_defined(op, src, "src");
  detail::check_same_device(op, {&x, &index, &src});
  DLTRAIN_CHECK(x.dim() >= 1, op, ": input must have at least one dimension but is 0-d");
  const int64_t d = wrap_dim(dim, x.dim(), op);
  check_index(op, index, "index");
  DLTRAIN_CHECK(index.dim() <= 1, op, ": index must be 1-d but has shape ",
                shape_str(index.shape()), "; flatten it with .reshape({-1})");
  DLTRAIN_CHECK(x.dtype() != DType::b8, op,
                ": not defined for bool tensors; convert with .to(DType::i64) or similar");
  DLTRAIN_CHECK(src.dtype() == x.dtype(), op, ": src has dtype ", src.dtype(),
                " but the input has ", x.dtype(), "; convert src with .to(", x.dtype(), ")");
  DLTRAIN_CHECK(is_floating(x.dtype()) || alpha == std::floor(alpha), op, ": alpha ", alpha,
                " must be a whole number for the integer dtype ", x.dtype());
  Shape want = x.shape();
  want[d] = index.numel();
  DLTRAIN_CHECK(src.shape() == want, op, ": src must have shape ", shape_str(want),
                " (the input's shape with index.numel() = ", index.numel(), " along dim ", d,
                ") but has shape ", shape_str(src.shape()));
  const DType dt = x.dtype();
  // 16-bit floats accumulate in f32 and round once at the end.
  const DType acc = dt == DType::f16 || dt == DType::bf16 ? DType::f32 : dt;
  const Lines s = lines_of(x.shape(), d);
  Tensor out = empty(x.shape(), TensorOptions(acc).with_device(x.device()));
  Tensor sc, idx;
  {
    NoGradGuard ng;
    out.copy_(x.detach());
    sc = src.detach().to(acc);
    if (alpha != 1.0) sc = mul(sc, alpha);
    sc = sc.contiguous();
  }
  if (x.device().is_cuda()) {
    idx = device_index(op, index, "index");
    backend::cuda::index_add_rows(out, sc, idx, s.outer, s.L, s.inner, -1);
  } else {
    const std::vector<int64_t> iv = read_index(op, index, "index");
    check_range(op, iv, x.size(d), "the indexed dimension");
    index_add_rows(out, s, iv, sc, -1, op);
    idx = index.detach().to(DType::i64);
  }
  if (acc != dt) out = out.to(dt);
  autograd::record(
      op, {x, src}, {out},
      [idx, d, alpha, rx = x.requires_grad(),
       rs = src.requires_grad()](const std::vector<Tensor>& g) {
        Tensor gx, gs;
        if (rx) gx = g[0];
        if (rs) {
          gs = index_select(g[0], d, idx);
          if (alpha != 1.0) gs = mul(gs, alpha);
        }
        return std::vector<Tensor>{gx, gs};
      },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor one_hot(const Tensor& indices, int64_t num_classes) {
  DLTRAIN_OP_SCOPE("one_hot", indices);
  const char* op = "one_hot";
  if (indices.defined() && indices.device().is_cuda() && num_classes >= 0) {
    check_index(op, indices, "indices");
    Shape out_shape = indices.shape();
    out_shape.push_back(num_classes);
    Tensor out = empty(out_shape, TensorOptions(DType::i64).with_device(indices.device()));
    backend::cuda::one_hot(out, device_index(op, indices, "indices"), num_classes);
    return out;
  }
  // Without num_classes the maximum decides the shape: CUDA indices are read back (a sync).
  const std::vector<int64_t> idx = read_index(op, indices, "indices");
  int64_t C = num_classes;
  if (C < 0) {
    DLTRAIN_CHECK(!idx.empty(), op,
                  ": cannot infer the number of classes from an empty tensor; pass num_classes");
    C = *std::max_element(idx.begin(), idx.end()) + 1;
  }
  check_range(op, idx, C, "num_classes");
  Shape out_shape = indices.shape();
  out_shape.push_back(C);
  if (indices.device().is_cuda()) {
    Tensor out = empty(out_shape, TensorOptions(DType::i64).with_device(indices.device()));
    backend::cuda::one_hot(out, device_index(op, indices, "indices"), C);
    return out;
  }
  Tensor out = zeros(out_shape, TensorOptions(DType::i64));
  int64_t* p = out.data<int64_t>();
  for (size_t i = 0; i < idx.size(); ++i) p[static_cast<int64_t>(i) * C + idx[i]] = 1;
  return out;
}

}  // namespace dltrain
