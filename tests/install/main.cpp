// Trains y = 2x + 1 by gradient descent using only the installed headers and library.
#include <dltrain/dltrain.hpp>

#include <cmath>
#include <cstdio>

int main() {
  using namespace dltrain;
  Generator g(0);
  Tensor x = randn({64, 1}, {}, &g);
  Tensor y = add(mul(x, 2.0), 1.0);
  Tensor w = zeros({1, 1}).requires_grad_(), b = zeros({1}).requires_grad_();
  for (int step = 0; step < 200; ++step) {
    Tensor loss = mse_loss(linear(x, w, b), y);
    w.set_grad(Tensor());
    b.set_grad(Tensor());
    loss.backward();
    NoGradGuard ng;
    add_(w, w.grad(), -0.1);
    add_(b, b.grad(), -0.1);
  }
  const double wv = w.item(), bv = b.item();
  std::printf("consumer: w=%.4f b=%.4f (expect 2, 1)\n", wv, bv);
  return std::abs(wv - 2.0) < 1e-3 && std::abs(bv - 1.0) < 1e-3 ? 0 : 1;
}
