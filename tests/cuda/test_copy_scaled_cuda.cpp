// copy_scaled_ on CUDA against the CPU (tests/ops/test_copy_scaled.cpp checks the CPU against
// mul + copy_): every pair of floating dtypes, contiguous, transposed and broadcast sources,
// and the DDP bucket case (f32 -> bf16 / f16 with 1 / world size). Both sides round the
// product to src's dtype and then to dst's, so they agree exactly; 16-bit results get one
// unit in the last place of slack for a different rounding of subnormals.
// GPU-only: without a GPU, tests/cuda/main.cpp skips every test (exit code 4).
#include <catch2/catch.hpp>

#include "dltrain/dltrain.hpp"
#include "tests/cuda/cuda_test_util.hpp"

using namespace dltrain;
using namespace dltrain::test;

TEST_CASE("copy_scaled_ on CUDA equals the CPU's", "[cuda][copy]") {
  const DType dts[] = {DType::f32, DType::f64, DType::f16, DType::bf16};
  manual_seed(6);
  const Tensor base = mul(randn({33, 17}), 200.0);
  for (double scale : {0.5, 1.0 / 3, 4.0}) {
    for (DType sdt : dts) {
      for (DType ddt : dts) {
        const std::string what = "copy_scaled_ " + dt_str(sdt) + " -> " + dt_str(ddt);
        const double rtol = ddt == DType::f16 ? 0x1p-11 : (ddt == DType::bf16 ? 0x1p-8 : 0.0);
        const Tensor src = base.to(sdt);
        Tensor want = empty({33, 17}, ddt);
        copy_scaled_(want, src, scale);
        Tensor got = empty({33, 17}, TensorOptions(ddt).with_device(kCuda));
        copy_scaled_(got, src.to(kCuda), scale);
        check_close(got.to(Device::cpu()), want, rtol, 0, what);
        Tensor got_t = empty({17, 33}, TensorOptions(ddt).with_device(kCuda));
        copy_scaled_(got_t, src.to(kCuda).t(), scale);
        check_close(got_t.to(Device::cpu()), want.t().contiguous(), rtol, 0, what + " (t)");
        Tensor got_b = empty({4, 33, 17}, TensorOptions(ddt).with_device(kCuda));
        copy_scaled_(got_b, src.to(kCuda), scale);
        check_close(got_b.to(Device::cpu()), want.expand({4, 33, 17}).contiguous(), rtol, 0,
                    what + " (broadcast)");
      }
    }
  }
}

TEST_CASE("copy_scaled_ on CUDA: a DDP bucket's f32 -> 16-bit share", "[cuda][copy][ddp]") {
  manual_seed(7);
  const Tensor grads = mul(randn({1 << 20}), 1e-3);
  for (DType wire : {DType::bf16, DType::f16}) {
    Tensor want = empty({1 << 20}, wire);
    copy_scaled_(want, grads, 1.0 / 8);
    Tensor got = empty({1 << 20}, TensorOptions(wire).with_device(kCuda));
    copy_scaled_(got, grads.to(kCuda), 1.0 / 8);
    check_close(got.to(Device::cpu()), want, wire == DType::f16 ? 0x1p-11 : 0x1p-8, 0,
                "bucket share " + dt_str(wire));
  }
  // Devices must match: a CPU source into a CUDA destination is refused.
  Tensor dst = empty({4}, TensorOptions(DType::f16).with_device(kCuda));
  CHECK_THROWS_WITH(copy_scaled_(dst, zeros({4}), 0.5), Catch::Contains("one device"));
}
