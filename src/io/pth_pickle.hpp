// The restricted pickle machine of the .pth reader (internal header): the objects it builds
// and the one entry point. It never imports or calls anything: a GLOBAL it does not know
// becomes an opaque placeholder that remembers the name; tensors are lazy records (storage
// key, dtype, offset, sizes, strides) read only if the chosen state dict needs them. Defined
// in pth_pickle.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dltrain/core/dtype.hpp"
#include "dltrain/core/tensor.hpp"

namespace dltrain::io::pth {

struct PyObj;
using Obj = std::shared_ptr<PyObj>;

// A tensor as the pickle describes it; its data is read only if the state dict needs it.
struct TensorRecord {
  std::string storage_type;  // "torch.FloatStorage"
  std::string key;           // record name under <archive>/data/
  int64_t storage_numel = 0;
  int64_t offset = 0;
  Shape sizes, strides;
};

struct PyObj {
  enum class Kind {
    None,
    Bool,
    Int,
    Float,
    Str,
    Bytes,
    Tuple,
    List,
    Dict,
    Global,
    Opaque,
    Storage,
    Tensor
  };
  Kind kind = Kind::None;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;           // Str/Bytes value; Global/Opaque: "module.name"; Storage: its type
  std::vector<Obj> items;  // Tuple, List
  std::vector<std::pair<Obj, Obj>> dict;  // Dict, insertion order
  std::shared_ptr<TensorRecord> tensor;   // Tensor, Storage (key, numel, type)
  int depth = 0;                          // nesting depth of containers below
};

/// A new object of kind k.
Obj make(PyObj::Kind k);
/// What `o` is, in words, for error messages.
std::string describe(const Obj& o);

struct StorageType {
  const char* name;
  DType dtype;         // dtype of the loaded tensor
  uint64_t file_size;  // bytes per element in the record
};

/// The storage type named `name` ("torch.FloatStorage", ...), or null when dltrain has no
/// dtype for it.
const StorageType* find_storage_type(const std::string& name);

/// Runs the pickle `data` (record `record` of the file `path`, both for errors) and returns the
/// object it builds.
Obj unpickle(const std::string& data, const std::string& path, const std::string& record);

}  // namespace dltrain::io::pth
