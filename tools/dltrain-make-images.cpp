// dltrain-make-images: writes a learnable, ImageNet-shaped JPEG image folder built from
// Fashion-MNIST (one sub-folder per class, colour JPEGs of varied sizes and aspect
// ratios), for exercising ImageFolder, the dataloader benchmark and the course's
// data-loading sessions without the 138 GB of ImageNet. Deterministic for a seed.
//
//   dltrain-make-images OUT_DIR [--classes 10] [--per-class 50] [--size 256] [--seed 0]
//                       [--val] [--quality 90] [--fashion-root DIR]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dltrain/data/image_folder.hpp"
#include "dltrain/data/vision.hpp"

namespace {

void usage() {
  std::fprintf(stderr,
               "usage: dltrain-make-images OUT_DIR [--classes 10] [--per-class 50] [--size 256]\n"
               "                           [--seed 0] [--val] [--quality 90] "
               "[--fashion-root DIR]\n"
               "Writes OUT_DIR/n0000000<c>_<name>/n0000000<c>_<k>.JPEG: per class, per-class\n"
               "Fashion-MNIST images of that class (train split, or test split with --val),\n"
               "upscaled to a random shorter side in [0.75, 1.25] x size with a random aspect\n"
               "ratio in [3/4, 4/3], colourised per image.\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir, fashion = "/usr/share/datasets/fashion-mnist";
  dltrain::data::MakeImageFolderOptions o;
  bool val = false;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "dltrain-make-images: missing value after %s\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (k == "--classes")
        o.classes = std::stoll(next());
      else if (k == "--per-class")
        o.per_class = std::stoll(next());
      else if (k == "--size")
        o.size = std::stoll(next());
      else if (k == "--seed")
        o.seed = std::stoull(next());
      else if (k == "--quality")
        o.quality = std::stoi(next());
      else if (k == "--fashion-root")
        fashion = next();
      else if (k == "--val")
        val = true;
      else if (k == "-h" || k == "--help") {
        usage();
        return 0;
      } else if (!k.empty() && k[0] != '-' && out_dir.empty())
        out_dir = k;
      else {
        usage();
        return 2;
      }
    } catch (const std::logic_error&) {  // std::stoll on a non-number
      std::fprintf(stderr, "dltrain-make-images: %s needs a number\n", k.c_str());
      return 2;
    }
  }
  if (out_dir.empty()) {
    usage();
    return 2;
  }
  try {
    const auto t0 = std::chrono::steady_clock::now();
    // Pixels stay in [0, 1] (no normalisation): write_image_folder rescales them to u8.
    const dltrain::data::MNIST source(fashion, /*train=*/!val);
    const int64_t n =
        dltrain::data::write_image_folder(out_dir, source.data(), source.targets(), o);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("wrote %lld images in %lld classes to %s (%s split, seed %llu) in %.1f s\n",
                static_cast<long long>(n), static_cast<long long>(o.classes), out_dir.c_str(),
                val ? "test" : "train", static_cast<unsigned long long>(o.seed), s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dltrain-make-images: %s\n", e.what());
    return 1;
  }
  return 0;
}
