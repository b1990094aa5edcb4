// torch.save (.pth) reader: the step that turns the unpickled object into a StateDict, over
// the ZIP directory reader (pth_zip.*) and the restricted pickle machine (pth_pickle.*).
//
// Hand-written because no maintained C++ library reads torch.save files without libtorch;
// the ZIP part is small because torch.save stores records uncompressed (zlib is not
// needed, and compressed entries are refused). The pickle machine never imports or calls
// anything: a GLOBAL it does not know becomes an opaque placeholder that remembers the
// name, so a checkpoint dict may carry other objects (an argparse.Namespace next to the
// model's state dict) as long as the chosen state dict itself holds only tensors; a
// placeholder that ends up where a tensor is needed raises an error naming it. Tensors
// are lazy records (storage key, dtype, offset, sizes, strides) until the state dict is
// chosen, so ignored parts of a checkpoint (optimizer state) are never read from disk;
// each storage is read once (CRC-32 checked) and shared by all tensors that view it.
#include "dltrain/io/pth.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <sstream>

#include "dltrain/core/error.hpp"
#include "dltrain/io/file_format.hpp"
#include "src/io/crc32.hpp"
#include "src/io/pth_common.hpp"
#include "src/io/pth_pickle.hpp"
#include "src/io/pth_zip.hpp"
#include "src/io/raw_file.hpp"

namespace dltrain::io {

using namespace pth;

namespace {

// --- from the unpickled object to a StateDict -----------------------------------------------

class Materializer {
 public:
  Materializer(const ZipArchive& zip, const std::string& path, const std::string& prefix)
      : zip_(zip), path_(path), prefix_(prefix) {}

  Tensor tensor(const std::string& name, const TensorRecord& r) {
    const StorageType* st = find_storage_type(r.storage_type);
    if (st == nullptr)
      fail(path_, "tensor '", name, "' has storage type ", r.storage_type,
           ", which dltrain has no dtype for (it holds float32/64, float16, bfloat16, int64, "
           "int32, uint8, bool; int8/int16 are widened to int32); convert it in PyTorch "
           "(e.g. t.float() or t.long()) before saving");
    const Storage& storage = load(name, r, *st);
    // Every element the view reaches must lie inside the storage.
    const bool empty_view = std::find(r.sizes.begin(), r.sizes.end(), 0) != r.sizes.end();
    if (!empty_view) {
      uint64_t last = static_cast<uint64_t>(r.offset);
      bool overflow = false;
      for (size_t d = 0; d < r.sizes.size(); ++d) {
        const uint64_t span = static_cast<uint64_t>(r.sizes[d] - 1);
        const uint64_t stride = static_cast<uint64_t>(r.strides[d]);
        if (stride != 0 && span > (std::numeric_limits<uint64_t>::max() - last) / stride)
          overflow = true;
        else
          last += span * stride;
      }
      if (overflow || last >= static_cast<uint64_t>(r.storage_numel))
        fail(path_, "tensor '", name, "' (sizes ", shape_str(r.sizes), ", strides ",
             shape_str(r.strides), ", offset ", r.offset, ") reaches past the end of its storage '",
             r.key, "' of ", r.storage_numel, " elements; the file is corrupt, get a fresh copy");
    } else if (r.offset > r.storage_numel) {
      fail(path_, "tensor '", name, "' has storage offset ", r.offset, " past its storage '", r.key,
           "' of ", r.storage_numel, " elements; the file is corrupt");
    }
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = storage;
    impl->shape = r.sizes;
    impl->strides = r.strides;
    impl->offset = r.offset;
    impl->dtype = st->dtype;
    return Tensor(std::move(impl));
  }

 private:
  const Storage& load(const std::string& name, const TensorRecord& r, const StorageType& st) {
    auto it = cache_.find(r.key);
    if (it != cache_.end()) {
      if (it->second.type != &st || it->second.numel != r.storage_numel)
        fail(path_, "storage '", r.key,
             "' is referenced with two different types or sizes; the "
             "file is corrupt, get a fresh copy");
      return it->second.storage;
    }
    const std::string record = prefix_ + "data/" + r.key;
    const ZipEntry* e = zip_.find(record);
    if (e == nullptr)
      fail(path_, "the archive has no record '", record, "', which holds the data of tensor '",
           name, "'; the file is incomplete or corrupt, get a fresh copy", kResave);
    const uint64_t expect = static_cast<uint64_t>(r.storage_numel) * st.file_size;
    if (static_cast<uint64_t>(r.storage_numel) >
            std::numeric_limits<uint64_t>::max() / st.file_size ||
        e->size != expect)
      fail(path_, "record '", record, "' holds ", e->size, " bytes but tensor '", name,
           "' needs a ", r.storage_type, " of ", r.storage_numel, " elements (", expect,
           " bytes); the file is corrupt, get a fresh copy");
    zip_.locate(*e);  // validates the size before allocating for it
    const uint64_t out_bytes = static_cast<uint64_t>(r.storage_numel) * dtype_size(st.dtype);
    Storage storage(static_cast<size_t>(out_bytes), Device::cpu());
    if (st.file_size == dtype_size(st.dtype)) {
      zip_.read(*e, storage.data());
    } else {  // int8 / int16 widened to int32
      std::vector<unsigned char> raw(static_cast<size_t>(e->size));
      zip_.read(*e, raw.data());
      auto* dst = static_cast<int32_t*>(storage.data());
      for (int64_t k = 0; k < r.storage_numel; ++k) {
        if (st.file_size == 1) {
          dst[k] = static_cast<int8_t>(raw[static_cast<size_t>(k)]);
        } else {
          int16_t v;
          std::memcpy(&v, raw.data() + 2 * k, 2);
          dst[k] = v;
        }
      }
    }
    if (st.dtype == DType::b8) {
      const auto* p = static_cast<const unsigned char*>(storage.data());
      for (uint64_t k = 0; k < out_bytes; ++k)
        if (p[k] > 1)
          fail(path_, "bool storage '", record, "' holds the byte ", static_cast<int>(p[k]),
               " (only 0 and 1 are booleans); the file is corrupt, get a fresh copy");
    }
    return cache_.emplace(r.key, Cached{storage, &st, r.storage_numel}).first->second.storage;
  }

  struct Cached {
    Storage storage;
    const StorageType* type;
    int64_t numel;
  };
  const ZipArchive& zip_;
  const std::string& path_;
  const std::string& prefix_;
  std::map<std::string, Cached> cache_;
};

// A dict whose keys are all strings and whose values are all tensors.
bool is_state_dict(const Obj& o) {
  if (o->kind != PyObj::Kind::Dict) return false;
  for (const auto& [k, v] : o->dict)
    if (k->kind != PyObj::Kind::Str || v->kind != PyObj::Kind::Tensor) return false;
  return true;
}

const Obj* dict_get(const Obj& d, const std::string& key) {
  for (const auto& [k, v] : d->dict)
    if (k->kind == PyObj::Kind::Str && k->s == key) return &v;
  return nullptr;
}

// Why `o` is not a state dict, for the error message.
std::string why_not(const Obj& o) {
  if (o->kind == PyObj::Kind::Opaque && o->s.rfind("torch.nn.modules.", 0) == 0)
    return "it holds a whole model object (" + o->s +
           ", saved with torch.save(model, path)), whose loading needs its Python code";
  if (o->kind != PyObj::Kind::Dict) return "it holds " + describe(o) + ", not a dict of tensors";
  for (const auto& [k, v] : o->dict) {
    if (k->kind != PyObj::Kind::Str) return "it has a key that is " + describe(k) + ", not a str";
    if (v->kind != PyObj::Kind::Tensor)
      return "its entry '" + k->s + "' is " + describe(v) + ", not a tensor";
  }
  return "";
}

}  // namespace

StateDict load_pth(const std::string& path) {
  detail::require_little_endian_host(kOp);
  const detail::InputFile f(path, kOp);
  const ZipArchive zip(f);

  // The records live under one top-level folder named after the file (PyTorch 1.x) or
  // "archive" (2.x): find it through its data.pkl.
  std::string prefix;
  bool torchscript = false;
  for (const ZipEntry& e : zip.entries()) {
    const size_t slash = e.name.find('/');
    if (slash == std::string::npos) continue;
    const std::string rest = e.name.substr(slash + 1);
    if (rest == "data.pkl") {
      if (!prefix.empty())
        fail(path, "the archive holds two data.pkl records ('", prefix, "data.pkl' and '", e.name,
             "'); it was not written by torch.save", kResave);
      prefix = e.name.substr(0, slash + 1);
    }
    if (rest == "constants.pkl" || rest.rfind("code/", 0) == 0) torchscript = true;
  }
  if (prefix.empty())
    fail(path,
         torchscript ? "this is a TorchScript archive (torch.jit.save), not a torch.save file"
                     : "this ZIP archive has no <archive>/data.pkl record, so it was not written "
                       "by torch.save",
         kResave);
  if (const ZipEntry* bo = zip.find(prefix + "byteorder")) {
    // Appended piecewise: GCC 12 warns (-Wrestrict, a false positive) on "(" + std::string.
    std::string order = "(";
    order += std::to_string(bo->size);
    order += " bytes)";
    if (bo->size <= 16) {
      order.assign(static_cast<size_t>(bo->size), '\0');
      zip.read(*bo, order.data());
    }
    if (order != "little")
      fail(path, "the tensors were saved with byte order '", order,
           "' (on a big-endian machine); dltrain reads little-endian data only: load the file "
           "in PyTorch on that machine and save it as safetensors, which is always "
           "little-endian");
  }

  const ZipEntry* pkl = zip.find(prefix + "data.pkl");
  zip.locate(*pkl);  // validates the size before allocating for it
  std::string pickle(static_cast<size_t>(pkl->size), '\0');
  zip.read(*pkl, pickle.data());
  const Obj root = unpickle(pickle, path, pkl->name);

  Obj chosen;
  if (is_state_dict(root)) {
    chosen = root;
  } else if (root->kind == PyObj::Kind::Dict) {
    for (const char* key : {"state_dict", "model_state_dict", "model"}) {
      const Obj* v = dict_get(root, key);
      if (v != nullptr && is_state_dict(*v)) {
        chosen = *v;
        break;
      }
    }
  }
  if (!chosen) {
    std::string detail = why_not(root);
    for (const char* key : {"state_dict", "model_state_dict", "model"}) {
      const Obj* v = dict_get(root, key);
      if (root->kind == PyObj::Kind::Dict && v != nullptr)
        detail += "; its '" + std::string(key) + "' entry is no state dict either: " + why_not(*v);
    }
    fail(path, "the saved object is not a state dict: ", detail,
         ". A checkpoint dict is accepted when its 'state_dict', 'model_state_dict' or 'model' "
         "entry is a dict of tensors",
         kResave);
  }

  Materializer m(zip, path, prefix);
  StateDict sd;
  for (const auto& [k, v] : chosen->dict) sd.insert(k->s, m.tensor(k->s, *v->tensor));
  return sd;
}

}  // namespace dltrain::io