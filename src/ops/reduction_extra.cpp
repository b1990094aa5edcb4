// Reductions and scans beyond sum/mean/max: cumsum and prod (one pass per line on either
// device, src/backend/cuda/scan.hpp on CUDA), and logsumexp, norm, any, all composed from
// existing ops (so they run on both devices with no kernel of their own).
//
// cumsum's gradient is the reverse cumsum of the output gradient; prod's is the output
// gradient times the product of the other elements of the line (two passes, exact with
// zeros, where g * prod / x is not). norm records its own node with torch.linalg.vector_norm's
// backward formulas (a composed sqrt would give NaN at zero). Lines are [outer, L, inner]
// views of a contiguous tensor; the CPU walks blocks of inner positions per outer index and
// accumulates floating values in double, integers in int64.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/reduction.hpp"
#include "src/backend/cpu/cast.hpp"
#include "src/backend/cuda/scan.hpp"
#include "src/core/trace.hpp"
#include "src/ops/common.hpp"

namespace dltrain {

using backend::cpu::cast;
using backend::cuda::LineOp;

namespace {

using detail::Lines;
using detail::lines_of;

void line_cpu(const Tensor& out, const Tensor& x, const Lines& s, LineOp op) {
  constexpr int64_t B = 64;
  const int64_t nbj = (s.inner + B - 1) / B;
  dispatch_numeric(x.dtype(), "cumsum/prod", [&]<class T>() {
    using A = std::conditional_t<std::is_floating_point_v<acc_t<T>>, double, int64_t>;
    const T* xp = x.data<T>();
    T* op_ = out.data<T>();
    parallel_for(0, s.outer * nbj, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, s.L * B)),
                 [&](int64_t b, int64_t e) {
                   std::array<A, B> acc;
                   for (int64_t u = b; u < e; ++u) {
                     const int64_t o = u / nbj, j0 = (u % nbj) * B, j1 = std::min(s.inner, j0 + B),
                                   w = j1 - j0;
                     const T* xl = xp + o * s.L * s.inner + j0;
                     T* ol = op_ + o * s.L * s.inner + j0;
                     auto at = [&](int64_t l) { return l * s.inner; };
                     switch (op) {
                       case LineOp::CumSum:
                         acc.fill(A(0));
                         for (int64_t l = 0; l < s.L; ++l)
                           for (int64_t j = 0; j < w; ++j) {
                             acc[j] += cast<A>(xl[at(l) + j]);
                             ol[at(l) + j] = cast<T>(acc[j]);
                           }
                         break;
                       case LineOp::CumSumReverse:
                         acc.fill(A(0));
                         for (int64_t l = s.L - 1; l >= 0; --l)
                           for (int64_t j = 0; j < w; ++j) {
                             acc[j] += cast<A>(xl[at(l) + j]);
                             ol[at(l) + j] = cast<T>(acc[j]);
                           }
                         break;
                       case LineOp::Prod:
                         acc.fill(A(1));
                         for (int64_t l = 0; l < s.L; ++l)
                           for (int64_t j = 0; j < w; ++j) acc[j] *= cast<A>(xl[at(l) + j]);
                         for (int64_t j = 0; j < w; ++j)
                           op_[o * s.inner + j0 + j] = cast<T>(acc[j]);
                         break;
                       case LineOp::ProdOthers:
                         acc.fill(A(1));
                         for (int64_t l = 0; l < s.L; ++l)
                           for (int64_t j = 0; j < w; ++j) {
                             ol[at(l) + j] = cast<T>(acc[j]);
                             acc[j] *= cast<A>(xl[at(l) + j]);
                           }
                         acc.fill(A(1));
                         for (int64_t l = s.L - 1; l >= 0; --l)
                           for (int64_t j = 0; j < w; ++j) {
                             ol[at(l) + j] = cast<T>(cast<A>(ol[at(l) + j]) * acc[j]);
                             acc[j] *= cast<A>(xl[at(l) + j]);
                           }
                         break;
                     }
                   }
                 });
  });
}

// op over the lines of x along dim (x is made contiguous); the output is contiguous with x's
// shape ([outer, inner] reshaped to `prod_shape` for Prod).
Tensor run_lines(const Tensor& x, int64_t dim, LineOp op, const Shape& out_shape) {
  const Tensor xc = x.detach().contiguous();
  const Lines s = lines_of(xc.shape(), dim);
  Tensor out = empty(out_shape, xc.options());
  if (xc.device().is_cuda())
    backend::cuda::line_scan(out, xc, s.outer, s.L, s.inner, op);
  else
    line_cpu(out, xc, s, op);
  return out;
}

// Integer and bool inputs of cumsum/prod compute in int64, as PyTorch.
Tensor widen(const Tensor& x) { return is_floating(x.dtype()) ? x : x.to(DType::i64); }

// Maximum over dims (empty: all), keeping them as size 1; no gradient.
Tensor amax_keep(const Tensor& x, const Shape& dims) {
  Tensor m = x.detach();
  if (m.dim() == 0) return m;
  Shape ds = dims;
  if (ds.empty())
    for (int64_t d = 0; d < m.dim(); ++d) ds.push_back(d);
  for (int64_t d : ds) m = max(m, wrap_dim(d, x.dim(), "amax"), true).first;
  return m;
}

// The shape after reducing `dims` (empty: all) without keepdim.
Shape reduced_shape(const Tensor& x, const Shape& dims, const char* op) {
  std::vector<bool> red(static_cast<size_t>(x.dim()), dims.empty());
  for (int64_t d : dims) red[wrap_dim(d, x.dim(), op)] = true;
  Shape s;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!red[d]) s.push_back(x.size(d));
  return s;
}

}  // namespace

Tensor cumsum(const Tensor& x, int64_t dim) {
  DLTRAIN_OP_SCOPE("cumsum", x);
  const char* op = "cumsum";
  detail::check_defined(op, x, "input");
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"dim", dim}}, [&] { return cumsum(x, dim); });
    });
  if (x.dim() == 0) return cumsum(x.reshape({1}), 0).reshape({});
  const int64_t d = wrap_dim(dim, x.dim(), op);
  const Tensor xw = widen(x.detach());
  Tensor out = run_lines(xw, d, LineOp::CumSum, x.shape());
  if (is_floating(x.dtype()))
    autograd::record(op, {x}, {out}, [d](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{run_lines(g[0], d, LineOp::CumSumReverse, g[0].shape())};
    });
  // The reversed cumsum is linear in g; its adjoint is the cumsum (create_graph).
  autograd::set_adjoint(
      out, [d](const std::vector<Tensor>& gg) { return std::vector<Tensor>{cumsum(gg[0], d)}; });
  return out;
}

Tensor prod(const Tensor& x, int64_t dim, bool keepdim) {
  DLTRAIN_OP_SCOPE("prod", x);
  const char* op = "prod";
  detail::check_defined(op, x, "input");
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"dim", dim}, {"keepdim", keepdim}},
                                  [&] { return prod(x, dim, keepdim); });
    });
  if (x.dim() == 0) return prod(x.reshape({1}), 0, false).reshape({});
  const int64_t d = wrap_dim(dim, x.dim(), op);
  const Tensor xw = widen(x.detach());
  Shape keep = x.shape();
  keep[d] = 1;
  Tensor out = run_lines(xw, d, LineOp::Prod, keep);
  if (!keepdim) out = out.squeeze(d);
  if (is_floating(x.dtype()))
    autograd::record(
        op, {x}, {out},
        [xd = x.detach(), xs = autograd::SavedInput(x, x), d, keep](const std::vector<Tensor>& g) {
          if (autograd::grad_mode_enabled()) {
            // create_graph: the product as a chain of multiplications of slices along d
            // (exact with zeros, unlike exp(sum(log))), differentiated to any order.
            return autograd::grad_by_recompute(
                [d, keep](const std::vector<Tensor>& in) {
                  Tensor p = in[0].narrow(d, 0, 1);
                  for (int64_t i = 1; i < in[0].size(d); ++i) p = mul(p, in[0].narrow(d, i, 1));
                  return std::vector<Tensor>{p};
                },
                {xs.get()}, {g[0].reshape(keep)});
          }
          const Tensor others = run_lines(xd, d, LineOp::ProdOthers, xd.shape());
          return std::vector<Tensor>{mul(g[0].reshape(keep), others)};
        },
        autograd::HigherOrder::Supported);
  return out;
}

Tensor prod(const Tensor& x) {
  DLTRAIN_OP_SCOPE("prod", x);
  detail::check_defined("prod", x, "input");
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({x}, {}, [&] { return prod(x); }); });
  return prod(x.reshape({-1}), 0, false);
}

Tensor logsumexp(const Tensor& x, const Shape& dims, bool keepdim) {
  DLTRAIN_OP_SCOPE("logsumexp", x);
  const char* op = "logsumexp";
  detail::check_defined(op, x, "input");
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"dims", dims}, {"keepdim", keepdim}},
                                  [&] { return logsumexp(x, dims, keepdim); });
    });
  DLTRAIN_CHECK(is_floating(x.dtype()), op, ": input must be floating-point but has dtype ",
                x.dtype(), "; convert it with .to(DType::f32)");
  Tensor m = amax_keep(x, dims);
  // An infinite maximum would give inf - inf = NaN: shift by 0 there (PyTorch's rule).
  m = masked_fill(m, eq(abs(m), std::numeric_limits<double>::infinity()), 0.0);
  const Tensor r = add(log(sum(exp(sub(x, m)), dims, true)), m);
  return keepdim ? r : r.reshape(reduced_shape(x, dims, op));
}

Tensor norm(const Tensor& x, double p, const Shape& dims, bool keepdim) {
  DLTRAIN_OP_SCOPE("norm", x);
  const char* op = "norm";
  detail::check_defined(op, x, "input");
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"p", p}, {"dims", dims}, {"keepdim", keepdim}},
                                  [&] { return norm(x, p, dims, keepdim); });
    });
  DLTRAIN_CHECK(is_floating(x.dtype()), op, ": input must be floating-point but has dtype ",
                x.dtype(), "; convert it with .to(DType::f32)");
  const bool inf = std::isinf(p) && p > 0;
  DLTRAIN_CHECK(inf || p == 0 || p >= 1, op, ": p = ", p,
                " is not supported; use p = 0, p >= 1 or INFINITY");
  const DType dt = x.dtype();
  const DType acc = dt == DType::f16 || dt == DType::bf16 ? DType::f32 : dt;
  const Shape out_shape = keepdim ? Shape() : reduced_shape(x, dims, op);
  Tensor r;  // keepdim shape, in acc
  {
    NoGradGuard ng;
    const Tensor xa = x.detach().to(acc);
    if (p == 0)
      r = sum(ne(xa, 0.0), dims, true).to(acc);
    else if (inf)
      r = amax_keep(abs(xa), dims);
    else if (p == 1)
      r = sum(abs(xa), dims, true);
    else if (p == 2)
      r = sqrt(sum(mul(xa, xa), dims, true));
    else
      r = pow(sum(pow(abs(xa), p), dims, true), 1.0 / p);
  }
  const Shape keep = r.shape();
  Tensor out = r.to(dt);
  if (!keepdim) out = out.reshape(out_shape);
  if (p != 0)
    autograd::record(
        op, {x}, {out},
        [xd = x, ro = autograd::SavedOutput(out), p, inf, dims,
         keep](const std::vector<Tensor>& g) {
          const Tensor r = ro.get().reshape(keep);
          const Tensor gk = g[0].reshape(keep);
          const Tensor zero = zeros({}, gk.options());
          Tensor gx;
          if (inf) {
            const Tensor a = abs(xd);
            const Tensor mask = logical_or(eq(a, r), ne(a, a)).to(gk.dtype());
            gx = mul(sign(xd), mul(div(gk, sum(mask, dims, true)), mask));
          } else if (p == 1) {
            gx = mul(sign(xd), gk);
          } else {
            const Tensor scale = where(eq(r, 0.0), zero, div(gk, p == 2 ? r : pow(r, p - 1)));
            const Tensor s = p == 2 ? xd : mul(sign(xd), pow(abs(xd), p - 1));
            gx = mul(s, scale);
          }
          return std::vector<Tensor>{gx};
        },
        autograd::HigherOrder::Supported);
  return out;
}

Tensor any(const Tensor& x, const Shape& dims, bool keepdim) {
  DLTRAIN_OP_SCOPE("any", x);
  detail::check_defined("any", x, "input");
  return gt(sum(ne(x.detach(), 0.0), dims, keepdim), 0.0);
}

Tensor all(const Tensor& x, const Shape& dims, bool keepdim) {
  DLTRAIN_OP_SCOPE("all", x);
  detail::check_defined("all", x, "input");
  return eq(sum(eq(x.detach(), 0.0), dims, keepdim), 0.0);
}

}  // namespace dltrain
