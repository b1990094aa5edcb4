// Trains y = 2x + 1 by gradient descent using only the installed headers and library.
#include <unistd.h>
#include <dltrain/dltrain.hpp>
#include <dltrain/train/metrics.hpp>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <string>

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
  // A convolution: oneDNN's when the library has it, so its runtime must load and run from
  // wherever the package put it (tests/install/check_install.sh moves the prefix first).
  const double conv_sum = sum(conv2d(ones({1, 1, 4, 4}), ones({1, 1, 3, 3}))).item();
  std::printf("consumer: conv2d sum=%.1f (expect 36)\n", conv_sum);
  if (conv_sum != 36.0) return 1;
  // train/'s sinks link from the installed copy too (protobuf, ISA-L and libpng when the
  // library was built with them).
  const auto dir = std::filesystem::temp_directory_path() /
                   ("dltrain_consumer_" + std::to_string(static_cast<long>(::getpid())));
  {
    train::MetricsOptions o;
    o.csv = (dir / "metrics.csv").string();
    if (train::tensorboard_available()) o.tensorboard = (dir / "tb").string();
    train::MetricsWriter m(o);
    m.add_scalar("w", wv, 200);
    m.add_histogram("x", x, 200);
  }
  const bool wrote = std::filesystem::file_size(dir / "metrics.csv") > 0;
  std::filesystem::remove_all(dir);
  if (!wrote) return 1;
  // The run-time build facts agree with what the CMake package (or pkg-config) said.
  const BuildInfo& info = build_info();
  std::printf("consumer: %s\n", info.str().c_str());
#ifdef EXPECT_WITH
  const bool expected[] = {EXPECT_WITH};  // cuda, mpi, hdf5, jpeg, dnnl
  const bool got[] = {info.cuda, info.mpi, info.hdf5, info.jpeg, info.dnnl};
  for (size_t i = 0; i < sizeof(got) / sizeof(got[0]); ++i)
    if (expected[i] != got[i]) {
      std::printf("consumer: build_info() disagrees with the package's DLTRAIN_WITH_* (%zu)\n", i);
      return 1;
    }
#endif
  return std::abs(wv - 2.0) < 1e-3 && std::abs(bv - 1.0) < 1e-3 ? 0 : 1;
}
