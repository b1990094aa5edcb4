// What the .pth reader's parts share (internal header): the error helpers that name the
// operation and the file, and the advice for files dltrain cannot read.
#pragma once

#include <cstdint>
#include <string>

#include "dltrain/core/error.hpp"

namespace dltrain::io::pth {

constexpr const char* kOp = "load_pth";
constexpr const char* kResave =
    "; dltrain reads only state dicts saved by torch.save (PyTorch >= 1.6): in Python, "
    "re-save the weights with torch.save(model.state_dict(), path)";

template <class... A>
[[noreturn]] void fail(const std::string& path, const A&... a) {
  DLTRAIN_FAIL(kOp, ": '", path, "': ", a...);
}

// The little-endian unsigned integer of n bytes at p (ZIP fields, pickle arguments).
inline uint64_t le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

}  // namespace dltrain::io::pth
