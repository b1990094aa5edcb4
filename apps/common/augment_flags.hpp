// The course's augmentation flags (issue 30, day 3 "Data Augmentation"): per-sample policies
// (--auto-augment trivial|rand|imagenet, --random-erasing P) and batch mixing (--mixup A,
// --cutmix A), and the batch-mixing function they build (header-only). The per-sample
// transforms are the program's business (where its samples are decoded); this file holds what
// the examples share.
//
// Invariants: with both --mixup and --cutmix, each batch gets one of the two (torchvision v2's
// RandomChoice); the mixing draws from the Generator the program passes (per rank), which must
// outlive the returned function.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "apps/common/cli.hpp"
#include "dltrain/core/generator.hpp"
#include "dltrain/data/mix.hpp"

namespace dltrain::apps {

struct AugmentFlags {
  std::string auto_augment = "none";
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
    f.add("--mixup", &mixup, "MixUp alpha on each training batch (0: off)").min(0);
    f.add("--cutmix", &cutmix,
          "CutMix alpha on each training batch (0: off; with --mixup, one of the two per batch)")
        .min(0);
  }
  void check(const cli::Flags& f) const {
    if (random_erasing > 1) f.fail("--random-erasing: a probability is at most 1");
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
