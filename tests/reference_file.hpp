// Reader for the golden files in tests/reference (written by make_reference.py).
//
// Format: optional '#' comment lines; then per tensor a header line
// `name ndim d0 .. d{ndim-1}` and one line of ndim-shape row-major values.
// Any malformed, truncated or missing file raises dltrain::Error naming the
// file, the record and what was wrong.
#pragma once

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "dltrain/dltrain.hpp"

namespace dltrain::testing {

inline std::map<std::string, Tensor> read_reference(const std::string& path) {
  std::ifstream in(path);
  DLTRAIN_CHECK(in.good(), "reference file '", path, "' cannot be opened; regenerate it with ",
                "tests/reference/make_reference.py");
  std::map<std::string, Tensor> r;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream hs(line);
    std::string name;
    int64_t nd = -1;
    hs >> name >> nd;
    DLTRAIN_CHECK(!name.empty() && nd >= 0 && nd <= 8, path, ":", lineno, ": malformed header '",
                  line, "' (expected: name ndim sizes...)");
    Shape shape(static_cast<size_t>(nd));
    for (auto& s : shape) {
      DLTRAIN_CHECK(static_cast<bool>(hs >> s) && s >= 0, path, ":", lineno,
                    ": bad size in header of '", name, "'");
    }
    std::string values;
    DLTRAIN_CHECK(static_cast<bool>(std::getline(in, values)), path, ": truncated: record '", name,
                  "' has a header but no values line");
    ++lineno;
    std::istringstream vs(values);
    std::vector<double> v;
    v.reserve(static_cast<size_t>(shape_numel(shape)));
    std::string tok;
    while (vs >> tok) {
      // strtod, unlike operator>>, reads the "nan" and "inf" that Python's %g writes.
      char* end = nullptr;
      const double d = std::strtod(tok.c_str(), &end);
      DLTRAIN_CHECK(end == tok.c_str() + tok.size(), path, ":", lineno, ": non-numeric value '",
                    tok, "' in record '", name, "'");
      v.push_back(d);
    }
    DLTRAIN_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape), path, ":", lineno,
                  ": truncated or corrupt record '", name, "': expected ", shape_numel(shape),
                  " values for shape ", shape_str(shape), " but found ", v.size());
    r[name] = nd == 0 ? from_vector(v).reshape({}) : from_vector(v, shape);
  }
  DLTRAIN_CHECK(!r.empty(), "reference file '", path, "' holds no tensors");
  return r;
}

/// The golden file `path`, read once per process and kept.
inline const std::map<std::string, Tensor>& cached_reference(const std::string& path) {
  static std::map<std::string, std::map<std::string, Tensor>> files;
  auto it = files.find(path);
  if (it == files.end()) it = files.emplace(path, read_reference(path)).first;
  return it->second;
}

/// Tensor `name` of the golden file `path`; dltrain::Error naming both when it is missing.
inline Tensor reference_tensor(const std::string& path, const std::string& name) {
  const auto& r = cached_reference(path);
  auto it = r.find(name);
  DLTRAIN_CHECK(it != r.end(), "no reference tensor '", name, "' in '", path,
                "'; regenerate the file with its script in tests/reference/");
  return it->second;
}

}  // namespace dltrain::testing
