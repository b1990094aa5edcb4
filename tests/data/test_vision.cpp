// MNIST (synthetic roots and the real Fashion-MNIST installed by scripts/setup.sh) and
// CIFAR-10 (generated 5+1 file roots): shapes, values, normalisation, label checks and
// the errors for missing, truncated and inconsistent files.
#include <catch2/catch.hpp>

#include <filesystem>

#include "data/data_test_util.hpp"
#include "dltrain/data/idx.hpp"
#include "dltrain/data/vision.hpp"
#include "dltrain/dltrain.hpp"

using namespace dltrain;
using namespace dltrain::data;
using Catch::Contains;
using dltrain::testing::read_bytes;
using dltrain::testing::TempDir;
using dltrain::testing::write_bytes;

namespace {

const std::string kFashion = "/usr/share/datasets/fashion-mnist";

// u8 pixel values as the loaders must produce them: v / 255 rounded to float.
std::vector<float> scaled(const Tensor& u8) {
  std::vector<float> out;
  for (int v : u8.to_vector<int>()) out.push_back(static_cast<float>(v / 255.0));
  return out;
}

// A synthetic MNIST root with n images/labels; `gz` writes the .gz variants.
void make_mnist(const TempDir& dir, const std::string& split, const Tensor& images,
                const Tensor& labels, bool gz = false) {
  const std::string sfx = gz ? ".gz" : "";
  write_idx(dir.file(split + "-images-idx3-ubyte" + sfx), images, gz);
  write_idx(dir.file(split + "-labels-idx1-ubyte" + sfx), labels, gz);
}

}  // namespace

TEST_CASE("MNIST loads a synthetic root, plain and gzip", "[data][mnist]") {
  Generator g(5);
  const Tensor images = randint(0, 256, {6, 28, 28}, DType::u8, &g);
  const Tensor labels = tensor({3, 0, 9, 1, 1, 7}, DType::u8);
  for (bool gz : {false, true}) {
    if (gz && !gzip_supported()) {
      WARN("this build has no zlib: skipping the .gz MNIST root");
      continue;
    }
    TempDir dir("mnist");
    make_mnist(dir, "t10k", images, labels, gz);
    MNIST ds(dir.str(), /*train=*/false);
    REQUIRE(ds.size() == 6);
    REQUIRE(ds.data().dtype() == DType::f32);
    REQUIRE(ds.data().shape() == Shape{6, 1, 28, 28});
    REQUIRE(ds.targets().dtype() == DType::i64);
    REQUIRE(ds.targets().to_vector<int64_t>() == std::vector<int64_t>{3, 0, 9, 1, 1, 7});
    REQUIRE(ds.data().to_vector<float>() == scaled(images));
    const Example e = ds.get(2);
    REQUIRE(e.data.shape() == Shape{1, 28, 28});
    REQUIRE(e.target.item<int64_t>() == 9);
    REQUIRE_THROWS_WITH(MNIST(dir.str(), /*train=*/true), Contains("train-images-idx3-ubyte"));
  }
}

TEST_CASE("MNIST normalisation and option errors", "[data][mnist]") {
  TempDir dir("mnist_norm");
  make_mnist(dir, "train", full({2, 28, 28}, 255, DType::u8), tensor({0, 1}, DType::u8));
  MNIST ds(dir.str(), true, ImageOptions{{0.5f}, {0.25f}});
  const auto v = ds.data().to_vector<float>();
  REQUIRE(v.front() == Approx(2.0f));  // (1 - 0.5) / 0.25
  REQUIRE(v.back() == Approx(2.0f));
  REQUIRE_THROWS_WITH(MNIST(dir.str(), true, ImageOptions{{0.5f}, {}}), Contains("mean"));
  REQUIRE_THROWS_WITH(MNIST(dir.str(), true, ImageOptions{{0.5f}, {0.f}}), Contains("> 0"));
  REQUIRE_THROWS_WITH(MNIST(dir.str(), true, ImageOptions{{0.1f, 0.2f}, {1.f, 1.f}}),
                      Contains("mean needs 1 value or one per channel (1) but has 2"));
}

TEST_CASE("MNIST rejects inconsistent files, naming them", "[data][mnist]") {
  SECTION("missing files name both paths tried") {
    TempDir dir("mnist_missing");
    REQUIRE_THROWS_WITH(MNIST(dir.str(), true),
                        Contains(dir.file("train-images-idx3-ubyte")) &&
                            Contains(dir.file("train-images-idx3-ubyte.gz")));
  }
  SECTION("image/label counts differ") {
    TempDir dir("mnist_count");
    make_mnist(dir, "train", zeros({3, 28, 28}, DType::u8), tensor({1, 2}, DType::u8));
    REQUIRE_THROWS_WITH(MNIST(dir.str(), true), Contains("3 images") && Contains("2 labels") &&
                                                    Contains(dir.file("train-labels-idx1-ubyte")));
  }
  SECTION("label out of range") {
    TempDir dir("mnist_label");
    make_mnist(dir, "train", zeros({3, 28, 28}, DType::u8), tensor({1, 10, 2}, DType::u8));
    REQUIRE_THROWS_WITH(MNIST(dir.str(), true), Contains(dir.file("train-labels-idx1-ubyte")) &&
                                                    Contains("label 10 at record 1"));
  }
  SECTION("wrong dimension count or image size") {
    TempDir dir("mnist_dims");
    make_mnist(dir, "train", zeros({3, 784}, DType::u8), tensor({1, 2, 3}, DType::u8));
    REQUIRE_THROWS_WITH(MNIST(dir.str(), true),
                        Contains(dir.file("train-images-idx3-ubyte")) && Contains("[3, 784]"));
    make_mnist(dir, "train", zeros({3, 28, 28}, DType::u8), zeros({3, 1}, DType::u8));
    REQUIRE_THROWS_WITH(MNIST(dir.str(), true),
                        Contains(dir.file("train-labels-idx1-ubyte")) && Contains("[3, 1]"));
    make_mnist(dir, "train", zeros({3, 28, 28}, DType::f32), tensor({1, 2, 3}, DType::u8));
    REQUIRE_THROWS_WITH(MNIST(dir.str(), true), Contains("float32"));
  }
  SECTION("truncated image file") {
    TempDir dir("mnist_trunc");
    make_mnist(dir, "train", zeros({3, 28, 28}, DType::u8), tensor({1, 2, 3}, DType::u8));
    const std::string path = dir.file("train-images-idx3-ubyte");
    auto bytes = read_bytes(path);
    bytes.resize(bytes.size() - 100);
    write_bytes(path, bytes);
    REQUIRE_THROWS_WITH(MNIST(dir.str(), true), Contains(path) && Contains("truncated"));
  }
}

TEST_CASE("Fashion-MNIST (real files) loads with the published statistics", "[data][mnist][real]") {
  REQUIRE(std::filesystem::exists(kFashion + "/train-images-idx3-ubyte.gz"));
  if (!gzip_supported()) {
    WARN(
        "this build has no zlib: the real (gzip) Fashion-MNIST cannot be read; checking the error");
    REQUIRE_THROWS_WITH(MNIST(kFashion, true), Contains("gunzip"));
    return;
  }
  MNIST train(kFashion, true);
  REQUIRE(train.size() == 60000);
  REQUIRE(train.data().shape() == Shape{60000, 1, 28, 28});
  REQUIRE(train.targets().shape() == Shape{60000});
  const float* px = train.data().data<float>();
  float lo = 1, hi = 0;
  for (int64_t i = 0; i < train.data().numel(); ++i) {
    lo = std::min(lo, px[i]);
    hi = std::max(hi, px[i]);
  }
  REQUIRE(lo == 0.0f);
  REQUIRE(hi == 1.0f);
  std::vector<int64_t> per_class(10, 0);
  for (int64_t y : train.targets().to_vector<int64_t>()) ++per_class.at(static_cast<size_t>(y));
  REQUIRE(per_class == std::vector<int64_t>(10, 6000));
  // First labels and first image's pixel sum, from Python's gzip module on the same files.
  REQUIRE(train.targets().slice(0, 0, 10).to_vector<int64_t>() ==
          std::vector<int64_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5});
  double sum0 = 0;
  for (int i = 0; i < 784; ++i) sum0 += px[i] * 255.0;
  REQUIRE(sum0 == Approx(76247.0).margin(1e-2));

  MNIST test(kFashion, false);
  REQUIRE(test.data().shape() == Shape{10000, 1, 28, 28});
  REQUIRE(test.targets().slice(0, 0, 10).to_vector<int64_t>() ==
          std::vector<int64_t>{9, 2, 1, 1, 6, 1, 4, 6, 5, 7});
  const auto [tmin, tmax] = std::minmax_element(test.data().data<float>(),
                                                test.data().data<float>() + test.data().numel());
  REQUIRE(*tmin >= 0.0f);
  REQUIRE(*tmax <= 1.0f);
}

namespace {

// Writes a CIFAR-10 root: 5 train files of `per_file` records and a test file of `n_test`.
// Pixel (i, c, h, w) of the global train index i is (i * 7 + c * 50 + h * 3 + w) % 256.
Tensor cifar_images(int64_t first, int64_t n) {
  std::vector<uint8_t> v;
  for (int64_t i = first; i < first + n; ++i)
    for (int c = 0; c < 3; ++c)
      for (int h = 0; h < 32; ++h)
        for (int w = 0; w < 32; ++w)
          v.push_back(static_cast<uint8_t>((i * 7 + c * 50 + h * 3 + w) % 256));
  return from_vector(v, {n, 3, 32, 32});
}
Tensor cifar_labels(int64_t first, int64_t n) {
  std::vector<int64_t> v;
  for (int64_t i = first; i < first + n; ++i) v.push_back(i % 10);
  return from_vector(v);
}
void make_cifar(const std::string& dir, int64_t per_file, int64_t n_test) {
  for (int k = 0; k < 5; ++k)
    write_cifar10_binary(dir + "/data_batch_" + std::to_string(k + 1) + ".bin",
                         cifar_images(k * per_file, per_file),
                         cifar_labels(k * per_file, per_file));
  write_cifar10_binary(dir + "/test_batch.bin", cifar_images(1000, n_test),
                       cifar_labels(3, n_test));
}

}  // namespace

TEST_CASE("CIFAR10 round trip through the binary format", "[data][cifar]") {
  TempDir dir("cifar");
  make_cifar(dir.str(), 3, 4);
  // Record layout on disk: label byte, then R plane, G plane, B plane.
  const auto raw = read_bytes(dir.file("data_batch_2.bin"));
  REQUIRE(raw.size() == 3 * 3073);
  REQUIRE(raw[0] == 3);                          // global index 3 -> label 3
  REQUIRE(raw[1 + 1024] == (3 * 7 + 50) % 256);  // G plane, pixel (0, 0)

  CIFAR10 train(dir.str(), true);
  REQUIRE(train.size() == 15);
  REQUIRE(train.data().shape() == Shape{15, 3, 32, 32});
  REQUIRE(train.data().dtype() == DType::f32);
  REQUIRE(train.targets().dtype() == DType::i64);
  REQUIRE(train.targets().to_vector<int64_t>() == cifar_labels(0, 15).to_vector<int64_t>());
  REQUIRE(train.data().to_vector<float>() == scaled(cifar_images(0, 15)));

  CIFAR10 test(dir.str(), false);
  REQUIRE(test.size() == 4);
  REQUIRE(test.targets().to_vector<int64_t>() == std::vector<int64_t>{3, 4, 5, 6});
  REQUIRE(test.get(1).data.select(0, 2).select(0, 0).select(0, 0).item<float>() ==
          static_cast<float>(((1001 * 7 + 100) % 256) / 255.0));

  // Per-channel normalisation.
  CIFAR10 norm(dir.str(), false, ImageOptions{{0.1f, 0.2f, 0.3f}, {0.5f, 0.25f, 2.f}});
  const Tensor x = test.data(), xn = norm.data();
  for (int64_t c = 0; c < 3; ++c) {
    const float mean = std::vector<float>{0.1f, 0.2f, 0.3f}[c];
    const float sd = std::vector<float>{0.5f, 0.25f, 2.f}[c];
    const float a = x.select(0, 3).select(0, c).select(0, 5).select(0, 7).item<float>();
    const float b = xn.select(0, 3).select(0, c).select(0, 5).select(0, 7).item<float>();
    REQUIRE(b == Approx((a - mean) / sd));
  }
}

TEST_CASE("CIFAR10 finds files in root/cifar-10-batches-bin", "[data][cifar]") {
  TempDir dir("cifar_sub");
  std::filesystem::create_directories(dir.file("cifar-10-batches-bin"));
  make_cifar(dir.file("cifar-10-batches-bin"), 1, 2);
  REQUIRE(CIFAR10(dir.str(), true).size() == 5);
  REQUIRE(CIFAR10(dir.str(), false).size() == 2);
}

TEST_CASE("CIFAR10 errors name the file", "[data][cifar]") {
  TempDir dir("cifar_err");
  make_cifar(dir.str(), 2, 2);
  SECTION("a missing train file") {
    std::filesystem::remove(dir.file("data_batch_3.bin"));
    REQUIRE_THROWS_AS(CIFAR10(dir.str(), true), Error);
    REQUIRE_THROWS_WITH(CIFAR10(dir.str(), true),
                        Contains(dir.file("data_batch_3.bin")) && Contains("missing"));
    REQUIRE(CIFAR10(dir.str(), false).size() == 2);  // the test split does not need it
  }
  SECTION("a missing test file") {
    std::filesystem::remove(dir.file("test_batch.bin"));
    REQUIRE_THROWS_WITH(CIFAR10(dir.str(), false), Contains(dir.file("test_batch.bin")));
  }
  SECTION("a truncated file") {
    auto bytes = read_bytes(dir.file("data_batch_5.bin"));
    bytes.resize(bytes.size() - 10);
    write_bytes(dir.file("data_batch_5.bin"), bytes);
    REQUIRE_THROWS_WITH(CIFAR10(dir.str(), true), Contains(dir.file("data_batch_5.bin")) &&
                                                      Contains("truncated or corrupt") &&
                                                      Contains(std::to_string(bytes.size())));
  }
  SECTION("an empty file") {
    write_bytes(dir.file("test_batch.bin"), {});
    REQUIRE_THROWS_WITH(CIFAR10(dir.str(), false),
                        Contains(dir.file("test_batch.bin")) && Contains("truncated or corrupt"));
  }
  SECTION("a label >= 10") {
    auto bytes = read_bytes(dir.file("test_batch.bin"));
    bytes[3073] = 10;
    write_bytes(dir.file("test_batch.bin"), bytes);
    REQUIRE_THROWS_WITH(CIFAR10(dir.str(), false),
                        Contains(dir.file("test_batch.bin")) && Contains("label 10 in record 1"));
  }
  SECTION("writer argument checks") {
    REQUIRE_THROWS_WITH(write_cifar10_binary(dir.file("w.bin"), zeros({1, 3, 32, 32}), tensor({1})),
                        Contains("uint8") && Contains(dir.file("w.bin")));
    REQUIRE_THROWS_WITH(write_cifar10_binary(dir.file("w.bin"), zeros({1, 3, 32, 32}, DType::u8),
                                             tensor({12}, DType::i64)),
                        Contains("label 12"));
    REQUIRE_THROWS_WITH(write_cifar10_binary(dir.file("w.bin"), zeros({2, 3, 32, 32}, DType::u8),
                                             tensor({1}, DType::i64)),
                        Contains("[2]"));
  }
}
