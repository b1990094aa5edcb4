// The issue-14 ops on CUDA against the CPU: conv_transpose2d (cuDNN backward-data as forward,
// NCHW and channels-last, stride, padding, output_padding, dilation, groups, bias), and the
// resampling, activation and loss ops. Forward and every input gradient from the same random
// inputs; f32 without TF32 (tight), with TF32 (looser), f16/bf16 against the CPU's f32 result
// of the same rounded inputs, f64. Errors are measured relative to the largest reference value.
// GPU-only: without a GPU tests/cuda/main.cpp exits with ctest's skip code.
#include <catch2/catch.hpp>

#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "tests/cuda/cuda_test_util.hpp"

using namespace dltrain;
using namespace dltrain::test;

namespace {

using V = std::vector<Tensor>;
using Fn = std::function<Tensor(const V&)>;
const MemoryFormat kCL = MemoryFormat::ChannelsLast;

Tensor rnd(const Shape& s, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  Generator g(seed);
  return add(mul(randn(s, DType::f32, &g), scale), shift);
}

struct Run {
  Tensor out;  // on the CPU, f64
  MemoryFormat fmt;
  V grads;  // on the CPU, f64 (undefined where no gradient)
};

// f on copies of `inputs` on dev; floating inputs listed in `diff` become leaves requiring
// grad; backward from the output with seed gy.
Run run_on(Device dev, const Fn& f, const V& inputs, const std::vector<bool>& diff,
           const Tensor& gy) {
  V leaves;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor l = dev.is_cpu() ? inputs[i].clone() : inputs[i].to(dev);
    l = l.contiguous(inputs[i].suggest_memory_format()).detach();
    if (diff[i] && is_floating(l.dtype())) l.requires_grad_();
    leaves.push_back(l);
  }
  const Tensor out = f(leaves);
  REQUIRE(out.device() == dev);
  Run r{out.detach().to(Device::cpu()).to(DType::f64), out.suggest_memory_format(), {}};
  if (out.requires_grad()) out.backward(gy.to(out.dtype()).to(dev));
  for (const Tensor& l : leaves)
    r.grads.push_back(l.grad().defined() ? l.grad().to(Device::cpu()).to(DType::f64) : Tensor());
  return r;
}

double tol_for(DType dt, double f32_tol) {
  switch (dt) {
    case DType::f16:
      return 5e-3;
    case DType::bf16:
      return 3e-2;
    case DType::f64:
      return 1e-11;
    default:
      return cuda::allow_tf32() ? 5e-3 : f32_tol;
  }
}

// f on the CPU and on the GPU from the same inputs (floating ones rounded to dt; the CPU
// reference computes in f32 from the rounded values for 16-bit dtypes). Compares the output,
// its memory format and the gradients of the inputs marked in diff (all floating by default).
void check(const std::string& name, const Fn& f, const V& inputs, DType dt,
           std::vector<bool> diff = {}, double f32_tol = 1e-5) {
  if (diff.empty()) diff.assign(inputs.size(), true);
  const double tol = tol_for(dt, f32_tol);
  const DType ref_dt = ref_dtype(dt);
  V in_dt, in_ref;
  for (const Tensor& t : inputs) {
    const bool fl = is_floating(t.dtype());
    const MemoryFormat fmt = t.suggest_memory_format();
    in_dt.push_back(fl ? t.to(dt).contiguous(fmt) : t);
    in_ref.push_back(fl ? t.to(dt).to(ref_dt).contiguous(fmt) : t);
  }
  Tensor probe;
  {
    NoGradGuard ng;
    probe = f(in_ref);
  }
  const Tensor gy = rnd(probe.shape(), 1000).to(dt).to(ref_dt);
  const Run want = run_on(Device::cpu(), f, in_ref, diff, gy);
  const Run got = run_on(kCuda, f, in_dt, diff, gy);
  const std::string tag = name + " [" + dtype_name(dt) + "]";
  check_close(got.out, want.out, 0, 0, tag + " output", tol);
  {
    INFO(tag << " output memory format");
    CHECK(got.fmt == want.fmt);
  }
  for (size_t i = 0; i < want.grads.size(); ++i) {
    INFO(tag << " grad of input " << i);
    REQUIRE(got.grads[i].defined() == want.grads[i].defined());
    if (want.grads[i].defined())
      check_close(got.grads[i], want.grads[i], 0, 0, tag + " grad of input " + std::to_string(i),
                  tol);
  }
}

// check() in f32 without and with TF32, f16, bf16 and f64.
void check_all(const std::string& name, const Fn& f, const V& inputs, std::vector<bool> diff = {},
               double f32_tol = 1e-5) {
  {
    Tf32 off(false);
    check(name + " (TF32 off)", f, inputs, DType::f32, diff, f32_tol);
  }
  {
    Tf32 on(true);
    check(name + " (TF32 on)", f, inputs, DType::f32, diff, f32_tol);
  }
  for (DType dt : {DType::f16, DType::bf16, DType::f64}) check(name, f, inputs, dt, diff, f32_tol);
}

struct ConvTCfg {
  int64_t N, Cin, H, W, Cout, kh, kw;
  Int2 stride, pad, opad, dil;
  int64_t groups;
  bool bias;
};

}  // namespace

TEST_CASE("conv_transpose2d on CUDA matches the CPU (NCHW and channels-last)", "[cuda][gpu]") {
  const std::vector<ConvTCfg> cfgs{
      {2, 4, 5, 6, 3, 3, 3, 1, 1, 0, 1, 1, true},
      {2, 8, 7, 7, 4, 4, 4, 2, 1, 0, 1, 1, true},   // DCGAN-style 4x4/2
      {3, 4, 5, 4, 6, 3, 3, 2, 1, 1, 1, 2, false},  // output_padding, groups
      {2, 3, 4, 5, 4, 3, 2, {2, 3}, {0, 1}, {1, 2}, {2, 1}, 1, true},
      {2, 16, 6, 6, 16, 3, 3, 2, 1, 1, 1, 16, true},  // depthwise
      {1, 2, 4, 5, 3, 3, 3, 1, 1, 1, 2, 1, true},     // output_padding >= stride
      {2, 32, 7, 7, 64, 2, 2, 2, 0, 0, 1, 1, false},  // U-Net up-conv
  };
  uint64_t seed = 1;
  for (const ConvTCfg& c : cfgs)
    for (bool cl : {false, true}) {
      Tensor x = rnd({c.N, c.Cin, c.H, c.W}, seed++);
      if (cl) x = x.contiguous(kCL);
      V inputs{x, rnd({c.Cin, c.Cout / c.groups, c.kh, c.kw}, seed++, 0.3)};
      if (c.bias) inputs.push_back(rnd({c.Cout}, seed++));
      std::ostringstream name;
      name << "conv_transpose2d x[" << c.N << "," << c.Cin << "," << c.H << "," << c.W << "] k"
           << c.kh << "x" << c.kw << " s(" << c.stride.h << "," << c.stride.w << ") op(" << c.opad.h
           << "," << c.opad.w << ") d(" << c.dil.h << "," << c.dil.w << ") g" << c.groups
           << (cl ? " channels-last" : " NCHW");
      check_all(
          name.str(),
          [c](const V& in) {
            return conv_transpose2d(in[0], in[1], c.bias ? in[2] : Tensor(), c.stride, c.pad,
                                    c.opad, c.groups, c.dil);
          },
          inputs, {}, 1e-4);
    }
}

TEST_CASE("conv1d on CUDA matches the CPU", "[cuda][gpu]") {
  check_all(
      "conv1d s2 p1 d2 g2", [](const V& in) { return conv1d(in[0], in[1], in[2], 2, 1, 2, 2); },
      {rnd({3, 4, 17}, 41), rnd({6, 2, 3}, 42, 0.3), rnd({6}, 43)}, {}, 1e-4);
}

TEST_CASE("nn::ConvTranspose2d on CUDA under f16 autocast runs in f16", "[cuda][gpu]") {
  nn::ConvTranspose2d up(4, 2, 4, {.stride = 2, .padding = 1});
  up.to(kCuda);
  Tensor x = rnd({2, 4, 5, 5}, 7).to(kCuda);
  Tensor y;
  {
    amp::autocast ac(DeviceType::CUDA);
    y = up.forward(x);
  }
  CHECK(y.dtype() == DType::f16);
  CHECK(y.shape() == Shape{2, 2, 10, 10});
  sum(y.to(DType::f32)).backward();
  CHECK(up.weight.grad().dtype() == DType::f32);
}

TEST_CASE("interpolate, pad and pixel_shuffle on CUDA match the CPU", "[cuda][gpu]") {
  const Tensor x = rnd({2, 3, 5, 6}, 11);
  using IM = InterpolateMode;
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> ops{
      {"nearest x2", [](const Tensor& t) { return interpolate(t, {.scale_factor = 2.0}); }},
      {"nearest to 7x4", [](const Tensor& t) { return interpolate(t, {.size = Int2(7, 4)}); }},
      {"bilinear x2",
       [](const Tensor& t) { return interpolate(t, {.scale_factor = 2.0, .mode = IM::Bilinear}); }},
      {"bilinear to 9x3 align_corners",
       [](const Tensor& t) {
         return interpolate(t, {.size = Int2(9, 3), .mode = IM::Bilinear, .align_corners = true});
       }},
      {"pad constant",
       [](const Tensor& t) {
         return pad(t, {1, 2, -1, 3}, PadMode::Constant, 0.5);
       }},
      {"pad reflect",
       [](const Tensor& t) {
         return pad(t, {2, 1, 3, 0}, PadMode::Reflect);
       }},
      {"pad replicate",
       [](const Tensor& t) {
         return pad(t, {0, 4, 2, 2}, PadMode::Replicate);
       }},
      {"pixel_shuffle",
       [](const Tensor& t) {
         return pixel_shuffle(pad(t, {0, 0, 0, 0, 0, 1}), 2);
       }},
  };
  for (const auto& [name, f] : ops)
    for (bool cl : {false, true})
      for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64})
        check(
            name + (cl ? " channels-last" : " NCHW"), [f = f](const V& in) { return f(in[0]); },
            {cl ? x.contiguous(kCL) : x}, dt);
  // Other ranks and numbers of padded dims (fused [1, P, H, W] kernel; per-dim gather).
  const Tensor x3 = rnd({4, 5, 6}, 12), x1 = rnd({9}, 13);
  for (DType dt : {DType::f32, DType::f64}) {
    check(
        "pad reflect 3-d",
        [](const V& in) {
          return pad(in[0], {2, 1, 1, 3}, PadMode::Reflect);
        },
        {x3}, dt);
    check(
        "pad replicate 1-d",
        [](const V& in) {
          return pad(in[0], {3, 2}, PadMode::Replicate);
        },
        {x1}, dt);
    check(
        "pad reflect, three dims",
        [](const V& in) {
          return pad(in[0], {1, 1, 2, 0, 1, 1}, PadMode::Reflect);
        },
        {x}, dt);
  }
}

TEST_CASE("group_norm and instance_norm on CUDA match the CPU", "[cuda][gpu]") {
  const Tensor x = rnd({3, 6, 5, 4}, 51, 2.0, 0.5), w = rnd({6}, 52), b = rnd({6}, 53);
  for (bool cl : {false, true})
    for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
      const std::string tag = cl ? " channels-last" : " NCHW";
      check(
          "group_norm" + tag, [](const V& in) { return group_norm(in[0], 3, in[1], in[2]); },
          {cl ? x.contiguous(kCL) : x, w, b}, dt);
      check(
          "instance_norm" + tag,
          [](const V& in) { return instance_norm(in[0], {}, {}, in[1], in[2]); },
          {cl ? x.contiguous(kCL) : x, w, b}, dt);
    }
  // Running statistics are updated on the device as on the CPU.
  Tensor rm = zeros({6}), rv = ones({6});
  Tensor rm_gpu = rm.to(kCuda), rv_gpu = rv.to(kCuda);
  instance_norm(x, rm, rv, {}, {}, true, 0.3);
  instance_norm(x.to(kCuda), rm_gpu, rv_gpu, {}, {}, true, 0.3);
  check_close(rm_gpu.to(Device::cpu()), rm, 1e-6, 1e-6, "running_mean");
  check_close(rv_gpu.to(Device::cpu()), rv, 1e-6, 1e-6, "running_var");
}

TEST_CASE("activations and unary math on CUDA match the CPU", "[cuda][gpu]") {
  const Tensor x = rnd({3, 5, 7}, 21, 3.0);
  const Tensor pos = add(abs(x), 0.1);
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> ops{
      {"silu", [](const Tensor& t) { return silu(t); }},
      {"softplus", [](const Tensor& t) { return softplus(t); }},
      {"softplus beta 2 threshold 3", [](const Tensor& t) { return softplus(t, 2.0, 3.0); }},
      {"elu", [](const Tensor& t) { return elu(t, 0.7); }},
      {"mish", [](const Tensor& t) { return mish(t); }},
      {"hardswish", [](const Tensor& t) { return hardswish(t); }},
      {"sin", [](const Tensor& t) { return sin(t); }},
      {"cos", [](const Tensor& t) { return cos(t); }},
      {"expm1", [](const Tensor& t) { return expm1(t); }},
      {"sign", [](const Tensor& t) { return sign(t); }},
  };
  for (const auto& [name, f] : ops)
    for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64})
      check(
          name, [f = f](const V& in) { return f(in[0]); }, {x}, dt);
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64})
    check(
        "log1p", [](const V& in) { return log1p(in[0]); }, {pos}, dt);
  for (DType dt : {DType::f32, DType::f64})
    check(
        "clamp with tensor bounds", [](const V& in) { return clamp(in[0], in[1], in[2]); },
        {x, rnd({5, 1}, 22), add(rnd({7}, 23), 1.0)}, dt);
}

TEST_CASE("logical and / or / xor on CUDA match the CPU", "[cuda][gpu]") {
  const Tensor a = gt(rnd({4, 5}, 61), 0.0), b = gt(rnd({5}, 62), 0.3);
  const Tensor x = rnd({4, 5}, 63);
  for (const auto& [name, f] :
       std::vector<std::pair<std::string, std::function<Tensor(const Tensor&, const Tensor&)>>>{
           {"and", [](const Tensor&p, const Tensor&q) { return logical_and(p, q); }},
           {"or", [](const Tensor&p, const Tensor&q) { return logical_or(p, q); }},
           {"xor", [](const Tensor&p, const Tensor&q) { return logical_xor(p, q); }}}) {
    const Tensor got = f(a.to(kCuda), b.to(kCuda)), mixed = f(x.to(kCuda), b.to(kCuda));
    CHECK(got.dtype() == DType::b8);
    check_close(got.to(Device::cpu()).to(DType::i64), f(a, b).to(DType::i64), 0, 0,
                "logical_" + name);
    check_close(mixed.to(Device::cpu()).to(DType::i64), f(x, b).to(DType::i64), 0, 0,
                "logical_" + name + " mixed");
  }
}

TEST_CASE("regression losses on CUDA match the CPU", "[cuda][gpu]") {
  const Tensor a = rnd({4, 6}, 31), b = rnd({4, 6}, 32), c = rnd({4, 6}, 33);
  for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum})
    for (DType dt : {DType::f32, DType::f64}) {
      check(
          "l1_loss", [red](const V& v) { return l1_loss(v[0], v[1], red); }, {a, b}, dt);
      check(
          "smooth_l1_loss", [red](const V& v) { return smooth_l1_loss(v[0], v[1], red, 0.5); },
          {a, b}, dt);
      check(
          "huber_loss", [red](const V& v) { return huber_loss(v[0], v[1], red, 0.7); }, {a, b}, dt);
      check(
          "binary_cross_entropy",
          [red](const V& v) {
            return binary_cross_entropy(sigmoid(v[0]), sigmoid(v[1]),
                                        {.reduction = red, .weight = sigmoid(v[2])});
          },
          {a, b, c}, dt);
      check(
          "gaussian_nll_loss",
          [red](const V& v) { return gaussian_nll_loss(v[0], v[1], exp(v[2]), true, 1e-6, red); },
          {a, b, c}, dt);
    }
  for (KLDivReduction red :
       {KLDivReduction::None, KLDivReduction::Mean, KLDivReduction::Sum, KLDivReduction::BatchMean})
    for (bool log_target : {false, true})
      for (DType dt : {DType::f32, DType::f64})
        check(
            "kl_div",
            [red, log_target](const V& v) {
              const Tensor t = log_target ? log_softmax(v[1], 1) : softmax(v[1], 1);
              return kl_div(log_softmax(v[0], 1), t, red, log_target);
            },
            {a, b}, dt);
}

TEST_CASE("rand_like and randn_like on CUDA draw on the device what the CPU draws", "[cuda][gpu]") {
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16})
    for (bool normal : {false, true}) {
      INFO(dt_str(dt) << (normal ? " randn_like" : " rand_like"));
      const Tensor like = zeros({3, 4, 5, 7}, TensorOptions(dt).with_device(kCuda)).contiguous(kCL);
      Generator a(21), b(21);
      const Tensor got = normal ? randn_like(like, &a) : rand_like(like, &a);
      CHECK(got.device() == kCuda);
      CHECK(got.dtype() == dt);
      CHECK(got.is_contiguous(kCL));
      const Tensor want = normal ? randn({3, 4, 5, 7}, TensorOptions(dt), &b)
                                 : rand({3, 4, 5, 7}, TensorOptions(dt), &b);
      CHECK(a.offset() == b.offset());
      // f64 normals may differ in the last bit of the device's log/sin/cos.
      check_close(got.to(Device::cpu()).to(DType::f64), want.to(DType::f64),
                  dt == DType::f64 && normal ? 1e-14 : 0, 0, "values");
    }
  // bernoulli on the device draws what the CPU draws.
  Generator g1(8), g2(8);
  const Tensor probs = rand({50, 40});
  check_close(bernoulli(probs.to(kCuda), &g1).to(Device::cpu()), bernoulli(probs, &g2), 0, 0,
              "bernoulli");
  // multinomial on the device draws the CPU's indices, with and without replacement.
  const Tensor weights = add(rand({6, 30}), 0.01);
  for (bool replacement : {false, true})
    for (DType dt : {DType::f32, DType::f64, DType::f16}) {
      Generator m1(4), m2(4);
      const Tensor pw = weights.to(dt);
      check_close(multinomial(pw.to(kCuda), 12, replacement, &m1).to(Device::cpu()),
                  multinomial(pw, 12, replacement, &m2), 0, 0,
                  std::string("multinomial ") + dt_str(dt) + (replacement ? " with" : " without") +
                      " replacement");
    }
  // rand / randn with a CUDA device in the options take the same device path.
  Generator a(5), b(5);
  check_close(randn({1000}, TensorOptions().with_device(kCuda), &a).to(Device::cpu()),
              randn({1000}, TensorOptions(), &b), 0, 0, "randn on cuda");
}
