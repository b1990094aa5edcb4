// CPU benchmark of the fused elementwise maps and their gradient kernels (the functors of
// src/ops/elementwise_ops.hpp): each op on an f32 activation of ResNet-50's first stage
// (8x64x56x56, 1.6 M elements), forward alone, and forward + backward through the op; a few
// in bf16. Prints one line per case (median ms over --iters runs after two warm-ups) and
// optionally writes JSON {"threads": N, "cases": {name: ms}}. Used to check that a change to
// the elementwise path keeps its speed (run the old and the new binary in turn).
//
// Usage: elementwise_cpu [--threads N] [--iters N] [--json PATH]
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "apps/common/op_bench.hpp"
#include "dltrain/dltrain.hpp"

using namespace dltrain;

int main(int argc, char** argv) {
  apps::OpBench bench("elementwise_cpu",
                      "Fused elementwise maps and their backward, median ms per case.");
  bench.parse(argc, argv);
  using Op = std::function<Tensor(const Tensor&)>;
  const std::vector<std::pair<std::string, Op>> ops = {
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"leaky_relu", [](const Tensor& x) { return leaky_relu(x, 0.1); }},
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, true); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"silu", [](const Tensor& x) { return silu(x); }},
      {"softplus", [](const Tensor& x) { return softplus(x); }},
      {"elu", [](const Tensor& x) { return elu(x); }},
      {"mish", [](const Tensor& x) { return mish(x); }},
      {"hardswish", [](const Tensor& x) { return hardswish(x); }},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.5); }},
      {"abs", [](const Tensor& x) { return abs(x); }},
      {"exp", [](const Tensor& x) { return exp(x); }},
      {"sin", [](const Tensor& x) { return sin(x); }},
      {"pow 1.5", [](const Tensor& x) { return pow(abs(x), 1.5); }},
  };
  const Shape shape{8, 64, 56, 56};
  const Tensor x = randn(shape);
  Tensor xg = x.clone();
  xg.requires_grad_();
  const Tensor g = randn(shape);
  for (const auto& [name, f] : ops) {
    bench.run(name + " fwd f32", [&] {
      NoGradGuard no_grad;
      f(x);
    });
    bench.run(name + " fwd+bwd f32", [&] { f(xg).backward(g); });
  }
  const Tensor xb = x.to(DType::bf16);
  for (const auto& [name, f] : ops)
    if (name == "relu" || name == "gelu" || name == "silu" || name == "sigmoid")
      bench.run(name + " fwd bf16", [&] {
        NoGradGuard no_grad;
        f(xb);
      });
  return bench.finish();
}
