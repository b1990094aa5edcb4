// MixUp, CutMix and the Gamma/Beta samplers behind them (see the header).
//
// The samplers draw Philox blocks from a Generator (one 128-bit counter gives two 53-bit
// uniforms), so a seed fixes every lambda and box. The mixing itself is written with tensor
// ops in torchvision's order (roll(x).mul(1 - lambda).add(x.mul(lambda))), so a float32 batch
// mixes to the same values torchvision computes.
#include "dltrain/data/mix.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/indexing.hpp"
#include "dltrain/ops/shape.hpp"

namespace dltrain::data {

namespace {

Generator& gen_or_default(Generator* g) { return g ? *g : default_generator(); }

// Uniform doubles in [0, 1) (53 bits) from consecutive Philox blocks of a Generator.
class UniformStream {
 public:
  explicit UniformStream(Generator& g) : g_(g) {}
  double next() {
    if (used_ == 4) {
      block_ = philox4x32(g_.reserve(1), 0, g_.seed());
      used_ = 0;
    }
    const uint64_t hi = block_[used_], lo = block_[used_ + 1];
    used_ += 2;
    const uint64_t x = ((hi << 32) | lo) >> 11;
    return static_cast<double>(x) * 0x1.0p-53;
  }
  // Uniform in (0, 1]: safe under log.
  double open_low() { return 1.0 - next(); }
  // Standard normal (Box-Muller; one of the pair is used).
  double normal() {
    const double u1 = open_low(), u2 = next();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  Generator& g_;
  std::array<uint32_t, 4> block_{};
  int used_ = 4;
};

// log of a Gamma(shape, 1) draw: Marsaglia & Tsang (2000) for shape >= 1; for shape < 1,
// Gamma(shape) = Gamma(shape + 1) U^(1/shape), kept in logs (U^(1/shape) underflows for small
// shapes).
double log_gamma_draw(double shape, UniformStream& u) {
  if (shape < 1.0) return log_gamma_draw(shape + 1.0, u) + std::log(u.open_low()) / shape;
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x, v;
    do {
      x = u.normal();
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double lu = std::log(u.open_low());
    if (lu < 0.5 * x * x + d - d * v + d * std::log(v)) return std::log(d * v);
  }
}

void check_batch(const char* op, const Tensor& images, const Tensor& labels, int64_t num_classes,
                 int64_t min_dim) {
  DLTRAIN_CHECK(images.defined() && labels.defined(), op, ": images and labels must be defined");
  DLTRAIN_CHECK(is_floating(images.dtype()), op, ": images must be floating-point but have dtype ",
                images.dtype(), "; normalise the u8 batch first (data::normalize_batch or .to)");
  DLTRAIN_CHECK(images.dim() >= min_dim, op, ": expected a batch of images [N, C, H, W] but got ",
                shape_str(images.shape()));
  DLTRAIN_CHECK(images.device() == labels.device(), op, ": images are on ", images.device(),
                " but labels on ", labels.device());
  if (labels.dim() == 1) {
    DLTRAIN_CHECK(labels.dtype() == DType::i64 || labels.dtype() == DType::i32, op,
                  ": labels [N] must be class indices (int64) but have dtype ", labels.dtype());
  } else {
    DLTRAIN_CHECK(labels.dim() == 2 && is_floating(labels.dtype()), op,
                  ": labels must be class indices [N] (int64) or probabilities [N, num_classes] "
                  "(floating) but are ",
                  shape_str(labels.shape()), " of dtype ", labels.dtype());
    DLTRAIN_CHECK(labels.size(1) == num_classes, op, ": labels have ", labels.size(1),
                  " classes but num_classes is ", num_classes);
  }
  DLTRAIN_CHECK(labels.size(0) == images.size(0), op, ": the batch has ", images.size(0),
                " images but ", labels.size(0), " labels");
}

// torchvision's _mixup_label: one-hot (f32) then roll(y).mul(1 - lambda).add(y.mul(lambda)).
Tensor mix_labels(const Tensor& labels, int64_t num_classes, double lambda) {
  const Tensor y =
      labels.dim() == 1 ? one_hot(labels.to(DType::i64), num_classes).to(DType::f32) : labels;
  return add(mul(roll(y, {1}, {0}), 1.0 - lambda), mul(y, lambda));
}

void check_alpha(const char* op, int64_t num_classes, double alpha) {
  DLTRAIN_CHECK(num_classes > 0, op, ": num_classes must be positive but is ", num_classes);
  DLTRAIN_CHECK(alpha > 0.0 && std::isfinite(alpha), op, ": alpha must be positive but is ", alpha);
}

}  // namespace

double sample_gamma(double shape, Generator* gen) {
  DLTRAIN_CHECK(shape > 0.0 && std::isfinite(shape), "sample_gamma: shape must be positive but is ",
                shape);
  UniformStream u(gen_or_default(gen));
  return std::exp(log_gamma_draw(shape, u));
}

double sample_beta(double a, double b, Generator* gen) {
  DLTRAIN_CHECK(a > 0.0 && b > 0.0 && std::isfinite(a) && std::isfinite(b),
                "sample_beta: a and b must be positive but are ", a, " and ", b);
  UniformStream u(gen_or_default(gen));
  const double lx = log_gamma_draw(a, u), ly = log_gamma_draw(b, u);
  // X / (X + Y) = 1 / (1 + exp(ly - lx)).
  return 1.0 / (1.0 + std::exp(ly - lx));
}

MixUp::MixUp(int64_t num_classes, double alpha) : num_classes_(num_classes), alpha_(alpha) {
  check_alpha("MixUp", num_classes, alpha);
}

MixedBatch MixUp::operator()(const Tensor& images, const Tensor& labels, Generator* gen) const {
  return apply(images, labels, sample_beta(alpha_, alpha_, gen));
}

MixedBatch MixUp::apply(const Tensor& images, const Tensor& labels, double lambda) const {
  check_batch("MixUp", images, labels, num_classes_, 2);
  DLTRAIN_CHECK(lambda >= 0.0 && lambda <= 1.0, "MixUp: lambda must be in [0, 1] but is ", lambda);
  NoGradGuard ng;
  MixedBatch out;
  out.images = add(mul(roll(images, {1}, {0}), 1.0 - lambda), mul(images, lambda));
  out.labels = mix_labels(labels, num_classes_, lambda);
  return out;
}

CutMix::CutMix(int64_t num_classes, double alpha) : num_classes_(num_classes), alpha_(alpha) {
  check_alpha("CutMix", num_classes, alpha);
}

CutMixBox CutMix::box_for(int64_t height, int64_t width, double lambda, int64_t cx, int64_t cy) {
  DLTRAIN_CHECK(height > 0 && width > 0 && cx >= 0 && cx < width && cy >= 0 && cy < height,
                "CutMix: centre (", cx, ", ", cy, ") must lie in the ", height, " x ", width,
                " image");
  DLTRAIN_CHECK(lambda >= 0.0 && lambda <= 1.0, "CutMix: lambda must be in [0, 1] but is ", lambda);
  const double r = 0.5 * std::sqrt(1.0 - lambda);
  const auto rw = static_cast<int64_t>(r * static_cast<double>(width));  // int(): truncation
  const auto rh = static_cast<int64_t>(r * static_cast<double>(height));
  return {std::max<int64_t>(cx - rw, 0), std::max<int64_t>(cy - rh, 0),
          std::min<int64_t>(cx + rw, width), std::min<int64_t>(cy + rh, height)};
}

MixedBatch CutMix::operator()(const Tensor& images, const Tensor& labels, Generator* gen) const {
  check_batch("CutMix", images, labels, num_classes_, 3);
  const int64_t H = images.size(images.dim() - 2), W = images.size(images.dim() - 1);
  Generator& g = gen_or_default(gen);
  const double lambda = sample_beta(alpha_, alpha_, &g);
  // torchvision draws r_x = randint(W) then r_y = randint(H).
  UniformStream u(g);
  const auto cx = std::min<int64_t>(static_cast<int64_t>(u.next() * static_cast<double>(W)), W - 1);
  const auto cy = std::min<int64_t>(static_cast<int64_t>(u.next() * static_cast<double>(H)), H - 1);
  return apply(images, labels, box_for(H, W, lambda, cx, cy));
}

MixedBatch CutMix::apply(const Tensor& images, const Tensor& labels, const CutMixBox& box) const {
  check_batch("CutMix", images, labels, num_classes_, 3);
  const int64_t H = images.size(images.dim() - 2), W = images.size(images.dim() - 1);
  DLTRAIN_CHECK(box.x1 >= 0 && box.x1 <= box.x2 && box.x2 <= W && box.y1 >= 0 && box.y1 <= box.y2 &&
                    box.y2 <= H,
                "CutMix: box x [", box.x1, ", ", box.x2, ") y [", box.y1, ", ", box.y2,
                ") is not inside the ", H, " x ", W, " image");
  NoGradGuard ng;
  MixedBatch out;
  out.images = images.clone();
  const int64_t d = images.dim();
  if (box.area() > 0) {
    const Tensor rolled = roll(images, {1}, {0});
    out.images.narrow(d - 2, box.y1, box.y2 - box.y1)
        .narrow(d - 1, box.x1, box.x2 - box.x1)
        .copy_(
            rolled.narrow(d - 2, box.y1, box.y2 - box.y1).narrow(d - 1, box.x1, box.x2 - box.x1));
  }
  const double lambda =
      1.0 - static_cast<double>(box.area()) / (static_cast<double>(W) * static_cast<double>(H));
  out.labels = mix_labels(labels, num_classes_, lambda);
  return out;
}

MixUpOrCutMix::MixUpOrCutMix(MixUp mixup, CutMix cutmix, double p_mixup)
    : mixup_(mixup), cutmix_(cutmix), p_mixup_(p_mixup) {
  DLTRAIN_CHECK(p_mixup >= 0.0 && p_mixup <= 1.0,
                "MixUpOrCutMix: p_mixup must be in [0, 1] but is ", p_mixup);
  DLTRAIN_CHECK(mixup.num_classes() == cutmix.num_classes(),
                "MixUpOrCutMix: MixUp has num_classes ", mixup.num_classes(), " but CutMix ",
                cutmix.num_classes());
}

MixedBatch MixUpOrCutMix::operator()(const Tensor& images, const Tensor& labels,
                                     Generator* gen) const {
  Generator& g = gen_or_default(gen);
  UniformStream u(g);
  return u.next() < p_mixup_ ? mixup_(images, labels, &g) : cutmix_(images, labels, &g);
}

}  // namespace dltrain::data
