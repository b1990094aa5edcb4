// optim::param_groups_no_decay (dltrain/optim/param_groups.hpp): normalisation parameters
// and biases in a group without weight decay or LARS adaptation.
#include "dltrain/optim/param_groups.hpp"

#include <cmath>
#include <set>
#include <string>

#include "dltrain/core/error.hpp"
#include "dltrain/nn/layers.hpp"

namespace dltrain::optim {

namespace {

// SyncBatchNorm derives from nn::BatchNorm.
bool is_norm_layer(const nn::Module& m) {
  return dynamic_cast<const nn::BatchNorm*>(&m) != nullptr ||
         dynamic_cast<const nn::LayerNorm*>(&m) != nullptr ||
         dynamic_cast<const nn::GroupNorm*>(&m) != nullptr ||
         dynamic_cast<const nn::InstanceNorm2d*>(&m) != nullptr;
}

}  // namespace

std::vector<ParamGroup> param_groups_no_decay(const nn::Module& module, double weight_decay,
                                              const NoDecayOptions& options) {
  DLTRAIN_CHECK(weight_decay >= 0.0 && std::isfinite(weight_decay),
                "param_groups_no_decay: invalid weight_decay ", weight_decay,
                " (must be finite and >= 0)");
  std::set<const TensorImpl*> norm_params;
  for (const auto& [name, m] : module.named_modules()) {
    if (!is_norm_layer(*m)) continue;
    for (const auto& [pname, p] : m->named_parameters(/*recurse=*/false))
      norm_params.insert(p.impl().get());
  }
  std::vector<ParamGroup> groups(2);
  groups[0].weight_decay = weight_decay;
  groups[1].weight_decay = 0.0;
  if (options.exclude_from_trust_ratio) groups[1].trust_ratio = false;
  std::set<const TensorImpl*> seen;
  for (const auto& [name, p] : module.named_parameters()) {
    if (!p.requires_grad() || !seen.insert(p.impl().get()).second) continue;
    const auto dot = name.rfind('.');
    const std::string local = dot == std::string::npos ? name : name.substr(dot + 1);
    const bool no_decay = norm_params.count(p.impl().get()) != 0 || local.rfind("bias", 0) == 0;
    groups[no_decay ? 1 : 0].params.push_back(p);
  }
  return groups;
}

}  // namespace dltrain::optim
