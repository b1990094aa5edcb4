// The torchvision ResNet family (dltrain/nn/models/resnet.hpp): BasicBlock, Bottleneck and
// the stage builder, with torchvision's parameter names and initialisation.
#include "dltrain/nn/models/resnet.hpp"

#include "dltrain/autograd/node.hpp"
#include "dltrain/nn/checkpoint.hpp"
#include "dltrain/nn/init.hpp"
#include "dltrain/ops/elementwise.hpp"

namespace dltrain::models {

namespace {

std::shared_ptr<nn::Conv2d> conv(int64_t in, int64_t out, int64_t k, int64_t stride,
                                 int64_t groups = 1) {
  nn::Conv2dOptions o;
  o.stride = stride;
  o.padding = k / 2;
  o.groups = groups;
  o.bias = false;
  return std::make_shared<nn::Conv2d>(in, out, k, o);
}

std::shared_ptr<nn::BatchNorm2d> bn(int64_t c) { return std::make_shared<nn::BatchNorm2d>(c); }

// The residual sum and final ReLU shared by both block kinds.
Tensor residual_out(const Tensor& branch, const Tensor& x, const std::shared_ptr<nn::Module>& ds) {
  return relu(add(branch, ds ? (*ds)(x) : x));
}

}  // namespace

BasicBlock::BasicBlock(int64_t inplanes, int64_t planes, int64_t stride,
                       std::shared_ptr<nn::Module> ds, const ResNetOptions& opts)
    : Module("BasicBlock") {
  DLTRAIN_CHECK(opts.groups == 1 && opts.width_per_group == 64,
                "BasicBlock supports only groups = 1 and width_per_group = 64; use a Bottleneck "
                "ResNet (50 or deeper) for ResNeXt / wide variants");
  conv1 = register_module("conv1", conv(inplanes, planes, 3, stride));
  bn1 = register_module("bn1", bn(planes));
  register_module("relu", std::make_shared<nn::ReLU>());
  conv2 = register_module("conv2", conv(planes, planes, 3, 1));
  bn2 = register_module("bn2", bn(planes));
  if (ds) downsample = register_module("downsample", std::move(ds));
}

// Children are called as (*m)(x) so that an error names the layer (nn::ModuleError).
Tensor BasicBlock::forward(const Tensor& x) {
  Tensor out = relu((*bn1)((*conv1)(x)));
  out = (*bn2)((*conv2)(out));
  return residual_out(out, x, downsample);
}

Bottleneck::Bottleneck(int64_t inplanes, int64_t planes, int64_t stride,
                       std::shared_ptr<nn::Module> ds, const ResNetOptions& opts)
    : Module("Bottleneck") {
  int64_t width = planes * opts.width_per_group / 64 * opts.groups;
  conv1 = register_module("conv1", conv(inplanes, width, 1, 1));
  bn1 = register_module("bn1", bn(width));
  conv2 = register_module("conv2", conv(width, width, 3, stride, opts.groups));
  bn2 = register_module("bn2", bn(width));
  conv3 = register_module("conv3", conv(width, planes * expansion, 1, 1));
  bn3 = register_module("bn3", bn(planes * expansion));
  register_module("relu", std::make_shared<nn::ReLU>());
  if (ds) downsample = register_module("downsample", std::move(ds));
}

Tensor Bottleneck::forward(const Tensor& x) {
  Tensor out = relu((*bn1)((*conv1)(x)));
  out = relu((*bn2)((*conv2)(out)));
  out = (*bn3)((*conv3)(out));
  return residual_out(out, x, downsample);
}

ResNet::ResNet(BlockKind block, std::array<int64_t, 4> layers, const ResNetOptions& opts)
    : Module("ResNet"), block_(block), opts_(opts) {
  DLTRAIN_CHECK(opts.num_classes > 0, "ResNet: num_classes must be positive, got ",
                opts.num_classes);
  DLTRAIN_CHECK(opts.groups > 0 && opts.width_per_group > 0,
                "ResNet: groups and width_per_group must be positive");
  if (opts.cifar_stem) {
    conv1 = register_module("conv1", conv(3, 64, 3, 1));
  } else {
    nn::Conv2dOptions o;
    o.stride = 2;
    o.padding = 3;
    o.bias = false;
    conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(3, 64, 7, o));
  }
  bn1 = register_module("bn1", bn(64));
  register_module("relu", std::make_shared<nn::ReLU>());
  if (opts.cifar_stem) {
    maxpool = register_module("maxpool", std::make_shared<nn::Identity>());
  } else {
    maxpool = register_module("maxpool", std::make_shared<nn::MaxPool2d>(3, 2, 1));
  }
  layer1 = register_module("layer1", make_layer(64, layers[0], 1));
  layer2 = register_module("layer2", make_layer(128, layers[1], 2));
  layer3 = register_module("layer3", make_layer(256, layers[2], 2));
  layer4 = register_module("layer4", make_layer(512, layers[3], 2));
  avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
  int64_t expansion = block == BlockKind::Basic ? BasicBlock::expansion : Bottleneck::expansion;
  fc = register_module("fc", std::make_shared<nn::Linear>(512 * expansion, opts.num_classes));

  apply([](nn::Module& m) {
    if (auto* c = dynamic_cast<nn::Conv2d*>(&m)) {
      nn::init::kaiming_normal_(c->weight, 0.0, nn::init::FanMode::FanOut, "relu");
    }
  });
  if (opts.zero_init_residual) {
    apply([](nn::Module& m) {
      if (auto* b = dynamic_cast<Bottleneck*>(&m)) nn::init::zeros_(b->bn3->weight);
      if (auto* b = dynamic_cast<BasicBlock*>(&m)) nn::init::zeros_(b->bn2->weight);
    });
  }
}

std::shared_ptr<nn::Sequential> ResNet::make_layer(int64_t planes, int64_t blocks, int64_t stride) {
  DLTRAIN_CHECK(blocks > 0, "ResNet: every stage needs at least one block");
  int64_t expansion = block_ == BlockKind::Basic ? BasicBlock::expansion : Bottleneck::expansion;
  auto make_block = [&](int64_t s, std::shared_ptr<nn::Module> ds) -> std::shared_ptr<nn::Module> {
    if (block_ == BlockKind::Basic) {
      return std::make_shared<BasicBlock>(inplanes_, planes, s, std::move(ds), opts_);
    }
    return std::make_shared<Bottleneck>(inplanes_, planes, s, std::move(ds), opts_);
  };
  std::shared_ptr<nn::Module> ds;
  if (stride != 1 || inplanes_ != planes * expansion) {
    ds = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
        conv(inplanes_, planes * expansion, 1, stride), bn(planes * expansion)});
  }
  auto seq = std::make_shared<nn::Sequential>();
  seq->push_back(make_block(stride, ds));
  inplanes_ = planes * expansion;
  for (int64_t i = 1; i < blocks; ++i) seq->push_back(make_block(1, nullptr));
  return seq;
}

Tensor ResNet::features(const Tensor& x) {
  DLTRAIN_CHECK(x.dim() == 4 && x.size(1) == 3, "ResNet: expected images [N, 3, H, W], got shape ",
                shape_str(x.shape()));
  auto stem = [this](const Tensor& in) { return (*maxpool)(relu((*bn1)((*conv1)(in)))); };
  Tensor y;
  if (checkpoint_segments > 0 && autograd::grad_mode_enabled()) {
    // The stem's full-resolution activations are the largest after layer1's: recomputed too.
    y = nn::checkpoint_sequential(blocks(), checkpoint_segments, nn::checkpoint(stem, x));
  } else {
    y = (*layer4)((*layer3)((*layer2)((*layer1)(stem(x)))));
  }
  return (*avgpool)(y).flatten(1);
}

std::vector<std::shared_ptr<nn::Module>> ResNet::blocks() const {
  std::vector<std::shared_ptr<nn::Module>> out;
  for (const auto& layer : {layer1, layer2, layer3, layer4})
    for (int64_t i = 0; i < layer->size(); ++i) out.push_back((*layer)[i]);
  return out;
}

Tensor ResNet::forward(const Tensor& x) { return (*fc)(features(x)); }

std::shared_ptr<ResNet> resnet18(const ResNetOptions& o) {
  return std::make_shared<ResNet>(BlockKind::Basic, std::array<int64_t, 4>{2, 2, 2, 2}, o);
}
std::shared_ptr<ResNet> resnet34(const ResNetOptions& o) {
  return std::make_shared<ResNet>(BlockKind::Basic, std::array<int64_t, 4>{3, 4, 6, 3}, o);
}
std::shared_ptr<ResNet> resnet50(const ResNetOptions& o) {
  return std::make_shared<ResNet>(BlockKind::Bottleneck, std::array<int64_t, 4>{3, 4, 6, 3}, o);
}
std::shared_ptr<ResNet> resnet101(const ResNetOptions& o) {
  return std::make_shared<ResNet>(BlockKind::Bottleneck, std::array<int64_t, 4>{3, 4, 23, 3}, o);
}
std::shared_ptr<ResNet> resnet152(const ResNetOptions& o) {
  return std::make_shared<ResNet>(BlockKind::Bottleneck, std::array<int64_t, 4>{3, 8, 36, 3}, o);
}

std::shared_ptr<ResNet> resnet(const std::string& name, const ResNetOptions& o) {
  if (name == "resnet18") return resnet18(o);
  if (name == "resnet34") return resnet34(o);
  if (name == "resnet50") return resnet50(o);
  if (name == "resnet101") return resnet101(o);
  if (name == "resnet152") return resnet152(o);
  DLTRAIN_FAIL("models::resnet: unknown architecture '", name,
               "' (use resnet18, resnet34, resnet50, resnet101 or resnet152)");
}

}  // namespace dltrain::models
