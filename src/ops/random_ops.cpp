// Random ops built from the random factories and comparisons (the layers below core's
// factories may not call ops, so these live here): bernoulli, drawn on the tensor's device
// as rand_like(p) < p, a pure function of the generator state like every draw.
#include "dltrain/core/generator.hpp"
#include "dltrain/core/tensor.hpp"
#include "dltrain/ops/elementwise.hpp"

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

}  // namespace dltrain
