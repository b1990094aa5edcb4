// torch.save (.pth) reader: files written by PyTorch 1.13 load bit for bit (every dtype,
// views sharing a storage, channels-last, 0-d, empty, a checkpoint dict, parameters, pickle
// protocol 4, ZIP64), and every kind of corrupt or unsupported file raises an error that
// names the file and the problem.
#include <catch2/catch.hpp>

#include <algorithm>

#include "dltrain/io/pth.hpp"
#include "io/io_test_util.hpp"

using namespace dltrain;
using namespace dltrain::testing;
using Catch::Contains;

namespace {

const std::vector<std::string> kRefOrder = {
    "f32",       "f32.special", "f64",      "f16",      "bf16",         "i64",        "i32",
    "i16",       "i8",          "u8",       "bool",     "scalar.f64",   "scalar.i64", "empty",
    "view.base", "view.t",      "view.row", "view.col", "channels_last"};

void require_reference(const StateDict& sd) {
  const auto ref = read_io_reference();
  REQUIRE(sd.keys() == kRefOrder);
  for (const auto& [name, t] : sd) {
    INFO(name);
    REQUIRE(bitwise_equal(t, ref.at("ref." + name)));
  }
}

// Pickle opcodes for a state dict {name: tensor} with one tensor, as torch.save writes it.
std::string K(int v) { return std::string("K") + static_cast<char>(v); }
std::string X(const std::string& s) {
  std::string out = "X";
  for (int k = 0; k < 4; ++k) out += static_cast<char>((s.size() >> (8 * k)) & 0xFF);
  return out + s;
}
std::string int_tuple(const std::vector<int>& v) {
  std::string out = "(";
  for (int x : v) out += K(x);
  return out + "t";
}
std::string tensor_pickle(const std::string& storage_type, int numel, int offset,
                          const std::vector<int>& sizes, const std::vector<int>& strides,
                          const std::string& name = "w") {
  return "\x80\x02}(" + X(name) + "ctorch._utils\n_rebuild_tensor_v2\n((" + X("storage") +
         "ctorch\n" + storage_type + "\n" + X("0") + X("cpu") + K(numel) + "tQ" + K(offset) +
         int_tuple(sizes) + int_tuple(strides) + "\x89" + "ccollections\nOrderedDict\n)Rt" + "Ru.";
}

std::vector<uint8_t> zip_with(const std::string& pickle,
                              const std::vector<uint8_t>& storage0 = {}) {
  return make_zip({{"arc/data.pkl", bytes_of(pickle)},
                   {"arc/data/0", storage0},
                   {"arc/version", bytes_of("3\n")}});
}

uint64_t le32(const std::vector<uint8_t>& b, size_t at) {
  return b[at] | (b[at + 1] << 8) | (b[at + 2] << 16) | (static_cast<uint64_t>(b[at + 3]) << 24);
}

void require_error(const std::string& path, const std::vector<std::string>& parts) {
  try {
    io::load_pth(path);
    FAIL("load_pth('" << path << "') did not throw");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    REQUIRE(msg.find(path) != std::string::npos);
    for (const auto& p : parts) REQUIRE(msg.find(p) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("torch.save state dict loads bit for bit, views and layouts kept", "[io][pth]") {
  const StateDict sd = io::load_pth(kIoDir + "/tensors.pth");
  require_reference(sd);
  // Views of one storage share it here too, with PyTorch's strides and offsets.
  const Tensor &base = sd.at("view.base"), &t = sd.at("view.t"), &row = sd.at("view.row"),
               &col = sd.at("view.col");
  REQUIRE(t.storage().data() == base.storage().data());
  REQUIRE(row.storage().data() == base.storage().data());
  REQUIRE(col.storage().data() == base.storage().data());
  REQUIRE(t.strides() == Shape{1, 5});
  REQUIRE(row.storage_offset() == 10);
  REQUIRE(col.storage_offset() == 8);
  REQUIRE(col.strides() == Shape{5});
  REQUIRE(sd.at("channels_last").is_contiguous(MemoryFormat::ChannelsLast));
  REQUIRE_FALSE(sd.at("channels_last").is_contiguous());
  REQUIRE(sd.at("scalar.f64").dim() == 0);
  REQUIRE(sd.at("scalar.f64").item<double>() == 2.5);
  REQUIRE(sd.at("empty").shape() == Shape{0, 3});
  REQUIRE(sd.at("i8").dtype() == DType::i32);  // int8 / int16 widen to int32
  REQUIRE(sd.at("i16").to_vector<int32_t>() == std::vector<int32_t>{0, -1, 32767, -32768});
  REQUIRE(sd.at("i64").to_vector<int64_t>()[2] == (int64_t{1} << 62) + 1);
  REQUIRE_FALSE(sd.at("f32").requires_grad());
  REQUIRE(sd.at("f32").device().is_cpu());

  // The same archive rewritten by Python's zipfile with ZIP64 records everywhere.
  require_reference(io::load_pth(kIoDir + "/tensors_zip64.pth"));
}

TEST_CASE("checkpoint dicts, parameters and pickle protocol 4", "[io][pth]") {
  const auto ref = read_io_reference();
  // {"epoch", "model", "optimizer", "args": argparse.Namespace, ...}: the model entry is
  // chosen; the rest (a Python object included) is parsed and ignored, never executed.
  const StateDict sd = io::load_pth(kIoDir + "/checkpoint.pth");
  const std::vector<std::string> keys = {"0.weight",
                                         "0.bias",
                                         "1.weight",
                                         "1.bias",
                                         "1.running_mean",
                                         "1.running_var",
                                         "1.num_batches_tracked",
                                         "4.weight",
                                         "4.bias"};
  REQUIRE(sd.keys() == keys);
  for (const auto& [name, t] : sd) {
    INFO(name);
    REQUIRE(bitwise_equal(t, ref.at("ckpt." + name)));
  }
  REQUIRE(sd.at("1.num_batches_tracked").item<int64_t>() == 1);

  // The same names and shapes as dltrain's layers: strict loading into the equivalent model.
  nn::Sequential model({std::make_shared<nn::Conv2d>(2, 3, 3), std::make_shared<nn::BatchNorm2d>(3),
                        std::make_shared<nn::ReLU>(), std::make_shared<nn::Flatten>(),
                        std::make_shared<nn::Linear>(12, 4)});
  model.load_state_dict(sd);
  REQUIRE(bitwise_equal(model.state_dict().at("4.weight"), ref.at("ckpt.4.weight")));

  // dict(model.named_parameters()) (Parameters) with pickle protocol 4 (FRAME, MEMOIZE,
  // SHORT_BINUNICODE, STACK_GLOBAL).
  const StateDict params = io::load_pth(kIoDir + "/params_proto4.pth");
  REQUIRE(params.keys() == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias",
                                                    "4.weight", "4.bias"});
  for (const auto& [name, t] : params) {
    INFO(name);
    REQUIRE(bitwise_equal(t, ref.at("ckpt." + name)));
  }
}

TEST_CASE("load_pth refuses files that are not torch.save state dicts", "[io][pth][errors]") {
  TempDir dir("pth_unsupported");
  const std::string missing = dir.file("missing.pth");
  require_error(missing, {"does not exist"});
  const std::string text = dir.file("notes.pth");
  write_bytes(text, bytes_of("just some text, not a zip archive\n"));
  require_error(text, {"not a torch.save file", "torch.save(model.state_dict(), path)"});
  const std::string emptyf = dir.file("empty.pth");
  write_bytes(emptyf, {});
  require_error(emptyf, {"the file is empty"});

  require_error(kIoDir + "/legacy.pth", {"legacy", "PyTorch < 1.6", "re-save"});
  require_error(kIoDir + "/module.pth", {"whole model object", "torch.nn.modules.linear.Linear",
                                         "torch.save(model.state_dict(), path)"});
  require_error(kIoDir + "/namespace.pth",
                {"entry 'args'", "argparse.Namespace", "not supported by dltrain"});
  require_error(kIoDir + "/complex.pth", {"tensor 'w'", "torch.ComplexFloatStorage"});
  require_error(kIoDir + "/tensors_big_endian.pth", {"byte order 'big'", "safetensors"});

  // Crafted archives: TorchScript, no data.pkl, a global that would run code.
  const std::string f = dir.file("crafted.pth");
  write_bytes(f, make_zip({{"m/constants.pkl", bytes_of("\x80\x02).")},
                           {"m/code/m.py", bytes_of("def f(): pass\n")}}));
  require_error(f, {"TorchScript"});
  write_bytes(f, make_zip({{"a/other", bytes_of("x")}}));
  require_error(f, {"no <archive>/data.pkl"});
  write_bytes(f, zip_with("\x80\x02}(" + X("w") + "cos\nsystem\n" + X("rm -rf /") + "\x85Ru."));
  require_error(f, {"entry 'w'", "os.system", "not supported by dltrain"});
  write_bytes(f, zip_with("\x80\x02}(" + X("epoch") + K(3) + "u."));
  require_error(f, {"entry 'epoch' is the int 3", "'state_dict', 'model_state_dict' or 'model'"});
}

TEST_CASE("load_pth: corrupt pickles and tensor records", "[io][pth][errors]") {
  TempDir dir("pth_pickle");
  const std::string f = dir.file("crafted.pth");
  // The crafting helpers themselves produce a loadable file: Short storage widened, with
  // an offset view.
  write_bytes(
      f, zip_with(tensor_pickle("ShortStorage", 3, 1, {2}, {1}), {0xFF, 0xFF, 1, 0, 0xFE, 0xFF}));
  REQUIRE(io::load_pth(f).at("w").to_vector<int32_t>() == std::vector<int32_t>{1, -2});

  write_bytes(f, zip_with("\x80\x02\x8f."));
  require_error(f, {"data.pkl", "opcode 0x8f", "torch.save(model.state_dict(), path)"});
  write_bytes(f, zip_with("\x80\x02}(" + X("w")));
  require_error(f, {"not a valid pickle", "without a STOP"});
  write_bytes(f, zip_with(std::string("\x80\x02}(X\xff\x00\x00\x00w", 10)));
  require_error(f, {"not a valid pickle", "past the end"});
  write_bytes(f, zip_with("\x80\x02h\x05."));
  require_error(f, {"memo lookup"});
  write_bytes(f, zip_with("\x80\x02s."));
  require_error(f, {"stack empty"});

  write_bytes(f, zip_with(tensor_pickle("FloatStorage", 2, 0, {3}, {1}), std::vector<uint8_t>(8)));
  require_error(f, {"tensor 'w'", "reaches past the end of its storage"});
  write_bytes(
      f, zip_with(tensor_pickle("FloatStorage", 2, 1, {2, 2}, {0, 1}), std::vector<uint8_t>(8)));
  require_error(f, {"tensor 'w'", "reaches past the end of its storage"});
  write_bytes(f, zip_with(tensor_pickle("FloatStorage", 3, 0, {2}, {1}), std::vector<uint8_t>(8)));
  require_error(f, {"arc/data/0", "holds 8 bytes", "tensor 'w'", "12 bytes"});
  write_bytes(f, zip_with(tensor_pickle("BoolStorage", 2, 0, {2}, {1}), {1, 2}));
  require_error(f, {"bool storage", "byte 2"});
  write_bytes(
      f, make_zip({{"arc/data.pkl", bytes_of(tensor_pickle("FloatStorage", 2, 0, {2}, {1}))}}));
  require_error(f, {"no record 'arc/data/0'", "tensor 'w'"});
}

TEST_CASE("load_pth: truncated and damaged archives", "[io][pth][errors]") {
  TempDir dir("pth_damaged");
  const auto good = read_bytes(kIoDir + "/tensors.pth");
  REQUIRE(good.size() > 1000);
  const std::string f = dir.file("damaged.pth");
  for (size_t cut : {size_t{3}, size_t{100}, good.size() / 2, good.size() - 30, good.size() - 1}) {
    INFO("cut at " << cut);
    write_bytes(f, std::vector<uint8_t>(good.begin(), good.begin() + static_cast<long>(cut)));
    require_error(
        f, {cut < 4 ? "not a torch.save file" : "end-of-central-directory record is missing"});
  }

  // torch.save writes no archive comment: the end record is the last 22 bytes.
  const size_t eocd = good.size() - 22;
  REQUIRE(le32(good, eocd) == 0x06054b50u);
  const size_t cd = le32(good, eocd + 16);
  REQUIRE(le32(good, cd) == 0x02014b50u);  // first entry: <archive>/data.pkl at offset 0

  auto bad_cd = good;
  bad_cd[eocd + 19] = 0x7F;  // central directory offset far past the end
  write_bytes(f, bad_cd);
  require_error(f, {"central directory", "outside the archive"});

  auto deflated = good;  // the central directory says "deflate"
  deflated[cd + 10] = 8;
  write_bytes(f, deflated);
  require_error(f, {"tensors/data.pkl", "compressed (ZIP method 8, deflate)"});
  auto local_deflated = good;  // only the local header says so
  local_deflated[8] = 8;
  write_bytes(f, local_deflated);
  require_error(f, {"tensors/data.pkl", "compressed"});

  // Rename the record of storage 0 (tensor "f32") in its local and central headers.
  auto renamed = good;
  const std::string from = "tensors/data/0";
  int hits = 0;
  for (auto it = renamed.begin();
       (it = std::search(it, renamed.end(), from.begin(), from.end())) != renamed.end(); ++it) {
    *(it + static_cast<long>(from.size()) - 1) = 'Z';
    ++hits;
  }
  REQUIRE(hits == 2);
  write_bytes(f, renamed);
  require_error(f, {"no record 'tensors/data/0'", "tensor 'f32'"});

  // Flip one bit of f32's first element (bits 0xC0466666, stored 66 66 46 C0).
  auto flipped = good;
  const std::vector<uint8_t> first = {0x66, 0x66, 0x46, 0xC0};
  auto at = std::search(flipped.begin(), flipped.end(), first.begin(), first.end());
  REQUIRE(at != flipped.end());
  *at ^= 1;
  write_bytes(f, flipped);
  require_error(f, {"tensors/data/0", "CRC-32"});
}
