// The restricted pickle machine of the .pth reader (src/io/pth_pickle.hpp): protocols 2 to 5,
// the opcodes torch.save writes, persistent ids for storages, nothing imported or called.
#include "src/io/pth_pickle.hpp"

#include <array>
#include <cstring>
#include <limits>
#include <sstream>

#include "src/io/pth_common.hpp"

namespace dltrain::io::pth {

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

namespace {

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

}  // namespace

Obj unpickle(const std::string& data, const std::string& path, const std::string& record) {
  return Unpickler(data, path, record).run();
}

}  // namespace dltrain::io::pth
