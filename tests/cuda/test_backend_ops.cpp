// Every case of the op-case registry (tests/op_cases.*) on CUDA against the CPU, one test case
// per op case ("backend_ops: <case>", tag [backend_ops]): forward and backward (of
// sum(out * w), w fixed random) in each of the case's dtypes among f32, f16, bf16 and f64, and in
// both memory formats where the case has 4-d inputs. The reference is the CPU's result of the op
// in f64 on the very values the CUDA run sees (its inputs rounded to the dtype), so the bound is
// the case's tolerance model (op_cases.hpp): the exact result rounded once to the dtype, plus the
// float (double for f64) accumulation of the case's K terms; for 16-bit dtypes both backends
// compute in float and round once (PyTorch's opmath rule). A failure names the case, dtype,
// layout, output or gradient, the worst element and its error against the bound, and says
// whether the CPU's own run in that dtype meets the same bound. TF32 is off during the runs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <sstream>

#include "dltrain/dltrain.hpp"
#include "op_cases.hpp"
#include "op_cases_catch.hpp"
#include "tests/cuda/cuda_test_util.hpp"

using namespace dltrain;
using namespace dltrain::testing;

namespace {

constexpr uint64_t kSeed = 1;

std::vector<std::string> check_on(const OpCase& c, DType dt, MemoryFormat fmt, Device dev) {
  const std::vector<Tensor> in = c.make_inputs(kSeed, dt, dev, fmt);
  const std::vector<Tensor> ref = to_reference(c.make_inputs(kSeed, dt, Device::cpu(), fmt));
  const CaseRun got = run_case(c, in, true);
  // The reference runs take the w of the run they check (rounded to its output dtypes).
  const CaseRun exact = run_case(c, ref, true, false, &got.out_dtype);
  CaseRun scale;
  if (c.tol.multilinear) scale = run_case(c, ref, true, true, &got.out_dtype);
  return check_run(c, got, exact, c.tol.multilinear ? &scale : nullptr);
}

void run_backend_ops(const OpCase& c) {
  // TF32 off: the registry's bounds are f32 arithmetic's (u = 2^-24), and TF32 (on by
  // default) rounds the products' inputs to 10 bits. The TF32 paths keep their own tests
  // (tests/cuda/test_blas_cuda.cpp, test_dnn_cuda.cpp).
  const test::Tf32 no_tf32(false);
  const Device cuda = Device::cuda(0);
  int checked = 0;
  for (DType dt : c.dtypes)
    for (MemoryFormat fmt : case_formats(c)) {
      std::ostringstream what;
      what << "case " << c.name << ", " << dt << ", " << format_name(fmt) << ", CUDA vs CPU";
      INFO(what.str());
      std::vector<std::string> bad;
      try {
        bad = check_on(c, dt, fmt, cuda);
      } catch (const std::exception& e) {
        bad.push_back(std::string("threw: ") + e.what());
      }
      if (!bad.empty()) {
        std::vector<std::string> cpu_bad;
        try {
          cpu_bad = check_on(c, dt, fmt, Device::cpu());
        } catch (const std::exception& e) {
          cpu_bad.push_back(std::string("threw: ") + e.what());
        }
        INFO("the CPU's own " << dt << " run "
                              << (cpu_bad.empty() ? "meets the bound"
                                                  : "fails it too: " + cpu_bad.front()));
        for (const std::string& m : bad) FAIL_CHECK(what.str() << ": " << m);
      }
      CHECK(bad.empty());
      ++checked;
    }
  CHECK(checked > 0);
}

[[maybe_unused]] const bool registered = [] {
  std::set<std::string> seen;
  for (const OpCase& c : op_cases()) {
    if (!seen.insert(c.name).second) continue;  // test_ops' completeness test names repeats
    const OpCase* p = &c;
    register_test_case(
        "backend_ops: " + c.name, "[cuda][backend_ops]", [p] { run_backend_ops(*p); }, __FILE__,
        __LINE__);
  }
  return true;
}();

}  // namespace
