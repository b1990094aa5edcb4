// Matrix products: mm, bmm, matmul and linear, with their gradients.
//
// mm and bmm run backend::cpu::gemm (CPU) or backend::cuda::gemm (cuBLASLt) on
// the operands as they are laid out (row-major, column-major or transposed views
// map without a copy; any other stride pattern is made contiguous first) and
// always return a contiguous result. f16/bf16 operands are multiplied in float
// and rounded once. On the CPU bmm parallelises over the batch when it has at
// least as many matrices as threads, otherwise inside each product. matmul is
// composed of mm/bmm and view ops, so its gradients (including the sum over
// broadcast batch dims) come from those ops' nodes; so is linear on the CPU. On
// CUDA linear is one GEMM with the bias fused as an epilogue, and its own node
// computes the input and weight gradients as GEMMs and the bias gradient as a
// column sum.
#include "dltrain/ops/linalg.hpp"

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/reduction.hpp"
#include "src/backend/cpu/gemm.hpp"
#include "src/backend/cuda/blas.hpp"
#include "src/backend/cuda/dnn.hpp"
#include "src/core/trace.hpp"
#include "src/ops/common.hpp"

namespace dltrain {

using backend::cpu::Mat;

namespace {

bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }

void check_operands(const char* op, const Tensor& a, const Tensor& b) {
  detail::check_defined(op, a, "self");
  detail::check_defined(op, b, "other");
  detail::check_same_device(op, {&a, &b});
  DLTRAIN_CHECK(is_floating(a.dtype()) && a.dtype() == b.dtype(), op,
                ": expected two floating-point tensors of the same dtype but got ", a.dtype(),
                " and ", b.dtype(), "; convert them with .to(dtype)");
}

// The innermost two dims of `t` at element offset `off` as a Mat.
template <class T>
Mat<const T> mat_at(const Tensor& t, int64_t off) {
  const int64_t d = t.dim();
  return {static_cast<const T*>(t.data_ptr()) + off, t.size(d - 2), t.size(d - 1), t.stride(d - 2),
          t.stride(d - 1)};
}

// `t` itself when its matrices can be mapped by gemm, else a contiguous copy.
Tensor mappable(const Tensor& t) {
  const int64_t d = t.dim();
  Mat<const char> m{nullptr, t.size(d - 2), t.size(d - 1), t.stride(d - 2), t.stride(d - 1)};
  return backend::cpu::normalise(m) ? t : t.contiguous();
}

// c[i] = a[i] * b[i] for 3-d a [B,n,k], b [B,k,m] (any batch strides); no autograd.
Tensor batched_product(const Tensor& a0, const Tensor& b0) {
  if (a0.device().is_cuda()) {
    Tensor c = empty({a0.size(0), a0.size(1), b0.size(2)}, a0.options());
    backend::cuda::gemm(c, a0.detach(), b0.detach());
    return c;
  }
  const DType dt = a0.dtype();
  const DType ct = is_half(dt) ? DType::f32 : dt;
  Tensor a = mappable(a0.detach().to(ct)), b = mappable(b0.detach().to(ct));
  const int64_t B = a.size(0), n = a.size(1), m = b.size(2);
  Tensor c = empty({B, n, m}, TensorOptions(ct));
  dispatch_floating(ct, "bmm", [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      T* cp = static_cast<T*>(c.data_ptr());
      auto one = [&](int64_t i) {
        backend::cpu::gemm<T>(mat_at<T>(a, i * a.stride(0)), mat_at<T>(b, i * b.stride(0)),
                              Mat<T>{cp + i * n * m, n, m, m, 1}, T(0));
      };
      const int64_t threads = get_num_threads();
      if (B >= threads && threads > 1 && !in_parallel_region()) {
        parallel_for(0, B, 1, [&](int64_t s, int64_t e) {
          for (int64_t i = s; i < e; ++i) one(i);
        });
      } else {
        for (int64_t i = 0; i < B; ++i) one(i);
      }
    }
  });
  return ct == dt ? c : c.to(dt);
}

// [M, n] x [n, p] -> [M, p] on CUDA into a new tensor; no autograd.
Tensor cuda_mm(const Tensor& a, const Tensor& b, const Tensor& bias = Tensor()) {
  Tensor c = empty({a.size(0), b.size(1)}, a.options());
  backend::cuda::gemm(c.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0), bias);
  return c;
}

// linear on CUDA (x, weight, bias of one floating dtype): x's leading dims are folded into the
// rows of one GEMM with the bias as its epilogue.
Tensor linear_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const int64_t in = weight.size(1), out_features = weight.size(0);
  // Rows counted explicitly: reshape cannot infer a -1 next to a 0 (in or out_features of 0).
  const int64_t rows = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  const Tensor x2 = x.detach().reshape({rows, in});
  const Tensor w = weight.detach();
  Tensor y2 = cuda_mm(x2, w.t(), bias.defined() ? bias.detach() : Tensor());
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(out_features);
  Tensor y = y2.view(out_shape);
  const bool rx = x.requires_grad(), rw = weight.requires_grad(),
             rb = bias.defined() && bias.requires_grad();
  autograd::record(
      "linear", {x, weight, bias}, {y},
      [xs = rw ? x2 : Tensor(), ws = rx ? weight : Tensor(),
       xh = rw ? autograd::SavedInput(x, x) : autograd::SavedInput(), x_shape = x.shape(), rx, rw,
       rb, rows, in, out_features, dt = x.dtype()](const std::vector<Tensor>& g) {
        const Tensor gy = g[0].dtype() == dt ? g[0] : g[0].to(dt);
        const Tensor g2 = gy.reshape({rows, out_features});
        Tensor gx, gw, gb;
        if (autograd::grad_mode_enabled()) {  // create_graph: differentiable ops
          if (rx) gx = mm(g2, ws).reshape(x_shape);
          if (rw) gw = mm(g2.t(), xh.get().reshape({rows, in}));
          if (rb) gb = sum(g2, {0});
          return std::vector<Tensor>{gx, gw, gb};
        }
        if (rx) gx = cuda_mm(g2.detach(), ws.detach()).view(x_shape);
        if (rw) gw = cuda_mm(g2.t().detach(), xs);
        if (rb) {
          gb = empty({out_features}, g2.options());
          backend::cuda::channel_sum(gb, g2);
        }
        return std::vector<Tensor>{gx, gw, gb};
      },
      autograd::HigherOrder::Supported);
  return y;
}

}  // namespace

Tensor mm(const Tensor& a, const Tensor& b) {
  DLTRAIN_OP_SCOPE("mm", a, b);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({a, b}, {}, [&] { return mm(a, b); });
    });
  if (auto ac = amp::detail::autocast_args(amp::Op::mm, {&a, &b})) return mm((*ac)[0], (*ac)[1]);
  check_operands("mm", a, b);
  detail::check_dim("mm", a, 2, "self");
  detail::check_dim("mm", b, 2, "other");
  DLTRAIN_CHECK(a.size(1) == b.size(0), "mm: cannot multiply ", shape_str(a.shape()), " by ",
                shape_str(b.shape()), ": the inner dimensions ", a.size(1), " and ", b.size(0),
                " differ; transpose an operand or fix its shape");
  Tensor out = batched_product(a.detach().unsqueeze(0), b.detach().unsqueeze(0)).squeeze(0);
  const bool ra = a.requires_grad(), rb = b.requires_grad();
  autograd::record(
      "mm", {a, b}, {out},
      [as = rb ? a : Tensor(), bs = ra ? b : Tensor(), ra, rb](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{ra ? mm(g[0], bs.t()) : Tensor(),
                                   rb ? mm(as.t(), g[0]) : Tensor()};
      },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  DLTRAIN_OP_SCOPE("bmm", a, b);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({a, b}, {}, [&] { return bmm(a, b); });
    });
  if (auto ac = amp::detail::autocast_args(amp::Op::bmm, {&a, &b})) return bmm((*ac)[0], (*ac)[1]);
  check_operands("bmm", a, b);
  detail::check_dim("bmm", a, 3, "self");
  detail::check_dim("bmm", b, 3, "other");
  DLTRAIN_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1), "bmm: cannot multiply ",
                shape_str(a.shape()), " by ", shape_str(b.shape()),
                ": expected [b, n, k] x [b, k, m] with equal batch sizes and inner dimensions; use "
                "matmul for broadcasting batch dims");
  Tensor out = batched_product(a, b);
  const bool ra = a.requires_grad(), rb = b.requires_grad();
  autograd::record(
      "bmm", {a, b}, {out},
      [as = rb ? a : Tensor(), bs = ra ? b : Tensor(), ra, rb](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{ra ? bmm(g[0], bs.transpose(1, 2)) : Tensor(),
                                   rb ? bmm(as.transpose(1, 2), g[0]) : Tensor()};
      },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  DLTRAIN_OP_SCOPE("matmul", a, b);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({a, b}, {}, [&] { return matmul(a, b); });
    });
  if (auto ac = amp::detail::autocast_args(amp::Op::matmul, {&a, &b}))
    return matmul((*ac)[0], (*ac)[1]);
  check_operands("matmul", a, b);
  DLTRAIN_CHECK(a.dim() >= 1 && b.dim() >= 1,
                "matmul: both operands need at least 1 dimension but got ", shape_str(a.shape()),
                " and ", shape_str(b.shape()), "; use mul for scalars");
  const int64_t ka = a.size(-1), kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  DLTRAIN_CHECK(ka == kb, "matmul: cannot multiply ", shape_str(a.shape()), " by ",
                shape_str(b.shape()), ": the contracted dimensions ", ka, " (last of self) and ",
                kb, " (second to last of other) differ");
  if (a.dim() == 1 && b.dim() == 1) return mm(a.unsqueeze(0), b.unsqueeze(1)).reshape({});
  if (a.dim() <= 2 && b.dim() <= 2) {
    Tensor out = mm(a.dim() == 1 ? a.unsqueeze(0) : a, b.dim() == 1 ? b.unsqueeze(1) : b);
    if (a.dim() == 1) out = out.squeeze(0);
    if (b.dim() == 1) out = out.squeeze(-1);
    return out;
  }
  if (b.dim() <= 2) {  // fold a's batch dims into its rows: one large mm
    Shape out_shape(a.shape().begin(), a.shape().end() - 1);
    Tensor out = mm(a.reshape({-1, ka}), b.dim() == 1 ? b.unsqueeze(1) : b);
    if (b.dim() == 2) out_shape.push_back(b.size(1));
    return out.reshape(out_shape);
  }
  Tensor a1 = a.dim() == 1 ? a.unsqueeze(0) : a;
  const int64_t n = a1.size(-2), m = b.size(-1);
  const Shape ba(a1.shape().begin(), a1.shape().end() - 2),
      bb(b.shape().begin(), b.shape().end() - 2);
  const Shape batch = broadcast_shapes(ba, bb, "matmul");
  const int64_t B = shape_numel(batch);
  Shape ea = batch, eb = batch;
  ea.insert(ea.end(), {n, ka});
  eb.insert(eb.end(), {kb, m});
  Tensor out = bmm(a1.expand(ea).reshape({B, n, ka}), b.expand(eb).reshape({B, kb, m}));
  Shape out_shape = batch;
  if (a.dim() > 1) out_shape.push_back(n);
  out_shape.push_back(m);
  return out.reshape(out_shape);
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  DLTRAIN_OP_SCOPE("linear", x, weight, bias);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x, weight, bias}, {}, [&] { return linear(x, weight, bias); });
    });
  if (auto ac = amp::detail::autocast_args(amp::Op::linear, {&x, &weight, &bias}))
    return linear((*ac)[0], (*ac)[1], (*ac)[2]);
  detail::check_defined("linear", x, "input");
  detail::check_defined("linear", weight, "weight");
  detail::check_same_device("linear", {&x, &weight, &bias});
  DLTRAIN_CHECK(weight.dim() == 2,
                "linear: weight must be 2-d [out_features, in_features] but got ",
                shape_str(weight.shape()));
  DLTRAIN_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input ",
                shape_str(x.shape()), " has ", x.dim() >= 1 ? x.size(-1) : 0,
                " features in its last dim but weight ", shape_str(weight.shape()), " expects ",
                weight.size(1));
  DLTRAIN_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
                "linear: bias must be 1-d of size ", weight.size(0), " (out_features) but got ",
                bias.defined() ? shape_str(bias.shape()) : std::string());
  if (x.device().is_cuda() && is_floating(x.dtype()) && weight.dtype() == x.dtype() &&
      (!bias.defined() || bias.dtype() == x.dtype()))
    return linear_cuda(x, weight, bias);
  Tensor out = matmul(x, weight.t());
  return bias.defined() ? add(out, bias) : out;
}

}  // namespace dltrain
