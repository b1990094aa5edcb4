// The op-case registry (tests/op_cases.*) on the CPU, one Catch2 test case per op case and check:
//   "registry: <case>"            f64 finite-difference gradcheck of the case's differentiable
//                                  inputs, both layouts, and gradgradcheck where flagged; then
//                                  the case in each of its dtypes and layouts, forward and
//                                  backward, against the exact result (the op in f64 on the same
//                                  rounded values), within the case's tolerance model;
//   "registry dnnl: <case>"       cases with a oneDNN path, f32 and bf16, forward and backward,
//                                  with oneDNN and with dltrain's native kernels, each against the
//                                  exact result (so the two agree within twice the bound, on
//                                  AVX2, AVX-512 and AMX CPUs alike: ctest runs "[dnnl]" once
//                                  more capped to AVX2);
// and the completeness checks: every public op of include/dltrain/ops/*.hpp and every row of
// the autocast policy table has a case or a reviewed exclusion.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "dltrain/backend/cpu.hpp"
#include "dltrain/dltrain.hpp"
#include "gradcheck.hpp"
#include "op_cases.hpp"
#include "op_cases_catch.hpp"

using namespace dltrain;
using namespace dltrain::testing;

namespace {

constexpr uint64_t kSeed = 1;

// The case's floating outputs flattened into one f64 vector: what gradcheck differentiates.
Tensor flat_outputs(const OpCase& c, const std::vector<Tensor>& in) {
  std::vector<Tensor> parts;
  for (const Tensor& o : c.fn(in))
    if (is_floating(o.dtype())) parts.push_back(o.reshape({-1}));
  return parts.size() == 1 ? parts[0] : cat(parts, 0);
}

std::vector<Tensor> grad_leaves(const OpCase& c, std::vector<Tensor> in) {
  for (int i : c.grad_inputs) {
    Tensor& t = in[static_cast<size_t>(i)];
    t = t.detach().clone(MemoryFormat::Preserve).detach();
    t.requires_grad_();
  }
  return in;
}

void run_gradcheck(const OpCase& c) {
  for (MemoryFormat fmt : case_formats(c)) {
    INFO("case " << c.name << ", f64, " << format_name(fmt));
    const std::vector<Tensor> in =
        grad_leaves(c, c.make_inputs(kSeed, DType::f64, Device::cpu(), fmt));
    auto f = [&c](const std::vector<Tensor>& x) { return flat_outputs(c, x); };
    const double worst = gradcheck(f, in);
    CHECK(worst < 1e-4);  // gradcheck FAILs at the element first; this states the bound
    if (c.higher_order) {
      INFO("gradgradcheck");
      CHECK(gradgradcheck(f, in) < 1e-4);
    }
  }
}

std::string describe(const OpCase& c, DType dt, MemoryFormat fmt, const char* path = nullptr) {
  std::ostringstream os;
  os << "case " << c.name << ", " << dt << ", " << format_name(fmt);
  if (path) os << ", " << path;
  return os.str();
}

// Runs c in dt/fmt on the CPU and checks it against the exact result; returns the failures.
std::vector<std::string> check_cpu(const OpCase& c, DType dt, MemoryFormat fmt) {
  const std::vector<Tensor> in = c.make_inputs(kSeed, dt, Device::cpu(), fmt);
  const std::vector<Tensor> ref = to_reference(in);
  const CaseRun got = run_case(c, in, true);
  // The reference runs take the w of the run they check (rounded to its output dtypes).
  const CaseRun exact = run_case(c, ref, true, false, &got.out_dtype);
  CaseRun scale;
  if (c.tol.multilinear) scale = run_case(c, ref, true, true, &got.out_dtype);
  return check_run(c, got, exact, c.tol.multilinear ? &scale : nullptr);
}

void run_cpu(const OpCase& c) {
  int checked = 0;
  for (DType dt : c.dtypes)
    for (MemoryFormat fmt : case_formats(c)) {
      const std::string what = describe(c, dt, fmt);
      INFO(what);
      std::vector<std::string> bad;
      try {
        bad = check_cpu(c, dt, fmt);
      } catch (const std::exception& e) {
        bad.push_back(std::string("threw: ") + e.what());
      }
      for (const std::string& m : bad) FAIL_CHECK(what << ": " << m);
      CHECK(bad.empty());
      ++checked;
    }
  CHECK(checked > 0);
}

void run_dnnl(const OpCase& c) {
  const bool was_enabled = cpu::dnnl_enabled();  // DLTRAIN_DNNL=0 stays 0 after the test
  for (DType dt : {DType::f32, DType::bf16}) {
    if (std::find(c.dtypes.begin(), c.dtypes.end(), dt) == c.dtypes.end()) continue;
    for (MemoryFormat fmt : case_formats(c)) {
      for (bool on : {true, false}) {
        const std::string what =
            describe(c, dt, fmt, on ? "oneDNN (when built in)" : "native kernels");
        INFO(what << ", oneDNN ISA " << cpu::dnnl_isa());
        cpu::set_dnnl_enabled(on);
        std::vector<std::string> bad;
        try {
          bad = check_cpu(c, dt, fmt);
        } catch (const std::exception& e) {
          bad.push_back(std::string("threw: ") + e.what());
        }
        cpu::set_dnnl_enabled(was_enabled);
        for (const std::string& m : bad) FAIL_CHECK(what << ": " << m);
        CHECK(bad.empty());
      }
    }
  }
}

bool valid_name(const std::string& n) {
  return !n.empty() && std::all_of(n.begin(), n.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '.';
  });
}

[[maybe_unused]] const bool registered = [] {
  std::set<std::string> seen;
  for (const OpCase& c : op_cases()) {
    // A bad or repeated name is reported by the completeness test below, not registered twice.
    if (!valid_name(c.name) || !seen.insert(c.name).second) continue;
    const OpCase* p = &c;
    const bool f64 = std::find(c.dtypes.begin(), c.dtypes.end(), DType::f64) != c.dtypes.end();
    const bool grad = !c.grad_inputs.empty() && f64 && !c.no_gradcheck;
    // One ctest test (one process) per case for the gradcheck and the dtype sweep: ctest's
    // start-up per process is what the registry's run time is made of.
    register_test_case(
        "registry: " + c.name, grad ? "[ops][registry][gradcheck][cpu]" : "[ops][registry][cpu]",
        [p, grad] {
          if (grad) {
            SECTION("f64 gradcheck") { run_gradcheck(*p); }
          }
          SECTION("every dtype and layout against the exact result") { run_cpu(*p); }
        },
        __FILE__, __LINE__);
    if (c.dnnl)
      register_test_case(
          "registry dnnl: " + c.name, "[ops][registry][dnnl]", [p] { run_dnnl(*p); }, __FILE__,
          __LINE__);
  }
  return true;
}();

// The public op names declared in include/dltrain/ops/*.hpp: free functions in namespace dltrain
// (not in a `detail` namespace) returning Tensor, Tensor&, std::vector<Tensor> or a pair/tuple
// of Tensors. Declarations start a line (clang-format keeps them so).
std::map<std::string, std::string> public_ops() {
  namespace fs = std::filesystem;
  const std::regex decl(
      R"(^\s*(?:inline\s+)?(?:Tensor&?|std::vector<Tensor>|std::pair<Tensor,\s*Tensor>|std::tuple<[^>]*>)\s+(operator[^\s(]+|[A-Za-z_]\w*)\s*\()");
  std::map<std::string, std::string> ops;  // name -> header
  const fs::path dir = fs::path(DLTRAIN_SOURCE_DIR) / "include" / "dltrain" / "ops";
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".hpp") continue;
    std::ifstream f(entry.path());
    std::string line;
    bool in_comment = false;
    int detail_depth = 0;
    while (std::getline(f, line)) {
      if (in_comment) {
        const auto e = line.find("*/");
        if (e == std::string::npos) continue;
        line = line.substr(e + 2);
        in_comment = false;
      }
      if (const auto c = line.find("//"); c != std::string::npos) line = line.substr(0, c);
      if (const auto b = line.find("/*"); b != std::string::npos) {
        in_comment = line.find("*/", b) == std::string::npos;
        line = line.substr(0, b);
      }
      if (line.find("namespace detail") != std::string::npos) {
        detail_depth = 1;
        continue;
      }
      if (detail_depth > 0) {
        detail_depth += static_cast<int>(std::count(line.begin(), line.end(), '{'));
        detail_depth -= static_cast<int>(std::count(line.begin(), line.end(), '}'));
        continue;
      }
      std::smatch m;
      if (std::regex_search(line, m, decl)) ops.emplace(m[1], entry.path().filename().string());
    }
  }
  return ops;
}

}  // namespace

TEST_CASE("registry: every public op has a case or a reviewed exclusion",
          "[ops][registry][completeness]") {
  const std::map<std::string, std::string> ops = public_ops();
  INFO("parsed " << ops.size() << " public op names from " << DLTRAIN_SOURCE_DIR
                 << "/include/dltrain/ops");
  // The parser must see the headers: ~100 names (a wrong path or a broken regex finds none).
  REQUIRE(ops.size() > 100);
  REQUIRE(ops.count("conv2d") == 1);
  REQUIRE(ops.count("operator+") == 1);
  REQUIRE(ops.count("scaled_dot_product_attention_with_weights") == 1);
  std::set<std::string> covered, excluded;
  std::set<std::string> names;
  for (const OpCase& c : op_cases()) {
    INFO("case " << c.name);
    CHECK(valid_name(c.name));  // ctest splits names on ';'; Catch filters trip on others
    CHECK(names.insert(c.name).second);
    CHECK(!c.ops.empty());
    CHECK(c.fn);
    CHECK(c.make_inputs);
    for (const std::string& op : c.ops) {
      INFO("op " << op);
      CHECK(ops.count(op) == 1);  // a case names public ops only (a typo would cover nothing)
      covered.insert(op);
    }
  }
  for (const auto* list : {&op_exclusions(), &op_not_yet_covered()})
    for (const OpExclusion& e : *list) {
      INFO("exclusion " << e.op << ": " << e.reason);
      CHECK(ops.count(e.op) == 1);
      CHECK(covered.count(e.op) == 0);  // covered now: drop it from the list
      excluded.insert(e.op);
    }
  std::vector<std::string> missing;
  for (const auto& [op, header] : ops)
    if (!covered.count(op) && !excluded.count(op)) missing.push_back(op + " (" + header + ")");
  for (const std::string& m : missing)
    FAIL_CHECK("public op " << m << " has no case in tests/op_cases.cpp and no exclusion");
  CHECK(missing.empty());
}

TEST_CASE("registry: every autocast policy row has a case", "[ops][registry][completeness]") {
  std::set<std::string> covered;
  for (const OpCase& c : op_cases())
    for (const std::string& op : c.ops) covered.insert(op);
  const auto table = amp::policy_table();
  REQUIRE(table.size() > 20);
  for (const amp::OpPolicy& row : table) {
    INFO("autocast policy row " << row.name);
    CHECK(covered.count(row.name) == 1);
  }
}

TEST_CASE("registry: the tolerance model fails a result off by one rounding of a partial sum",
          "[ops][registry][completeness]") {
  // The check must catch what issue 26 was (a bf16 sum rounded in bf16 along the way): a
  // 9-term average whose result is off by a bf16 ulp of the partial sums is beyond the bound.
  OpCase c;
  c.name = "self_test";
  c.grad_inputs = {};
  c.tol = Tolerance{.terms = 9, .multilinear = true};
  CaseRun exact, scale, got;
  const Tensor e = full({4}, 1.0 + 0x1p-7 / 3, TensorOptions(DType::f64));
  exact.out = {e};
  exact.out_dtype = {DType::f64};
  scale.out = {full({4}, 1.0, TensorOptions(DType::f64))};
  scale.out_dtype = {DType::f64};
  got.out = {e.to(DType::bf16).to(DType::f64)};
  got.out_dtype = {DType::bf16};
  CHECK(check_run(c, got, exact, &scale).empty());  // exact rounded once: fine
  got.out = {add(e.to(DType::bf16).to(DType::f64), 0x1p-7)};
  CHECK(check_run(c, got, exact, &scale).size() == 1);  // one bf16 ulp more: caught
}
