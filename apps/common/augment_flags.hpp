// The course's augmentation flags (issue 30, day 3 "Data Augmentation"): per-sample policies
// (--auto-augment trivial|rand|imagenet, --random-erasing P [--random-erasing-value
// mean|random]) and batch mixing (--mixup A,
// --cutmix A), and the batch-mixing function they build (header-only). The per-sample
// transforms are the program's business (where its samples are decoded); this file holds what
// the examples share.
//
// Invariants: with both --mixup and --cutmix, each batch gets one of the two (torchvision v2's
// RandomChoice); the mixing draws from the Generator the program passes (per rank), which must
// outlive the returned function.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "apps/common/cli.hpp"
#include "dltrain/core/generator.hpp"
#include "dltrain/data/augment.hpp"
#include "dltrain/data/mix.hpp"

namespace dltrain::apps {

struct AugmentFlags {
  std::string auto_augment = "none";
  std::string random_erasing_value = "mean";
  double random_erasing = 0, mixup = 0, cutmix = 0;

  /// `erase_to`: what RandomErasing fills its boxes with, for --help.
  void add_to(cli::Flags& f, const char* erase_to) {
    f.group(cli::group::kAugment);
    f.add("--auto-augment", &auto_augment,
          "per-sample policy after crop and flip, as torchvision's recipe: trivial "
          "(TrivialAugmentWide), rand (RandAugment), imagenet (AutoAugment), none")
        .choices({"none", "trivial", "rand", "imagenet"})
        .value_name("NAME");
    f.add("--random-erasing", &random_erasing,
          std::string("RandomErasing probability (boxes erased to ") + erase_to + "; 0: off)")
        .min(0);
    f.add("--random-erasing-value", &random_erasing_value,
          "what --random-erasing fills a box with: mean (torchvision's default value 0 after "
          "Normalize) or random (value='random': normal noise of the normalised image)")
        .choices({"mean", "random"});
    f.add("--mixup", &mixup, "MixUp alpha on each training batch (0: off)").min(0);
    f.add("--cutmix", &cutmix,
          "CutMix alpha on each training batch (0: off; with --mixup, one of the two per batch)")
        .min(0);
  }
  void check(const cli::Flags& f) const {
    if (random_erasing > 1) f.fail("--random-erasing: a probability is at most 1");
    if (random_erasing == 0 && f.given("--random-erasing-value"))
      f.fail("--random-erasing-value needs --random-erasing P");
  }

  /// --random-erasing on u8 images that the program then normalises with `mean` and `std`
  /// (0..1 scale): boxes erased to round(255 * mean), 0 after normalisation, or to normal noise
  /// of the normalised image with --random-erasing-value random; null when off.
  std::shared_ptr<const data::Augmentation> make_random_erasing(
      const std::vector<float>& mean, const std::vector<float>& std) const {
    if (random_erasing <= 0) return nullptr;
    const std::array<double, 2> scale{0.02, 0.33}, ratio{0.3, 3.3};  // torchvision's defaults
    if (random_erasing_value == "random")
      return std::make_shared<data::RandomErasing>(
          data::RandomErasing::random(random_erasing, std::vector<double>(mean.begin(), mean.end()),
                                      std::vector<double>(std.begin(), std.end()), scale, ratio));
    std::vector<uint8_t> fill;
    for (float m : mean) fill.push_back(static_cast<uint8_t>(std::lround(255.f * m)));
    return std::make_shared<data::RandomErasing>(random_erasing, scale, ratio, fill);
  }

  using Mix = std::function<data::MixedBatch(const Tensor& images, const Tensor& labels)>;
  /// --mixup / --cutmix over `num_classes` soft labels, drawing from `gen`; null without either.
  /// Prints which ("batch mixing: MixUp or CutMix (one per batch)").
  Mix make_mix(int64_t num_classes, Generator& gen) const {
    if (mixup <= 0 && cutmix <= 0) return nullptr;
    Mix mix;
    if (mixup > 0 && cutmix > 0) {
      auto both = std::make_shared<data::MixUpOrCutMix>(data::MixUp(num_classes, mixup),
                                                        data::CutMix(num_classes, cutmix));
      mix = [both, &gen](const Tensor& x, const Tensor& y) { return (*both)(x, y, &gen); };
    } else if (mixup > 0) {
      mix = [m = data::MixUp(num_classes, mixup), &gen](const Tensor& x, const Tensor& y) {
        return m(x, y, &gen);
      };
    } else {
      mix = [m = data::CutMix(num_classes, cutmix), &gen](const Tensor& x, const Tensor& y) {
        return m(x, y, &gen);
      };
    }
    std::printf("batch mixing: %s\n", mixup > 0 && cutmix > 0 ? "MixUp or CutMix (one per batch)"
                                      : mixup > 0             ? "MixUp"
                                                              : "CutMix");
    return mix;
  }
};

}  // namespace dltrain::apps
