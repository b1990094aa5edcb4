// sort, argsort, topk: the indices are computed on the input's device (std::sort per line with
// ties broken by position on the CPU, CUB's segmented sort on CUDA via
// backend::cuda::sort_lines), and the values are gather(x, dim, indices), which carries the
// gradient. The sorted dim is moved last and made contiguous first, so every line is a dense
// row. topk orders only its first k positions on the CPU (std::partial_sort) and sorts the
// whole line on CUDA.
#include "dltrain/ops/sort.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "dltrain/core/parallel.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/indexing.hpp"
#include "src/backend/cpu/cast.hpp"
#include "src/backend/cuda/scan.hpp"
#include "src/core/trace.hpp"
#include "src/ops/common.hpp"

namespace dltrain {

using backend::cpu::cast;

namespace {

// Stable argsort of every row of x (contiguous [lines, L]) into idx (int64 [lines, L]); with
// k < L only the first k positions of each row are ordered (partial sort, for topk). Equal
// values are ordered by position, which makes the order total, so std::sort and
// std::partial_sort give exactly the stable order.
void sort_rows_cpu(const Tensor& idx, const Tensor& x, int64_t lines, int64_t L, bool descending,
                   int64_t k) {
  dispatch_numeric(x.dtype(), "sort", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = x.data<T>();
    int64_t* ip = idx.data<int64_t>();
    parallel_for(0, lines, std::max<int64_t>(1, 4096 / std::max<int64_t>(L, 1)),
                 [&](int64_t b, int64_t e) {
                   std::vector<A> key(static_cast<size_t>(L));
                   for (int64_t r = b; r < e; ++r) {
                     for (int64_t l = 0; l < L; ++l) key[l] = cast<A>(xp[r * L + l]);
                     int64_t* row = ip + r * L;
                     std::iota(row, row + L, int64_t{0});
                     // NaN is above every number; ties keep their positions' order.
                     auto before = [&](int64_t a, int64_t c) {
                       const A u = key[a], v = key[c];
                       const bool un = u != u, vn = v != v;
                       if (un || vn) return un && vn ? a < c : (descending ? un : vn);
                       if (u != v) return descending ? u > v : u < v;
                       return a < c;
                     };
                     if (k < L)
                       std::partial_sort(row, row + k, row + L, before);
                     else
                       std::sort(row, row + L, before);
                   }
                 });
  });
}

// Indices (int64, x's shape) that sort x along d.
Tensor sort_indices(const Tensor& x, int64_t d, bool descending, int64_t k = -1) {
  Tensor xt = x.detach();
  if (xt.dtype() == DType::b8) xt = xt.to(DType::u8);
  const int64_t last = x.dim() - 1;
  xt = xt.transpose(d, last).contiguous();
  const int64_t L = x.size(d), lines = L == 0 ? 0 : x.numel() / L;
  Tensor idx = empty(xt.shape(), TensorOptions(DType::i64).with_device(x.device()));
  if (x.device().is_cuda()) {
    // CUB orders a negative NaN below -inf: make every NaN the positive canonical one.
    if (is_floating(xt.dtype())) xt = masked_fill(xt, ne(xt, xt), NAN).contiguous();
    backend::cuda::sort_lines(idx, xt, lines, L, descending);
  } else {
    sort_rows_cpu(idx, xt, lines, L, descending, k < 0 ? L : k);
  }
  return idx.transpose(d, last);
}

}  // namespace

std::pair<Tensor, Tensor> sort(const Tensor& x, int64_t dim, bool descending) {
  DLTRAIN_OP_SCOPE("sort", x);
  const char* op = "sort";
  detail::check_defined(op, x, "input");
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"dim", dim}, {"descending", descending}},
                                  [&] { return sort(x, dim, descending); });
    });
  if (x.dim() == 0) {
    auto [v, i] = sort(x.reshape({1}), 0, descending);
    return {v.reshape({}), i.reshape({})};
  }
  const int64_t d = wrap_dim(dim, x.dim(), op);
  const Tensor idx = sort_indices(x, d, descending).contiguous();
  return {gather(x, d, idx), idx};
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending) {
  DLTRAIN_OP_SCOPE("argsort", x);
  const char* op = "argsort";
  detail::check_defined(op, x, "input");
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"dim", dim}, {"descending", descending}},
                                  [&] { return argsort(x, dim, descending); });
    });
  if (x.dim() == 0) return zeros({}, TensorOptions(DType::i64).with_device(x.device()));
  return sort_indices(x, wrap_dim(dim, x.dim(), op), descending).contiguous();
}

std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim, bool largest) {
  DLTRAIN_OP_SCOPE("topk", x);
  const char* op = "topk";
  detail::check_defined(op, x, "input");
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"k", k}, {"dim", dim}, {"largest", largest}},
                                  [&] { return topk(x, k, dim, largest); });
    });
  if (x.dim() == 0) {
    auto [v, i] = topk(x.reshape({1}), k, 0, largest);
    return {v.reshape({}), i.reshape({})};
  }
  const int64_t d = wrap_dim(dim, x.dim(), op);
  DLTRAIN_CHECK(k >= 0 && k <= x.size(d), op, ": k = ", k, " is out of range for dimension ", d,
                " of size ", x.size(d), " (input shape ", shape_str(x.shape()),
                "); valid range is [0, ", x.size(d), "]");
  const Tensor idx = sort_indices(x, d, largest, k).narrow(d, 0, k).contiguous();
  return {gather(x, d, idx), idx};
}

}  // namespace dltrain
