// MNIST / Fashion-MNIST and CIFAR-10 loaders and the CIFAR-10 writer.
//
// Pixels are converted through a 256-entry table per channel holding
// (v / 255 - mean) / std, so the conversion is one parallel lookup pass and an
// unnormalised 255 maps to exactly 1.0f.
#include "dltrain/data/vision.hpp"

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "dltrain/core/error.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/data/idx.hpp"

namespace dltrain::data {

namespace {

namespace fs = std::filesystem;
using Lut = std::vector<std::array<float, 256>>;

// One table per channel; throws naming `op` on malformed options.
Lut make_lut(const ImageOptions& o, int64_t channels, const char* op) {
  DLTRAIN_CHECK(o.mean.empty() == o.std.empty(), op, ": ImageOptions has ", o.mean.size(),
                " mean values but ", o.std.size(), " std values; give both (1 or ", channels,
                " values each) or neither");
  for (const auto& [name, v] : {std::pair{"mean", &o.mean}, std::pair{"std", &o.std}})
    DLTRAIN_CHECK(v->empty() || v->size() == 1 || static_cast<int64_t>(v->size()) == channels, op,
                  ": ImageOptions ", name, " needs 1 value or one per channel (", channels,
                  ") but has ", v->size());
  for (float s : o.std)
    DLTRAIN_CHECK(s > 0, op, ": ImageOptions std values must be > 0 but one is ", s);
  Lut lut(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) {
    const auto pick = [&](const std::vector<float>& v, float dflt) {
      return v.empty() ? dflt : v[v.size() == 1 ? 0 : static_cast<size_t>(c)];
    };
    const float mean = pick(o.mean, 0.f), sd = pick(o.std, 1.f);
    for (int k = 0; k < 256; ++k)
      lut[static_cast<size_t>(c)][static_cast<size_t>(k)] =
          (static_cast<float>(k) / 255.f - mean) / sd;
  }
  return lut;
}

// First path of `root/name` or `root/name.gz` that exists; throws naming both.
std::string find_idx(const std::string& root, const std::string& name) {
  const fs::path plain = fs::path(root) / name;
  const fs::path gz = fs::path(root) / (name + ".gz");
  std::error_code ec;
  if (fs::is_regular_file(plain, ec)) return plain.string();
  if (fs::is_regular_file(gz, ec)) return gz.string();
  DLTRAIN_FAIL(
      "MNIST: neither '", plain.string(), "' nor '", gz.string(),
      "' exists; point root at the folder holding the MNIST or Fashion-MNIST IDX files "
      "(Debian's dataset-fashion-mnist installs them in /usr/share/datasets/fashion-mnist)");
}

Tensor labels_to_i64(const uint8_t* p, int64_t n, const std::string& path, const char* op) {
  Tensor y = empty({n}, TensorOptions(DType::i64));
  int64_t* o = y.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    DLTRAIN_CHECK(p[i] < 10, op, ": '", path, "' has label ", int{p[i]}, " at record ", i,
                  "; labels must be in [0, 10)");
    o[i] = p[i];
  }
  return y;
}

TensorDataset load_mnist(const std::string& root, bool train, const ImageOptions& options) {
  const char* op = "MNIST";
  const std::string split = train ? "train" : "t10k";
  const Lut lut = make_lut(options, 1, op);
  const std::string ipath = find_idx(root, split + "-images-idx3-ubyte");
  const std::string lpath = find_idx(root, split + "-labels-idx1-ubyte");
  const Tensor raw_x = read_idx(ipath);
  DLTRAIN_CHECK(
      raw_x.dtype() == DType::u8 && raw_x.dim() == 3 && raw_x.size(1) == 28 && raw_x.size(2) == 28,
      op, ": '", ipath, "' holds ", raw_x.dtype(), " of shape ", shape_str(raw_x.shape()),
      " but MNIST images are uint8 [N, 28, 28]");
  const Tensor raw_y = read_idx(lpath);
  DLTRAIN_CHECK(raw_y.dtype() == DType::u8 && raw_y.dim() == 1, op, ": '", lpath, "' holds ",
                raw_y.dtype(), " of shape ", shape_str(raw_y.shape()),
                " but MNIST labels are uint8 [N]");
  const int64_t n = raw_x.size(0);
  DLTRAIN_CHECK(raw_y.size(0) == n, op, ": '", ipath, "' holds ", n, " images but '", lpath,
                "' holds ", raw_y.size(0), " labels; the files belong to different sets");
  Tensor x = empty({n, 1, 28, 28}, TensorOptions(DType::f32));
  const uint8_t* in = raw_x.data<uint8_t>();
  float* out = x.data<float>();
  const auto& table = lut[0];
  parallel_for(0, x.numel(), 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = table[in[i]];
  });
  return TensorDataset(x, labels_to_i64(raw_y.data<uint8_t>(), n, lpath, op));
}

TensorDataset load_cifar10(const std::string& root, bool train, const ImageOptions& options) {
  const char* op = "CIFAR10";
  constexpr int64_t kPixels = 3 * 32 * 32, kRecord = kPixels + 1;
  const Lut lut = make_lut(options, 3, op);
  std::vector<std::string> names;
  if (train)
    for (int k = 1; k <= 5; ++k) names.push_back("data_batch_" + std::to_string(k) + ".bin");
  else
    names.push_back("test_batch.bin");
  std::error_code ec;
  fs::path dir(root);
  if (!fs::exists(dir / names[0], ec) && fs::is_directory(dir / "cifar-10-batches-bin", ec))
    dir /= "cifar-10-batches-bin";
  // Sizes first, so a missing or truncated file fails before anything is read.
  std::vector<std::string> paths;
  std::vector<int64_t> counts;
  int64_t n = 0;
  for (const auto& name : names) {
    const std::string p = (dir / name).string();
    DLTRAIN_CHECK(fs::is_regular_file(p, ec), op, ": '", p, "' is missing; the ",
                  train ? "train split needs data_batch_1.bin .. data_batch_5.bin"
                        : "test split needs test_batch.bin",
                  " (CIFAR-10 binary version) in '", dir.string(), "'");
    const uint64_t size = fs::file_size(p, ec);
    DLTRAIN_CHECK(!ec, op, ": cannot stat '", p, "': ", ec.message());
    DLTRAIN_CHECK(size > 0 && size % kRecord == 0, op, ": '", p,
                  "' is truncated or corrupt: its size ", size,
                  " bytes is not a positive multiple of the ", kRecord,
                  "-byte record (1 label byte + 3072 pixel bytes)");
    paths.push_back(p);
    counts.push_back(static_cast<int64_t>(size / kRecord));
    n += counts.back();
  }
  std::vector<uint8_t> raw(static_cast<size_t>(n * kRecord));
  Tensor y = empty({n}, TensorOptions(DType::i64));
  int64_t first = 0;
  for (size_t f = 0; f < paths.size(); ++f) {
    const size_t bytes = static_cast<size_t>(counts[f] * kRecord);
    uint8_t* dst = raw.data() + first * kRecord;
    FILE* fp = std::fopen(paths[f].c_str(), "rb");
    DLTRAIN_CHECK(fp != nullptr, op, ": cannot open '", paths[f], "': ", std::strerror(errno));
    const size_t got = std::fread(dst, 1, bytes, fp);
    std::fclose(fp);
    DLTRAIN_CHECK(got == bytes, op, ": '", paths[f], "' is truncated: read ", got, " of ", bytes,
                  " bytes");
    int64_t* labels = y.data<int64_t>() + first;
    for (int64_t r = 0; r < counts[f]; ++r) {
      const uint8_t label = dst[r * kRecord];
      DLTRAIN_CHECK(label < 10, op, ": '", paths[f], "' has label ", int{label}, " in record ", r,
                    "; labels must be in [0, 10)");
      labels[r] = label;
    }
    first += counts[f];
  }
  Tensor x = empty({n, 3, 32, 32}, TensorOptions(DType::f32));
  float* out = x.data<float>();
  parallel_for(0, n, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const uint8_t* in = raw.data() + r * kRecord + 1;
      float* o = out + r * kPixels;
      for (int64_t c = 0; c < 3; ++c) {
        const auto& table = lut[static_cast<size_t>(c)];
        for (int64_t j = c * 1024; j < (c + 1) * 1024; ++j) o[j] = table[in[j]];
      }
    }
  });
  return TensorDataset(x, y);
}

}  // namespace

MNIST::MNIST(const std::string& root, bool train, const ImageOptions& options)
    : TensorDataset(load_mnist(root, train, options)) {}

CIFAR10::CIFAR10(const std::string& root, bool train, const ImageOptions& options)
    : TensorDataset(load_cifar10(root, train, options)) {}

void write_cifar10_binary(const std::string& path, const Tensor& images_u8, const Tensor& labels) {
  const char* op = "write_cifar10_binary";
  DLTRAIN_CHECK(images_u8.defined() && labels.defined(), op, ": undefined tensor (writing '", path,
                "')");
  DLTRAIN_CHECK(images_u8.dtype() == DType::u8 && images_u8.dim() == 4 && images_u8.size(1) == 3 &&
                    images_u8.size(2) == 32 && images_u8.size(3) == 32,
                op, ": images must be uint8 [N, 3, 32, 32] but are ", images_u8.dtype(), " ",
                shape_str(images_u8.shape()), " (writing '", path, "')");
  const int64_t n = images_u8.size(0);
  DLTRAIN_CHECK(!is_floating(labels.dtype()) && labels.dtype() != DType::b8 && labels.dim() == 1 &&
                    labels.size(0) == n,
                op, ": labels must be integers of shape [", n, "] but are ", labels.dtype(), " ",
                shape_str(labels.shape()), " (writing '", path, "')");
  const std::vector<int64_t> lab = labels.to_vector<int64_t>();
  for (size_t i = 0; i < lab.size(); ++i)
    DLTRAIN_CHECK(lab[i] >= 0 && lab[i] < 10, op, ": label ", lab[i], " at index ", i,
                  " is not in [0, 10) (writing '", path, "')");
  const Tensor x = images_u8.detach().to(Device::cpu()).contiguous();
  const uint8_t* px = x.data<uint8_t>();
  constexpr int64_t kPixels = 3 * 32 * 32;
  std::vector<uint8_t> buf(static_cast<size_t>(n * (kPixels + 1)));
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* rec = buf.data() + i * (kPixels + 1);
    rec[0] = static_cast<uint8_t>(lab[static_cast<size_t>(i)]);
    std::memcpy(rec + 1, px + i * kPixels, kPixels);
  }
  FILE* fp = std::fopen(path.c_str(), "wb");
  DLTRAIN_CHECK(fp != nullptr, op, ": cannot create '", path, "': ", std::strerror(errno));
  bool ok = buf.empty() || std::fwrite(buf.data(), 1, buf.size(), fp) == buf.size();
  ok = (std::fclose(fp) == 0) && ok;
  DLTRAIN_CHECK(ok, op, ": writing '", path, "' failed (disk full or not writable?)");
}

}  // namespace dltrain::data
