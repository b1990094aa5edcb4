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

#include "apps/common/cli.hpp"
#include "dltrain/data/image_folder.hpp"
#include "dltrain/data/vision.hpp"

int main(int argc, char** argv) {
  std::string out_dir, fashion = "/usr/share/datasets/fashion-mnist";
  dltrain::data::MakeImageFolderOptions o;
  bool val = false;
  dltrain::cli::Flags f(
      "dltrain-make-images",
      "Writes OUT_DIR/n0000000<c>_<name>/n0000000<c>_<k>.JPEG: per class, --per-class "
      "Fashion-MNIST images of that class (train split, or test split with --val), upscaled to a "
      "random shorter side in [0.75, 1.25] x --size with a random aspect ratio in [3/4, 4/3], "
      "colourised per image.");
  f.add("OUT_DIR", &out_dir, "the folder to write").required();
  f.group("Images");
  f.add("--classes", &o.classes, "classes (Fashion-MNIST has 10)").min(1);
  f.add("--per-class", &o.per_class, "images per class").positive();
  f.add("--size", &o.size, "mean shorter side in pixels").positive();
  f.add("--seed", &o.seed, "seed of the sizes, crops and colours");
  f.add("--quality", &o.quality, "JPEG quality (1-100)").min(1);
  f.add_switch("--val", &val, "take the test split (a validation folder)");
  f.add("--fashion-root", &fashion, "the Fashion-MNIST IDX files").value_name("DIR");
  f.parse(argc, argv);
  if (o.quality > 100) f.fail("--quality: '" + std::to_string(o.quality) + "' must be <= 100");
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
