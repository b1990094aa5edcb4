// Registers one Catch2 (v2) test case per op case at static-initialisation time, so that ctest's
// catch_discover_tests sees each case as its own test (named in the listing, run alone, timed
// alone). Used by tests/ops/test_op_registry.cpp and tests/cuda/test_backend_ops.cpp.
#pragma once

#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <utility>

namespace dltrain::testing {

class FunctionInvoker : public Catch::ITestInvoker {
 public:
  explicit FunctionInvoker(std::function<void()> f) : f_(std::move(f)) {}
  void invoke() const override { f_(); }

 private:
  std::function<void()> f_;
};

/// Registers `f` as the test case `name` with `tags`. `file` must be a string literal (__FILE__):
/// Catch's --filenames-as-tags (scripts/gpu/first_run.sh runs one process per file) reads it.
inline void register_test_case(const std::string& name, const std::string& tags,
                               std::function<void()> f, const char* file, std::size_t line) {
  Catch::getMutableRegistryHub().registerTest(Catch::makeTestCase(
      new FunctionInvoker(std::move(f)), "", Catch::NameAndTags{name.c_str(), tags.c_str()},
      Catch::SourceLineInfo(file, line)));
}

}  // namespace dltrain::testing
