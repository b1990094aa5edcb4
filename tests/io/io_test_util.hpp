// Helpers for the weight-interchange tests: the bit-exact golden tensors of
// tests/reference/io/io_reference.txt (written by make_io_reference.py), a bitwise tensor
// comparison, a minimal STORED-only ZIP writer for crafting torch.save-like archives, and
// the probes for a Python with torch (and torchvision).
//
// io_reference.txt: per tensor a line `name dtype ndim sizes...` (dltrain dtype names) and a
// line of row-major elements, each the unsigned decimal value of its little-endian bit
// pattern. A malformed file raises dltrain::Error naming the file and the record.
#pragma once

#include <sys/wait.h>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "data/data_test_util.hpp"
#include "dltrain/dltrain.hpp"

namespace dltrain::testing {

inline const std::string kIoDir = DLTRAIN_REFERENCE_DIR "/io";

inline std::map<std::string, Tensor> read_io_reference(
    const std::string& path = kIoDir + "/io_reference.txt") {
  std::ifstream in(path);
  DLTRAIN_CHECK(in.good(), "io reference file '", path,
                "' cannot be opened; regenerate it with tests/reference/make_io_reference.py");
  std::map<std::string, Tensor> r;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream hs(line);
    std::string name, dtname;
    int64_t nd = -1;
    hs >> name >> dtname >> nd;
    DType dt = DType::f32;
    bool found = false;
    for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64,
                    DType::u8, DType::b8}) {
      if (dtname == dtype_name(d)) {
        dt = d;
        found = true;
      }
    }
    DLTRAIN_CHECK(found && nd >= 0, path, ": malformed header '", line, "'");
    Shape shape(static_cast<size_t>(nd));
    for (auto& s : shape)
      DLTRAIN_CHECK(static_cast<bool>(hs >> s), path, ": bad sizes in '", line, "'");
    std::string values;
    DLTRAIN_CHECK(static_cast<bool>(std::getline(in, values)), path, ": record '", name,
                  "' has no values line");
    Tensor t = empty(shape, TensorOptions(dt));
    auto* p = static_cast<unsigned char*>(t.data_ptr());
    std::istringstream vs(values);
    uint64_t bits = 0;
    int64_t n = 0;
    while (vs >> bits) {
      DLTRAIN_CHECK(n < t.numel(), path, ": record '", name, "' has too many values");
      std::memcpy(p + n * static_cast<int64_t>(t.element_size()), &bits, t.element_size());
      ++n;
    }
    DLTRAIN_CHECK(n == t.numel(), path, ": record '", name, "' has ", n, " values, expected ",
                  t.numel());
    r[name] = t;
  }
  DLTRAIN_CHECK(!r.empty(), path, " holds no tensors");
  return r;
}

/// The row-major bytes of `t` (any layout).
inline std::vector<unsigned char> tensor_bytes(const Tensor& t) {
  Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  return std::vector<unsigned char>(p, p + c.numel() * static_cast<int64_t>(c.element_size()));
}

/// Same dtype, same shape and the same bits in every element (NaN payloads and -0 included).
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && tensor_bytes(a) == tensor_bytes(b);
}

inline uint32_t crc32(const std::vector<uint8_t>& data) {
  uint32_t c = 0xFFFFFFFFu;
  for (uint8_t byte : data) {
    c ^= byte;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return c ^ 0xFFFFFFFFu;
}

/// A ZIP archive of STORED records, as torch.save writes (without its 64-byte alignment).
inline std::vector<uint8_t> make_zip(
    const std::vector<std::pair<std::string, std::vector<uint8_t>>>& records) {
  std::vector<uint8_t> out, cd;
  auto put = [](std::vector<uint8_t>& v, uint64_t x, int n) {
    for (int k = 0; k < n; ++k) v.push_back(static_cast<uint8_t>(x >> (8 * k)));
  };
  for (const auto& [name, data] : records) {
    const uint64_t offset = out.size();
    const uint32_t crc = crc32(data);
    put(out, 0x04034b50u, 4);
    put(out, 20, 2);  // version needed
    put(out, 0, 2);   // flags
    put(out, 0, 2);   // method: STORED
    put(out, 0, 4);   // time, date
    put(out, crc, 4);
    put(out, data.size(), 4);
    put(out, data.size(), 4);
    put(out, name.size(), 2);
    put(out, 0, 2);
    out.insert(out.end(), name.begin(), name.end());
    out.insert(out.end(), data.begin(), data.end());
    put(cd, 0x02014b50u, 4);
    put(cd, 20, 2);
    put(cd, 20, 2);
    put(cd, 0, 2);
    put(cd, 0, 2);
    put(cd, 0, 4);
    put(cd, crc, 4);
    put(cd, data.size(), 4);
    put(cd, data.size(), 4);
    put(cd, name.size(), 2);
    put(cd, 0, 2);  // extra
    put(cd, 0, 2);  // comment
    put(cd, 0, 2);  // disk
    put(cd, 0, 2);  // internal attributes
    put(cd, 0, 4);  // external attributes
    put(cd, offset, 4);
    cd.insert(cd.end(), name.begin(), name.end());
  }
  const uint64_t cd_offset = out.size();
  out.insert(out.end(), cd.begin(), cd.end());
  put(out, 0x06054b50u, 4);
  put(out, 0, 4);
  put(out, records.size(), 2);
  put(out, records.size(), 2);
  put(out, cd.size(), 4);
  put(out, cd_offset, 4);
  put(out, 0, 2);
  return out;
}

inline std::vector<uint8_t> bytes_of(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

/// Whether /usr/bin/python3 can import torch (the checker script needs it). Setting
/// DLTRAIN_TEST_NO_PYTHON=1 answers no, to exercise the C++-only path.
inline bool python_with_torch() {
  const char* off = std::getenv("DLTRAIN_TEST_NO_PYTHON");
  if (off != nullptr && std::string(off) != "" && std::string(off) != "0") return false;
  static const bool ok = std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
  return ok;
}

/// Whether /usr/bin/python3 can import torch and torchvision (make_io_reference.py
/// --check-resnet18 needs both; Debian packages them separately). DLTRAIN_TEST_NO_PYTHON=1
/// answers no, as above.
inline bool python_with_torchvision() {
  if (!python_with_torch()) return false;
  static const bool ok =
      std::system("/usr/bin/python3 -c 'import torchvision' >/dev/null 2>&1") == 0;
  return ok;
}

/// Runs make_io_reference.py with `args`; returns its exit status (-1 if it did not run).
inline int run_io_reference_script(const std::string& args) {
  const std::string cmd =
      "/usr/bin/python3 '" DLTRAIN_REFERENCE_DIR "/make_io_reference.py' " + args;
  const int rc = std::system(cmd.c_str());
  return rc == -1 ? -1 : WEXITSTATUS(rc);
}

}  // namespace dltrain::testing
