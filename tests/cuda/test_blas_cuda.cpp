// Matrix products on CUDA (cuBLASLt) against the CPU: mm, bmm, matmul (every batching and
// broadcasting case), linear (fused bias), forward and backward, on odd sizes, transposed
// and strided views; f32 without TF32 (tight), with TF32 (looser), f16/bf16 against the CPU
// f32 result of the same rounded inputs, f64. Errors are measured relative to the largest
// reference value (a GEMM's rounding scales with its inputs, not with each output).
// GPU-only: without a GPU tests/cuda/main.cpp exits with ctest's skip code.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
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
using Fn = std::function<V(const V&)>;

Device gpu() { return Device::cuda(0); }

Tensor rnd(const Shape& s, uint64_t seed, double scale = 1.0) {
  Generator g(seed);
  return mul(randn(s, DType::f32, &g), scale);
}

struct Run {
  std::vector<Tensor> outs, grads;  // on the CPU, f64
};

// Runs f on copies of `inputs` (CPU tensors in the dtype and layout to test) moved to dev, as
// leaves requiring grad, then backward with seeds `gys` (one per output).
Run run_on(Device dev, const Fn& f, const std::vector<Tensor>& inputs,
           const std::vector<Tensor>& gys) {
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) {
    Tensor l = dev.is_cpu() ? t.clone() : t.to(dev);
    l.requires_grad_();
    leaves.push_back(l);
  }
  const std::vector<Tensor> outs = f(leaves);
  std::vector<Tensor> seeds;
  for (size_t i = 0; i < outs.size(); ++i) {
    REQUIRE(outs[i].device() == dev);
    seeds.push_back(gys[i].to(outs[i].dtype()).to(dev));
  }
  autograd::backward(outs, seeds);
  Run r;
  for (const Tensor& o : outs) r.outs.push_back(o.detach().to(Device::cpu()).to(DType::f64));
  for (const Tensor& l : leaves)
    r.grads.push_back(l.grad().defined() ? l.grad().to(Device::cpu()).to(DType::f64) : Tensor());
  return r;
}

// Every element within tol * max|reference| (dltrain::test::check_close with a norm bound).
void require_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  check_close(got, want, 0, 0, what, tol);
}

// f on the CPU and on the GPU in dtype dt from the same inputs (rounded to dt; the CPU
// reference computes in f32 from the rounded values for 16-bit dtypes), compared with `tol`.
void check(const std::string& name, const Fn& f, const std::vector<Tensor>& inputs, int n_out,
           DType dt, double tol) {
  std::vector<Tensor> in_dt, in_ref, gys_ref;
  const DType ref_dt = ref_dtype(dt);
  for (const Tensor& t : inputs) {
    in_dt.push_back(t.to(dt));
    in_ref.push_back(t.to(dt).to(ref_dt));
  }
  // Seeds: computed from the reference outputs' shapes.
  std::vector<Tensor> probe;
  {
    NoGradGuard ng;
    probe = f(in_ref);
  }
  REQUIRE(static_cast<int>(probe.size()) == n_out);
  for (int i = 0; i < n_out; ++i)
    gys_ref.push_back(rnd(probe[i].shape(), 1000 + i).to(dt).to(ref_dt));
  const Run want = run_on(Device::cpu(), f, in_ref, gys_ref);
  const Run got = run_on(gpu(), f, in_dt, gys_ref);
  const std::string tag = name + " [" + dtype_name(dt) + "]";
  for (int i = 0; i < n_out; ++i)
    require_close(got.outs[i], want.outs[i], tol, tag + " output " + std::to_string(i));
  for (size_t i = 0; i < want.grads.size(); ++i)
    require_close(got.grads[i], want.grads[i], tol, tag + " grad of input " + std::to_string(i));
}

// Runs `name` in f32 without TF32, f32 with TF32, f16, bf16 and f64.
void check_all_dtypes(const std::string& name, const Fn& f, const std::vector<Tensor>& inputs,
                      int n_out = 1) {
  {
    Tf32 off(false);
    check(name + " (TF32 off)", f, inputs, n_out, DType::f32, 2e-5);
  }
  {
    Tf32 on(true);
    check(name + " (TF32 on)", f, inputs, n_out, DType::f32, 5e-3);
  }
  check(name, f, inputs, n_out, DType::f16, 4e-3);
  check(name, f, inputs, n_out, DType::bf16, 3e-2);
  check(name, f, inputs, n_out, DType::f64, 1e-12);
}

}  // namespace

TEST_CASE("mm on CUDA matches the CPU, with transposed and strided operands", "[cuda][gpu]") {
  check_all_dtypes("mm", [](const V& in) { return V{mm(in[0], in[1])}; },
                   {rnd({37, 53}, 1), rnd({53, 29}, 2)});
  // Column-major operands (transposed views) map without a copy.
  check_all_dtypes("mm a^T b^T", [](const V& in) { return V{mm(in[0].t(), in[1].t())}; },
                   {rnd({53, 37}, 3), rnd({29, 53}, 4)});
  // Strided views that are neither row- nor column-major are copied.
  check_all_dtypes(
      "mm strided",
      [](const V& in) { return V{mm(in[0].slice(1, 0, 106, 2), in[1].slice(0, 1, 54))}; },
      {rnd({37, 106}, 5), rnd({54, 29}, 6)});
  // Vectors and single rows / columns.
  check_all_dtypes("mm row x col", [](const V& in) { return V{mm(in[0], in[1])}; },
                   {rnd({1, 64}, 7), rnd({64, 1}, 8)});
  check_all_dtypes("mm large", [](const V& in) { return V{mm(in[0], in[1].t())}; },
                   {rnd({256, 200}, 9), rnd({136, 200}, 10)});
}

TEST_CASE("bmm on CUDA matches the CPU, with transposed batch operands", "[cuda][gpu]") {
  check_all_dtypes("bmm", [](const V& in) { return V{bmm(in[0], in[1])}; },
                   {rnd({5, 17, 23}, 11), rnd({5, 23, 19}, 12)});
  check_all_dtypes("bmm transposed",
                   [](const V& in) { return V{bmm(in[0].transpose(1, 2), in[1].transpose(1, 2))}; },
                   {rnd({4, 23, 17}, 13), rnd({4, 19, 23}, 14)});
  // Batch dim not outermost in memory.
  check_all_dtypes("bmm permuted batch",
                   [](const V& in) {
                     return V{bmm(in[0].permute({1, 0, 2}), in[1])};
                   },
                   {rnd({9, 3, 11}, 15), rnd({3, 11, 7}, 16)});
}

TEST_CASE("matmul on CUDA matches the CPU in every batching case", "[cuda][gpu]") {
  const Fn mmf = [](const V& in) { return V{matmul(in[0], in[1])}; };
  check_all_dtypes("matmul 1d.1d", mmf, {rnd({33}, 20), rnd({33}, 21)});
  check_all_dtypes("matmul 1d.2d", mmf, {rnd({33}, 22), rnd({33, 7}, 23)});
  check_all_dtypes("matmul 2d.1d", mmf, {rnd({9, 33}, 24), rnd({33}, 25)});
  check_all_dtypes("matmul 3d.2d", mmf, {rnd({3, 9, 33}, 26), rnd({33, 7}, 27)});
  check_all_dtypes("matmul 3d.1d", mmf, {rnd({3, 9, 33}, 28), rnd({33}, 29)});
  check_all_dtypes("matmul 1d.3d", mmf, {rnd({33}, 30), rnd({4, 33, 7}, 31)});
  check_all_dtypes("matmul 2d.3d", mmf, {rnd({9, 33}, 32), rnd({4, 33, 7}, 33)});
  check_all_dtypes("matmul 3d.3d", mmf, {rnd({4, 9, 33}, 34), rnd({4, 33, 7}, 35)});
  // Broadcast batch dims: a batch stride of 0, and a materialised broadcast.
  check_all_dtypes("matmul broadcast [3] x [1]", mmf, {rnd({3, 9, 33}, 36), rnd({1, 33, 7}, 37)});
  check_all_dtypes("matmul broadcast [2,1] x [3]", mmf,
                   {rnd({2, 1, 9, 33}, 38), rnd({3, 33, 7}, 39)});
}

TEST_CASE("linear on CUDA (fused bias epilogue) matches the CPU", "[cuda][gpu]") {
  const Fn lin_b = [](const V& in) { return V{linear(in[0], in[1], in[2])}; };
  const Fn lin = [](const V& in) { return V{linear(in[0], in[1])}; };
  check_all_dtypes("linear+bias 2d", lin_b, {rnd({31, 45}, 40), rnd({27, 45}, 41), rnd({27}, 42)});
  check_all_dtypes("linear+bias 3d", lin_b,
                   {rnd({2, 5, 64}, 43), rnd({96, 64}, 44), rnd({96}, 45)});
  check_all_dtypes("linear+bias 1d", lin_b, {rnd({45}, 46), rnd({27, 45}, 47), rnd({27}, 48)});
  check_all_dtypes("linear 2d", lin, {rnd({31, 45}, 49), rnd({27, 45}, 50)});
  // A non-contiguous input (a transposed view) and an unaligned bias (offset view).
  check_all_dtypes("linear strided",
                   [](const V& in) { return V{linear(in[0].t(), in[1], in[2].slice(0, 1, 28))}; },
                   {rnd({45, 31}, 51), rnd({27, 45}, 52), rnd({28}, 53)});
}

TEST_CASE("empty inner dimension gives zeros (plus bias) on CUDA", "[cuda][gpu]") {
  const Tensor a = zeros({4, 0}, TensorOptions(DType::f32).with_device(gpu()));
  const Tensor b = zeros({0, 3}, TensorOptions(DType::f32).with_device(gpu()));
  const Tensor c = mm(a, b);
  REQUIRE(c.shape() == Shape{4, 3});
  REQUIRE(c.to(Device::cpu()).to_vector<float>() == std::vector<float>(12, 0.0f));
  const Tensor bias = tensor({1, 2, 3}).to(gpu());
  const Tensor y = linear(a, zeros({3, 0}, TensorOptions(DType::f32).with_device(gpu())), bias);
  REQUIRE(y.to(Device::cpu()).to_vector<float>() ==
          std::vector<float>{1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3});
}

TEST_CASE("CUDA matrix products reject mixed devices and dtypes", "[cuda][gpu]") {
  const Tensor a = rnd({3, 4}, 60).to(gpu());
  REQUIRE_THROWS_AS(mm(a, rnd({4, 2}, 61)), Error);
  REQUIRE_THROWS_AS(mm(a, rnd({4, 2}, 62).to(DType::f64).to(gpu())), Error);
}
