// Convolution, batch norm, layer norm and pooling on CUDA (cuDNN and the dnn kernels) against
// the CPU: forward and backward from the same random inputs, NCHW and channels-last, stride,
// padding, dilation, groups, bias, odd sizes, ceil_mode, count_include_pad; f32 without TF32
// (tight), with TF32 (looser), f16/bf16 against the CPU f32 result of the same rounded inputs,
// f64; output memory formats; running statistics; a tiny conv-bn-relu-pool-linear net;
// deterministic algorithms; cuDNN's direct bf16 batch norm against the f32 copies ("[bf16_bn]").
// Errors are measured relative to the largest reference value of each tensor.
// GPU-only: without a GPU tests/cuda/main.cpp exits with ctest's skip code.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "tests/cuda/cuda_test_util.hpp"

using namespace dltrain;
using namespace dltrain::test;

namespace {

using V = std::vector<Tensor>;
using Fn = std::function<V(const V&)>;

Device gpu() { return Device::cuda(0); }
const MemoryFormat kCL = MemoryFormat::ChannelsLast;

Tensor rnd(const Shape& s, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  Generator g(seed);
  return add(mul(randn(s, DType::f32, &g), scale), shift);
}

// Sets one of dltrain::cuda's switches for a scope and puts its previous value back.
template <bool (*Get)(), void (*Set)(bool)>
struct Switch {
  bool prev;
  explicit Switch(bool on) : prev(Get()) { Set(on); }
  ~Switch() { Set(prev); }
};
using Benchmark = Switch<cuda::cudnn_benchmark, cuda::set_cudnn_benchmark>;
using Deterministic = Switch<cuda::cudnn_deterministic, cuda::set_cudnn_deterministic>;
using Bf16Bn = Switch<cuda::cudnn_bf16_batch_norm, cuda::set_cudnn_bf16_batch_norm>;

bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }

struct Run {
  V outs, grads;  // on the CPU, f64 (integer outputs keep their dtype)
  std::vector<MemoryFormat> out_fmts;
};

// f on copies of `inputs` moved to dev as leaves requiring grad (the floating ones), then
// backward from the floating outputs with seeds `gys`.
Run run_on(Device dev, const Fn& f, const V& inputs, const V& gys) {
  V leaves;
  for (const Tensor& t : inputs) {
    Tensor l = dev.is_cpu() ? t.clone() : t.to(dev);
    if (is_floating(l.dtype())) l.requires_grad_();
    leaves.push_back(l);
  }
  const V outs = f(leaves);
  V roots, seeds;
  for (size_t i = 0; i < outs.size(); ++i) {
    REQUIRE(outs[i].device() == dev);
    if (!is_floating(outs[i].dtype())) continue;
    roots.push_back(outs[i]);
    seeds.push_back(gys[i].to(outs[i].dtype()).to(dev));
  }
  autograd::backward(roots, seeds);
  Run r;
  for (const Tensor& o : outs) {
    r.out_fmts.push_back(o.suggest_memory_format());
    const Tensor c = o.detach().to(Device::cpu());
    r.outs.push_back(is_floating(c.dtype()) ? c.to(DType::f64) : c);
  }
  for (const Tensor& l : leaves)
    r.grads.push_back(l.grad().defined() ? l.grad().to(Device::cpu()).to(DType::f64) : Tensor());
  return r;
}

// Every element within tol * max|reference| (dltrain::test::check_close with a norm bound).
void require_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  check_close(got, want, 0, 0, what, tol);
}

double tol_for(DType dt) {
  switch (dt) {
    case DType::f16:
      return 5e-3;
    case DType::bf16:
      return 3e-2;
    case DType::f64:
      return 1e-11;
    default:
      return cuda::allow_tf32() ? 5e-3 : 1e-4;
  }
}

// f on the CPU and on the GPU from the same inputs. Inputs with convert[i] are rounded to dt
// (the CPU reference computes in f32 from the rounded values for 16-bit dtypes); the others
// are passed as they are. Compares outputs, their memory formats and all input gradients.
void check(const std::string& name, const Fn& f, const V& inputs, DType dt,
           std::vector<bool> convert = {}, double tol = -1) {
  if (convert.empty()) convert.assign(inputs.size(), true);
  if (tol < 0) tol = tol_for(dt);
  const DType ref_dt = ref_dtype(dt);
  V in_dt, in_ref;
  for (size_t i = 0; i < inputs.size(); ++i) {
    in_dt.push_back(convert[i] ? inputs[i].to(dt) : inputs[i]);
    in_ref.push_back(convert[i] ? inputs[i].to(dt).to(ref_dt) : inputs[i]);
  }
  V probe;
  {
    NoGradGuard ng;
    probe = f(in_ref);
  }
  V gys;
  for (size_t i = 0; i < probe.size(); ++i)
    gys.push_back(rnd(probe[i].shape(), 1000 + i).to(dt).to(ref_dt));
  const Run want = run_on(Device::cpu(), f, in_ref, gys);
  const Run got = run_on(gpu(), f, in_dt, gys);
  const std::string tag = name + " [" + dtype_name(dt) + "]";
  for (size_t i = 0; i < want.outs.size(); ++i) {
    require_close(got.outs[i], want.outs[i], tol, tag + " output " + std::to_string(i));
    INFO(tag << " output " << i << " memory format");
    REQUIRE(got.out_fmts[i] == want.out_fmts[i]);
  }
  for (size_t i = 0; i < want.grads.size(); ++i) {
    if (!want.grads[i].defined()) {
      REQUIRE_FALSE(got.grads[i].defined());
      continue;
    }
    require_close(got.grads[i], want.grads[i], tol, tag + " grad of input " + std::to_string(i));
  }
}

// check() in f32 without and with TF32, f16, bf16 and f64.
void check_all(const std::string& name, const Fn& f, const V& inputs,
               std::vector<bool> convert = {}) {
  {
    Tf32 off(false);
    check(name + " (TF32 off)", f, inputs, DType::f32, convert);
  }
  {
    Tf32 on(true);
    check(name + " (TF32 on)", f, inputs, DType::f32, convert);
  }
  for (DType dt : {DType::f16, DType::bf16, DType::f64}) check(name, f, inputs, dt, convert);
}

struct ConvCfg {
  int64_t N, Cin, H, W, Cout, kh, kw;
  Int2 stride, pad, dil;
  int64_t groups;
  bool bias;
};

std::string conv_name(const ConvCfg& c, bool cl) {
  std::ostringstream os;
  os << "conv2d x[" << c.N << "," << c.Cin << "," << c.H << "," << c.W << "] w[" << c.Cout << ","
     << c.Cin / c.groups << "," << c.kh << "," << c.kw << "] s(" << c.stride.h << "," << c.stride.w
     << ") p(" << c.pad.h << "," << c.pad.w << ") d(" << c.dil.h << "," << c.dil.w << ") g"
     << c.groups << (c.bias ? " bias" : "") << (cl ? " channels-last" : " NCHW");
  return os.str();
}

void check_conv(const ConvCfg& c, bool cl, bool weight_cl, uint64_t seed) {
  Tensor x = rnd({c.N, c.Cin, c.H, c.W}, seed);
  Tensor w = rnd({c.Cout, c.Cin / c.groups, c.kh, c.kw}, seed + 1, 0.3);
  if (cl) x = x.contiguous(kCL);
  if (weight_cl) w = w.contiguous(kCL);
  V inputs{x, w};
  if (c.bias) inputs.push_back(rnd({c.Cout}, seed + 2));
  const Fn f = [c](const V& in) {
    return V{conv2d(in[0], in[1], c.bias ? in[2] : Tensor(), c.stride, c.pad, c.dil, c.groups)};
  };
  check_all(conv_name(c, cl), f, inputs);
}

const std::vector<ConvCfg>& conv_cfgs() {
  static const std::vector<ConvCfg> cfgs{
      {2, 3, 9, 11, 5, 3, 3, 1, 1, 1, 1, true},
      {3, 4, 10, 7, 6, 3, 2, {2, 1}, {1, 0}, 1, 2, true},
      {2, 6, 13, 12, 6, 3, 3, 2, 2, 2, 3, false},
      {1, 8, 7, 7, 16, 1, 1, 1, 0, 1, 1, true},
      {2, 16, 15, 15, 16, 3, 3, 1, 1, 1, 16, true},  // depthwise
      {4, 3, 32, 30, 8, 7, 7, 2, 3, 1, 1, false},    // ResNet-like stem
      {2, 5, 8, 9, 7, 5, 5, 1, 0, {1, 2}, 1, true},  // anisotropic dilation
      {2, 32, 14, 14, 64, 3, 3, 2, 1, 1, 1, false},  // tensor-core friendly channels
  };
  return cfgs;
}

// batch_norm with running statistics on each device; compares outputs, gradients and the
// updated statistics.
void check_batch_norm(const Shape& shape, bool cl, bool affine, bool training, DType dt,
                      uint64_t seed) {
  const int64_t C = shape[1];
  Tensor x = rnd(shape, seed, 2.0, 0.5);
  if (cl) x = x.contiguous(kCL);
  const Tensor rm0 = rnd({C}, seed + 3, 0.1);
  Generator g(seed + 4);
  const Tensor rv0 = add(rand({C}, DType::f32, &g), 0.5);
  const DType pt = dt == DType::f64 ? DType::f64 : DType::f32;
  Tensor rm_cpu = rm0.to(pt), rv_cpu = rv0.to(pt);
  Tensor rm_gpu = rm0.to(pt).to(gpu()), rv_gpu = rv0.to(pt).to(gpu());
  const Fn f = [&](const V& in) {
    const bool on_gpu = in[0].device().is_cuda();
    return V{batch_norm(in[0], affine ? in[1] : Tensor(), affine ? in[2] : Tensor(),
                        on_gpu ? rm_gpu : rm_cpu, on_gpu ? rv_gpu : rv_cpu, training, 0.3, 1e-5)};
  };
  std::ostringstream name;
  name << "batch_norm " << shape_str(shape) << (cl ? " channels-last" : "")
       << (affine ? " affine" : "") << (training ? " training" : " eval");
  // Parameters stay f32 (f64 for f64 inputs), as in mixed precision.
  const V inputs{x, rnd({C}, seed + 1, 1.0, 1.0).to(pt), rnd({C}, seed + 2).to(pt)};
  // check() runs the forward three times per device (probe, then run_on): reset the
  // statistics so that both devices see the same starting values.
  rm_cpu.copy_(rm0);
  rv_cpu.copy_(rv0);
  check(name.str(), f, inputs, dt, {true, false, false});
  if (training) {
    // The CPU ran the forward twice (probe + run), the GPU once: replay the GPU once more.
    NoGradGuard ng;
    Tensor xg = x.to(dt).to(gpu());
    batch_norm(xg, affine ? inputs[1].to(gpu()) : Tensor(), affine ? inputs[2].to(gpu()) : Tensor(),
               rm_gpu, rv_gpu, true, 0.3, 1e-5);
    const double tol = is_half(dt) ? 1e-3 : 1e-5;
    require_close(rm_gpu.to(Device::cpu()).to(DType::f64), rm_cpu.to(DType::f64), tol,
                  name.str() + " running_mean");
    require_close(rv_gpu.to(Device::cpu()).to(DType::f64), rv_cpu.to(DType::f64), tol,
                  name.str() + " running_var");
  }
}

}  // namespace

TEST_CASE("conv2d on CUDA matches the CPU (NCHW and channels-last)", "[cuda][gpu]") {
  uint64_t seed = 100;
  for (const ConvCfg& c : conv_cfgs()) {
    check_conv(c, false, false, seed);
    check_conv(c, true, true, seed + 10);
    seed += 20;
  }
  // Channels-last input with an NCHW weight (the output follows the input).
  check_conv(conv_cfgs()[0], true, false, 900);
  check_conv(conv_cfgs()[1], false, true, 910);
}

TEST_CASE("conv2d on CUDA in cuDNN benchmark mode matches the CPU", "[cuda][gpu]") {
  Benchmark on(true);
  check_conv(conv_cfgs()[7], true, true, 300);
  check_conv(conv_cfgs()[2], false, false, 310);
}

TEST_CASE("conv2d on CUDA gives a channels-last output for a channels-last input", "[cuda][gpu]") {
  const Tensor x = rnd({2, 8, 6, 6}, 1).contiguous(kCL).to(gpu());
  const Tensor w = rnd({4, 8, 3, 3}, 2).to(gpu());
  REQUIRE(conv2d(x, w, Tensor(), 1, 1).suggest_memory_format() == kCL);
  REQUIRE(conv2d(x.contiguous(), w, Tensor(), 1, 1).is_contiguous());
}

TEST_CASE("batch_norm on CUDA matches the CPU (training, eval, running stats)", "[cuda][gpu]") {
  uint64_t seed = 400;
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64})
    for (bool training : {true, false})
      for (bool affine : {true, false}) {
        check_batch_norm({4, 6, 5, 7}, false, affine, training, dt, seed++);
        check_batch_norm({4, 6, 5, 7}, true, affine, training, dt, seed++);
        check_batch_norm({9, 5}, false, affine, training, dt, seed++);
        check_batch_norm({3, 4, 11}, false, affine, training, dt, seed++);
        check_batch_norm({2, 3, 4, 5, 3}, false, affine, training, dt, seed++);
      }
}

TEST_CASE("batch_norm on CUDA updates f16 running statistics through a copy", "[cuda][gpu]") {
  const Tensor x = rnd({8, 3, 4, 4}, 7);
  Tensor rm_c = zeros({3}), rv_c = ones({3});
  Tensor rm_g = zeros({3}, DType::f16).to(gpu()), rv_g = ones({3}, DType::f16).to(gpu());
  batch_norm(x, Tensor(), Tensor(), rm_c, rv_c, true, 0.1);
  batch_norm(x.to(gpu()), Tensor(), Tensor(), rm_g, rv_g, true, 0.1);
  REQUIRE(rm_g.dtype() == DType::f16);
  require_close(rm_g.to(Device::cpu()).to(DType::f64), rm_c.to(DType::f64), 2e-3,
                "f16 running_mean");
  require_close(rv_g.to(Device::cpu()).to(DType::f64), rv_c.to(DType::f64), 2e-3,
                "f16 running_var");
}

TEST_CASE("layer_norm on CUDA matches the CPU", "[cuda][gpu]") {
  struct Case {
    Shape x, ns;
    bool affine;
  };
  const std::vector<Case> cases{{{6, 37}, {37}, true},
                                {{2, 3, 4, 50}, {4, 50}, true},
                                {{5, 1500}, {1500}, true},
                                {{7, 300}, {300}, false},
                                {{3, 1}, {1}, true}};
  uint64_t seed = 600;
  for (const Case& c : cases) {
    const Fn f = [c](const V& in) {
      return V{
          layer_norm(in[0], c.ns, c.affine ? in[1] : Tensor(), c.affine ? in[2] : Tensor(), 1e-5)};
    };
    const V inputs{rnd(c.x, seed, 2.0, 1.0), rnd(c.ns, seed + 1, 1.0, 1.0), rnd(c.ns, seed + 2)};
    for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
      check("layer_norm " + shape_str(c.x) + " over " + shape_str(c.ns), f, inputs, dt);
      // Parameters kept in f32 while the input is 16-bit (mixed precision).
      if (is_half(dt))
        check("layer_norm f32 params " + shape_str(c.x), f, inputs, dt, {true, false, false});
    }
    seed += 3;
  }
}

TEST_CASE("max_pool2d on CUDA matches the CPU", "[cuda][gpu]") {
  struct Case {
    Shape x;
    Int2 k;
    std::optional<Int2> s;
    Int2 p, d;
    bool ceil;
  };
  const std::vector<Case> cases{
      {{2, 5, 13, 12}, 3, 2, 1, 1, false},            // ResNet's stem pool
      {{2, 4, 8, 10}, 2, std::nullopt, 0, 1, false},  // 2x2/2
      {{2, 3, 9, 11}, 2, std::nullopt, 0, 1, true},   // odd sizes, ceil_mode
      {{1, 6, 10, 9}, {3, 2}, Int2(2, 1), {1, 0}, {2, 1}, false},
      {{2, 3, 11, 11}, 3, 2, 0, 1, true},
      {{3, 2, 5, 5}, 5, 1, 2, 1, false},
  };
  uint64_t seed = 700;
  for (const Case& c : cases)
    for (bool cl : {false, true}) {
      Tensor x = rnd(c.x, seed++);
      if (cl) x = x.contiguous(kCL);
      const std::string name = "max_pool2d " + shape_str(c.x) + (cl ? " channels-last" : "");
      for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
        check(
            name, [c](const V& in) { return V{max_pool2d(in[0], c.k, c.s, c.p, c.d, c.ceil)}; },
            {x}, dt);
        check(
            name + " with indices",
            [c](const V& in) {
              auto [y, i] = max_pool2d_with_indices(in[0], c.k, c.s, c.p, c.d, c.ceil);
              return V{y, i};
            },
            {x}, dt);
      }
    }
}

TEST_CASE("max_pool2d on CUDA follows the CPU on ties and NaN", "[cuda][gpu]") {
  // Many ties (values from a small set) and a NaN.
  Generator g(800);
  Tensor x = randint(-2, 3, {2, 3, 9, 9}, DType::i64, &g).to(DType::f32);
  {
    NoGradGuard ng;
    x.select(0, 1).select(0, 2).select(0, 4).select(0, 4).fill_(std::nan(""));
  }
  for (bool cl : {false, true}) {
    const Tensor xi = cl ? x.contiguous(kCL) : x;
    check(
        "max_pool2d ties",
        [](const V& in) {
          auto [y, i] = max_pool2d_with_indices(in[0], 3, 2, 1);
          return V{y, i};
        },
        {xi}, DType::f32);
  }
}

TEST_CASE("avg_pool2d on CUDA matches the CPU", "[cuda][gpu]") {
  struct Case {
    Shape x;
    Int2 k;
    std::optional<Int2> s;
    Int2 p;
    bool ceil, cip;
  };
  const std::vector<Case> cases{
      {{2, 5, 13, 12}, 3, 2, 1, false, true},
      {{2, 5, 13, 12}, 3, 2, 1, false, false},
      {{2, 3, 9, 11}, 2, std::nullopt, 0, true, true},
      {{2, 3, 10, 11}, 3, 2, 1, true, false},
      {{1, 4, 7, 8}, {3, 2}, Int2(2, 3), {1, 1}, true, true},
      {{2, 2, 7, 7}, 7, 1, 0, false, true},
  };
  uint64_t seed = 900;
  for (const Case& c : cases)
    for (bool cl : {false, true}) {
      Tensor x = rnd(c.x, seed++);
      if (cl) x = x.contiguous(kCL);
      for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64})
        check(
            "avg_pool2d " + shape_str(c.x) + (cl ? " channels-last" : ""),
            [c](const V& in) { return V{avg_pool2d(in[0], c.k, c.s, c.p, c.ceil, c.cip)}; }, {x},
            dt);
    }
}

TEST_CASE("adaptive_avg_pool2d on CUDA matches the CPU (global and general)", "[cuda][gpu]") {
  struct Case {
    Shape x;
    Int2 out;
  };
  const std::vector<Case> cases{{{4, 64, 7, 7}, 1}, {{2, 5, 10, 13}, 7}, {{2, 5, 10, 13}, {3, 5}},
                                {{2, 3, 4, 4}, 6},  {{3, 9, 1, 1}, 1},   {{2, 3, 17, 5}, {4, 1}}};
  uint64_t seed = 1000;
  for (const Case& c : cases)
    for (bool cl : {false, true}) {
      Tensor x = rnd(c.x, seed++);
      if (cl) x = x.contiguous(kCL);
      for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64})
        check(
            "adaptive_avg_pool2d " + shape_str(c.x) + (cl ? " channels-last" : ""),
            [c](const V& in) { return V{adaptive_avg_pool2d(in[0], c.out)}; }, {x}, dt);
    }
}

TEST_CASE("a small conv-bn-relu-pool-linear net trains the same on CUDA and CPU", "[cuda][gpu]") {
  for (bool cl : {false, true}) {
    Tensor rm1_c = zeros({8}), rv1_c = ones({8}), rm2_c = zeros({16}), rv2_c = ones({16});
    Tensor rm1_g = rm1_c.to(gpu()), rv1_g = rv1_c.to(gpu()), rm2_g = rm2_c.to(gpu()),
           rv2_g = rv2_c.to(gpu());
    const Fn net = [&](const V& in) {
      const bool g = in[0].device().is_cuda();
      Tensor h = conv2d(in[0], in[1], in[2], 1, 1);
      h = relu(batch_norm(h, in[3], in[4], g ? rm1_g : rm1_c, g ? rv1_g : rv1_c, true));
      h = max_pool2d(h, 3, 2, 1);
      h = conv2d(h, in[5], Tensor(), 1, 1);
      h = relu(batch_norm(h, in[6], in[7], g ? rm2_g : rm2_c, g ? rv2_g : rv2_c, true));
      h = adaptive_avg_pool2d(h, 1).flatten(1);
      return V{linear(h, in[8], in[9])};
    };
    Tensor x = rnd({4, 3, 16, 16}, 1100);
    if (cl) x = x.contiguous(kCL);
    const V inputs{x,
                   rnd({8, 3, 3, 3}, 1101, 0.3),
                   rnd({8}, 1102, 0.1),
                   rnd({8}, 1103, 0.1, 1.0),
                   rnd({8}, 1104, 0.1),
                   rnd({16, 8, 3, 3}, 1105, 0.2),
                   rnd({16}, 1106, 0.1, 1.0),
                   rnd({16}, 1107, 0.1),
                   rnd({10, 16}, 1108, 0.3),
                   rnd({10}, 1109, 0.1)};
    Tf32 off(false);
    check(std::string("tiny net") + (cl ? " channels-last" : ""), net, inputs, DType::f32, {},
          2e-4);
  }
}

TEST_CASE("conv2d on CUDA with deterministic algorithms matches the CPU and repeats bit for bit",
          "[cuda][gpu][deterministic]") {
  // The default (the heuristic's fastest, whatever its determinism) is what every other conv2d
  // test here runs.
  Deterministic det(true);
  check_conv(conv_cfgs()[7], true, true, 400);
  check_conv(conv_cfgs()[4], false, false, 410);  // depthwise
  {
    Benchmark bench(true);
    check_conv(conv_cfgs()[7], false, false, 420);
  }
  // The weight gradient sums over N * H * W positions (where fast kernels split the sum and
  // add the parts with atomics): the same inputs give the same bits.
  const Tensor x = rnd({16, 64, 28, 28}, 5).contiguous(kCL).to(gpu());
  const Tensor w = rnd({64, 64, 3, 3}, 6, 0.1).contiguous(kCL).to(gpu());
  const Tensor gy = rnd({16, 64, 28, 28}, 7).contiguous(kCL).to(gpu());
  auto grads = [&] {
    Tensor xl = x.detach().requires_grad_(), wl = w.detach().requires_grad_();
    autograd::backward({conv2d(xl, wl, Tensor(), 1, 1)}, {gy});
    return std::make_pair(wl.grad().to(Device::cpu()).to_vector<float>(),
                          xl.grad().to(Device::cpu()).to_vector<float>());
  };
  const auto first = grads(), second = grads();
  CHECK(first.first == second.first);
  CHECK(first.second == second.second);
}

namespace {

// One bf16 batch_norm forward and backward on the GPU, through f32 copies (direct = false) or
// straight on cuDNN's bf16 path; every result on the CPU in f64.
struct BnOut {
  Tensor y, gx, gw, gb, rm, rv;
};
BnOut bn_bf16(bool direct, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& rm0,
              const Tensor& rv0, bool training, const Tensor& gy) {
  Bf16Bn mode(direct);
  Tensor xl = x.detach().requires_grad_(), wl = w.detach().requires_grad_(),
         bl = b.detach().requires_grad_();
  Tensor rm = rm0.clone(), rv = rv0.clone();
  Tensor y = batch_norm(xl, wl, bl, rm, rv, training, 0.1, 1e-5);
  REQUIRE(y.dtype() == DType::bf16);
  REQUIRE(y.suggest_memory_format() == x.suggest_memory_format());
  autograd::backward({y}, {gy});
  REQUIRE(xl.grad().dtype() == DType::bf16);
  auto host = [](const Tensor& t) { return t.detach().to(Device::cpu()).to(DType::f64); };
  return {host(y), host(xl.grad()), host(wl.grad()), host(bl.grad()), host(rm), host(rv)};
}

// One bf16 ulp at |v| (the spacing of bf16 numbers in v's binade: 8 significant bits).
double bf16_ulp(double v) {
  const double a = std::abs(v);
  if (a < 0x1p-126) return 0x1p-133;
  return std::ldexp(1.0, std::ilogb(a) - 7);
}

// |got - want| <= ulps * bf16_ulp(want) + slack, element by element; returns the largest
// |got - want| in ulps of want, for the report.
double check_ulps(const Tensor& got, const Tensor& want, double ulps, double slack,
                  const std::string& what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  double worst = 0, worst_ulps = 0;
  size_t at = 0;
  bool ok = true;
  for (size_t i = 0; i < g.size(); ++i) {
    const double d = std::abs(g[i] - w[i]), bound = ulps * bf16_ulp(w[i]) + slack;
    worst_ulps = std::max(worst_ulps, d / bf16_ulp(w[i]));
    if (!(d <= bound) && (ok || d - bound > worst)) {
      worst = d - bound;
      at = i;
      ok = false;
    }
  }
  std::ostringstream msg;
  if (!ok)
    msg << "element " << at << ": direct bf16 " << g[at] << ", via f32 " << w[at] << " (bound "
        << ulps * bf16_ulp(w[at]) + slack << ")";
  INFO(msg.str());
  CHECK(ok);
  return worst_ulps;
}

// |got - want| <= bound per channel (f32 results: the statistics and parameter gradients).
void check_per_channel(const Tensor& got, const Tensor& want, const std::vector<double>& bound,
                       const std::string& what) {
  INFO(what);
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  for (size_t c = 0; c < g.size(); ++c) {
    INFO("channel " << c << ": direct bf16 " << g[c] << ", via f32 " << w[c] << ", bound "
                    << bound[c]);
    CHECK(std::abs(g[c] - w[c]) <= bound[c]);
  }
}

}  // namespace

TEST_CASE("bf16 batch_norm straight on cuDNN is the f32 path to within bf16 rounding",
          "[cuda][gpu][bf16_bn]") {
  // The two paths read the same bf16 values (exact in f32) and both compute in f32; the direct
  // one rounds y and the input gradient to bf16 inside cuDNN, the other after. So each bf16
  // output may differ by one bf16 ulp (two f32 values on either side of a rounding boundary),
  // plus what f32 arithmetic in another order can move: a sum of `count` terms is off by at
  // most count * 2^-24 times the sum of their magnitudes (the bound of any summation order).
  // The f32 outputs (parameter gradients, running statistics) get that term alone. If cuDNN
  // kept bf16 intermediates (a bf16 accumulator, a bf16 normalised x), errors would be ~2^-8
  // relative and fail these bounds: then the f32 copies stay the default (docs/design.md).
  const double u = 0x1p-24;
  struct Cfg {
    Shape shape;
    bool cl;
  };
  for (const Cfg& cfg : {Cfg{{8, 16, 16, 16}, false}, Cfg{{8, 16, 16, 16}, true},
                         Cfg{{5, 7, 9, 11}, false}, Cfg{{5, 7, 9, 11}, true}}) {
    for (bool training : {true, false}) {
      std::ostringstream name;
      name << "bf16 batch_norm " << shape_str(cfg.shape) << (cfg.cl ? " channels-last" : " NCHW")
           << (training ? " training" : " eval");
      INFO(name.str());
      const int64_t N = cfg.shape[0], C = cfg.shape[1], H = cfg.shape[2], W = cfg.shape[3];
      const int64_t count = N * H * W;
      Tensor xh = rnd(cfg.shape, 50, 2.0, 0.5).to(DType::bf16);
      Tensor gyh = rnd(cfg.shape, 51).to(DType::bf16);
      if (cfg.cl) {
        xh = xh.contiguous(kCL);
        gyh = gyh.contiguous(kCL);
      }
      const Tensor wh = rnd({C}, 52, 1.0, 1.0), bh = rnd({C}, 53);
      Generator g(54);
      const Tensor rm0 = rnd({C}, 55, 0.1).to(gpu()),
                   rv0 = add(rand({C}, DType::f32, &g), 0.5).to(gpu());
      const Tensor x = xh.to(gpu()), gy = gyh.to(gpu()), w = wh.to(gpu()), b = bh.to(gpu());
      const BnOut ref = bn_bf16(false, x, w, b, rm0, rv0, training, gy);
      const BnOut got = bn_bf16(true, x, w, b, rm0, rv0, training, gy);

      // Per-channel magnitudes (f64, on the CPU) for the f32 slack terms.
      const Tensor xd = xh.to(DType::f64), gyd = gyh.to(DType::f64);
      const Shape red{0, 2, 3};
      const Tensor mean_b = mean(xd, red), var_b = var(xd, red, /*correction=*/0);
      const Tensor m = training ? mean_b : rm0.to(Device::cpu()).to(DType::f64);
      const Tensor v = training ? var_b : rv0.to(Device::cpu()).to(DType::f64);
      const Tensor invstd = rsqrt(add(v, 1e-5));
      const Tensor xhat = mul(sub(xd, m.view({1, C, 1, 1})), invstd.view({1, C, 1, 1}));
      const double max_xhat = max(abs(xhat)).item<double>();
      const double max_gy = max(abs(gyd)).item<double>();
      const double max_scale = max(abs(mul(wh.to(DType::f64), invstd))).item<double>();
      const double max_b = max(abs(bh.to(DType::f64))).item<double>();
      const auto sum_abs_gy = sum(abs(gyd), red).to_vector<double>();
      const auto sum_abs_gyx = sum(abs(mul(gyd, xhat)), red).to_vector<double>();
      const auto sum_abs_x = sum(abs(xd), red).to_vector<double>();
      const auto sum_x2 = sum(mul(xd, xd), red).to_vector<double>();

      // y = w * (x - mean) * invstd + b: the mean's f32 error (count * u * max|x|) and the
      // inverse std's (count * u relative, carried by |x - mean| <= 2 max|x|), and the
      // affine's own rounding. In evaluation the statistics are given: rounding alone.
      const double k = training ? static_cast<double>(count) : 4.0;
      const double max_x = max(abs(xd)).item<double>();
      const double y_slack =
          k * u * (max_scale * (3 * max_x + 1) + max_b) + 4 * u * (max_scale * max_xhat + max_b);
      const double y_ulps = check_ulps(got.y, ref.y, 1, y_slack, "y");
      // gx = w * invstd * (gy - mean(gy) - xhat * mean(gy * xhat)) in training, w * invstd * gy
      // in evaluation: the means are sums of count terms (errors count * u * max_gy and
      // count * u * max_gy * max_xhat, the latter multiplied by xhat), xhat and invstd carry
      // the statistics' count * u, so terms up to max_scale * max_gy * (2 + max_xhat)^2.
      const double gx_slack = (training ? static_cast<double>(count) : 4.0) * u * max_scale *
                              max_gy * (2 + max_xhat) * (2 + max_xhat);
      const double gx_ulps = check_ulps(got.gx, ref.gx, 1, gx_slack, "grad x");
      std::vector<double> gw_bound(C), gb_bound(C), rm_bound(C), rv_bound(C);
      const auto rmv = ref.rm.to_vector<double>(), rvv = ref.rv.to_vector<double>();
      for (int64_t c = 0; c < C; ++c) {
        const auto cc = static_cast<size_t>(c);
        gb_bound[cc] = count * u * sum_abs_gy[cc];
        gw_bound[cc] = count * u * sum_abs_gyx[cc] * 2;  // xhat's own f32 error as much again
        rm_bound[cc] = 0.1 * count * u * sum_abs_x[cc] / count + 4 * u * std::abs(rmv[cc]);
        rv_bound[cc] = 0.1 * count * u * 2 * sum_x2[cc] / (count - 1) + 4 * u * std::abs(rvv[cc]);
      }
      check_per_channel(got.gw, ref.gw, gw_bound, "grad weight");
      check_per_channel(got.gb, ref.gb, gb_bound, "grad bias");
      check_per_channel(got.rm, ref.rm, rm_bound, "running_mean");
      check_per_channel(got.rv, ref.rv, rv_bound, "running_var");
      // The first GPU run's evidence for docs/design.md.
      std::printf("%s: direct vs f32 copies, worst y %.2f ulp, worst grad x %.2f ulp\n",
                  name.str().c_str(), y_ulps, gx_ulps);
    }
  }
}
