// Softmax, log_softmax, the losses and dropout on CUDA against the CPU: the same fresh
// random inputs run on both devices, forward and backward (gradients compared), f32/f64
// tight and f16/bf16 within a few units of their precision. Dropout must reproduce the CPU
// mask exactly from the same generator state and advance the generator alike.
// GPU-only: without a GPU, tests/cuda/main.cpp makes every test exit with ctest's skip code.
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "tests/cuda/cuda_test_util.hpp"

using namespace dltrain;

namespace {

const Device kDev = Device::cuda(0);

struct Tol {
  double rtol, atol;
};

Tol tol_for(DType dt) {
  switch (dt) {
    case DType::f64:
      return {1e-10, 1e-12};
    case DType::f16:
      return {1e-2, 2e-3};
    case DType::bf16:
      return {2e-2, 1e-2};
    default:
      return {2e-5, 1e-6};
  }
}

// Every element of `got` (any device) within atol + rtol * |want| of `want` (NaNs must match).
void require_close(const Tensor& got, const Tensor& want, Tol tol, const std::string& what) {
  REQUIRE(got.dtype() == want.dtype());
  dltrain::test::check_close(got, want, tol.rtol, tol.atol, what);
}

// A CPU leaf and its CUDA twin (same values), both requiring grad.
struct Pair {
  Tensor cpu, gpu;
};

Pair leaf_pair(const Tensor& values, bool requires_grad = true) {
  Pair p{values.clone(), values.to(kDev)};
  if (requires_grad) {
    p.cpu.requires_grad_();
    p.gpu.requires_grad_();
  }
  return p;
}

std::string name_of(DType dt) {
  std::ostringstream s;
  s << dt;
  return s.str();
}

const std::vector<DType> kFloat = {DType::f32, DType::f64, DType::f16, DType::bf16};

}  // namespace

TEST_CASE("softmax and log_softmax on CUDA match the CPU over inner and outer dims",
          "[cuda][gpu]") {
  struct Case {
    Shape shape;
    int64_t dim;
  };
  const std::vector<Case> cases = {
      {{64, 10}, 1},        // warp per row
      {{7, 3000}, -1},      // block of 256 per row
      {{3, 20000}, 1},      // block of 1024 per row
      {{4, 5, 6, 7}, 1},    // columns (inner = 42)
      {{2, 300, 3}, 1},     // few long columns: transposed to rows
      {{9, 5}, 0},          // reduce the outer dim
      {{1000, 4, 257}, 1},  // many short columns
  };
  for (DType dt : kFloat) {
    for (bool log : {false, true}) {
      for (const Case& c : cases) {
        const std::string what = name_of(dt) + (log ? " log_softmax " : " softmax ") +
                                 shape_str(c.shape) + " dim " + std::to_string(c.dim);
        Pair x = leaf_pair((randn(c.shape, DType::f64) * 3.0).to(dt));
        Tensor yc = log ? log_softmax(x.cpu, c.dim) : softmax(x.cpu, c.dim);
        Tensor yg = log ? log_softmax(x.gpu, c.dim) : softmax(x.gpu, c.dim);
        REQUIRE(yg.device() == kDev);
        require_close(yg, yc, tol_for(dt), what + " forward");
        Tensor gy = randn(c.shape, DType::f64).to(dt);
        yc.backward(gy);
        yg.backward(gy.to(kDev));
        require_close(x.gpu.grad(), x.cpu.grad(), tol_for(dt), what + " backward");
      }
    }
  }
}

TEST_CASE("softmax on CUDA accepts a non-contiguous input", "[cuda][gpu]") {
  Tensor base = randn({6, 40}, DType::f64).to(DType::f32);
  Tensor yc = softmax(base.t(), 0);
  Tensor yg = softmax(base.to(kDev).t(), 0);
  require_close(yg, yc, tol_for(DType::f32), "transposed input");
}

TEST_CASE("cross_entropy on CUDA matches the CPU with every option", "[cuda][gpu]") {
  const std::vector<Shape> shapes = {{37, 11}, {8, 2000}, {3, 5, 4, 6}};
  for (DType dt : kFloat) {
    for (const Shape& shape : shapes) {
      Shape tshape = shape;
      tshape.erase(tshape.begin() + 1);
      const int64_t C = shape[1];
      for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
        for (double eps : {0.0, 0.1}) {
          for (bool weighted : {false, true}) {
            for (bool ignore : {false, true}) {
              std::ostringstream what;
              what << dt << " " << shape_str(shape) << " reduction " << static_cast<int>(red)
                   << " eps " << eps << " weighted " << weighted << " ignore " << ignore;
              Pair x = leaf_pair((randn(shape, DType::f64) * 2.0).to(dt));
              std::vector<int64_t> tv = randint(0, C, tshape).to_vector<int64_t>();
              const int64_t ignore_index = ignore ? 1 : -100;
              if (ignore)
                for (size_t i = 0; i < tv.size(); i += 3) tv[i] = ignore_index;
              Tensor t = from_vector(tv, tshape);
              Tensor w = uniform({C}, 0.5, 1.5, DType::f32);
              CrossEntropyOptions oc{.reduction = red,
                                     .ignore_index = ignore_index,
                                     .label_smoothing = eps,
                                     .weight = weighted ? w : Tensor()};
              CrossEntropyOptions og = oc;
              if (weighted) og.weight = w.to(kDev);
              Tensor lc = cross_entropy(x.cpu, t, oc);
              Tensor lg = cross_entropy(x.gpu, t.to(kDev), og);
              REQUIRE(lg.device() == kDev);
              require_close(lg, lc, tol_for(dt), what.str() + " loss");
              if (red == Reduction::None) {
                Tensor gy = randn(lc.shape(), DType::f64).to(dt);
                lc.backward(gy);
                lg.backward(gy.to(kDev));
              } else {
                lc.backward();
                lg.backward();
              }
              require_close(x.gpu.grad(), x.cpu.grad(), tol_for(dt), what.str() + " grad");
            }
          }
        }
      }
    }
  }
}

TEST_CASE("cross_entropy on CUDA: unbatched input, int32 targets, all targets ignored",
          "[cuda][gpu]") {
  Pair x = leaf_pair(randn({7}, DType::f64).to(DType::f32));
  Tensor t = scalar_tensor(3.0, DType::i64);
  Tensor lc = cross_entropy(x.cpu, t);
  Tensor lg = cross_entropy(x.gpu, t.to(kDev));
  REQUIRE(lg.dim() == 0);
  require_close(lg, lc, tol_for(DType::f32), "unbatched");
  lc.backward();
  lg.backward();
  require_close(x.gpu.grad(), x.cpu.grad(), tol_for(DType::f32), "unbatched grad");

  Pair y = leaf_pair(randn({5, 4}, DType::f64).to(DType::f32));
  Tensor t32 = from_vector(std::vector<int32_t>{0, 3, 2, 1, 3});
  require_close(cross_entropy(y.gpu, t32.to(kDev)), cross_entropy(y.cpu, t32), tol_for(DType::f32),
                "int32 targets");

  // Mean over zero total weight is 0/0 = NaN on both devices, as in PyTorch.
  Tensor all_ignored = full({5}, -100.0, DType::i64);
  require_close(cross_entropy(y.gpu, all_ignored.to(kDev)), cross_entropy(y.cpu, all_ignored),
                tol_for(DType::f32), "all ignored");
}

TEST_CASE("cross_entropy with class probabilities on CUDA matches the CPU", "[cuda][gpu]") {
  // The CUDA path is a composite of CUDA ops (log_softmax's fused kernel, elementwise, sum),
  // the CPU one a fused loop: both gradients (logits and target) must agree.
  const std::vector<Shape> shapes = {{37, 11}, {8, 2000}, {3, 5, 4, 6}, {9}};
  for (DType dt : kFloat) {
    for (const Shape& shape : shapes) {
      const int64_t C = shape.size() == 1 ? shape[0] : shape[1];
      for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
        for (bool smooth_weight : {false, true}) {
          std::ostringstream what;
          what << dt << " " << shape_str(shape) << " reduction " << static_cast<int>(red)
               << " smoothing+weight " << smooth_weight;
          Pair x = leaf_pair((randn(shape, DType::f64) * 2.0).to(dt));
          Pair t = leaf_pair(softmax(randn(shape, DType::f64), shape.size() == 1 ? 0 : 1).to(dt));
          Tensor w = uniform({C}, 0.5, 1.5, DType::f32);
          CrossEntropyOptions oc{.reduction = red,
                                 .label_smoothing = smooth_weight ? 0.1 : 0.0,
                                 .weight = smooth_weight ? w : Tensor()};
          CrossEntropyOptions og = oc;
          if (smooth_weight) og.weight = w.to(kDev);
          Tensor lc = cross_entropy(x.cpu, t.cpu, oc);
          Tensor lg = cross_entropy(x.gpu, t.gpu, og);
          REQUIRE(lg.device() == kDev);
          REQUIRE(lg.shape() == lc.shape());
          require_close(lg, lc, tol_for(dt), what.str() + " loss");
          Tensor gy = randn(lc.shape(), DType::f64).to(dt);
          lc.backward(gy);
          lg.backward(gy.to(kDev));
          require_close(x.gpu.grad(), x.cpu.grad(), tol_for(dt), what.str() + " grad logits");
          require_close(t.gpu.grad(), t.cpu.grad(), tol_for(dt), what.str() + " grad target");
        }
      }
    }
  }
}

TEST_CASE("nll_loss on CUDA matches the CPU", "[cuda][gpu]") {
  for (DType dt : kFloat) {
    for (const Shape& shape : {Shape{20, 6}, Shape{2, 6, 3, 5}}) {
      Shape tshape = shape;
      tshape.erase(tshape.begin() + 1);
      for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
        for (bool weighted : {false, true}) {
          std::ostringstream what;
          what << dt << " " << shape_str(shape) << " reduction " << static_cast<int>(red)
               << " weighted " << weighted;
          Pair x = leaf_pair(randn(shape, DType::f64).to(dt));
          std::vector<int64_t> tv = randint(0, shape[1], tshape).to_vector<int64_t>();
          for (size_t i = 0; i < tv.size(); i += 4) tv[i] = 2;  // ignore_index below
          Tensor t = from_vector(tv, tshape);
          Tensor w = uniform({shape[1]}, 0.5, 1.5, DType::f64);
          NLLLossOptions oc{.reduction = red, .ignore_index = 2, .weight = weighted ? w : Tensor()};
          NLLLossOptions og = oc;
          if (weighted) og.weight = w.to(kDev);
          Tensor lc = nll_loss(x.cpu, t, oc);
          Tensor lg = nll_loss(x.gpu, t.to(kDev), og);
          require_close(lg, lc, tol_for(dt), what.str() + " loss");
          if (red == Reduction::None) {
            Tensor gy = randn(lc.shape(), DType::f64).to(dt);
            lc.backward(gy);
            lg.backward(gy.to(kDev));
          } else {
            lc.backward();
            lg.backward();
          }
          require_close(x.gpu.grad(), x.cpu.grad(), tol_for(dt), what.str() + " grad");
        }
      }
    }
  }
}

TEST_CASE("mse_loss on CUDA matches the CPU", "[cuda][gpu]") {
  for (DType dt : {DType::f32, DType::f16}) {
    for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
      Pair x = leaf_pair(randn({6, 7}, DType::f64).to(dt));
      Pair y = leaf_pair(randn({6, 7}, DType::f64).to(dt));
      Tensor lc = mse_loss(x.cpu, y.cpu, red);
      Tensor lg = mse_loss(x.gpu, y.gpu, red);
      require_close(lg, lc, tol_for(dt), "mse forward");
      if (red == Reduction::None) {
        Tensor gy = randn({6, 7}, DType::f64).to(dt);
        lc.backward(gy);
        lg.backward(gy.to(kDev));
      } else {
        lc.backward();
        lg.backward();
      }
      require_close(x.gpu.grad(), x.cpu.grad(), tol_for(dt), "mse grad input");
      require_close(y.gpu.grad(), y.cpu.grad(), tol_for(dt), "mse grad target");
    }
  }
}

TEST_CASE("binary_cross_entropy_with_logits on CUDA matches the CPU", "[cuda][gpu]") {
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
      for (bool with_pw : {false, true}) {
        std::ostringstream what;
        what << dt << " reduction " << static_cast<int>(red) << " pos_weight " << with_pw;
        Pair x = leaf_pair((randn({8, 5}, DType::f64) * 4.0).to(dt));
        Pair y = leaf_pair(rand({8, 5}, DType::f64).to(dt));
        Pair pw = leaf_pair(uniform({5}, 0.5, 3.0, DType::f64).to(dt));
        Tensor lc = binary_cross_entropy_with_logits(
            x.cpu, y.cpu, {.reduction = red, .pos_weight = with_pw ? pw.cpu : Tensor()});
        Tensor lg = binary_cross_entropy_with_logits(
            x.gpu, y.gpu, {.reduction = red, .pos_weight = with_pw ? pw.gpu : Tensor()});
        require_close(lg, lc, tol_for(dt), what.str() + " forward");
        if (red == Reduction::None) {
          Tensor gy = randn({8, 5}, DType::f64).to(dt);
          lc.backward(gy);
          lg.backward(gy.to(kDev));
        } else {
          lc.backward();
          lg.backward();
        }
        require_close(x.gpu.grad(), x.cpu.grad(), tol_for(dt), what.str() + " grad logits");
        require_close(y.gpu.grad(), y.cpu.grad(), tol_for(dt), what.str() + " grad target");
        if (with_pw)
          require_close(pw.gpu.grad(), pw.cpu.grad(), tol_for(dt), what.str() + " grad pw");
      }
    }
  }
}

TEST_CASE("dropout on CUDA draws the CPU's mask from the same generator state", "[cuda][gpu]") {
  for (DType dt : kFloat) {
    for (const Shape& shape : {Shape{33, 17}, Shape{1}, Shape{2, 3, 5, 7}}) {
      for (double p : {0.1, 0.5, 0.9}) {
        std::ostringstream what;
        what << dt << " " << shape_str(shape) << " p " << p;
        INFO(what.str());
        Tensor values = randn(shape, DType::f64).to(dt);
        if (shape.size() == 4) values = values.contiguous(MemoryFormat::ChannelsLast);
        Pair x = leaf_pair(values);
        Generator gc(1234), gg(1234);
        gc.set_offset(77);
        gg.set_offset(77);
        Tensor yc = dropout(x.cpu, p, true, &gc);
        Tensor yg = dropout(x.gpu, p, true, &gg);
        REQUIRE(gc.offset() == gg.offset());
        // The mask: identical zero patterns (inputs are nonzero almost surely).
        const std::vector<double> vc = yc.to_vector<double>();
        const std::vector<double> vg = yg.to(Device::cpu()).to_vector<double>();
        for (size_t i = 0; i < vc.size(); ++i) REQUIRE((vc[i] == 0.0) == (vg[i] == 0.0));
        require_close(yg, yc, {1e-6, 0.0}, what.str() + " values");
        Tensor gy = randn(shape, DType::f64).to(dt);
        yc.backward(gy);
        yg.backward(gy.to(kDev));
        require_close(x.gpu.grad(), x.cpu.grad(), {1e-6, 0.0}, what.str() + " grad");
      }
    }
  }
  // The default generator advances alike.
  Tensor x = randn({1000}, DType::f32);
  manual_seed(99);
  Tensor yc = dropout(x, 0.3);
  const uint64_t offset = default_generator().offset();
  manual_seed(99);
  Tensor yg = dropout(x.to(kDev), 0.3);
  REQUIRE(default_generator().offset() == offset);
  REQUIRE(yg.to(Device::cpu()).to_vector<float>() == yc.to_vector<float>());
  // Evaluation mode and p = 0 return the input itself.
  REQUIRE(dropout(x.to(kDev), 0.3, false).device() == kDev);
}
