// Writes a small synthetic dataset in the CIFAR-10 binary format (data_batch_1..5.bin and
// test_batch.bin) so the cifar10 example can be tried, and tested, where CIFAR-10 itself
// cannot be downloaded. Class k images are noise around a class-specific colour and
// stripe pattern, so a model can learn them.
//
//   cifar10_synthetic DIR [IMAGES_PER_FILE = 64] [SEED = 0]   (--help lists them)
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "apps/common/cli.hpp"
#include "dltrain/data/vision.hpp"
#include "dltrain/dltrain.hpp"

using namespace dltrain;

int main(int argc, char** argv) {
  std::string dir;
  int64_t n = 64;
  uint64_t seed = 0;
  cli::Flags f("cifar10_synthetic",
               "Writes a learnable synthetic dataset in the CIFAR-10 binary format "
               "(data_batch_1..5.bin, test_batch.bin) for the cifar10 example.");
  f.add("DIR", &dir, "output folder").required();
  f.add("IMAGES_PER_FILE", &n, "images in each of the 6 files").positive();
  f.add("SEED", &seed, "seed of the labels and the noise");
  f.parse(argc, argv);
  try {
    std::filesystem::create_directories(dir);
    Generator gen(seed);
    const char* files[] = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                           "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"};
    for (const char* f : files) {
      Tensor labels = randint(0, 10, {n}, DType::i64, &gen);
      Tensor noise = randint(0, 64, {n, 3, 32, 32}, DType::i64, &gen);
      const int64_t* lp = labels.data<int64_t>();
      const int64_t* np = noise.data<int64_t>();
      std::vector<uint8_t> img(static_cast<size_t>(n * 3 * 32 * 32));
      for (int64_t i = 0; i < n; ++i) {
        int64_t k = lp[i];
        for (int64_t c = 0; c < 3; ++c) {
          for (int64_t y = 0; y < 32; ++y) {
            for (int64_t x = 0; x < 32; ++x) {
              size_t at = static_cast<size_t>(((i * 3 + c) * 32 + y) * 32 + x);
              int64_t base = 40 + 20 * ((k + c * 3) % 10);             // colour per class
              int64_t stripe = ((x + y * (k % 3)) / (2 + k % 4)) % 2;  // pattern per class
              img[at] = static_cast<uint8_t>(std::min<int64_t>(255, base + 60 * stripe + np[at]));
            }
          }
        }
      }
      Tensor images = from_vector(img, {n, 3, 32, 32});
      data::write_cifar10_binary(dir + "/" + f, images, labels);
    }
    std::printf("wrote 6 CIFAR-10 binary files of %lld images each to %s\n",
                static_cast<long long>(n), dir.c_str());
  } catch (const std::exception& e) {  // dltrain::Error or a filesystem error
    std::fprintf(stderr, "cifar10_synthetic: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
