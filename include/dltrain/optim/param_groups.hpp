// Parameter groups built from a module: the weight-decay / no-decay split of large-batch
// training recipes (MLPerf ResNet-50 with LARS, timm, BERT with LAMB).
//
// Normalisation parameters (the affine weight and bias of BatchNorm, SyncBatchNorm,
// LayerNorm, GroupNorm and InstanceNorm2d) and biases (a parameter whose own name starts with
// "bias", in any module) are not decayed: decaying a BN scale only rescales what the next
// layer sees, and decaying biases pulls them to 0 for nothing. Everything else (conv and
// linear weights, embeddings) is. LARS and LAMB also leave the no-decay group out of the
// trust-ratio adaptation when asked (ParamGroup::trust_ratio = false), as MLPerf's reference
// implementations do with their skip list.
#pragma once

#include <vector>

#include "dltrain/nn/module.hpp"
#include "dltrain/optim/optimizer.hpp"

namespace dltrain::optim {

/// Options of param_groups_no_decay.
struct NoDecayOptions {
  /// Set `trust_ratio = false` on the no-decay group (for LARS and LAMB only: the other
  /// optimizers refuse a group that sets a field they do not use).
  bool exclude_from_trust_ratio = false;
};

/// Two groups over `module`'s trainable parameters (requires_grad; shared ones once), in
/// named_parameters() order within each: [0] the decayed ones with `weight_decay` set, [1]
/// the normalisation parameters and biases with weight_decay 0 (and trust_ratio false when
/// options say so). Either may be empty. Other fields stay unset, so the optimizer's options
/// fill them. Throws dltrain::Error for a negative or non-finite weight_decay.
/// Example: `LARS opt(param_groups_no_decay(*model, 5e-5, {.exclude_from_trust_ratio = true}),
/// {.lr = 10.0, .momentum = 0.9});`
std::vector<ParamGroup> param_groups_no_decay(const nn::Module& module, double weight_decay,
                                              const NoDecayOptions& options = {});

}  // namespace dltrain::optim
