// ResNet family against torchvision (tests/reference/make_resnet_reference.py):
// state-dict keys, order and shapes, parameter counts, and float64 outputs,
// losses, gradients and running statistics with deterministic weights, in NCHW
// and channels-last.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <sstream>

#include "reference_file.hpp"

using namespace dltrain;

namespace {

const std::map<std::string, Tensor>& ref() {
  static const auto r =
      dltrain::testing::read_reference(DLTRAIN_REFERENCE_DIR "/resnet_reference.txt");
  return r;
}

Tensor R(const std::string& name) {
  auto it = ref().find(name);
  DLTRAIN_CHECK(it != ref().end(), "no reference tensor '", name, "'");
  return it->second;
}

// The fill rule of make_resnet_reference.py, entry k of the state dict, element i.
void deterministic_fill(nn::Module& m) {
  int64_t k = 0;
  for (const auto& [name, t] : m.state_dict()) {
    if (is_floating(t.dtype())) {
      std::vector<double> v(static_cast<size_t>(t.numel()));
      std::string leafname = name.substr(name.rfind('.') + 1);
      double fan = t.dim() >= 2 ? static_cast<double>(t.numel() / t.size(0)) : 1.0;
      for (size_t i = 0; i < v.size(); ++i) {
        double s = std::sin(0.7 * static_cast<double>(i) + 0.3 * static_cast<double>(k));
        if (t.dim() >= 2) {
          v[i] = s / std::sqrt(fan);
        } else if (leafname == "running_var") {
          v[i] = 1.2 + 0.2 * s;
        } else if (leafname == "weight") {
          v[i] = 1.0 + 0.1 * s;
        } else {
          v[i] = 0.1 * s;
        }
      }
      Tensor dst = t;
      dst.copy_(from_vector(v, t.shape()));
    }
    ++k;
  }
}

Tensor det_input(const Shape& s) {
  std::vector<double> v(static_cast<size_t>(shape_numel(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.05 * static_cast<double>(i));
  return from_vector(v, s);
}

void close(const Tensor& got, const std::string& name, double tol = 1e-8) {
  INFO(name);
  Tensor want = R(name);
  REQUIRE(got.shape() == want.shape());
  Tensor err = max(abs(sub(got.to(DType::f64), want))), scale = max(abs(want));
  INFO("max abs error " << err.item<double>() << " (max |ref| " << scale.item<double>() << ")");
  REQUIRE(allclose(got.to(DType::f64), want, tol, tol));
}

void check_against_torchvision(const std::string& tag, std::shared_ptr<models::ResNet> model,
                               const Shape& in_shape, std::vector<int64_t> target,
                               MemoryFormat fmt) {
  model->to(DType::f64);
  deterministic_fill(*model);
  if (fmt == MemoryFormat::ChannelsLast) model->to(fmt);
  Tensor x = det_input(in_shape).contiguous(fmt);
  model->eval();
  {
    NoGradGuard ng;
    close(model->forward(x).slice(1, 0, 200), tag + ".eval_logits");
  }
  model->train();
  Tensor logits = model->forward(x);
  Tensor loss = cross_entropy(logits, from_vector(target));
  loss.backward();
  close(loss, tag + ".loss");
  close(model->conv1->weight.grad().select(0, 0), tag + ".grad_conv1_w0");
  close(model->fc->bias.grad(), tag + ".grad_fc_b");
  auto last = model->layer4->operator[](-1);
  Tensor w = last->child("conv1")->named_parameters(false).at(0).second;
  close(w.grad().select(0, 0), tag + ".grad_layer4_last_conv1_w0");
  close(model->bn1->running_mean, tag + ".bn1_running_mean");
  REQUIRE(model->bn1->num_batches_tracked.item<int64_t>() == 1);
}

}  // namespace

TEST_CASE("ResNet state dicts match torchvision's keys, order, shapes and parameter counts") {
  std::ifstream in(DLTRAIN_REFERENCE_DIR "/resnet_keys.txt");
  REQUIRE(in.good());
  std::map<std::string, std::vector<std::pair<std::string, Shape>>> keys;
  std::map<std::string, int64_t> counts;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string arch, name;
    ls >> arch >> name;
    if (name == "#params") {
      ls >> counts[arch];
      continue;
    }
    Shape s;
    int64_t d;
    while (ls >> d) s.push_back(d);
    keys[arch].emplace_back(name, s);
  }
  REQUIRE(keys.size() == 6);
  for (const auto& [arch, expected] : keys) {
    INFO(arch);
    models::ResNetOptions o;
    std::shared_ptr<models::ResNet> m;
    if (arch == "resnet18_cifar") {
      o.cifar_stem = true;
      o.num_classes = 10;
      m = models::resnet18(o);
    } else {
      m = models::resnet(arch, o);
    }
    StateDict sd = m->state_dict();
    REQUIRE(sd.size() == static_cast<int64_t>(expected.size()));
    int64_t i = 0;
    for (const auto& [name, t] : sd) {
      INFO(name);
      REQUIRE(name == expected[static_cast<size_t>(i)].first);
      REQUIRE(t.shape() == expected[static_cast<size_t>(i)].second);
      ++i;
    }
    REQUIRE(m->num_parameters() == counts.at(arch));
  }
  REQUIRE(counts.at("resnet50") == 25557032);
}

TEST_CASE("ResNet-18 matches torchvision in float64 (eval logits, train loss, grads, BN stats)") {
  auto fmt = GENERATE(MemoryFormat::Contiguous, MemoryFormat::ChannelsLast);
  check_against_torchvision("resnet18", models::resnet18(), {2, 3, 64, 64}, {3, 7}, fmt);
}

TEST_CASE("ResNet-50 matches torchvision in float64") {
  check_against_torchvision("resnet50", models::resnet50(), {2, 3, 64, 64}, {1, 999},
                            MemoryFormat::Contiguous);
}

TEST_CASE("CIFAR ResNet-18 (3x3 stem, no max-pool) matches the torchvision-based reference") {
  models::ResNetOptions o;
  o.cifar_stem = true;
  o.num_classes = 10;
  check_against_torchvision("resnet18_cifar", models::resnet18(o), {2, 3, 32, 32}, {0, 9},
                            MemoryFormat::Contiguous);
}

TEST_CASE("ResNet initialisation follows torchvision") {
  manual_seed(7);
  models::ResNetOptions o;
  o.zero_init_residual = true;
  auto m = models::resnet50(o);
  // kaiming_normal(fan_out, relu): std = sqrt(2 / (out * k * k)).
  Tensor w = m->conv1->weight;
  double want = std::sqrt(2.0 / (64 * 7 * 7));
  REQUIRE(std::abs(stddev(w.detach(), {0, 1, 2, 3}).item<double>() - want) < 0.05 * want);
  REQUIRE(std::abs(mean(w.detach()).item<double>()) < 0.05 * want);
  REQUIRE(max(m->bn1->weight.detach()).item<double>() == 1.0);
  REQUIRE(min(m->bn1->weight.detach()).item<double>() == 1.0);
  REQUIRE(max(abs(m->bn1->bias.detach())).item<double>() == 0.0);
  auto block = std::dynamic_pointer_cast<models::Bottleneck>(m->layer1->operator[](0));
  REQUIRE(block != nullptr);
  REQUIRE(max(abs(block->bn3->weight.detach())).item<double>() == 0.0);
  REQUIRE(max(block->bn2->weight.detach()).item<double>() == 1.0);
  // fc keeps Linear's default U(+-1/sqrt(2048)).
  REQUIRE(max(abs(m->fc->weight.detach())).item<double>() <= 1.0 / std::sqrt(2048.0));
}

TEST_CASE("ResNet prints like torchvision and rejects bad input") {
  auto m = models::resnet18();
  std::string s = m->str();
  REQUIRE_THAT(s, Catch::StartsWith("ResNet(\n  (conv1): Conv2d(3, 64, kernel_size=(7, 7), "
                                    "stride=(2, 2), padding=(3, 3), bias=False)\n"));
  REQUIRE_THAT(s, Catch::Contains("(downsample): Sequential(\n        (0): Conv2d(64, 128, "
                                  "kernel_size=(1, 1), stride=(2, 2), bias=False)"));
  REQUIRE_THAT(s, Catch::Contains("(fc): Linear(in_features=512, out_features=1000, bias=True)"));
  REQUIRE_THROWS_WITH(m->forward(zeros({2, 1, 32, 32})), Catch::Contains("[N, 3, H, W]"));
  REQUIRE_THROWS_WITH(models::resnet("resnet42"), Catch::Contains("resnet50"));
}
