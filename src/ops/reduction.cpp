// Reductions. On the CPU, sums accumulate in double (floating) or int64 (integers) so that
// large f32 reductions stay accurate; CUDA tensors reduce with backend::cuda
// (src/backend/cuda/reduce.hpp: float for f16/bf16/f32, double for f64, int64 for
// integers, a tree order). max/min return the first extreme's index on both.
// Gradients: sum/mean broadcast the incoming gradient back; max/min over a dim
// route it to the chosen index; max/min of everything split it between ties;
// var/std are composed from differentiable ops. Outputs are contiguous.
#include "dltrain/ops/reduction.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "src/backend/cpu/cast.hpp"
#include "src/backend/cuda/reduce.hpp"
#include "src/core/trace.hpp"
#include "src/ops/common.hpp"

namespace dltrain {

using backend::cpu::cast;

namespace {

struct ReducePlan {
  std::vector<bool> reduced;  // per input dim
  Shape out_keep;             // keepdim shape
  Shape out_shape;            // final shape
  Shape order;                // kept dims then reduced dims
  int64_t M = 1, R = 1;       // outputs, elements per output
};

ReducePlan plan(const Tensor& x, const Shape& dims, bool keepdim, const char* op) {
  ReducePlan p;
  const int64_t nd = x.dim();
  p.reduced.assign(static_cast<size_t>(nd), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, nd, op);
    if (nd == 0) continue;
    DLTRAIN_CHECK(!p.reduced[w], op, ": dimension ", w, " appears more than once in ",
                  shape_str(dims));
    p.reduced[w] = true;
  }
  for (int64_t d = 0; d < nd; ++d) {
    if (p.reduced[d]) {
      p.out_keep.push_back(1);
      p.R *= x.shape()[d];
    } else {
      p.out_keep.push_back(x.shape()[d]);
      p.out_shape.push_back(x.shape()[d]);
      p.order.push_back(d);
      p.M *= x.shape()[d];
    }
  }
  for (int64_t d = 0; d < nd; ++d)
    if (p.reduced[d]) p.order.push_back(d);
  if (keepdim) p.out_shape = p.out_keep;
  return p;
}

// Sum kernel: returns a contiguous tensor of shape p.out_shape in dtype `out_dt`.
Tensor sum_kernel(const Tensor& x, const ReducePlan& p, DType out_dt) {
  Tensor out = empty(p.out_shape, TensorOptions(out_dt));
  const bool prefix = [&] {  // reduced dims all before kept dims, contiguous input: column sums
    if (!x.is_contiguous()) return false;
    bool seen_kept = false;
    for (bool r : p.reduced) {
      if (!r)
        seen_kept = true;
      else if (seen_kept)
        return false;
    }
    return true;
  }();
  dispatch_numeric(x.dtype(), "sum", [&]<class T>() {
    using Acc = std::conditional_t<std::is_floating_point_v<acc_t<T>>, double, int64_t>;
    dispatch_numeric(out_dt, "sum", [&]<class O>() {
      O* o = out.data<O>();
      const int64_t M = p.M, R = p.R;
      if (prefix && M > 1) {
        const T* src = x.data<T>();
        parallel_for(0, M, 256, [&](int64_t b, int64_t e) {
          std::vector<Acc> acc(static_cast<size_t>(e - b), Acc(0));
          for (int64_t r = 0; r < R; ++r) {
            const T* row = src + r * M;
            for (int64_t m = b; m < e; ++m) acc[m - b] += static_cast<Acc>(cast<acc_t<T>>(row[m]));
          }
          for (int64_t m = b; m < e; ++m) o[m] = cast<O>(acc[m - b]);
        });
        return;
      }
      Tensor xc = x.permute(p.order).contiguous();
      const T* src = xc.data<T>();
      if (M >= get_num_threads() || R < 4096) {
        parallel_for(0, M, std::max<int64_t>(1, 32768 / std::max<int64_t>(R, 1)),
                     [&](int64_t b, int64_t e) {
                       for (int64_t m = b; m < e; ++m) {
                         Acc acc = 0;
                         const T* row = src + m * R;
                         for (int64_t r = 0; r < R; ++r)
                           acc += static_cast<Acc>(cast<acc_t<T>>(row[r]));
                         o[m] = cast<O>(acc);
                       }
                     });
      } else {  // few long rows: split each row across threads
        for (int64_t m = 0; m < M; ++m) {
          const int64_t nt = get_num_threads();
          std::vector<Acc> part(static_cast<size_t>(nt), Acc(0));
          const T* row = src + m * R;
          const int64_t step = (R + nt - 1) / nt;
          parallel_for(0, nt, 1, [&](int64_t b, int64_t e) {
            for (int64_t t = b; t < e; ++t) {
              Acc acc = 0;
              for (int64_t r = t * step; r < std::min(R, (t + 1) * step); ++r)
                acc += static_cast<Acc>(cast<acc_t<T>>(row[r]));
              part[t] = acc;
            }
          });
          o[m] = cast<O>(std::accumulate(part.begin(), part.end(), Acc(0)));
        }
      }
    });
  });
  return out;
}

DType sum_dtype(DType t) { return is_floating(t) ? t : DType::i64; }

// sum without the autocast entry: mean and var are not autocast ops, so the sum inside them
// must keep their input's dtype.
Tensor sum_impl(const Tensor& x, const Shape& dims, bool keepdim) {
  const ReducePlan p = plan(x, dims, keepdim, "sum");
  const Tensor xin = x.dtype() == DType::b8 ? x.detach().to(DType::u8) : x;
  Tensor out;
  if (x.device().is_cuda()) {
    out = empty(p.out_shape, TensorOptions(sum_dtype(x.dtype())).with_device(x.device()));
    backend::cuda::sum(out.detach().view(p.out_keep), xin.detach());
  } else {
    out = sum_kernel(xin, p, sum_dtype(x.dtype()));
  }
  autograd::record(
      "sum", {x}, {out},
      [keep = p.out_keep, in = x.shape()](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{g[0].reshape(keep).expand(in)};
      },
      autograd::HigherOrder::Supported);
  return out;
}

}  // namespace

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim) {
  DLTRAIN_OP_SCOPE("sum", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"dims", dims}, {"keepdim", keepdim}},
                                  [&] { return sum(x, dims, keepdim); });
    });
  detail::check_defined("sum", x, "input");
  if (auto ac = amp::detail::autocast_args(amp::Op::sum, {&x})) return sum((*ac)[0], dims, keepdim);
  return sum_impl(x, dims, keepdim);
}

Tensor sum(const Tensor& x) { return sum(x, {}, false); }

Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  DLTRAIN_OP_SCOPE("mean", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"dims", dims}, {"keepdim", keepdim}},
                                  [&] { return mean(x, dims, keepdim); });
    });
  detail::check_defined("mean", x, "input");
  Tensor xf = is_floating(x.dtype()) ? x : x.to(DType::f32);
  const ReducePlan p = plan(xf, dims, keepdim, "mean");
  return div(sum_impl(xf, dims, keepdim), static_cast<double>(p.R));
}

Tensor mean(const Tensor& x) { return mean(x, {}, false); }

Tensor var(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim) {
  DLTRAIN_OP_SCOPE("var", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record(
          {x}, {{"dims", dims}, {"correction", correction}, {"keepdim", keepdim}},
          [&] { return var(x, dims, correction, keepdim); });
    });
  Tensor xf = is_floating(x.dtype()) ? x : x.to(DType::f32);
  const ReducePlan p = plan(xf, dims, keepdim, "var");
  Tensor centered = sub(xf, mean(xf, dims, true));
  const double denom = static_cast<double>(p.R - correction);
  return div(sum_impl(mul(centered, centered), dims, keepdim), denom > 0 ? denom : NAN);
}

Tensor stddev(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim) {
  return sqrt(var(x, dims, correction, keepdim));
}

namespace {

// Max/min over the reduced dim of p on the CPU: first extreme, NaN wins.
void extreme_cpu(const Tensor& x, const ReducePlan& p, const Tensor& values, const Tensor& indices,
                 bool is_max, const char* op) {
  Tensor xc = x.permute(p.order).contiguous();
  dispatch_numeric(x.dtype(), op, [&]<class T>() {
    const T* src = xc.data<T>();
    T* v = values.data<T>();
    int64_t* ix = indices.data<int64_t>();
    const int64_t R = p.R;
    parallel_for(0, p.M, std::max<int64_t>(1, 16384 / R), [&](int64_t b, int64_t e) {
      for (int64_t m = b; m < e; ++m) {
        const T* row = src + m * R;
        auto best = cast<acc_t<T>>(row[0]);
        int64_t bi = 0;
        for (int64_t r = 1; r < R; ++r) {
          const auto val = cast<acc_t<T>>(row[r]);
          if (best != best) break;  // NaN wins, as in PyTorch
          if (val != val || (is_max ? val > best : val < best)) {
            best = val;
            bi = r;
          }
        }
        v[m] = row[bi];
        ix[m] = bi;
      }
    });
  });
}

std::pair<Tensor, Tensor> extreme_dim(const char* op, const Tensor& x, int64_t dim, bool keepdim,
                                      bool is_max) {
  // A scope of its own: the profiler times it, and export_onnx records it (ReduceMax/ArgMax).
  DLTRAIN_OP_SCOPE(op, x);
  detail::check_defined(op, x, "input");
  DLTRAIN_CHECK(x.numel() > 0, op, ": cannot reduce an empty tensor of shape ",
                shape_str(x.shape()));
  const int64_t d = wrap_dim(dim, x.dim(), op);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"dim", d}, {"keepdim", keepdim}},
                                  [&] { return extreme_dim(op, x, d, keepdim, is_max); });
    });
  const ReducePlan p = plan(x, x.dim() == 0 ? Shape{} : Shape{d}, keepdim, op);
  Tensor values = empty(p.out_shape, TensorOptions(x.dtype()).with_device(x.device()));
  Tensor indices = empty(p.out_shape, TensorOptions(DType::i64).with_device(x.device()));
  if (x.device().is_cuda()) {
    backend::cuda::extreme(values.view(p.out_keep), indices.view(p.out_keep), x.detach(), d,
                           is_max);
  } else {
    extreme_cpu(x, p, values, indices, is_max, op);
  }
  if (is_floating(x.dtype())) {
    autograd::record(
        op, {x}, {values},
        [ix = indices, keep = p.out_keep, in = x.shape(), d,
         nd = x.dim()](const std::vector<Tensor>& g) {
          if (nd == 0) return std::vector<Tensor>{g[0].reshape(in)};
          if (g[0].device().is_cuda() && !autograd::grad_mode_enabled()) {
            Tensor gi = zeros(in, g[0].options());
            backend::cuda::extreme_backward(gi, g[0].detach().reshape(keep), ix.reshape(keep), d);
            return std::vector<Tensor>{gi};
          }
          Shape ar_shape(static_cast<size_t>(nd), 1);
          ar_shape[d] = in[d];
          Tensor pos = arange(static_cast<double>(in[d]), DType::i64).reshape(ar_shape);
          if (ix.device() != pos.device()) pos = pos.to(ix.device());
          Tensor mask = eq(pos, ix.reshape(keep));
          return std::vector<Tensor>{where(mask, g[0].reshape(keep), zeros({}, g[0].options()))};
        },
        autograd::HigherOrder::Supported);
  }
  return {values, indices};
}

Tensor extreme_all(const char* op, const Tensor& x, bool is_max) {
  DLTRAIN_OP_SCOPE(op, x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({x}, {}, [&] { return extreme_all(op, x, is_max); }); });
  Tensor flat = x.detach().reshape({-1});
  const Tensor v = extreme_dim(op, flat, 0, false, is_max).first;
  // The closure keeps a detached handle: `v` itself gets this node as its grad_fn, and a node
  // that owns its own output is a reference cycle that leaks the whole graph when no backward
  // runs (as in max(abs(a - b)).item(); found by LeakSanitizer).
  autograd::record(
      op, {x}, {v},
      [x = x.detach(), v = v.detach()](const std::vector<Tensor>& g) {
        Tensor mask = eq(x, v).to(g[0].dtype());
        return std::vector<Tensor>{mul(mask, div(g[0], sum(mask)))};
      },
      autograd::HigherOrder::Supported);
  return v;
}

}  // namespace

std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_dim("max", x, dim, keepdim, true);
}
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_dim("min", x, dim, keepdim, false);
}
Tensor max(const Tensor& x) { return extreme_all("max", x, true); }
Tensor min(const Tensor& x) { return extreme_all("min", x, false); }
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  // Indices have no gradient: grad mode off rather than a detached copy, which would hide the
  // op from export_onnx's tracer (its output would look like a constant).
  const NoGradGuard no_grad;
  return extreme_dim("argmax", x, dim, keepdim, true).second;
}
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) {
  // Indices have no gradient: grad mode off rather than a detached copy, which would hide the
  // op from export_onnx's tracer (its output would look like a constant).
  const NoGradGuard no_grad;
  return extreme_dim("argmin", x, dim, keepdim, false).second;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  DLTRAIN_OP_SCOPE("sum_to", x);
  if (x.shape() == shape) return x;
  const int64_t lead = x.dim() - static_cast<int64_t>(shape.size());
  DLTRAIN_CHECK(lead >= 0, "sum_to: cannot reduce shape ", shape_str(x.shape()), " to ",
                shape_str(shape));
  Shape dims;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < lead) {
      dims.push_back(d);
    } else if (shape[d - lead] == 1 && x.shape()[d] != 1) {
      dims.push_back(d);
    } else {
      DLTRAIN_CHECK(shape[d - lead] == x.shape()[d], "sum_to: cannot reduce shape ",
                    shape_str(x.shape()), " to ", shape_str(shape));
    }
  }
  Tensor r = dims.empty() ? x : sum(x, dims, true);
  return r.reshape(shape);
}

}  // namespace dltrain
