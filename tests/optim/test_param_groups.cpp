// param_groups_no_decay: the decay / no-decay split on the zoo's ResNet-50 (161 parameter
// tensors: 53 convolutions, 53 BatchNorms with a weight and a bias each, the fc weight and
// bias; 107 of them are not decayed) and on a model with LayerNorm, GroupNorm and biases; the
// groups drive SGD, LARS and LAMB.
#include <set>

#include "dltrain/nn/containers.hpp"
#include "dltrain/nn/layers.hpp"
#include "dltrain/nn/models/resnet.hpp"
#include "dltrain/optim/lamb.hpp"
#include "dltrain/optim/lars.hpp"
#include "dltrain/optim/param_groups.hpp"
#include "optim_test_util.hpp"

using namespace dltrain;
using namespace dltrain::optim;
using Catch::Contains;

namespace {

std::set<const TensorImpl*> impls(const std::vector<Tensor>& ts) {
  std::set<const TensorImpl*> out;
  for (const auto& t : ts) out.insert(t.impl().get());
  return out;
}

}  // namespace

TEST_CASE("param_groups_no_decay puts ResNet-50's BN parameters and biases in the no-decay group",
          "[optim][groups]") {
  auto model = models::resnet50();
  const auto named = model->named_parameters();
  REQUIRE(named.size() == 161);
  const auto groups = param_groups_no_decay(*model, 5e-5);
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].params.size() == 54);
  CHECK(groups[1].params.size() == 107);
  CHECK(*groups[0].weight_decay == 5e-5);
  CHECK(*groups[1].weight_decay == 0.0);
  CHECK_FALSE(groups[1].trust_ratio.has_value());
  CHECK_FALSE(groups[0].lr.has_value());
  const auto decay = impls(groups[0].params), no_decay = impls(groups[1].params);
  int bn = 0;
  for (const auto& [name, p] : named) {
    INFO(name);
    const bool is_bn = name.find(".bn") != std::string::npos || name.rfind("bn1.", 0) == 0 ||
                       name.find("downsample.1.") != std::string::npos;
    if (is_bn) ++bn;
    const bool want_no_decay = is_bn || name == "fc.bias";
    CHECK(no_decay.count(p.impl().get()) == (want_no_decay ? 1u : 0u));
    CHECK(decay.count(p.impl().get()) == (want_no_decay ? 0u : 1u));
    if (want_no_decay) CHECK(p.dim() == 1);
  }
  CHECK(bn == 106);
  // named_parameters() order within each group.
  CHECK(groups[0].params.front().impl() == model->named_parameters().front().second.impl());
  CHECK(groups[1].params.back().impl() == model->named_parameters().back().second.impl());

  // The groups drive the optimizers; LARS / LAMB take the trust-ratio exclusion too.
  SGD sgd(param_groups_no_decay(*model, 1e-4), {.lr = 0.1, .momentum = 0.9});
  CHECK(sgd.num_params() == 161);
  CHECK(*sgd.param_groups()[1].weight_decay == 0.0);
  const auto lars_groups = param_groups_no_decay(*model, 5e-5, {.exclude_from_trust_ratio = true});
  CHECK(*lars_groups[1].trust_ratio == false);
  LARS lars(lars_groups, {.lr = 10.0});
  CHECK(*lars.param_groups()[0].trust_ratio == true);
  CHECK(*lars.param_groups()[1].trust_ratio == false);
  LAMB lamb(param_groups_no_decay(*model, 0.01, {.exclude_from_trust_ratio = true}), {});
  CHECK(*lamb.param_groups()[0].weight_decay == 0.01);
  REQUIRE_THROWS_WITH(SGD(lars_groups, {.lr = 0.1}),
                      Contains("sets 'trust_ratio', which SGD does not use"));
}

TEST_CASE("param_groups_no_decay finds LayerNorm, GroupNorm and every bias, skips frozen ones",
          "[optim][groups]") {
  auto lin1 = std::make_shared<nn::Linear>(4, 8);
  auto ln = std::make_shared<nn::LayerNorm>(Shape{8});
  auto lin2 = std::make_shared<nn::Linear>(8, 6, /*bias=*/false);
  auto gn = std::make_shared<nn::GroupNorm>(2, 6);
  auto frozen = std::make_shared<nn::Linear>(6, 2);
  frozen->weight.requires_grad_(false);
  frozen->bias.requires_grad_(false);
  nn::Sequential model{lin1, ln, lin2, gn, frozen};
  const auto groups = param_groups_no_decay(model, 0.1);
  CHECK(impls(groups[0].params) == impls({lin1->weight, lin2->weight}));
  CHECK(impls(groups[1].params) == impls({lin1->bias, ln->weight, ln->bias, gn->weight, gn->bias}));
  REQUIRE_THROWS_WITH(param_groups_no_decay(model, -1.0), Contains("invalid weight_decay"));
}
