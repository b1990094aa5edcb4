// safetensors reader and writer.
//
// The header is parsed by a small JSON parser written here: dltrain has no JSON
// dependency and the header is a fixed, tiny subset (objects, arrays, strings,
// integers). The parser accepts any well-formed JSON (so an error says "bad value" rather
// than "unsupported syntax") but keeps integers exact up to 2^64 - 1 and nests at most
// 64 levels, so a hostile header cannot overflow the stack. Everything in the header is
// validated before a tensor is allocated; then the tensors are read in file order with
// one positioned read each, straight into their storage.
#include "dltrain/io/safetensors.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string_view>

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

// --- JSON ------------------------------------------------------------------------------

struct JsonMember;
struct Json {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  bool is_uint = false;  // a plain non-negative integer that fits in uint64
  uint64_t uint = 0;
  std::string str;  // a string's value, or a number's text
  std::vector<Json> array;
  // In document order, duplicates kept. Not a std::pair: a vector may hold an incomplete type
  // (C++17), a pair may not (clang rejects it).
  std::vector<JsonMember> object;
};
struct JsonMember {
  std::string key;
  Json value;
};

const char* kind_name(Json::Kind k) {
  switch (k) {
    case Json::Kind::Null:
      return "null";
    case Json::Kind::Bool:
      return "a boolean";
    case Json::Kind::Number:
      return "a number";
    case Json::Kind::String:
      return "a string";
    case Json::Kind::Array:
      return "an array";
    case Json::Kind::Object:
      return "an object";
  }
  return "?";
}

class JsonParser {
 public:
  JsonParser(std::string_view text, const std::string& path) : s_(text), path_(path) {}

  Json document() {
    skip_ws();
    Json v = value(0);
    skip_ws();
    if (i_ != s_.size()) fail("unexpected text after the end of the JSON object");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    DLTRAIN_FAIL(kLoad, ": '", path_, "' has a malformed JSON header: ", what, " at byte ", i_,
                 " of the header (file offset ", i_ + 8,
                 "); the file is corrupt or not a safetensors file, re-export it");
  }
  bool at_end() const { return i_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[i_]; }
  void skip_ws() {
    while (!at_end() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c, const char* context) {
    if (peek() != c) fail(std::string("expected '") + c + "' " + context);
    ++i_;
  }

  Json value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than 64 levels");
    if (at_end()) fail("unexpected end of the header");
    const char c = peek();
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') {
      Json v;
      v.kind = Json::Kind::String;
      v.str = string();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    for (const char* word : {"true", "false", "null"}) {
      const size_t n = std::strlen(word);
      if (s_.substr(i_, n) == word) {
        i_ += n;
        Json v;
        v.kind = word[0] == 'n' ? Json::Kind::Null : Json::Kind::Bool;
        v.boolean = word[0] == 't';
        return v;
      }
    }
    fail(std::string("unexpected character '") + c + "' where a value should start");
  }

  Json object(int depth) {
    Json v;
    v.kind = Json::Kind::Object;
    ++i_;  // '{'
    skip_ws();
    if (peek() == '}') {
      ++i_;
      return v;
    }
    while (true) {
      skip_ws();
      if (peek() != '"') fail("expected a string key in an object");
      std::string key = string();
      skip_ws();
      expect(':', "after an object key");
      skip_ws();
      v.object.push_back(JsonMember{std::move(key), value(depth + 1)});
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect('}', "or ',' after an object member");
      return v;
    }
  }

  Json array(int depth) {
    Json v;
    v.kind = Json::Kind::Array;
    ++i_;  // '['
    skip_ws();
    if (peek() == ']') {
      ++i_;
      return v;
    }
    while (true) {
      skip_ws();
      v.array.push_back(value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect(']', "or ',' after an array element");
      return v;
    }
  }

  Json number() {
    const size_t start = i_;
    bool plain = true;
    if (peek() == '-') {
      plain = false;
      ++i_;
    }
    auto digits = [&] {
      const size_t b = i_;
      while (!at_end() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      if (i_ == b) fail("expected a digit in a number");
    };
    if (peek() == '0') {
      ++i_;
    } else {
      digits();
    }
    if (peek() == '.') {
      plain = false;
      ++i_;
      digits();
    }
    if (peek() == 'e' || peek() == 'E') {
      plain = false;
      ++i_;
      if (peek() == '+' || peek() == '-') ++i_;
      digits();
    }
    Json v;
    v.kind = Json::Kind::Number;
    v.str = std::string(s_.substr(start, i_ - start));
    if (plain) {
      v.is_uint = true;
      for (char d : v.str) {
        const uint64_t digit = static_cast<uint64_t>(d - '0');
        if (v.uint > (std::numeric_limits<uint64_t>::max() - digit) / 10) {
          v.is_uint = false;
          break;
        }
        v.uint = v.uint * 10 + digit;
      }
    }
    return v;
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned u = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[i_++];
      u <<= 4;
      if (h >= '0' && h <= '9') {
        u |= static_cast<unsigned>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        u |= static_cast<unsigned>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        u |= static_cast<unsigned>(h - 'A' + 10);
      } else {
        fail("bad hex digit in a \\u escape");
      }
    }
    return u;
  }

  static void put_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    ++i_;  // opening quote
    std::string out;
    while (true) {
      if (at_end()) fail("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("raw control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_end()) fail("unterminated escape in a string");
      const char e = s_[i_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {  // high surrogate: a low one must follow
            if (s_.substr(i_, 2) != "\\u") fail("unpaired UTF-16 surrogate in a \\u escape");
            i_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("unpaired UTF-16 surrogate in a \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("unpaired UTF-16 surrogate in a \\u escape");
          }
          put_utf8(out, cp);
          break;
        }
        default:
          fail(std::string("invalid escape '\\") + e + "' in a string");
      }
    }
  }

  std::string_view s_;
  const std::string& path_;
  size_t i_ = 0;
};

void append_json_string(std::string& out, const std::string& s) {
  static const char* hex = "0123456789abcdef";
  out += '"';
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  out += '"';
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

template <class... A>
[[noreturn]] void bad(const std::string& path, const A&... a) {
  DLTRAIN_FAIL(kLoad, ": '", path, "': ", a...);
}

constexpr const char* kCorrupt =
    "; the file is corrupt or was not written by a safetensors writer, re-export it";

uint64_t as_uint(const Json& v, const std::string& path, const std::string& tensor,
                 const char* field) {
  if (v.kind != Json::Kind::Number || !v.is_uint)
    bad(path, "tensor '", tensor, "': ", field, " must hold non-negative integers but has ",
        v.kind == Json::Kind::Number ? v.str : kind_name(v.kind), kCorrupt);
  return v.uint;
}

Entry parse_entry(const std::string& name, const Json& v, const std::string& path) {
  if (v.kind != Json::Kind::Object)
    bad(path, "tensor '", name, "' is described by ", kind_name(v.kind),
        " instead of an object {\"dtype\", \"shape\", \"data_offsets\"}", kCorrupt);
  Entry e;
  e.name = name;
  const Json *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
  for (const auto& [key, field] : v.object) {
    const Json** slot = key == "dtype"          ? &dtype
                        : key == "shape"        ? &shape
                        : key == "data_offsets" ? &offsets
                                                : nullptr;
    if (slot == nullptr)
      bad(path, "tensor '", name, "' has an unknown field '", key,
          "' (expected only dtype, shape, data_offsets)", kCorrupt);
    if (*slot != nullptr) bad(path, "tensor '", name, "' has field '", key, "' twice", kCorrupt);
    *slot = &field;
  }
  if (!dtype || !shape || !offsets)
    bad(path, "tensor '", name, "' lacks its ",
        !dtype   ? "\"dtype\""
        : !shape ? "\"shape\""
                 : "\"data_offsets\"",
        " field", kCorrupt);
  if (dtype->kind != Json::Kind::String)
    bad(path, "tensor '", name, "': dtype must be a string but is ", kind_name(dtype->kind),
        kCorrupt);
  e.spec = find_dtype(dtype->str);
  if (e.spec == nullptr)
    bad(path, "tensor '", name, "' has unknown dtype '", dtype->str,
        "' (known: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL, and U16 U32 U64 F8_E4M3 F8_E5M2 "
        "which dltrain cannot hold)",
        kCorrupt);
  if (!e.spec->supported)
    bad(path, "tensor '", name, "' has dtype ", e.spec->name,
        ", which dltrain has no tensor type for (dltrain holds F64 F32 F16 BF16 I64 I32 U8 "
        "BOOL, and widens I16/I8 to int32); convert that tensor in PyTorch (e.g. "
        ".to(torch.int64) or .float()) and re-export the file");
  if (shape->kind != Json::Kind::Array)
    bad(path, "tensor '", name, "': shape must be an array but is ", kind_name(shape->kind),
        kCorrupt);
  uint64_t numel = 1;
  bool overflow = false;
  for (const Json& d : shape->array) {
    const uint64_t s = as_uint(d, path, name, "shape");
    if (s > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad(path, "tensor '", name, "' has an impossible size ", s, " in its shape", kCorrupt);
    if (s != 0 && numel > std::numeric_limits<uint64_t>::max() / s) overflow = true;
    numel *= s;
    e.shape.push_back(static_cast<int64_t>(s));
  }
  if (offsets->kind != Json::Kind::Array || offsets->array.size() != 2)
    bad(path, "tensor '", name, "': data_offsets must be an array [begin, end]", kCorrupt);
  e.begin = as_uint(offsets->array[0], path, name, "data_offsets");
  e.end = as_uint(offsets->array[1], path, name, "data_offsets");
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
  const Json root = JsonParser(text, path).document();
  if (root.kind != Json::Kind::Object) bad(path, "the JSON header is not an object", kCorrupt);

  Header h;
  h.data_start = 8 + n;
  const uint64_t data_size = f.size() - h.data_start;
  std::set<std::string> seen;
  bool have_meta = false;
  for (const auto& [name, v] : root.object) {
    if (name == "__metadata__") {
      if (have_meta) bad(path, "the header has two \"__metadata__\" entries", kCorrupt);
      have_meta = true;
      if (v.kind != Json::Kind::Object)
        bad(path, "\"__metadata__\" must be an object of strings but is ", kind_name(v.kind),
            kCorrupt);
      for (const auto& [key, val] : v.object) {
        if (val.kind != Json::Kind::String)
          bad(path, "\"__metadata__\" entry '", key, "' must be a string but is ",
              kind_name(val.kind), kCorrupt);
        if (!h.metadata.emplace(key, val.str).second)
          bad(path, "\"__metadata__\" has key '", key, "' twice", kCorrupt);
      }
      continue;
    }
    if (!seen.insert(name).second)
      bad(path, "tensor name '", name,
          "' appears twice in the header; names must be unique, re-export the file");
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
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) header += ',';
      first = false;
      append_json_string(header, k);
      header += ':';
      append_json_string(header, v);
    }
    header += '}';
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
    if (header.size() > 1) header += ',';
    append_json_string(header, name);
    header += ":{\"dtype\":\"";
    header += file_dtype_of(t.dtype());
    header += "\",\"shape\":[";
    for (size_t d = 0; d < t.shape().size(); ++d) {
      if (d > 0) header += ',';
      header += std::to_string(t.shape()[d]);
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + nbytes) + "]}";
    offset += nbytes;
  }
  header += '}';
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
