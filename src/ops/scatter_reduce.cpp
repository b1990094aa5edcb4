// scatter_reduce and the PyG aggregation primitives built on it (segment_max, segment_softmax).
//
// scatter_reduce runs in the accumulation dtype (f32 for f16/bf16, else the input's) and
// rounds once at the end. Sum and Mean are scatter_add (deterministic on the CPU, atomics on
// CUDA); Amax/Amin have their own scatter (a CPU loop split over positions that never collide,
// a compare-and-swap kernel on CUDA, src/backend/cuda/indexing.hpp). include_self = false first
// replaces the positions that receive a value by the reduction's identity, found from a count
// of hits (itself a scatter_add of ones). The backward formulas are PyTorch's
// (scatter_reduce_backward in FunctionsManual.cpp), written with gather/scatter_add/eq, so they
// run on either device. On the CPU every index is range-checked before anything runs; on CUDA
// an out-of-range index is dropped (see indexing.hpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/indexing.hpp"
#include "src/backend/cuda/indexing.hpp"
#include "src/core/trace.hpp"
#include "src/ops/common.hpp"
#include "src/ops/index_util.hpp"

namespace dltrain {

namespace {

void unravel(int64_t pos, const Shape& shape, std::vector<int64_t>& c) {
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    c[d] = shape[d] == 0 ? 0 : pos % shape[d];
    pos = shape[d] == 0 ? 0 : pos / shape[d];
  }
}

// dst (contiguous f32/f64) at [.., idx[c], ..] = max (min) of itself and src[c], NaN winning,
// over every position c of `ishape` (src any strides). Work is split over positions that
// differ outside `dim`, which never collide in dst, and each walks `dim` in order.
void scatter_extreme_cpu(const Tensor& dst, int64_t dim, const std::vector<int64_t>& idx,
                         const Shape& ishape, const Tensor& src, bool is_max) {
  const int64_t nd = static_cast<int64_t>(ishape.size());
  Shape outer_shape = ishape;
  outer_shape[dim] = 1;
  const int64_t units = shape_numel(outer_shape), K = ishape[dim];
  if (units == 0 || K == 0) return;
  const Shape ds = dst.strides(), ss = src.strides(), is = contiguous_strides(ishape);
  auto run = [&]<class T>() {
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
          const T v = sp[so + k * ss[dim]];
          if (t != t) continue;
          if (v != v || (is_max ? v > t : v < t)) t = v;
        }
      }
    });
  };
  if (dst.dtype() == DType::f64)
    run.template operator()<double>();
  else
    run.template operator()<float>();
}

// out [S, inner] (contiguous f32/f64, every row written) = the maximum of the rows e of src
// [E, inner] (contiguous, same dtype) with ids[e] = s, NaN winning; 0 for rows no id names.
// Split over blocks of columns (which never collide), rows walked in order: each step reads
// and writes contiguous runs, unlike the general scatter's column-by-column walk.
void segment_max_rows(const Tensor& out, const Tensor& src, const std::vector<int64_t>& ids,
                      int64_t S, int64_t inner) {
  constexpr int64_t B = 256;
  const int64_t E = static_cast<int64_t>(ids.size()), nbj = (inner + B - 1) / B;
  std::vector<char> hit(static_cast<size_t>(S), 0);
  for (int64_t i : ids) hit[static_cast<size_t>(i)] = 1;
  auto run = [&]<class T>() {
    T* o = out.data<T>();
    const T* sp = src.data<T>();
    std::fill(o, o + S * inner, -std::numeric_limits<T>::infinity());
    parallel_for(0, nbj, 1, [&](int64_t b, int64_t e) {
      for (int64_t u = b; u < e; ++u) {
        const int64_t j0 = u * B, j1 = std::min(inner, j0 + B);
        for (int64_t r = 0; r < E; ++r) {
          T* orow = o + ids[static_cast<size_t>(r)] * inner;
          const T* srow = sp + r * inner;
          for (int64_t j = j0; j < j1; ++j) {
            const T v = srow[j];
            if (orow[j] != orow[j]) continue;
            if (v != v || v > orow[j]) orow[j] = v;
          }
        }
      }
    });
    for (int64_t r = 0; r < S; ++r)
      if (!hit[static_cast<size_t>(r)]) std::fill(o + r * inner, o + (r + 1) * inner, T(0));
  };
  if (out.dtype() == DType::f64)
    run.template operator()<double>();
  else
    run.template operator()<float>();
}

DType acc_dtype(DType dt) { return dt == DType::f16 || dt == DType::bf16 ? DType::f32 : dt; }

// How many src values land on each position of a tensor of `shape` (in opts' dtype).
Tensor hit_count(const Shape& shape, int64_t dim, const Tensor& idx, const Shape& ishape,
                 TensorOptions opts) {
  return scatter_add(zeros(shape, opts), dim, idx, ones(ishape, opts));
}

}  // namespace

Tensor scatter_reduce(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                      ScatterReduce reduce, bool include_self) {
  DLTRAIN_OP_SCOPE("scatter_reduce", x, index, src);
  const char* op = "scatter_reduce";
  detail::check_defined(op, x, "input");
  detail::check_defined(op, src, "src");
  detail::check_same_device(op, {&x, &index, &src});
  DLTRAIN_CHECK(x.dim() >= 1, op, ": input must have at least one dimension but is 0-d");
  const int64_t d = wrap_dim(dim, x.dim(), op);
  detail::check_index(op, index, "index");
  DLTRAIN_CHECK(is_floating(x.dtype()), op, ": input must be floating-point but has dtype ",
                x.dtype(), "; convert it with .to(DType::f32)");
  DLTRAIN_CHECK(src.dtype() == x.dtype(), op, ": src has dtype ", src.dtype(),
                " but the input has ", x.dtype(), "; convert src with .to(", x.dtype(), ")");
  detail::check_index_shape(op, x, d, index);
  DLTRAIN_CHECK(src.dim() == index.dim(), op, ": src of shape ", shape_str(src.shape()),
                " must have as many dimensions as index ", shape_str(index.shape()));
  for (int64_t k = 0; k < index.dim(); ++k)
    DLTRAIN_CHECK(index.size(k) <= src.size(k), op, ": index of shape ", shape_str(index.shape()),
                  " is larger than src of shape ", shape_str(src.shape()), " in dimension ", k);
  const DType dt = x.dtype(), acc = acc_dtype(dt);
  const bool cuda = x.device().is_cuda();
  std::vector<int64_t> iv;
  Tensor idx;
  if (cuda) {
    idx = detail::device_index(op, index, "index");
  } else {
    iv = detail::read_index(op, index, "index");
    detail::check_range(op, iv, x.size(d), "the scattered dimension");
    idx = index.detach().to(DType::i64);
  }
  const bool extreme = reduce == ScatterReduce::Amax || reduce == ScatterReduce::Amin;
  const bool is_max = reduce == ScatterReduce::Amax;
  Tensor out;
  {
    NoGradGuard ng;
    const TensorOptions ao = TensorOptions(acc).with_device(x.device());
    const Tensor xa = x.detach().to(acc), sa = src.detach().to(acc);
    Tensor hit;
    if (reduce == ScatterReduce::Mean || !include_self)
      hit = hit_count(x.shape(), d, idx, index.shape(), ao);
    Tensor base = xa;
    if (!include_self) {
      const double identity = !extreme ? 0.0
                              : is_max ? -std::numeric_limits<double>::infinity()
                                       : std::numeric_limits<double>::infinity();
      base = where(gt(hit, 0.0), full({}, identity, ao), xa);
    }
    if (!extreme) {
      out = scatter_add(base, d, idx, sa);
    } else {
      out = empty(x.shape(), ao);
      out.copy_(base);
      if (cuda)
        backend::cuda::scatter_extreme_dim(out, d, idx, sa, is_max);
      else
        scatter_extreme_cpu(out, d, iv, index.shape(), sa, is_max);
    }
    if (reduce == ScatterReduce::Mean) {
      Tensor n = include_self ? add(hit, 1.0) : hit;
      out = div(out, masked_fill(n, eq(n, 0.0), 1.0));
    }
    if (acc != dt) out = out.to(dt);
  }
  autograd::record(
      op, {x, src}, {out},
      [xd = x.detach(), sd = src.detach(), idx, result = out.detach(), d, reduce, include_self,
       rx = x.requires_grad(), rs = src.requires_grad()](const std::vector<Tensor>& g) {
        const Shape ishape = idx.shape();
        const TensorOptions go = g[0].options();
        Tensor gx, gs;
        switch (reduce) {
          case ScatterReduce::Sum:
            gx = g[0];
            gs = gather(g[0], d, idx);
            break;
          case ScatterReduce::Mean: {
            Tensor n = scatter_add(full(xd.shape(), include_self ? 1.0 : 0.0, go), d, idx,
                                   ones(ishape, go));
            gx = div(g[0], masked_fill(n, eq(n, 0.0), 1.0));
            gs = gather(gx, d, idx);
            break;
          }
          default: {
            // Split evenly between every value equal to the result (x's own counted).
            Tensor sn = sd;
            for (int64_t k = 0; k < sd.dim(); ++k) sn = sn.narrow(k, 0, ishape[k]);
            const Tensor value = gather(result, d, idx);
            const Tensor self_is = eq(xd, result).to(go.dtype);
            const Tensor src_is = eq(sn, value).to(go.dtype);
            const Tensor gd = div(g[0], scatter_add(self_is, d, idx, src_is));
            gx = mul(self_is, gd);
            gs = mul(src_is, gather(gd, d, idx));
          }
        }
        if (!include_self && rx)
          gx = masked_fill(gx, gt(hit_count(xd.shape(), d, idx, ishape, go), 0.0), 0.0);
        return std::vector<Tensor>{rx ? gx : Tensor(),
                                   rs ? detail::zero_pad_to(gs, sd.shape()) : Tensor()};
      },
      // Made of ops, linear in g; the masks and counts are constant almost everywhere.
      autograd::HigherOrder::Supported);
  return out;
}

Tensor segment_max(const Tensor& src, const Tensor& segment_ids, int64_t num_segments) {
  DLTRAIN_OP_SCOPE("segment_max", src, segment_ids);
  const char* op = "segment_max";
  detail::check_defined(op, src, "src");
  detail::check_same_device(op, {&src, &segment_ids});
  DLTRAIN_CHECK(src.dim() >= 1, op, ": src must be [E, ...] but is 0-d");
  detail::check_index(op, segment_ids, "segment_ids");
  DLTRAIN_CHECK(segment_ids.dim() == 1 && segment_ids.size(0) == src.size(0), op,
                ": segment_ids must be [", src.size(0), "] (one id per row of src of shape ",
                shape_str(src.shape()), ") but has shape ", shape_str(segment_ids.shape()));
  DLTRAIN_CHECK(num_segments >= 0, op, ": num_segments must be >= 0 but is ", num_segments);
  if (src.device().is_cpu())
    detail::check_range(op, detail::read_index(op, segment_ids, "segment_ids"), num_segments,
                        "num_segments");
  DLTRAIN_CHECK(is_floating(src.dtype()), op, ": src must be floating-point but has dtype ",
                src.dtype(), "; convert it with .to(DType::f32)");
  Shape out_shape = src.shape(), id_shape(static_cast<size_t>(src.dim()), 1);
  out_shape[0] = num_segments;
  id_shape[0] = src.size(0);
  const Tensor ids = segment_ids.detach().to(DType::i64);
  Tensor out;
  {
    NoGradGuard ng;
    if (src.device().is_cuda()) {
      // scatter_reduce Amax, include_self = false, into zeros: PyG's rule (empty segments 0).
      const Tensor idx = ids.reshape(id_shape).expand(src.shape());
      out = scatter_reduce(zeros(out_shape, src.options()), 0, idx, src.detach(),
                           ScatterReduce::Amax, false);
    } else {
      const DType acc = acc_dtype(src.dtype());
      const int64_t inner = src.size(0) == 0 ? 0 : src.numel() / src.size(0);
      Tensor o = empty({num_segments, inner}, TensorOptions(acc));
      segment_max_rows(o, src.detach().to(acc).contiguous(), ids.to_vector<int64_t>(), num_segments,
                       inner);
      out = o.to(src.dtype()).reshape(out_shape);
    }
  }
  // scatter_reduce's Amax backward for include_self = false on zeros, with row ops: the
  // gradient is split between the rows equal to the maximum, and a 0 maximum also counts the
  // zero it started from (as torch and PyG do).
  autograd::record(
      op, {src}, {out},
      [sd = src.detach(), ids, result = out.detach(), num_segments](const std::vector<Tensor>& g) {
        const TensorOptions go = g[0].options();
        const Tensor src_is = eq(sd, index_select(result, 0, ids)).to(go.dtype);
        const Tensor n = add(eq(result, 0.0).to(go.dtype), segment_sum(src_is, ids, num_segments));
        const Tensor gd = div(g[0], n);
        return std::vector<Tensor>{mul(src_is, index_select(gd, 0, ids))};
      },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor segment_softmax(const Tensor& src, const Tensor& segment_ids, int64_t num_segments) {
  DLTRAIN_OP_SCOPE("segment_softmax", src, segment_ids);
  const char* op = "segment_softmax";
  detail::check_defined(op, src, "src");
  DLTRAIN_CHECK(is_floating(src.dtype()), op, ": src must be floating-point but has dtype ",
                src.dtype(), "; convert it with .to(DType::f32)");
  // As PyG's softmax: the shift by the segment maximum is a constant for the gradient.
  const Tensor m = segment_max(src.detach(), segment_ids, num_segments);
  const Tensor ids = segment_ids.detach().to(DType::i64);
  const Tensor e = exp(sub(src, index_select(m, 0, ids)));
  const Tensor s = add(segment_sum(e, ids, num_segments), 1e-16);
  return div(e, index_select(s, 0, ids));
}

}  // namespace dltrain
