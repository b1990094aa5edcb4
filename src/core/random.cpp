// Ranges and random factories. Random values are a pure function of
// (generator seed, generator offset, element index): element i uses Philox
// counter offset + i / 2 (uniform: two words of the block; normal: Box-Muller on
// the block's four words), so the result does not depend on the thread count.
// The per-element formulas live in src/core/philox.hpp, shared with the GPU:
// uniform/normal (rand, randn, rand_like, randn_like) for a CUDA device are drawn
// there by kernels/random.cu and equal the CPU's draw from the same state.
#include <cmath>
#include <numeric>

#include "dltrain/core/generator.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/core/tensor.hpp"
#include "src/backend/cpu/cast.hpp"
#include "src/backend/cuda/random.hpp"
#include "src/core/philox.hpp"

namespace dltrain {

namespace {

// Fills a fresh contiguous CPU tensor elementwise with f(i) -> double.
template <class F>
Tensor generate(const Shape& shape, TensorOptions opts, F f) {
  const Device dev = opts.device;
  const bool rg = opts.requires_grad;
  opts.device = Device::cpu();
  opts.requires_grad = false;
  Tensor t = empty(shape, opts);
  const int64_t n = t.numel();
  dispatch_all(t.dtype(), [&]<class T>() {
    T* p = t.data<T>();
    parallel_for(0, n, 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = backend::cpu::cast<T>(f(i));
    });
  });
  if (dev.is_cuda()) t = t.to(dev);
  if (rg) t.requires_grad_();
  return t;
}

Generator& gen_or_default(Generator* g) { return g ? *g : default_generator(); }

}  // namespace

Tensor arange(double start, double end, double step, TensorOptions opts) {
  DLTRAIN_CHECK(step != 0, "arange: step must be non-zero");
  const double span = (end - start) / step;
  const int64_t n = span > 0 ? static_cast<int64_t>(std::ceil(span - 1e-12)) : 0;
  return generate({n}, opts, [&](int64_t i) { return start + static_cast<double>(i) * step; });
}

Tensor arange(double end, TensorOptions opts) { return arange(0, end, 1, opts); }

Tensor linspace(double start, double end, int64_t steps, TensorOptions opts) {
  DLTRAIN_CHECK(steps >= 0, "linspace: steps must be >= 0, got ", steps);
  const double d = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0.0;
  // Fill from both ends, as PyTorch does, so the last value is exactly `end`.
  return generate({steps}, opts, [&](int64_t i) {
    return i < steps / 2 ? start + d * static_cast<double>(i)
                         : end - d * static_cast<double>(steps - 1 - i);
  });
}

namespace {

// A fresh contiguous tensor of `opts` drawn on its own device: the CUDA kernel, or
// generate() with the same per-element formula on the CPU.
Tensor draw(const Shape& shape, TensorOptions opts, backend::cuda::RandomKind kind, double a,
            double b, Generator* gen) {
  const uint64_t seed = gen_or_default(gen).seed();
  const uint64_t base =
      gen_or_default(gen).reserve(static_cast<uint64_t>((shape_numel(shape) + 1) / 2));
  if (opts.device.is_cuda()) {
    const bool rg = opts.requires_grad;
    opts.requires_grad = false;
    Tensor t = empty(shape, opts);
    backend::cuda::random_fill(t, kind, a, b, seed, base);
    if (rg) t.requires_grad_();
    return t;
  }
  if (kind == backend::cuda::RandomKind::Normal)
    return generate(shape, opts, [&](int64_t i) { return philox::normal_at(seed, base, i, a, b); });
  return generate(shape, opts, [&](int64_t i) { return philox::uniform_at(seed, base, i, a, b); });
}

Tensor like_format(const Tensor& r, const Tensor& t) {
  const MemoryFormat fmt = t.dim() == 4 ? t.suggest_memory_format() : MemoryFormat::Contiguous;
  return fmt == MemoryFormat::Contiguous ? r : r.contiguous(fmt);
}

}  // namespace

Tensor uniform(const Shape& shape, double low, double high, TensorOptions opts, Generator* gen) {
  DLTRAIN_CHECK(is_floating(opts.dtype), "uniform/rand: dtype must be floating, got ", opts.dtype);
  return draw(shape, opts, backend::cuda::RandomKind::Uniform, low, high, gen);
}

Tensor rand(const Shape& shape, TensorOptions opts, Generator* gen) {
  return uniform(shape, 0.0, 1.0, opts, gen);
}

Tensor normal(const Shape& shape, double mean, double std, TensorOptions opts, Generator* gen) {
  DLTRAIN_CHECK(is_floating(opts.dtype), "randn/normal: dtype must be floating, got ", opts.dtype);
  DLTRAIN_CHECK(std >= 0, "normal: std must be >= 0, got ", std);
  return draw(shape, opts, backend::cuda::RandomKind::Normal, mean, std, gen);
}

Tensor randn(const Shape& shape, TensorOptions opts, Generator* gen) {
  return normal(shape, 0.0, 1.0, opts, gen);
}

Tensor rand_like(const Tensor& t, Generator* gen) {
  DLTRAIN_CHECK(t.defined(), "rand_like: the tensor is undefined");
  DLTRAIN_CHECK(is_floating(t.dtype()), "rand_like: dtype must be floating, got ", t.dtype(),
                "; use randint for integers");
  return like_format(rand(t.shape(), t.options(), gen), t);
}

Tensor randn_like(const Tensor& t, Generator* gen) {
  DLTRAIN_CHECK(t.defined(), "randn_like: the tensor is undefined");
  DLTRAIN_CHECK(is_floating(t.dtype()), "randn_like: dtype must be floating, got ", t.dtype(),
                "; use randint for integers");
  return like_format(randn(t.shape(), t.options(), gen), t);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts, Generator* gen) {
  DLTRAIN_CHECK(high > low, "randint: high (", high, ") must be greater than low (", low, ")");
  const uint64_t range = static_cast<uint64_t>(high - low);
  const uint64_t seed = gen_or_default(gen).seed();
  const uint64_t base =
      gen_or_default(gen).reserve(static_cast<uint64_t>((shape_numel(shape) + 1) / 2));
  return generate(shape, opts, [&](int64_t i) {
    const auto w = philox4x32(base + static_cast<uint64_t>(i) / 2, 0, seed);
    const int lane = static_cast<int>(i % 2) * 2;
    const uint64_t x = (static_cast<uint64_t>(w[lane]) << 32) | w[lane + 1];
    return static_cast<double>(low + static_cast<int64_t>(x % range));
  });
}

Tensor randperm(int64_t n, Generator* gen) {
  DLTRAIN_CHECK(n >= 0, "randperm: n must be >= 0, got ", n);
  // Fisher-Yates driven by one Philox word per swap: deterministic for a seed.
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  const uint64_t seed = gen_or_default(gen).seed();
  const uint64_t base = gen_or_default(gen).reserve(static_cast<uint64_t>((n + 1) / 2));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto w = philox4x32(base + static_cast<uint64_t>(i) / 2, 1, seed);
    const int lane = static_cast<int>(i % 2) * 2;
    const uint64_t x = (static_cast<uint64_t>(w[lane]) << 32) | w[lane + 1];
    std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(x % static_cast<uint64_t>(i + 1))]);
  }
  return from_vector(v, {n});
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                   std::optional<TensorOptions> opts) {
  const Shape s = shape.empty() ? Shape{static_cast<int64_t>(values.size())} : shape;
  DLTRAIN_CHECK(shape_numel(s) == static_cast<int64_t>(values.size()),
                "from_vector: ", values.size(), " values do not fill shape ", shape_str(s), " (",
                shape_numel(s), " elements)");
  Tensor t = empty(s, TensorOptions(dtype_v<T>));
  T* p = t.data<T>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  if (opts) {
    t = t.to(opts->dtype).to(opts->device);
    if (opts->requires_grad) t.requires_grad_();
  }
  return t;
}

template Tensor from_vector<float>(const std::vector<float>&, const Shape&,
                                   std::optional<TensorOptions>);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&,
                                    std::optional<TensorOptions>);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&,
                                     std::optional<TensorOptions>);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&,
                                     std::optional<TensorOptions>);
template Tensor from_vector<uint8_t>(const std::vector<uint8_t>&, const Shape&,
                                     std::optional<TensorOptions>);
template Tensor from_vector<Half>(const std::vector<Half>&, const Shape&,
                                  std::optional<TensorOptions>);
template Tensor from_vector<BFloat16>(const std::vector<BFloat16>&, const Shape&,
                                      std::optional<TensorOptions>);

Tensor tensor(std::initializer_list<double> values, TensorOptions opts) {
  return from_vector(std::vector<double>(values), {}, opts);
}

}  // namespace dltrain
