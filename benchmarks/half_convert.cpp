// CPU benchmark of f32 <-> f16 conversion: to(f16), to(f32), copy_ into a preallocated f16
// tensor and copy_scaled_ (DDP's f16 gradient compression), each with the scalar loops and
// with F16C (cpu::set_f16c_enabled; the library picks F16C at run time where the CPU has it),
// on 1M elements (caches) and 16M (memory). Prints one line per case (median ms over --iters
// runs after two warm-ups) and optionally writes JSON {"threads": N, "cases": {name: ms}};
// benchmarks/peers/pytorch_half_convert.py runs x.half(), x.float() and copy_ in PyTorch on the
// same sizes and prints both sides in GB/s (bytes read + written per second).
//
// Usage: half_convert [--threads N] [--iters N] [--json PATH]
#include <cstdio>
#include <string>

#include "apps/common/op_bench.hpp"
#include "dltrain/backend/cpu.hpp"
#include "dltrain/dltrain.hpp"

using namespace dltrain;

int main(int argc, char** argv) {
  apps::OpBench bench("half_convert",
                      "f32 <-> f16 conversion (to, copy_, copy_scaled_) with the scalar loops "
                      "and with F16C, median ms per case; compare with "
                      "benchmarks/peers/pytorch_half_convert.py (GB/s).");
  bench.parse(argc, argv);
  std::printf("F16C on this CPU: %s\n", cpu::f16c_supported() ? "yes" : "no");
  for (int64_t n : {int64_t{1} << 20, int64_t{1} << 24}) {
    const std::string size = n == (int64_t{1} << 20) ? "1M" : "16M";
    const Tensor x = randn({n});
    const Tensor h = x.to(DType::f16);
    Tensor d = empty({n}, TensorOptions(DType::f16));
    for (bool f16c : {false, true}) {
      if (f16c && !cpu::f16c_supported()) continue;
      cpu::set_f16c_enabled(f16c);
      const std::string path = f16c ? " f16c" : " scalar";
      bench.run("to f16 " + size + path, [&] { (void)x.to(DType::f16); });
      bench.run("to f32 " + size + path, [&] { (void)h.to(DType::f32); });
      bench.run("copy_ f32->f16 " + size + path, [&] { d.copy_(x); });
      bench.run("copy_scaled_ f32->f16 " + size + path, [&] { copy_scaled_(d, x, 0.5); });
    }
  }
  return bench.finish();
}
