// One call per row of the autocast policy table (amp::Op), with operands of dtypes a and b
// on `dev`: shared by the CPU policy test (tests/amp) and the CUDA one (tests/cuda).
#pragma once

#include <catch2/catch.hpp>

#include <vector>

#include "dltrain/dltrain.hpp"

namespace dltrain::testing {

inline Tensor run_policy_op(amp::Op op, DType a, DType b, Device dev) {
  auto rnd = [dev](const Shape& s, uint64_t seed, DType dt) {
    Generator g(seed);
    return randn(s, DType::f32, &g).to(dt).to(dev);
  };
  const Tensor x = rnd({2, 3}, 1, a), y = rnd({3, 4}, 2, b);
  const Tensor pos = add(abs(rnd({2, 3}, 3, a)), 0.5);
  const Tensor labels = from_vector(std::vector<int64_t>{0, 2}).to(dev);
  switch (op) {
    case amp::Op::conv2d:
      return conv2d(rnd({1, 2, 5, 5}, 4, a), rnd({3, 2, 3, 3}, 5, b), rnd({3}, 6, b));
    case amp::Op::conv_transpose2d:
      return conv_transpose2d(rnd({1, 2, 4, 4}, 19, a), rnd({2, 3, 3, 3}, 20, b), rnd({3}, 21, b),
                              2, 1, 1);
    case amp::Op::linear:
      return linear(x, rnd({4, 3}, 7, b), rnd({4}, 8, b));
    case amp::Op::mm:
      return mm(x, y);
    case amp::Op::bmm:
      return bmm(rnd({2, 2, 3}, 9, a), rnd({2, 3, 2}, 10, b));
    case amp::Op::matmul:
      return matmul(rnd({2, 2, 3}, 11, a), y);
    case amp::Op::exp:
      return exp(x);
    case amp::Op::log:
      return log(pos);
    case amp::Op::pow:
      return pow(pos, 1.5);
    case amp::Op::rsqrt:
      return rsqrt(pos);
    case amp::Op::softmax:
      return softmax(x, 1);
    case amp::Op::log_softmax:
      return log_softmax(x, 1);
    case amp::Op::layer_norm:
      return layer_norm(x, {3}, rnd({3}, 12, b), rnd({3}, 13, b));
    case amp::Op::sum:
      return sum(x);
    case amp::Op::cross_entropy:
      return cross_entropy(x, labels);
    case amp::Op::nll_loss:
      return nll_loss(x, labels);
    case amp::Op::mse_loss:
      return mse_loss(x, rnd({2, 3}, 14, b));
    case amp::Op::binary_cross_entropy_with_logits:
      return binary_cross_entropy_with_logits(x, rnd({2, 3}, 15, b));
    case amp::Op::cat:
      return cat({x, rnd({1, 3}, 16, b)});
    case amp::Op::stack:
      return stack({x, rnd({2, 3}, 17, b)});
    case amp::Op::scatter_add:
      return scatter_add(x, 1, from_vector(std::vector<int64_t>{0, 1, 2, 2, 1, 0}, {2, 3}).to(dev),
                         rnd({2, 3}, 18, b));
    case amp::Op::log1p:
      return log1p(pos);
    case amp::Op::expm1:
      return expm1(x);
    case amp::Op::softplus:
      return softplus(x);
    case amp::Op::l1_loss:
      return l1_loss(x, rnd({2, 3}, 22, b));
    case amp::Op::smooth_l1_loss:
      return smooth_l1_loss(x, rnd({2, 3}, 23, b));
    case amp::Op::huber_loss:
      return huber_loss(x, rnd({2, 3}, 24, b));
    case amp::Op::kl_div:
      return kl_div(log_softmax(x.to(DType::f32), 1).to(a), softmax(rnd({2, 3}, 25, b), 1));
    case amp::Op::binary_cross_entropy:
      return binary_cross_entropy(sigmoid(x), sigmoid(rnd({2, 3}, 26, b)));
    case amp::Op::gaussian_nll_loss:
      return gaussian_nll_loss(x, rnd({2, 3}, 27, b), pos);
    case amp::Op::group_norm:
      return group_norm(rnd({2, 4, 3, 3}, 28, a), 2, rnd({4}, 29, b), rnd({4}, 30, b));
  }
  FAIL("run_policy_op has no case for policy-table op " << amp::policy(op).name);
  return Tensor();
}

}  // namespace dltrain::testing
