// torch.save (.pth) reader: a ZIP directory reader, a restricted pickle machine, and the
// step that turns the unpickled object into a StateDict.
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
#include "src/io/raw_file.hpp"

namespace dltrain::io {

namespace {

constexpr const char* kOp = "load_pth";
constexpr const char* kResave =
    "; dltrain reads only state dicts saved by torch.save (PyTorch >= 1.6): in Python, "
    "re-save the weights with torch.save(model.state_dict(), path)";

template <class... A>
[[noreturn]] void fail(const std::string& path, const A&... a) {
  DLTRAIN_FAIL(kOp, ": '", path, "': ", a...);
}

// --- ZIP -------------------------------------------------------------------------------------

uint64_t le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

struct ZipEntry {
  std::string name;
  uint64_t size = 0, comp_size = 0, local_offset = 0;
  uint32_t crc = 0;
  uint16_t method = 0, flags = 0;
};

// The central directory of a ZIP archive, and exact reads of its STORED records.
class ZipArchive {
 public:
  explicit ZipArchive(const detail::InputFile& f) : f_(f) {
    check_magic();
    read_directory();
  }

  const std::vector<ZipEntry>& entries() const { return entries_; }
  const ZipEntry* find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &entries_[it->second];
  }
  // Checks the record's local header and bounds; returns the file offset of its data.
  uint64_t locate(const ZipEntry& e) const {
    const std::string& path = f_.path();
    if (e.flags & 1u)
      fail(path, "record '", e.name, "' is encrypted; torch.save never encrypts", kResave);
    unsigned char lh[30];
    f_.read_at(e.local_offset, lh, 30, "the local header of record '" + e.name + "'");
    if (le(lh, 4) != 0x04034b50u)
      fail(path, "record '", e.name, "' has no local header at offset ", e.local_offset,
           "; the archive is corrupt, get a fresh copy");
    const auto local_method = static_cast<uint16_t>(le(lh + 8, 2));
    if (e.method != 0 || local_method != 0)
      fail(path, "record '", e.name, "' is compressed (ZIP method ",
           e.method != 0 ? e.method : local_method, e.method == 8 ? ", deflate" : "",
           "), but torch.save stores records uncompressed and dltrain reads only those; the "
           "file was re-zipped by another tool: use the file torch.save wrote, or re-save it "
           "with torch.save(model.state_dict(), path)");
    const uint64_t name_len = le(lh + 26, 2), extra_len = le(lh + 28, 2);
    std::string local_name(static_cast<size_t>(name_len), '\0');
    f_.read_at(e.local_offset + 30, local_name.data(), name_len,
               "the local header of record '" + e.name + "'");
    if (local_name != e.name)
      fail(path, "the local header at offset ", e.local_offset, " names '", local_name,
           "' but the central directory says '", e.name,
           "'; the archive is corrupt, get a fresh copy");
    const uint64_t start = e.local_offset + 30 + name_len + extra_len;
    if (e.comp_size != e.size || start > cd_offset_ || e.size > cd_offset_ - start)
      fail(path, "record '", e.name, "' (", e.size, " bytes at offset ", start,
           ") does not fit before the central directory at offset ", cd_offset_,
           "; the archive is corrupt, get a fresh copy");
    return start;
  }

  // Reads the whole record into dst (entry.size bytes) and verifies its CRC-32.
  void read(const ZipEntry& e, void* dst) const {
    const std::string& path = f_.path();
    f_.read_at(locate(e), dst, e.size, "record '" + e.name + "'");
    const uint32_t got = detail::crc32_update(0, dst, e.size);
    if (got != e.crc)
      fail(path, "record '", e.name, "' fails its CRC-32 check (stored ", e.crc, ", computed ", got,
           "): the data is corrupt, get a fresh copy of the file");
  }

 private:
  void check_magic() {
    const std::string& path = f_.path();
    unsigned char head[4] = {0, 0, 0, 0};
    const uint64_t n = std::min<uint64_t>(4, f_.size());
    if (n > 0) f_.read_at(0, head, n, "the file signature");
    if (n == 4 && le(head, 4) == 0x04034b50u) return;
    const FileFormat kind = detect_file_format(path);
    if (kind == FileFormat::Checkpoint || kind == FileFormat::Hdf5 ||
        kind == FileFormat::Safetensors)
      fail(path, "this is ", describe_file_format(kind), ", not a torch.save file; read it with ",
           kind == FileFormat::Safetensors ? "io::load_safetensors" : "io::read_checkpoint",
           " (or convert it with dltrain-convert)");
    if (n >= 2 && head[0] == 0x80 && head[1] <= 5)
      fail(path,
           "this is a pickle file in the legacy torch.save format (PyTorch < 1.6 or "
           "_use_new_zipfile_serialization=False), which dltrain does not read; load it "
           "in PyTorch and re-save it with torch.save(model.state_dict(), path) (PyTorch "
           ">= 1.6 writes the ZIP format)");
    if (f_.size() >= 262) {
      char ustar[5];
      f_.read_at(257, ustar, 5, "the file signature");
      if (std::memcmp(ustar, "ustar", 5) == 0)
        fail(path,
             "this is a tar archive in PyTorch's oldest torch.save format; load it in "
             "PyTorch and re-save it with torch.save(model.state_dict(), path)");
    }
    fail(path,
         "this is not a torch.save file: it does not start with a ZIP local header "
         "(PK\\3\\4)",
         f_.size() == 0 ? " (the file is empty)" : "", kResave);
  }

  void read_directory() {
    const std::string& path = f_.path();
    const uint64_t size = f_.size();
    // The end-of-central-directory record is the last 22 bytes plus a comment of at most
    // 65535 bytes: search backwards for its signature.
    const uint64_t tail_len = std::min<uint64_t>(size, 22 + 65535);
    std::vector<unsigned char> tail(static_cast<size_t>(tail_len));
    f_.read_at(size - tail_len, tail.data(), tail_len, "the end of the archive");
    int64_t eocd = -1;
    for (int64_t k = static_cast<int64_t>(tail_len) - 22; k >= 0; --k) {
      const unsigned char* p = tail.data() + k;
      if (le(p, 4) == 0x06054b50u && static_cast<uint64_t>(k) + 22 + le(p + 20, 2) == tail_len) {
        eocd = k;
        break;
      }
    }
    if (eocd < 0)
      fail(path,
           "the ZIP end-of-central-directory record is missing: the file is truncated "
           "(interrupted save, copy or download); get a complete copy");
    const unsigned char* e = tail.data() + eocd;
    const uint64_t eocd_pos = size - tail_len + static_cast<uint64_t>(eocd);
    uint64_t count = le(e + 10, 2), cd_size = le(e + 12, 4);
    cd_offset_ = le(e + 16, 4);
    uint64_t cd_end_limit = eocd_pos;
    if (le(e + 4, 2) != 0 || le(e + 6, 2) != 0)
      fail(path, "this is a multi-part (split) ZIP archive, which torch.save never writes",
           kResave);
    if (count == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_offset_ == 0xFFFFFFFFu) {
      // ZIP64: a locator just before the EOCD points at the ZIP64 EOCD record.
      if (eocd_pos < 20) fail(path, "the ZIP64 locator is missing; the archive is corrupt");
      unsigned char loc[20];
      f_.read_at(eocd_pos - 20, loc, 20, "the ZIP64 end-of-central-directory locator");
      if (le(loc, 4) != 0x07064b50u)
        fail(path,
             "the ZIP64 end-of-central-directory locator is missing; the archive is "
             "corrupt, get a fresh copy");
      const uint64_t z64 = le(loc + 8, 8);
      unsigned char rec[56];
      if (z64 > eocd_pos - 20 || eocd_pos - 20 - z64 < 56)
        fail(path,
             "the ZIP64 end-of-central-directory record lies outside the archive; the "
             "archive is corrupt, get a fresh copy");
      f_.read_at(z64, rec, 56, "the ZIP64 end-of-central-directory record");
      if (le(rec, 4) != 0x06064b50u)
        fail(path,
             "the ZIP64 end-of-central-directory record is missing; the archive is "
             "corrupt, get a fresh copy");
      count = le(rec + 32, 8);
      cd_size = le(rec + 40, 8);
      cd_offset_ = le(rec + 48, 8);
      cd_end_limit = z64;
    }
    if (cd_offset_ > cd_end_limit || cd_size > cd_end_limit - cd_offset_)
      fail(path, "the central directory (", cd_size, " bytes at offset ", cd_offset_,
           ") lies outside the archive; the file is truncated or corrupt, get a complete copy");
    std::vector<unsigned char> cd(static_cast<size_t>(cd_size));
    f_.read_at(cd_offset_, cd.data(), cd_size, "the ZIP central directory");
    uint64_t pos = 0;
    for (uint64_t i = 0; i < count; ++i) {
      if (cd_size - pos < 46 || le(cd.data() + pos, 4) != 0x02014b50u)
        fail(path, "central directory entry ", i, " of ", count,
             " is missing or damaged; the archive is corrupt, get a fresh copy");
      const unsigned char* p = cd.data() + pos;
      ZipEntry z;
      z.flags = static_cast<uint16_t>(le(p + 8, 2));
      z.method = static_cast<uint16_t>(le(p + 10, 2));
      z.crc = static_cast<uint32_t>(le(p + 16, 4));
      z.comp_size = le(p + 20, 4);
      z.size = le(p + 24, 4);
      const uint64_t name_len = le(p + 28, 2), extra_len = le(p + 30, 2),
                     comment_len = le(p + 32, 2);
      z.local_offset = le(p + 42, 4);
      if (cd_size - pos - 46 < name_len + extra_len + comment_len)
        fail(path, "central directory entry ", i,
             " runs past the directory's end; the archive is corrupt, get a fresh copy");
      z.name.assign(reinterpret_cast<const char*>(p + 46), static_cast<size_t>(name_len));
      // ZIP64 extended information: 8-byte values for the fields saturated above, in order.
      const unsigned char* x = p + 46 + name_len;
      const unsigned char* x_end = x + extra_len;
      while (x_end - x >= 4) {
        const uint64_t id = le(x, 2), len = le(x + 2, 2);
        if (static_cast<uint64_t>(x_end - x - 4) < len) break;
        if (id == 0x0001) {
          const unsigned char* v = x + 4;
          uint64_t left = len;
          for (uint64_t* field : {&z.size, &z.comp_size, &z.local_offset}) {
            if (*field != 0xFFFFFFFFu) continue;
            if (left < 8)
              fail(path, "record '", z.name,
                   "' has a short ZIP64 extra field; the archive is corrupt");
            *field = le(v, 8);
            v += 8;
            left -= 8;
          }
        }
        x += 4 + len;
      }
      if (!index_.emplace(z.name, entries_.size()).second)
        fail(path, "the archive holds two records named '", z.name,
             "'; the archive is corrupt, get a fresh copy");
      entries_.push_back(std::move(z));
      pos += 46 + name_len + extra_len + comment_len;
    }
  }

  const detail::InputFile& f_;
  std::vector<ZipEntry> entries_;
  std::map<std::string, size_t> index_;
  uint64_t cd_offset_ = 0;
};

// --- pickle objects --------------------------------------------------------------------------

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

Obj make(PyObj::Kind k) {
  auto o = std::make_shared<PyObj>();
  o->kind = k;
  return o;
}

std::string describe(const Obj& o) {
  switch (o->kind) {
    case PyObj::Kind::None:
      return "None";
    case PyObj::Kind::Bool:
      return o->b ? "the bool True" : "the bool False";
    case PyObj::Kind::Int:
      return "the int " + std::to_string(o->i);
    case PyObj::Kind::Float: {
      std::ostringstream os;
      os << "the float " << o->f;
      return os.str();
    }
    case PyObj::Kind::Str:
      return "a str";
    case PyObj::Kind::Bytes:
      return "a bytes object";
    case PyObj::Kind::Tuple:
      return "a tuple";
    case PyObj::Kind::List:
      return "a list";
    case PyObj::Kind::Dict:
      return "a dict";
    case PyObj::Kind::Global:
      return "the Python name " + o->s;
    case PyObj::Kind::Opaque:
      return "a Python object built by " + o->s + " (not supported by dltrain)";
    case PyObj::Kind::Storage:
      return "a bare storage (" + o->s + ")";
    case PyObj::Kind::Tensor:
      return "a tensor";
  }
  return "?";
}

struct StorageType {
  const char* name;
  DType dtype;         // dtype of the loaded tensor
  uint64_t file_size;  // bytes per element in the record
};

constexpr std::array<StorageType, 10> kStorageTypes{{{"torch.FloatStorage", DType::f32, 4},
                                                     {"torch.DoubleStorage", DType::f64, 8},
                                                     {"torch.HalfStorage", DType::f16, 2},
                                                     {"torch.BFloat16Storage", DType::bf16, 2},
                                                     {"torch.LongStorage", DType::i64, 8},
                                                     {"torch.IntStorage", DType::i32, 4},
                                                     {"torch.ShortStorage", DType::i32, 2},
                                                     {"torch.CharStorage", DType::i32, 1},
                                                     {"torch.ByteStorage", DType::u8, 1},
                                                     {"torch.BoolStorage", DType::b8, 1}}};

const StorageType* find_storage_type(const std::string& name) {
  for (const StorageType& t : kStorageTypes)
    if (name == t.name) return &t;
  return nullptr;
}

// --- the pickle machine ------------------------------------------------------------------------

constexpr int kMaxNesting = 1000;

class Unpickler {
 public:
  Unpickler(const std::string& data, const std::string& path, const std::string& record)
      : d_(data), path_(path), record_(record) {}

  Obj run() {
    while (true) {
      if (pos_ >= d_.size()) bad("the pickle ends without a STOP opcode");
      const size_t at = pos_;
      const auto op = static_cast<unsigned char>(d_[pos_++]);
      switch (op) {
        case 0x80: {  // PROTO
          const unsigned proto = u8();
          if (proto < 2 || proto > 5) bad_at(at, "pickle protocol " + std::to_string(proto));
          break;
        }
        case 0x95:  // FRAME (protocol 4): only a length hint
          take(8);
          break;
        case '.':  // STOP
          return pop();
        case '(':  // MARK
          marks_.push_back(stack_.size());
          break;
        case '0':  // POP
          pop();
          break;
        case '1':  // POP_MARK
          pop_mark();
          break;
        case '2':  // DUP
          push(top());
          break;
        case 'N':
          push(make(PyObj::Kind::None));
          break;
        case 0x88:
        case 0x89: {  // NEWTRUE, NEWFALSE
          Obj o = make(PyObj::Kind::Bool);
          o->b = op == 0x88;
          push(o);
          break;
        }
        case 'K':
          push_int(static_cast<int64_t>(u8()));
          break;
        case 'M':
          push_int(static_cast<int64_t>(le(take(2), 2)));
          break;
        case 'J':
          push_int(static_cast<int64_t>(static_cast<int32_t>(le(take(4), 4))));
          break;
        case 0x8a: {  // LONG1: n-byte little-endian two's complement
          const unsigned n = u8();
          if (n > 8) bad_at(at, "an integer wider than 64 bits");
          uint64_t v = n == 0 ? 0 : le(take(n), static_cast<int>(n));
          if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);
          push_int(static_cast<int64_t>(v));
          break;
        }
        case 'G': {  // BINFLOAT: big-endian double
          const unsigned char* p = take(8);
          uint64_t bits = 0;
          for (int k = 0; k < 8; ++k) bits = (bits << 8) | p[k];
          Obj o = make(PyObj::Kind::Float);
          std::memcpy(&o->f, &bits, 8);
          push(o);
          break;
        }
        case 'X':
          push_str(PyObj::Kind::Str, le(take(4), 4));
          break;
        case 0x8c:
          push_str(PyObj::Kind::Str, u8());
          break;
        case 0x8d:
          push_str(PyObj::Kind::Str, le(take(8), 8));
          break;
        case 'B':
          push_str(PyObj::Kind::Bytes, le(take(4), 4));
          break;
        case 'C':
          push_str(PyObj::Kind::Bytes, u8());
          break;
        case '}':
          push(make(PyObj::Kind::Dict));
          break;
        case ']':
          push(make(PyObj::Kind::List));
          break;
        case ')':
          push(make(PyObj::Kind::Tuple));
          break;
        case 't':
          push(container(PyObj::Kind::Tuple, pop_mark()));
          break;
        case 'l':
          push(container(PyObj::Kind::List, pop_mark()));
          break;
        case 0x85:
        case 0x86:
        case 0x87: {  // TUPLE1..3
          std::vector<Obj> items(static_cast<size_t>(op - 0x84));
          for (size_t k = items.size(); k-- > 0;) items[k] = pop();
          push(container(PyObj::Kind::Tuple, std::move(items)));
          break;
        }
        case 'd': {  // DICT
          std::vector<Obj> items = pop_mark();
          Obj o = make(PyObj::Kind::Dict);
          set_items(o, items, at);
          push(o);
          break;
        }
        case 'a': {  // APPEND
          Obj v = pop();
          append(top(), {v}, at);
          break;
        }
        case 'e': {  // APPENDS
          std::vector<Obj> items = pop_mark();
          append(top(), items, at);
          break;
        }
        case 's': {  // SETITEM
          Obj v = pop(), k = pop();
          set_items(top(), {k, v}, at);
          break;
        }
        case 'u': {  // SETITEMS
          std::vector<Obj> items = pop_mark();
          set_items(top(), items, at);
          break;
        }
        case 'c': {  // GLOBAL "module\nname\n"
          const std::string module = line(), name = line();
          push(global(module + "." + name));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          Obj name = pop(), module = pop();
          if (module->kind != PyObj::Kind::Str || name->kind != PyObj::Kind::Str)
            bad_at(at, "a STACK_GLOBAL whose operands are not strings");
          push(global(module->s + "." + name->s));
          break;
        }
        case 'R': {  // REDUCE
          Obj args = pop(), fn = pop();
          push(reduce(fn, args, at));
          break;
        }
        case 0x81: {  // NEWOBJ: cls.__new__(cls, *args), never run
          pop();      // the arguments
          push(opaque(pop()));
          break;
        }
        case 'b':  // BUILD: sets Python attributes (OrderedDict._metadata); not modelled
          pop();
          top();
          break;
        case 'Q':  // BINPERSID
          push(persistent(pop(), at));
          break;
        case 'q':
          memo_put(u8());
          break;
        case 'r':
          memo_put(le(take(4), 4));
          break;
        case 0x94:  // MEMOIZE
          memo_put(memo_.size());
          break;
        case 'h':
          memo_get(u8(), at);
          break;
        case 'j':
          memo_get(le(take(4), 4), at);
          break;
        default: {
          static const char* hex = "0123456789abcdef";
          bad_at(at, std::string("the pickle opcode 0x") + hex[op >> 4] + hex[op & 15] +
                         (op >= 0x20 && op < 0x7f ? std::string(" ('") + char(op) + "')" : ""));
        }
      }
    }
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail(path_, "record '", record_, "' is not a valid pickle: ", what,
         "; the file is corrupt, get a fresh copy");
  }
  [[noreturn]] void bad_at(size_t at, const std::string& what) const {
    fail(path_, "record '", record_, "' uses ", what, " at byte ", at,
         ", outside the subset torch.save writes for state dicts", kResave);
  }

  const unsigned char* take(size_t n) {
    if (d_.size() - pos_ < n) bad("it ends in the middle of an opcode's argument");
    const auto* p = reinterpret_cast<const unsigned char*>(d_.data() + pos_);
    pos_ += n;
    return p;
  }
  unsigned u8() { return *take(1); }
  std::string line() {
    const size_t nl = d_.find('\n', pos_);
    if (nl == std::string::npos) bad("a GLOBAL name is not terminated");
    std::string s = d_.substr(pos_, nl - pos_);
    pos_ = nl + 1;
    return s;
  }

  void push(Obj o) { stack_.push_back(std::move(o)); }
  void push_int(int64_t v) {
    Obj o = make(PyObj::Kind::Int);
    o->i = v;
    push(o);
  }
  void push_str(PyObj::Kind k, uint64_t n) {
    if (n > d_.size() - pos_) bad("a string runs past the end of the pickle");
    Obj o = make(k);
    o->s.assign(reinterpret_cast<const char*>(take(static_cast<size_t>(n))),
                static_cast<size_t>(n));
    push(o);
  }
  const Obj& top() const {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back()))
      bad("an opcode finds its stack empty");
    return stack_.back();
  }
  Obj pop() {
    top();
    Obj o = std::move(stack_.back());
    stack_.pop_back();
    return o;
  }
  std::vector<Obj> pop_mark() {
    if (marks_.empty()) bad("an opcode needs a MARK that is not there");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<Obj> items(std::make_move_iterator(stack_.begin() + static_cast<ptrdiff_t>(m)),
                           std::make_move_iterator(stack_.end()));
    stack_.resize(m);
    return items;
  }
  void nest(PyObj& parent, const Obj& child) {
    parent.depth = std::max(parent.depth, child->depth + 1);
    if (parent.depth > kMaxNesting) bad("containers nest more than 1000 levels deep");
  }
  Obj container(PyObj::Kind k, std::vector<Obj> items) {
    Obj o = make(k);
    for (const Obj& c : items) nest(*o, c);
    o->items = std::move(items);
    return o;
  }
  void append(const Obj& list, const std::vector<Obj>& items, size_t at) {
    if (list->kind == PyObj::Kind::Opaque) return;
    if (list->kind != PyObj::Kind::List) bad_at(at, "APPEND on " + describe(list));
    for (const Obj& c : items) {
      nest(*list, c);
      list->items.push_back(c);
    }
  }
  void set_items(const Obj& dict, const std::vector<Obj>& kv, size_t at) {
    if (kv.size() % 2 != 0) bad("SETITEMS has an odd number of operands");
    if (dict->kind == PyObj::Kind::Opaque) return;
    if (dict->kind != PyObj::Kind::Dict) bad_at(at, "SETITEM on " + describe(dict));
    for (size_t k = 0; k < kv.size(); k += 2) {
      nest(*dict, kv[k + 1]);
      dict->dict.emplace_back(kv[k], kv[k + 1]);
    }
  }
  void memo_put(uint64_t idx) {
    // Each memo slot costs at least one opcode byte, so a larger index is corrupt.
    if (idx > d_.size()) bad("a memo index is larger than the pickle");
    if (memo_.size() <= idx) memo_.resize(static_cast<size_t>(idx) + 1);
    memo_[static_cast<size_t>(idx)] = top();
  }
  void memo_get(uint64_t idx, size_t at) {
    if (idx >= memo_.size() || !memo_[static_cast<size_t>(idx)])
      bad("a memo lookup (at byte " + std::to_string(at) + ") refers to nothing stored");
    push(memo_[static_cast<size_t>(idx)]);
  }

  static Obj global(const std::string& name) {
    Obj o = make(PyObj::Kind::Global);
    o->s = name;
    return o;
  }
  static Obj opaque(const Obj& fn) {
    Obj o = make(PyObj::Kind::Opaque);
    o->s =
        fn->kind == PyObj::Kind::Global || fn->kind == PyObj::Kind::Opaque ? fn->s : describe(fn);
    return o;
  }

  static bool is_int(const Obj& o) { return o->kind == PyObj::Kind::Int; }
  Shape int_tuple(const Obj& o, size_t at, const char* what) {
    if (o->kind != PyObj::Kind::Tuple)
      bad_at(at, std::string("a tensor whose ") + what + " is " + describe(o));
    Shape s;
    for (const Obj& v : o->items) {
      if (!is_int(v) || v->i < 0)
        bad_at(at, std::string("a tensor whose ") + what + " holds " + describe(v));
      s.push_back(v->i);
    }
    return s;
  }

  Obj reduce(const Obj& fn, const Obj& args, size_t at) {
    if (args->kind != PyObj::Kind::Tuple) bad("REDUCE's arguments are not a tuple");
    const std::vector<Obj>& a = args->items;
    if (fn->kind != PyObj::Kind::Global) return opaque(fn);
    if (fn->s == "collections.OrderedDict") {
      Obj d = make(PyObj::Kind::Dict);
      if (a.size() == 1 && (a[0]->kind == PyObj::Kind::List || a[0]->kind == PyObj::Kind::Tuple)) {
        for (const Obj& pair : a[0]->items) {
          if (pair->kind != PyObj::Kind::Tuple || pair->items.size() != 2)
            bad_at(at, "an OrderedDict built from something other than (key, value) pairs");
          set_items(d, pair->items, at);
        }
      } else if (!a.empty()) {
        bad_at(at, "an OrderedDict built from " + describe(a[0]));
      }
      return d;
    }
    if (fn->s == "torch._utils._rebuild_tensor_v2") {
      // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
      if (a.size() < 6 || a.size() > 7 || a[0]->kind != PyObj::Kind::Storage || !is_int(a[1]))
        bad_at(at, "a _rebuild_tensor_v2 call with unexpected arguments");
      auto t = std::make_shared<TensorRecord>(*a[0]->tensor);
      t->offset = a[1]->i;
      t->sizes = int_tuple(a[2], at, "size");
      t->strides = int_tuple(a[3], at, "stride");
      if (t->offset < 0 || t->sizes.size() != t->strides.size())
        bad_at(at, "a tensor with a negative offset or sizes and strides of different lengths");
      Obj o = make(PyObj::Kind::Tensor);
      o->tensor = std::move(t);
      return o;
    }
    if (fn->s == "torch._utils._rebuild_parameter" ||
        fn->s == "torch._utils._rebuild_parameter_with_state") {
      if (a.empty() || a[0]->kind != PyObj::Kind::Tensor)
        bad_at(at, "a Parameter that does not wrap a plain tensor");
      return a[0];
    }
    return opaque(fn);
  }

  Obj persistent(const Obj& pid, size_t at) {
    // ('storage', <storage type>, key, location, numel)
    if (pid->kind != PyObj::Kind::Tuple || pid->items.size() != 5 ||
        pid->items[0]->kind != PyObj::Kind::Str || pid->items[0]->s != "storage" ||
        pid->items[1]->kind != PyObj::Kind::Global || pid->items[2]->kind != PyObj::Kind::Str ||
        !is_int(pid->items[4]) || pid->items[4]->i < 0)
      bad_at(at, "a persistent id that is not a torch.save storage reference");
    Obj o = make(PyObj::Kind::Storage);
    o->s = pid->items[1]->s;
    o->tensor = std::make_shared<TensorRecord>();
    o->tensor->storage_type = pid->items[1]->s;
    o->tensor->key = pid->items[2]->s;
    o->tensor->storage_numel = pid->items[4]->i;
    return o;
  }

  const std::string& d_;
  const std::string& path_;
  const std::string& record_;
  size_t pos_ = 0;
  std::vector<Obj> stack_;
  std::vector<size_t> marks_;
  std::vector<Obj> memo_;
};

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
    std::string order = "(" + std::to_string(bo->size) + " bytes)";
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
  const Obj root = Unpickler(pickle, path, pkl->name).run();

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
