// Strided N-operand loops for CPU elementwise kernels (internal header).
//
// for_each_strided walks a shape with one stride vector per operand
// (elements, 0 for broadcast dims), coalescing dimensions that are laid out
// contiguously with each other so that contiguous tensors become one flat
// loop, and splits the flat index range across the thread pool. The inner
// callback sees a 1-d run of n elements with one stride per operand; the map
// helpers give it a unit-stride fast path that the compiler vectorises.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "dltrain/core/parallel.hpp"
#include "dltrain/core/tensor.hpp"

namespace dltrain::backend::cpu {

/// Strides of `t` viewed as broadcast to `shape` (0 for broadcast dims).
Shape broadcast_strides(const Tensor& t, const Shape& shape);

template <size_t N>
struct StridedLoop {
  Shape shape;                   // coalesced
  std::array<Shape, N> strides;  // per operand, elements, coalesced
};

/// Merges adjacent dims whose strides chain for every operand and drops size-1 dims.
template <size_t N>
StridedLoop<N> coalesce(const Shape& shape, const std::array<Shape, N>& strides) {
  StridedLoop<N> r;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !r.shape.empty();
    for (size_t k = 0; merge && k < N; ++k) merge = r.strides[k].back() == strides[k][d] * shape[d];
    if (merge) {
      r.shape.back() *= shape[d];
      for (size_t k = 0; k < N; ++k) r.strides[k].back() = strides[k][d];
    } else {
      r.shape.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) r.strides[k].push_back(strides[k][d]);
    }
  }
  if (r.shape.empty()) {
    r.shape.push_back(1);
    for (size_t k = 0; k < N; ++k) r.strides[k].push_back(0);
  }
  return r;
}

/// Calls fn(ptrs, inner_strides, n) over runs of the innermost dimension, in parallel.
/// `base` are element pointers typed per operand via `elsize` (bytes).
template <size_t N, class F>
void for_each_strided(const Shape& shape, std::array<char*, N> base,
                      const std::array<Shape, N>& strides, const std::array<size_t, N>& elsize,
                      F&& fn, int64_t grain = 16384) {
  const int64_t total = shape_numel(shape);
  if (total == 0) return;
  // Walk the dims in operand 0's memory order (largest stride outermost; operand 0 is the
  // output of every map), so that a channels-last output, and inputs laid out like it,
  // coalesce into one unit-stride run instead of an inner loop with stride C.
  Shape order;  // dims as int64 (Shape), permuted below
  for (size_t d = 0; d < shape.size(); ++d) order.push_back(static_cast<int64_t>(d));
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return strides[0][a] > strides[0][b]; });
  Shape pshape;
  std::array<Shape, N> pstrides;
  for (int64_t d : order) {
    pshape.push_back(shape[d]);
    for (size_t k = 0; k < N; ++k) pstrides[k].push_back(strides[k][d]);
  }
  const StridedLoop<N> L = coalesce<N>(pshape, pstrides);
  const int64_t nd = static_cast<int64_t>(L.shape.size());
  const int64_t inner = L.shape[nd - 1];
  std::array<int64_t, N> inner_bytes;
  for (size_t k = 0; k < N; ++k)
    inner_bytes[k] = L.strides[k][nd - 1] * static_cast<int64_t>(elsize[k]);
  parallel_for(0, total, grain, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> idx(nd, 0);
    int64_t rem = begin;
    for (int64_t d = nd - 1; d >= 0; --d) {
      idx[d] = rem % L.shape[d];
      rem /= L.shape[d];
    }
    int64_t pos = begin;
    while (pos < end) {
      std::array<char*, N> p;
      for (size_t k = 0; k < N; ++k) {
        int64_t off = 0;
        for (int64_t d = 0; d < nd; ++d) off += idx[d] * L.strides[k][d];
        p[k] = base[k] + off * static_cast<int64_t>(elsize[k]);
      }
      const int64_t n = std::min(inner - idx[nd - 1], end - pos);
      fn(p, inner_bytes, n);
      pos += n;
      idx[nd - 1] += n;
      for (int64_t d = nd - 1; d > 0 && idx[d] == L.shape[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
      }
    }
  });
}

/// out[i] = op(in[i]) with `in` broadcast to out's shape. Out and In are element types.
template <class Out, class In, class Op>
void unary_map(const Tensor& out, const Tensor& in, Op op) {
  std::array<char*, 2> base{static_cast<char*>(out.data_ptr()), static_cast<char*>(in.data_ptr())};
  for_each_strided<2>(
      out.shape(), base, {out.strides(), broadcast_strides(in, out.shape())},
      {sizeof(Out), sizeof(In)},
      [&](const std::array<char*, 2>& p, const std::array<int64_t, 2>& s, int64_t n) {
        Out* o = reinterpret_cast<Out*>(p[0]);
        const In* a = reinterpret_cast<const In*>(p[1]);
        if (s[0] == sizeof(Out) && s[1] == sizeof(In)) {
          for (int64_t i = 0; i < n; ++i) o[i] = op(a[i]);
        } else {
          const int64_t so = s[0] / sizeof(Out), sa = s[1] / sizeof(In);
          for (int64_t i = 0; i < n; ++i) o[i * so] = op(a[i * sa]);
        }
      });
}

/// out[i] = op(a[i], b[i]) with a, b broadcast to out's shape.
template <class Out, class A, class B, class Op>
void binary_map(const Tensor& out, const Tensor& a, const Tensor& b, Op op) {
  std::array<char*, 3> base{static_cast<char*>(out.data_ptr()), static_cast<char*>(a.data_ptr()),
                            static_cast<char*>(b.data_ptr())};
  for_each_strided<3>(
      out.shape(), base,
      {out.strides(), broadcast_strides(a, out.shape()), broadcast_strides(b, out.shape())},
      {sizeof(Out), sizeof(A), sizeof(B)},
      [&](const std::array<char*, 3>& p, const std::array<int64_t, 3>& s, int64_t n) {
        Out* o = reinterpret_cast<Out*>(p[0]);
        const A* x = reinterpret_cast<const A*>(p[1]);
        const B* y = reinterpret_cast<const B*>(p[2]);
        if (s[0] == sizeof(Out) && s[1] == sizeof(A) && s[2] == sizeof(B)) {
          for (int64_t i = 0; i < n; ++i) o[i] = op(x[i], y[i]);
        } else if (s[0] == sizeof(Out) && s[1] == sizeof(A) && s[2] == 0) {
          const B yv = y[0];
          for (int64_t i = 0; i < n; ++i) o[i] = op(x[i], yv);
        } else {
          const int64_t so = s[0] / sizeof(Out), sa = s[1] / sizeof(A), sb = s[2] / sizeof(B);
          for (int64_t i = 0; i < n; ++i) o[i * so] = op(x[i * sa], y[i * sb]);
        }
      });
}

/// out[i] = op(a[i], b[i], c[i]) with broadcasting.
template <class Out, class A, class B, class C, class Op>
void ternary_map(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, Op op) {
  std::array<char*, 4> base{static_cast<char*>(out.data_ptr()), static_cast<char*>(a.data_ptr()),
                            static_cast<char*>(b.data_ptr()), static_cast<char*>(c.data_ptr())};
  for_each_strided<4>(
      out.shape(), base,
      {out.strides(), broadcast_strides(a, out.shape()), broadcast_strides(b, out.shape()),
       broadcast_strides(c, out.shape())},
      {sizeof(Out), sizeof(A), sizeof(B), sizeof(C)},
      [&](const std::array<char*, 4>& p, const std::array<int64_t, 4>& s, int64_t n) {
        const int64_t so = s[0] / sizeof(Out), sa = s[1] / sizeof(A), sb = s[2] / sizeof(B),
                      sc = s[3] / sizeof(C);
        Out* o = reinterpret_cast<Out*>(p[0]);
        const A* x = reinterpret_cast<const A*>(p[1]);
        const B* y = reinterpret_cast<const B*>(p[2]);
        const C* z = reinterpret_cast<const C*>(p[3]);
        for (int64_t i = 0; i < n; ++i) o[i * so] = op(x[i * sa], y[i * sb], z[i * sc]);
      });
}

}  // namespace dltrain::backend::cpu
