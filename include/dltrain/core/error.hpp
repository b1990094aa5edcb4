// dltrain::Error and the checking macros used by every layer.
//
// Every misuse of the library (wrong shape, dtype, device, bad file, bad
// configuration) raises dltrain::Error whose message names the operation, the
// offending values and, where one exists, the fix. Nothing in dltrain aborts
// or returns a silent wrong answer on bad input.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace dltrain {

/// The one exception type dltrain throws for misuse and failed I/O. `what()` is a
/// complete sentence: the op, the values involved, and how to fix the call.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

/// A device (or pinned host) allocation that failed for lack of memory: the CUDA allocator's
/// cudaErrorMemoryAllocation. A distinct type so that code that can do with less (cuDNN's
/// workspace search) retries on it alone, while every other failure (a sticky CUDA error, a
/// bad argument) propagates.
class OutOfMemoryError : public Error {
 public:
  explicit OutOfMemoryError(const std::string& msg) : Error(msg) {}
};

namespace detail {
/// Concatenates any streamable arguments into one string (used by DLTRAIN_CHECK).
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace dltrain

/// Throws dltrain::Error built from the streamable arguments when `cond` is false.
#define DLTRAIN_CHECK(cond, ...)                                              \
  do {                                                                        \
    if (!(cond)) throw ::dltrain::Error(::dltrain::detail::cat(__VA_ARGS__)); \
  } while (0)

/// Throws dltrain::Error built from the streamable arguments.
#define DLTRAIN_FAIL(...) throw ::dltrain::Error(::dltrain::detail::cat(__VA_ARGS__))
