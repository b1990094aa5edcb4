// Random ops built on the random factories and comparisons (the layers below core's factories
// may not call ops, so these live here), each a pure function of the generator state like
// every draw: bernoulli, drawn on the tensor's device as rand_like(p) < p; multinomial, one
// row per work item (CPU) or thread (CUDA) through src/ops/multinomial_row.hpp, so both
// devices draw the same indices.
#include <algorithm>
#include <cmath>
#include <vector>

#include "dltrain/core/generator.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/core/tensor.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "src/backend/cuda/random.hpp"
#include "src/ops/multinomial_row.hpp"

namespace dltrain {

Tensor bernoulli(const Tensor& p, Generator* gen) {
  DLTRAIN_CHECK(p.defined() && is_floating(p.dtype()),
                "bernoulli: the probabilities must be a floating tensor");
  return lt(rand_like(p, gen), p.detach()).to(p.dtype());
}

Tensor bernoulli(const Tensor& t, double p, Generator* gen) {
  DLTRAIN_CHECK(p >= 0 && p <= 1, "bernoulli: p must be in [0, 1] but is ", p);
  DLTRAIN_CHECK(t.defined() && is_floating(t.dtype()),
                "bernoulli: the tensor must be floating (its dtype is the result's)");
  return lt(rand_like(t, gen), p).to(t.dtype());
}

Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement, Generator* gen) {
  DLTRAIN_CHECK(
      probs.defined() && is_floating(probs.dtype()) && (probs.dim() == 1 || probs.dim() == 2),
      "multinomial: probs must be a floating [K] or [R, K] tensor but is ",
      probs.defined() ? shape_str(probs.shape()) : std::string("undefined"));
  const bool one = probs.dim() == 1;
  Tensor p = one ? probs.detach().unsqueeze(0) : probs.detach();
  if (p.dtype() == DType::f16 || p.dtype() == DType::bf16) p = p.to(DType::f32);
  const int64_t R = p.size(0), K = p.size(1);
  DLTRAIN_CHECK(num_samples > 0, "multinomial: num_samples must be positive but is ", num_samples);
  DLTRAIN_CHECK(K > 0, "multinomial: probs ", shape_str(probs.shape()), " has no categories");
  DLTRAIN_CHECK(replacement || num_samples <= K, "multinomial: cannot draw ", num_samples,
                " samples without replacement from ", K,
                " categories; pass replacement = true or fewer samples");
  if (p.device().is_cpu()) {
    const Tensor pd = p.to(DType::f64).contiguous();
    const double* v = pd.data<double>();
    for (int64_t r = 0; r < R; ++r) {
      int64_t nonzero = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double w = v[r * K + k];
        DLTRAIN_CHECK(std::isfinite(w) && w >= 0, "multinomial: row ", r, " of probs holds ", w,
                      "; weights must be finite and non-negative");
        nonzero += w > 0;
      }
      DLTRAIN_CHECK(nonzero > 0, "multinomial: row ", r, " of probs sums to zero");
      DLTRAIN_CHECK(replacement || nonzero >= num_samples, "multinomial: row ", r, " has only ",
                    nonzero, " non-zero categories, fewer than the ", num_samples,
                    " samples asked without replacement");
    }
  }
  Generator& g = gen ? *gen : default_generator();
  const uint64_t seed = g.seed();
  const uint64_t base = g.reserve(static_cast<uint64_t>((R * num_samples + 1) / 2));
  Tensor out = empty({R, num_samples}, TensorOptions(DType::i64).with_device(p.device()));
  if (p.device().is_cuda()) {
    Tensor taken;
    if (!replacement) {
      taken = empty({R, K}, TensorOptions(DType::u8).with_device(p.device()));
      taken.zero_();
    }
    backend::cuda::multinomial(out, p, replacement, seed, base, taken);
  } else {
    int64_t* o = out.data<int64_t>();
    dispatch_floating(p.dtype(), "multinomial", [&]<class T>() {
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        const T* pp = static_cast<const T*>(p.data_ptr());
        const int64_t sr = p.stride(0), sk = p.stride(1);
        parallel_for(0, R, 1, [&](int64_t b, int64_t e) {
          std::vector<uint8_t> taken(static_cast<size_t>(replacement ? 0 : K));
          for (int64_t r = b; r < e; ++r) {
            std::fill(taken.begin(), taken.end(), uint8_t{0});
            sampling::multinomial_row(pp + r * sr, sk, K, num_samples, replacement, seed, base, r,
                                      o + r * num_samples, 1, taken.data());
          }
        });
      }
    });
  }
  return one ? out.squeeze(0) : out;
}

}  // namespace dltrain
