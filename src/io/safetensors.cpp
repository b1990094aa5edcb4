// safetensors reader and writer.
//
// The header is JSON, read and written with nlohmann/json (ordered_json, so members keep
// the document's order). Its DOM parser is wrapped to add what the format needs and the
// library lacks: duplicate keys are an error (nlohmann keeps the last one silently), nesting
// stops at 64 levels, and every parse error is a dltrain::Error naming the file and the byte
// offset. Integers are exact up to 2^64 - 1 (nlohmann's number_unsigned); anything else where
// a size or offset belongs is rejected. Everything in the header is validated before a tensor
// is allocated; then the tensors are read in file order with one positioned read each,
// straight into their storage.
#include "dltrain/io/safetensors.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "dltrain/core/error.hpp"
#include "dltrain/io/file_format.hpp"
#include "src/io/raw_file.hpp"

namespace dltrain::io {

namespace {

constexpr const char* kLoad = "load_safetensors";
constexpr const char* kSave = "save_safetensors";
// The reference implementation refuses headers above 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeader = 100'000'000;
constexpr int kMaxDepth = 64;

// --- dtypes ----------------------------------------------------------------------------

struct DtypeSpec {
  const char* name;  // as written in the header
  uint64_t file_size;
  DType dtype;     // what load returns
  bool supported;  // false: a valid safetensors dtype dltrain cannot hold
};

constexpr std::array<DtypeSpec, 15> kDtypes{{{"F64", 8, DType::f64, true},
                                             {"F32", 4, DType::f32, true},
                                             {"F16", 2, DType::f16, true},
                                             {"BF16", 2, DType::bf16, true},
                                             {"I64", 8, DType::i64, true},
                                             {"I32", 4, DType::i32, true},
                                             {"U8", 1, DType::u8, true},
                                             {"BOOL", 1, DType::b8, true},
                                             {"I16", 2, DType::i32, true},  // widened
                                             {"I8", 1, DType::i32, true},   // widened
                                             {"U16", 2, DType::i32, false},
                                             {"U32", 4, DType::i64, false},
                                             {"U64", 8, DType::i64, false},
                                             {"F8_E4M3", 1, DType::f32, false},
                                             {"F8_E5M2", 1, DType::f32, false}}};

const DtypeSpec* find_dtype(const std::string& name) {
  for (const DtypeSpec& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

const char* file_dtype_of(DType t) {
  switch (t) {
    case DType::f64:
      return "F64";
    case DType::f32:
      return "F32";
    case DType::f16:
      return "F16";
    case DType::bf16:
      return "BF16";
    case DType::i64:
      return "I64";
    case DType::i32:
      return "I32";
    case DType::u8:
      return "U8";
    case DType::b8:
      return "BOOL";
  }
  DLTRAIN_FAIL(kSave, ": invalid dtype value ", static_cast<int>(t));
}

template <class... A>
[[noreturn]] void bad(const std::string& path, const A&... a) {
  DLTRAIN_FAIL(kLoad, ": '", path, "': ", a...);
}

constexpr const char* kCorrupt =
    "; the file is corrupt or was not written by a safetensors writer, re-export it";

// --- JSON ------------------------------------------------------------------------------

using Json = nlohmann::ordered_json;  // document order: the writer's and Python's

const char* kind_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float:
      return "a number";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    default:
      return "not a JSON value";
  }
}

// An iterator over the header text that records how far nlohmann's lexer has read, so that
// errors raised from the parser callback (depth, duplicate keys) can name a byte offset too.
class TrackedChar {
 public:
  using iterator_category = std::forward_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  TrackedChar() = default;
  TrackedChar(const char* p, const char* begin, size_t* read) : p_(p), begin_(begin), read_(read) {}
  reference operator*() const {
    *read_ = static_cast<size_t>(p_ - begin_) + 1;
    return *p_;
  }
  TrackedChar& operator++() {
    ++p_;
    return *this;
  }
  TrackedChar operator++(int) {
    TrackedChar old = *this;
    ++p_;
    return old;
  }
  bool operator==(const TrackedChar& o) const { return p_ == o.p_; }

 private:
  const char* p_ = nullptr;
  const char* begin_ = nullptr;
  size_t* read_ = nullptr;
};

[[noreturn]] void malformed(const std::string& path, const std::string& what, size_t byte) {
  DLTRAIN_FAIL(kLoad, ": '", path, "' has a malformed JSON header: ", what, " at byte ", byte,
               " of the header (file offset ", byte + 8,
               "); the file is corrupt or not a safetensors file, re-export it");
}

// nlohmann's message without its "[json.exception.parse_error.101] parse error at line 1,
// column 52: " prefix (the offset is reported in the file's terms instead).
std::string json_detail(const nlohmann::json::exception& e) {
  std::string m = e.what();
  if (const size_t b = m.find("] "); m.rfind("[json.exception.", 0) == 0 && b != std::string::npos)
    m.erase(0, b + 2);
  if (m.rfind("parse error", 0) == 0)
    if (const size_t c = m.find(": "); c != std::string::npos) m.erase(0, c + 2);
  // Its "last read" excerpt copies the file's bytes: keep the message printable ASCII.
  std::string out;
  for (const char c : m) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F) {
      out += c;
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    }
  }
  return out;
}

// Parses the header with nlohmann/json and two checks its DOM parser lacks: nesting at most
// kMaxDepth levels (the parser is iterative, but a deep document is never a safetensors
// header) and no duplicate key in any object (nlohmann keeps the last one silently, the
// reference implementation rejects the file). Any failure is a dltrain::Error naming the
// file and the byte offset.
Json parse_header_json(const std::string& text, const std::string& path) {
  struct Frame {
    bool object;
    std::set<std::string> keys;
    std::string key;  // the last key read in this object
  };
  std::vector<Frame> stack;
  size_t read = 0;  // characters the lexer has consumed
  const auto at = [&] { return read == 0 ? size_t{0} : read - 1; };
  auto check = [&](int /*depth*/, nlohmann::json::parse_event_t event, Json& parsed) {
    using E = nlohmann::json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start:
        if (stack.size() > static_cast<size_t>(kMaxDepth))
          malformed(path, "nesting deeper than " + std::to_string(kMaxDepth) + " levels", at());
        stack.push_back(Frame{event == E::object_start, {}, {}});
        break;
      case E::object_end:
      case E::array_end:
        stack.pop_back();
        break;
      case E::key: {
        Frame& f = stack.back();
        std::string k = parsed.get<std::string>();
        if (!f.keys.insert(k).second) {
          if (stack.size() == 1)
            bad(path,
                k == "__metadata__" ? std::string("the header has two \"__metadata__\" entries")
                                    : "tensor name '" + k + "' appears twice in the header",
                "; names must be unique, re-export the file (byte ", at(),
                " of the header, file offset ", at() + 8, ")");
          if (stack.size() == 2)
            bad(path,
                stack[0].key == "__metadata__" ? std::string("\"__metadata__\" has key '")
                                               : "tensor '" + stack[0].key + "' has field '",
                k, "' twice (byte ", at(), " of the header, file offset ", at() + 8, ")", kCorrupt);
          malformed(path, "key '" + k + "' appears twice in one object", at());
        }
        f.key = std::move(k);
        break;
      }
      case E::value:
        break;
    }
    return true;
  };
  const char* b = text.data();
  try {
    return Json::parse(TrackedChar(b, b, &read), TrackedChar(b + text.size(), b, &read), check);
  } catch (const nlohmann::json::parse_error& e) {
    malformed(path, json_detail(e), e.byte == 0 ? 0 : e.byte - 1);
  } catch (const nlohmann::json::exception& e) {  // e.g. out_of_range: a number like 1e999
    malformed(path, json_detail(e), at());
  }
}

// --- header ----------------------------------------------------------------------------

struct Entry {
  std::string name;
  Shape shape;
  const DtypeSpec* spec = nullptr;
  uint64_t begin = 0, end = 0;
};

struct Header {
  std::vector<Entry> entries;  // sorted by data offset
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // file offset of the data section
};

uint64_t as_uint(const Json& v, const std::string& path, const std::string& tensor,
                 const char* field) {
  if (!v.is_number_unsigned())
    bad(path, "tensor '", tensor, "': ", field, " must hold non-negative integers but has ",
        v.is_number() ? v.dump() : kind_name(v), kCorrupt);
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& name, const Json& v, const std::string& path) {
  if (!v.is_object())
    bad(path, "tensor '", name, "' is described by ", kind_name(v),
        " instead of an object {\"dtype\", \"shape\", \"data_offsets\"}", kCorrupt);
  Entry e;
  e.name = name;
  const Json *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
  for (const auto& [key, field] : v.items()) {
    const Json** slot = key == "dtype"          ? &dtype
                        : key == "shape"        ? &shape
                        : key == "data_offsets" ? &offsets
                                                : nullptr;
    if (slot == nullptr)
      bad(path, "tensor '", name, "' has an unknown field '", key,
          "' (expected only dtype, shape, data_offsets)", kCorrupt);
    *slot = &field;
  }
  if (!dtype || !shape || !offsets)
    bad(path, "tensor '", name, "' lacks its ",
        !dtype   ? "\"dtype\""
        : !shape ? "\"shape\""
                 : "\"data_offsets\"",
        " field", kCorrupt);
  if (!dtype->is_string())
    bad(path, "tensor '", name, "': dtype must be a string but is ", kind_name(*dtype), kCorrupt);
  const std::string& dtype_name = dtype->get_ref<const std::string&>();
  e.spec = find_dtype(dtype_name);
  if (e.spec == nullptr)
    bad(path, "tensor '", name, "' has unknown dtype '", dtype_name,
        "' (known: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL, and U16 U32 U64 F8_E4M3 F8_E5M2 "
        "which dltrain cannot hold)",
        kCorrupt);
  if (!e.spec->supported)
    bad(path, "tensor '", name, "' has dtype ", e.spec->name,
        ", which dltrain has no tensor type for (dltrain holds F64 F32 F16 BF16 I64 I32 U8 "
        "BOOL, and widens I16/I8 to int32); convert that tensor in PyTorch (e.g. "
        ".to(torch.int64) or .float()) and re-export the file");
  if (!shape->is_array())
    bad(path, "tensor '", name, "': shape must be an array but is ", kind_name(*shape), kCorrupt);
  uint64_t numel = 1;
  bool overflow = false;
  for (const Json& d : *shape) {
    const uint64_t s = as_uint(d, path, name, "shape");
    if (s > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad(path, "tensor '", name, "' has an impossible size ", s, " in its shape", kCorrupt);
    if (s != 0 && numel > std::numeric_limits<uint64_t>::max() / s) overflow = true;
    numel *= s;
    e.shape.push_back(static_cast<int64_t>(s));
  }
  if (!offsets->is_array() || offsets->size() != 2)
    bad(path, "tensor '", name, "': data_offsets must be an array [begin, end]", kCorrupt);
  e.begin = as_uint((*offsets)[0], path, name, "data_offsets");
  e.end = as_uint((*offsets)[1], path, name, "data_offsets");
  if (e.end < e.begin)
    bad(path, "tensor '", name, "' has data_offsets [", e.begin, ", ", e.end,
        "] that end before they begin", kCorrupt);
  const uint64_t width = e.spec->file_size;
  if (overflow || numel > std::numeric_limits<uint64_t>::max() / width ||
      numel * width != e.end - e.begin)
    bad(path, "tensor '", name, "' of shape ", shape_str(e.shape), " and dtype ", e.spec->name,
        " needs ", overflow ? std::string("more than 2^64") : std::to_string(numel * width),
        " bytes, but its data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin,
        kCorrupt);
  return e;
}

Header read_header(const detail::InputFile& f) {
  const std::string& path = f.path();
  // Another known kind of file gets its name and its reader, not a parse error.
  const FileFormat kind = detect_file_format(path);
  if (kind != FileFormat::Safetensors && kind != FileFormat::Other)
    bad(path, "this is ", describe_file_format(kind), ", not a safetensors file; read it with ",
        kind == FileFormat::Checkpoint || kind == FileFormat::Hdf5 ? "io::read_checkpoint"
                                                                   : "io::load_pth",
        " (or convert it with dltrain-convert)");
  if (f.size() < 8)
    bad(path, "the file has ", f.size(),
        " bytes, too few for the 8-byte header length that starts a safetensors file; it is "
        "truncated or not a safetensors file");
  unsigned char len_bytes[8];
  f.read_at(0, len_bytes, 8, "the header length");
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | len_bytes[k];
  if (n > f.size() - 8)
    bad(path, "the header length field says ", n, " bytes but only ", f.size() - 8,
        " bytes follow it; the file is truncated or not a safetensors file");
  if (n > kMaxHeader)
    bad(path, "the header length ", n, " exceeds the 100 MB limit of the safetensors format",
        kCorrupt);
  std::string text(static_cast<size_t>(n), '\0');
  f.read_at(8, text.data(), n, "the JSON header");
  if (n < 2 || text[0] != '{')
    bad(path, "the header does not start with '{' (", n,
        " header bytes); this is not a safetensors file");
  const Json root = parse_header_json(text, path);
  if (!root.is_object()) bad(path, "the JSON header is not an object", kCorrupt);

  Header h;
  h.data_start = 8 + n;
  const uint64_t data_size = f.size() - h.data_start;
  // Keys are unique here (parse_header_json rejects duplicates).
  for (const auto& [name, v] : root.items()) {
    if (name == "__metadata__") {
      if (!v.is_object())
        bad(path, "\"__metadata__\" must be an object of strings but is ", kind_name(v), kCorrupt);
      for (const auto& [key, val] : v.items()) {
        if (!val.is_string())
          bad(path, "\"__metadata__\" entry '", key, "' must be a string but is ", kind_name(val),
              kCorrupt);
        h.metadata.emplace(key, val.get<std::string>());
      }
      continue;
    }
    h.entries.push_back(parse_entry(name, v, path));
  }

  // The data section must be tiled exactly: sorted by offset, each tensor starts where the
  // previous one ended, and the last one ends at the end of the file.
  std::stable_sort(h.entries.begin(), h.entries.end(),
                   [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  uint64_t expected = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : h.entries) {
    if (e.end > data_size)
      bad(path, "tensor '", e.name, "' has data_offsets [", e.begin, ", ", e.end,
          "] past the end of the data section (", data_size,
          " bytes); the file is truncated or corrupt, get a complete copy");
    if (e.begin < expected)
      bad(path, "tensor '", e.name, "' (data_offsets [", e.begin, ", ", e.end,
          "]) overlaps tensor '", prev->name, "' (data_offsets [", prev->begin, ", ", prev->end,
          "])", kCorrupt);
    if (e.begin > expected)
      bad(path, "there are ", e.begin - expected, " unused bytes before tensor '", e.name,
          "' (data_offsets [", e.begin, ", ", e.end, "], previous data ends at ", expected,
          "); offsets must tile the data section", kCorrupt);
    expected = e.end;
    prev = &e;
  }
  if (expected != data_size)
    bad(path, "the data section has ", data_size, " bytes but the tensors use only ", expected,
        "; the file has trailing bytes or its header lost entries", kCorrupt);
  return h;
}

// A row-major CPU copy of `t` (or `t` itself when it already is one). A non-contiguous
// device tensor comes over as its whole storage in one contiguous copy and is reordered on
// the CPU, so writing needs no device kernel.
Tensor to_cpu_contiguous(const Tensor& t) {
  const Tensor d = t.detach();
  if (d.device().is_cpu()) return d.contiguous();
  if (d.is_contiguous()) return d.to(Device::cpu());
  const TensorImpl& src = *d.impl();
  auto whole = std::make_shared<TensorImpl>();
  whole->storage = src.storage;
  whole->dtype = src.dtype;
  whole->shape = {static_cast<int64_t>(src.storage.nbytes() / dtype_size(src.dtype))};
  whole->strides = {1};
  const Tensor host = Tensor(whole).to(Device::cpu());
  auto view = std::make_shared<TensorImpl>();
  view->storage = host.storage();
  view->dtype = src.dtype;
  view->shape = src.shape;
  view->strides = src.strides;
  view->offset = src.offset;
  return Tensor(view).contiguous();
}

}  // namespace

// --- public API ------------------------------------------------------------------------

std::vector<TensorInfo> list_safetensors(const std::string& path) {
  const detail::InputFile f(path, "list_safetensors");
  const Header h = read_header(f);
  std::vector<TensorInfo> out;
  out.reserve(h.entries.size());
  for (const Entry& e : h.entries)
    out.push_back({e.name, e.shape, e.spec->dtype, e.spec->name, e.begin, e.end});
  return out;
}

std::map<std::string, std::string> safetensors_metadata(const std::string& path) {
  const detail::InputFile f(path, "safetensors_metadata");
  return read_header(f).metadata;
}

StateDict load_safetensors(const std::string& path) {
  detail::require_little_endian_host(kLoad);
  const detail::InputFile f(path, kLoad);
  const Header h = read_header(f);
  StateDict sd;
  std::vector<unsigned char> staging;
  for (const Entry& e : h.entries) {
    Tensor t = empty(e.shape, TensorOptions(e.spec->dtype));
    const uint64_t nbytes = e.end - e.begin;
    const std::string what = "tensor '" + e.name + "'";
    if (e.spec->file_size == dtype_size(e.spec->dtype)) {
      if (nbytes > 0) f.read_at(h.data_start + e.begin, t.data_ptr(), nbytes, what);
      if (e.spec->dtype == DType::b8) {
        const auto* p = static_cast<const unsigned char*>(t.data_ptr());
        for (uint64_t k = 0; k < nbytes; ++k)
          if (p[k] > 1)
            bad(path, "BOOL tensor '", e.name, "' holds the byte ", static_cast<int>(p[k]),
                " at element ", k, " (only 0 and 1 are booleans)", kCorrupt);
      }
    } else {  // I8 / I16 widened to int32
      staging.resize(static_cast<size_t>(nbytes));
      if (nbytes > 0) f.read_at(h.data_start + e.begin, staging.data(), nbytes, what);
      auto* dst = t.data<int32_t>();
      const int64_t n = t.numel();
      if (e.spec->file_size == 1) {
        for (int64_t k = 0; k < n; ++k) dst[k] = static_cast<int8_t>(staging[k]);
      } else {
        for (int64_t k = 0; k < n; ++k) {
          int16_t v;
          std::memcpy(&v, staging.data() + 2 * k, 2);
          dst[k] = v;
        }
      }
    }
    sd.insert(e.name, t);
  }
  return sd;
}

void save_safetensors(const std::string& path, const StateDict& sd,
                      const std::map<std::string, std::string>& metadata) {
  detail::require_little_endian_host(kSave);
  // The header only needs shapes and dtypes: build it first, then convert and write one
  // tensor at a time so at most one extra copy (device->CPU, or a non-contiguous view)
  // exists at once.
  Json doc = Json::object();
  if (!metadata.empty()) {
    Json& meta = doc["__metadata__"] = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : sd) {
    DLTRAIN_CHECK(!name.empty(), kSave, ": cannot write '", path,
                  "': a tensor has an empty name; give every StateDict entry a name");
    DLTRAIN_CHECK(name != "__metadata__", kSave, ": cannot write '", path,
                  "': \"__metadata__\" is reserved by the safetensors format; rename that "
                  "entry (metadata goes in the `metadata` argument)");
    DLTRAIN_CHECK(t.defined(), kSave, ": cannot write '", path, "': tensor '", name,
                  "' is undefined");
    const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    Json shape = Json::array();
    for (int64_t d : t.shape()) shape.push_back(d);
    // Member order as the reference writer's: dtype, shape, data_offsets.
    doc[name] = Json{{"dtype", file_dtype_of(t.dtype())},
                     {"shape", std::move(shape)},
                     {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string header;
  try {
    header = doc.dump();
  } catch (const nlohmann::json::type_error& e) {  // 316: a name or value is not UTF-8
    DLTRAIN_FAIL(kSave, ": cannot write '", path, "': ", json_detail(e),
                 "; safetensors headers are JSON, so every tensor name and metadata key and "
                 "value must be valid UTF-8 text; rename the entry");
  }
  header.append((8 - header.size() % 8) % 8, ' ');

  detail::AtomicOutputFile out(path, kSave);
  unsigned char len_bytes[8];
  uint64_t n = header.size();
  for (unsigned char& b : len_bytes) {
    b = static_cast<unsigned char>(n & 0xFF);
    n >>= 8;
  }
  out.write(len_bytes, 8);
  out.write(header.data(), header.size());
  for (const auto& [name, t] : sd) {
    if (t.numel() == 0) continue;
    const Tensor c = to_cpu_contiguous(t);
    out.write(c.data_ptr(), static_cast<uint64_t>(c.numel()) * c.element_size());
  }
  out.commit();
}

}  // namespace dltrain::io
