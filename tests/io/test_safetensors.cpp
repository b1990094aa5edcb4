// safetensors: round trips of every dtype and layout, a file written by hand in Python read
// bit for bit, dltrain's files verified in Python (the reference tensors, and ResNet-18
// loaded into torchvision), and one clear error per kind of corrupt file.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include "dltrain/io/pth.hpp"
#include "dltrain/io/safetensors.hpp"
#include "io/io_test_util.hpp"
#include "reference_file.hpp"

using namespace dltrain;
using namespace dltrain::testing;
using Catch::Contains;

namespace {

// A safetensors file from a header string (no padding added) and data bytes.
std::vector<uint8_t> st_file(const std::string& header, const std::vector<uint8_t>& data = {}) {
  std::vector<uint8_t> out;
  for (int k = 0; k < 8; ++k) out.push_back(static_cast<uint8_t>(header.size() >> (8 * k)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

uint64_t header_length(const std::vector<uint8_t>& f) {
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | f[static_cast<size_t>(k)];
  return n;
}

// Every reference tensor (dltrain's view of the state dict of make_io_reference.py).
StateDict reference_state_dict() {
  StateDict sd;
  const auto ref = read_io_reference();
  const StateDict from_pth = io::load_pth(kIoDir + "/tensors.pth");  // for the saved order
  for (const auto& [name, t] : from_pth) sd.insert(name, ref.at("ref." + name));
  return sd;
}

// The fill rule of make_resnet_reference.py (entry k of the state dict, element i).
void deterministic_fill(nn::Module& m) {
  int64_t k = 0;
  for (const auto& [name, t] : m.state_dict()) {
    if (is_floating(t.dtype())) {
      std::vector<double> v(static_cast<size_t>(t.numel()));
      const std::string leaf = name.substr(name.rfind('.') + 1);
      const double fan = t.dim() >= 2 ? static_cast<double>(t.numel() / t.size(0)) : 1.0;
      for (size_t i = 0; i < v.size(); ++i) {
        const double s = std::sin(0.7 * static_cast<double>(i) + 0.3 * static_cast<double>(k));
        v[i] = t.dim() >= 2            ? s / std::sqrt(fan)
               : leaf == "running_var" ? 1.2 + 0.2 * s
               : leaf == "weight"      ? 1.0 + 0.1 * s
                                       : 0.1 * s;
      }
      Tensor dst = t;
      dst.copy_(from_vector(v, t.shape()));
    }
    ++k;
  }
}

}  // namespace

TEST_CASE("safetensors round trip: every dtype, any layout, metadata, order", "[io][safetensors]") {
  TempDir dir("st_roundtrip");
  StateDict sd = reference_state_dict();
  // Layouts that must be written row-major.
  Tensor x = randn({2, 3, 4, 5}, DType::f32);
  sd.insert("layout.channels_last", x.contiguous(MemoryFormat::ChannelsLast));
  sd.insert("layout.transposed", x.select(0, 1).transpose(0, 2));
  sd.insert("layout.strided_slice", x.slice(3, 1, 5, 2));
  sd.insert("layout.expanded",
            from_vector(std::vector<int64_t>{4, -9}).unsqueeze(1).expand({2, 3}));
  sd.insert("layout.bf16_channels_last", x.to(DType::bf16).contiguous(MemoryFormat::ChannelsLast));
  Tensor leaf = ones({3}, TensorOptions(DType::f64).with_requires_grad());
  sd.insert("requires_grad", leaf);
  REQUIRE_FALSE(sd.at("layout.channels_last").is_contiguous());
  REQUIRE_FALSE(sd.at("layout.transposed").is_contiguous());

  const std::map<std::string, std::string> meta{{"format", "pt"}, {"note", "quote \" and \\"}};
  const std::string path = dir.file("rt.safetensors");
  io::save_safetensors(path, sd, meta);
  REQUIRE_FALSE(std::filesystem::exists(path + ".tmp"));

  const StateDict back = io::load_safetensors(path);
  REQUIRE(back.keys() == sd.keys());
  for (const auto& [name, t] : sd) {
    INFO(name);
    const Tensor& b = back.at(name);
    REQUIRE(b.is_contiguous());
    REQUIRE_FALSE(b.requires_grad());
    REQUIRE(bitwise_equal(b, t.detach()));
  }
  REQUIRE(io::safetensors_metadata(path) == meta);

  // The header is padded to 8 bytes, so each tensor starts 8-byte aligned in the file, and
  // list_safetensors describes every tensor without reading data.
  const auto bytes = read_bytes(path);
  REQUIRE(header_length(bytes) % 8 == 0);
  const auto infos = io::list_safetensors(path);
  REQUIRE(infos.size() == static_cast<size_t>(sd.size()));
  uint64_t end = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    const Tensor& t = sd.items()[i].second;
    REQUIRE(infos[i].name == sd.items()[i].first);
    REQUIRE(infos[i].shape == t.shape());
    REQUIRE(infos[i].dtype == t.dtype());
    REQUIRE(infos[i].data_begin == end);
    end = infos[i].data_end;
    REQUIRE(end - infos[i].data_begin == static_cast<uint64_t>(t.numel()) * t.element_size());
  }
  REQUIRE(8 + header_length(bytes) + end == bytes.size());
  REQUIRE(infos[0].file_dtype == "F32");

  // An empty state dict is a valid file too; saving replaces an existing file.
  io::save_safetensors(path, StateDict{});
  REQUIRE(io::load_safetensors(path).empty());
  REQUIRE(io::safetensors_metadata(path).empty());
  REQUIRE(read_bytes(path).size() == 16);  // 8-byte length + "{}" padded to 8
}

TEST_CASE("safetensors written in Python load bit for bit", "[io][safetensors][reference]") {
  const auto ref = read_io_reference();
  const std::string path = kIoDir + "/tensors.safetensors";
  const StateDict sd = io::load_safetensors(path);
  REQUIRE(sd.size() == 19);
  for (const auto& [name, t] : sd) {
    INFO(name);
    REQUIRE(bitwise_equal(t, ref.at("ref." + name)));
  }
  REQUIRE(sd.at("scalar.i64").dim() == 0);
  REQUIRE(sd.at("scalar.i64").item<int64_t>() == 7);
  REQUIRE(sd.at("empty").shape() == Shape{0, 3});
  REQUIRE(std::isnan(sd.at("f16").to(DType::f32).to_vector<float>()[7]));
  REQUIRE(sd.at("i64").to_vector<int64_t>()[3] == std::numeric_limits<int64_t>::min());
  // int8 and int16 are widened to int32, losslessly.
  REQUIRE(sd.at("i8").dtype() == DType::i32);
  REQUIRE(sd.at("i8").to_vector<int32_t>() == std::vector<int32_t>{0, -1, 127, -128});
  REQUIRE(sd.at("i16").to_vector<int32_t>() == std::vector<int32_t>{0, -1, 32767, -32768});
  REQUIRE(io::safetensors_metadata(path) == std::map<std::string, std::string>{{"format", "pt"}});
  for (const auto& info : io::list_safetensors(path)) {
    if (info.name == "i8") {
      REQUIRE(info.file_dtype == "I8");
      REQUIRE(info.dtype == DType::i32);
    }
  }
}

TEST_CASE("safetensors written by dltrain are read back by PyTorch bit for bit",
          "[io][safetensors][reference][python]") {
  TempDir dir("st_python");
  // Loaded from torch.save's file: views with strides and offsets, a channels-last tensor.
  const StateDict sd = io::load_pth(kIoDir + "/tensors.pth");
  REQUIRE_FALSE(sd.at("view.t").is_contiguous());
  REQUIRE(sd.at("channels_last").is_contiguous(MemoryFormat::ChannelsLast));
  const std::string path = dir.file("from_dltrain.safetensors");
  io::save_safetensors(path, sd, {{"format", "pt"}, {"writer", "dltrain"}});

  const auto ref = read_io_reference();
  for (const auto& [name, t] : io::load_safetensors(path)) {
    INFO(name);
    REQUIRE(bitwise_equal(t, ref.at("ref." + name)));
  }
  if (!python_with_torch()) {
    WARN(
        "/usr/bin/python3 with torch is not available: the PyTorch side of this test "
        "(make_io_reference.py --check) was SKIPPED; only the C++ round trip was checked");
    return;
  }
  REQUIRE(run_io_reference_script("--check '" + path + "'") == 0);
  // The checker is not a rubber stamp: a file with other values fails it.
  const std::string other = dir.file("other.safetensors");
  StateDict changed = sd;
  changed.insert("f32", zeros({2, 3, 4}));
  io::save_safetensors(other, changed, {{"format", "pt"}, {"writer", "dltrain"}});
  REQUIRE(run_io_reference_script("--check '" + other + "' >/dev/null") == 1);
}

TEST_CASE("ResNet-18 weights exported by dltrain load into torchvision",
          "[io][safetensors][reference][python][resnet]") {
  TempDir dir("st_resnet");
  auto model = models::resnet18();
  deterministic_fill(*model);
  model->to(MemoryFormat::ChannelsLast);  // the file must still be row-major NCHW
  const std::string path = dir.file("resnet18.safetensors");
  io::save_safetensors(path, model->state_dict(), {{"format", "pt"}});

  // Back into a fresh dltrain model: the logits match torchvision's float64 reference up to
  // the float32 rounding of the weights.
  auto fresh = models::resnet18();
  fresh->load_state_dict(io::load_safetensors(path));
  fresh->eval();
  const auto ref = read_reference(DLTRAIN_REFERENCE_DIR "/resnet_reference.txt");
  std::vector<double> in(2 * 3 * 64 * 64);
  for (size_t i = 0; i < in.size(); ++i) in[i] = std::sin(0.05 * static_cast<double>(i));
  Tensor logits;
  {
    NoGradGuard ng;
    logits = fresh->forward(from_vector(in, {2, 3, 64, 64}, DType::f32)).slice(1, 0, 200);
  }
  const Tensor want = ref.at("resnet18.eval_logits");
  const double err =
      max(abs(sub(logits.to(DType::f64), want))).item<double>() / max(abs(want)).item<double>();
  INFO("max error relative to max |logit|: " << err);
  REQUIRE(err < 1e-5);

  if (!python_with_torchvision()) {
    WARN(
        "/usr/bin/python3 with torch and torchvision is not available (python3-torch and "
        "python3-torchvision): loading the exported ResNet-18 into torchvision "
        "(make_io_reference.py --check-resnet18) was SKIPPED");
    return;
  }
  REQUIRE(run_io_reference_script("--check-resnet18 '" + path + "'") == 0);
}

TEST_CASE("save_safetensors refuses bad names and leaves the destination alone",
          "[io][safetensors][errors]") {
  TempDir dir("st_save_errors");
  const std::string path = dir.file("keep.safetensors");
  StateDict good;
  good.insert("w", ones({2}));
  io::save_safetensors(path, good);
  const auto before = read_bytes(path);

  StateDict reserved;
  reserved.insert("__metadata__", ones({1}));
  REQUIRE_THROWS_WITH(io::save_safetensors(path, reserved), Contains(path) && Contains("reserved"));
  StateDict unnamed;
  unnamed.insert("", ones({1}));
  REQUIRE_THROWS_WITH(io::save_safetensors(path, unnamed), Contains("empty name"));
  // The header is JSON text: a name or metadata that is not UTF-8 cannot be written.
  StateDict latin1;
  latin1.insert("caf\xe9", ones({1}));
  REQUIRE_THROWS_WITH(io::save_safetensors(path, latin1),
                      Contains(path) && Contains("UTF-8") && Contains("rename"));
  REQUIRE_THROWS_WITH(io::save_safetensors(path, good, {{"note", "\xff"}}), Contains("UTF-8"));
  REQUIRE(read_bytes(path) == before);
  REQUIRE_FALSE(std::filesystem::exists(path + ".tmp"));

  const std::string nodir = dir.file("no/such/dir/x.safetensors");
  REQUIRE_THROWS_WITH(io::save_safetensors(nodir, good),
                      Contains(nodir) && Contains("cannot create"));
}

TEST_CASE("load_safetensors: missing, truncated and mis-sized files", "[io][safetensors][errors]") {
  TempDir dir("st_truncated");
  const std::string missing = dir.file("nope.safetensors");
  REQUIRE_THROWS_WITH(io::load_safetensors(missing),
                      Contains(missing) && Contains("does not exist"));
  REQUIRE_THROWS_WITH(io::load_safetensors(dir.str()), Contains("is a directory"));

  StateDict sd;
  sd.insert("a", arange(10.0));
  sd.insert("b", ones({3, 3}, DType::f64));
  const std::string good = dir.file("good.safetensors");
  io::save_safetensors(good, sd);
  const auto bytes = read_bytes(good);
  const uint64_t data_start = 8 + header_length(bytes);

  const std::string cut = dir.file("cut.safetensors");
  struct Cut {
    size_t at;
    const char* message;
  };
  for (const Cut& c : {Cut{0, "too few"}, Cut{5, "too few"}, Cut{8, "only 0 bytes follow"},
                       Cut{20, "truncated"}, Cut{static_cast<size_t>(data_start), "past the end"},
                       Cut{static_cast<size_t>(data_start) + 17, "tensor 'a'"},
                       Cut{bytes.size() - 1, "tensor 'b'"}}) {
    INFO("cut at " << c.at);
    write_bytes(cut, std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<long>(c.at)));
    REQUIRE_THROWS_WITH(io::load_safetensors(cut), Contains(cut) && Contains(c.message));
  }

  // Header length larger than the file; implausibly large; pointing into garbage.
  auto longer = bytes;
  longer[0] = 0xFF;
  longer[1] = 0xFF;
  write_bytes(cut, longer);
  REQUIRE_THROWS_WITH(io::load_safetensors(cut), Contains("header length field says 65535"));
  auto huge = bytes;
  huge[7] = 0x80;
  write_bytes(cut, huge);
  REQUIRE_THROWS_WITH(io::load_safetensors(cut), Contains("truncated or not a safetensors"));
  write_bytes(cut, st_file("[1,2,3]   "));
  REQUIRE_THROWS_WITH(io::load_safetensors(cut), Contains("does not start with '{'"));
  // Trailing bytes after the last tensor.
  auto trailing = bytes;
  trailing.push_back(0);
  write_bytes(cut, trailing);
  REQUIRE_THROWS_WITH(io::load_safetensors(cut), Contains("trailing bytes"));
}

TEST_CASE("load_safetensors: malformed JSON headers", "[io][safetensors][errors]") {
  TempDir dir("st_json");
  const std::string f = dir.file("bad.safetensors");
  const std::string ok = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  write_bytes(f, st_file(ok, {0, 0, 128, 63}));
  REQUIRE(io::load_safetensors(f).at("a").item<float>() == 1.0f);  // the baseline is valid

  struct Bad {
    std::string header;
    const char* message;
  };
  const std::string deep = "{\"x\":" + std::string(100, '[') + std::string(100, ']') + "}";
  for (const Bad& b : std::vector<Bad>{
           {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})", "expected '}'"},
           {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} x)", "expected end of input"},
           {R"({"a":{"dtype":"F32" "shape":[1],"data_offsets":[0,4]}})",
            "unexpected string literal"},
           {R"({"a":{"dtype":"F\q32","shape":[1],"data_offsets":[0,4]}})", "after backslash"},
           {R"({"a":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}})",
            "unexpected number literal"},
           {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},})", "object key"},
           {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,tru]}})", "invalid literal"},
           {"{\"a\":\"unterminated", "missing closing quote"},
           {"{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
            "ill-formed UTF-8 byte; last read: '\"a\\xff'"},
           {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,1e999]}})", "1e999"},
           {deep, "deeper than 64"},
           {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":{"k":1,"k":2}}})",
            "key 'k' appears twice"}}) {
    INFO(b.header);
    write_bytes(f, st_file(b.header, {0, 0, 128, 63}));
    REQUIRE_THROWS_WITH(io::load_safetensors(f),
                        Contains(f) && Contains("malformed JSON") && Contains(b.message));
  }
  // The error says where: the byte of the header and of the file.
  write_bytes(f, st_file(R"({"a":{"dtype":"F32",})", {0, 0, 128, 63}));
  REQUIRE_THROWS_WITH(io::load_safetensors(f),
                      Contains("at byte 20 of the header (file offset 28)"));
  write_bytes(f, st_file("{\"x\":" + std::string(70, '[') + std::string(70, ']') + "}"));
  REQUIRE_THROWS_WITH(io::load_safetensors(f),
                      Contains("deeper than 64 levels at byte 69 of the header"));
  // Members keep the document's order: two empty tensors (same offsets) load as listed.
  write_bytes(f, st_file(R"({"z":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                         R"("a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})"));
  REQUIRE(io::load_safetensors(f).keys() == std::vector<std::string>{"z", "a"});
  // Escapes decode, including a surrogate pair, and names may hold any character.
  write_bytes(
      f,
      st_file(R"({"w\u00e9\ud83d\ude00\"":{"dtype":"U8","shape":[],"data_offsets":[0,1]}})", {9}));
  REQUIRE(io::load_safetensors(f).keys() ==
          std::vector<std::string>{"w\xc3\xa9\xf0\x9f\x98\x80\""});
}

TEST_CASE("load_safetensors: invalid tensor entries name the tensor", "[io][safetensors][errors]") {
  TempDir dir("st_entries");
  const std::string f = dir.file("bad.safetensors");
  const std::vector<uint8_t> data8(8, 0);
  struct Bad {
    std::string header;
    std::vector<uint8_t> data;
    std::vector<const char*> messages;
  };
  for (
      const Bad& b : std::vector<Bad>{
          {R"({"w":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})",
           data8,
           {"tensor 'w'", "unknown dtype 'F31'"}},
          {R"({"w":{"dtype":"U16","shape":[4],"data_offsets":[0,8]}})",
           data8,
           {"tensor 'w'", "dtype U16", "no tensor type"}},
          {R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
           data8,
           {"tensor 'w'", "needs 12 bytes", "hold 8"}},
          {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
           data8,
           {"tensor 'w'", "past the end of the data section"}},
          {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"v":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
           data8,
           {"tensor 'v'", "overlaps tensor 'w'"}},
          {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
           data8,
           {"4 unused bytes before tensor 'w'"}},
          {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
           data8,
           {"tensor name 'w' appears twice", "file offset 64"}},
          {R"({"w":{"dtype":"F32","shape":[2],"dtype":"F32","data_offsets":[0,8]}})",
           data8,
           {"tensor 'w' has field 'dtype' twice"}},
          {R"({"__metadata__":{"k":"a","k":"b"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
           data8,
           {"\"__metadata__\" has key 'k' twice"}},
          {R"({"__metadata__":{},"__metadata__":{},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
           data8,
           {"two \"__metadata__\" entries"}},
          {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8.5]}})",
           data8,
           {"tensor 'w'", "non-negative integers but has 8.5"}},
          {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551616]}})",
           data8,
           {"tensor 'w'", "non-negative integers"}},
          {R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",
           data8,
           {"tensor 'w'", "non-negative integers", "-2"}},
          {R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})",
           data8,
           {"tensor 'w'", "non-negative integers"}},
          {R"({"w":{"dtype":"F32","shape":[2]}})", data8, {"tensor 'w'", "data_offsets"}},
          {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})",
           data8,
           {"tensor 'w'", "unknown field 'extra'"}},
          {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})",
           data8,
           {"tensor 'w'", "end before they begin"}},
          {R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
           data8,
           {"tensor 'w'", "more than 2^64"}},
          {R"({"w":[1,2]})", data8, {"tensor 'w'", "an array instead of an object"}},
          {R"({"__metadata__":{"k":1},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
           data8,
           {"__metadata__", "'k' must be a string"}},
          {R"({"w":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})",
           {1, 2},
           {"BOOL tensor 'w'", "byte 2"}}}) {
    INFO(b.header);
    write_bytes(f, st_file(b.header, b.data));
    try {
      io::load_safetensors(f);
      FAIL("no error");
    } catch (const Error& e) {
      const std::string msg = e.what();
      INFO(msg);
      REQUIRE(msg.find(f) != std::string::npos);
      for (const char* m : b.messages) REQUIRE(msg.find(m) != std::string::npos);
    }
  }
  // list_safetensors reads only the header: the bad BOOL data goes unnoticed there.
  REQUIRE(io::list_safetensors(f).at(0).name == "w");
}
