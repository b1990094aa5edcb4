// ResNet-18/34/50/101/152 with torchvision's exact structure, state-dict names
// and initialisation (conv weights kaiming_normal fan_out/relu, BN weight 1 and
// bias 0, Linear head PyTorch-default), so weights move between dltrain and
// torchvision unchanged. Bottleneck blocks put the stride on the 3x3 conv
// ("ResNet v1.5", as torchvision). The CIFAR variant swaps the 7x7/2 stem and
// its max-pool for a 3x3/1 conv and no pooling (the stem keeps its name
// "conv1"; "maxpool" becomes an Identity with no state).
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "dltrain/nn/containers.hpp"
#include "dltrain/nn/layers.hpp"

namespace dltrain::models {

struct ResNetOptions {
  int64_t num_classes = 1000;
  /// Initialise the last BN of each residual branch to zero, so each block starts as the
  /// identity (helps large-batch training; torchvision's zero_init_residual).
  bool zero_init_residual = false;
  /// 3x3 stride-1 stem without max-pool, for 32x32 inputs (CIFAR).
  bool cifar_stem = false;
  /// Bottleneck grouping and width (ResNeXt / wide ResNet); 1 and 64 for plain ResNet.
  int64_t groups = 1;
  int64_t width_per_group = 64;
};

/// conv3x3-BN-ReLU-conv3x3-BN plus the shortcut, then ReLU (ResNet-18/34).
class BasicBlock : public nn::Module {
 public:
  static constexpr int64_t expansion = 1;
  BasicBlock(int64_t inplanes, int64_t planes, int64_t stride,
             std::shared_ptr<nn::Module> downsample, const ResNetOptions& opts);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
  std::shared_ptr<nn::Module> downsample;  // null when the shortcut is the identity
};

/// conv1x1-BN-ReLU-conv3x3(stride)-BN-ReLU-conv1x1(x4)-BN plus the shortcut, then ReLU.
class Bottleneck : public nn::Module {
 public:
  static constexpr int64_t expansion = 4;
  Bottleneck(int64_t inplanes, int64_t planes, int64_t stride,
             std::shared_ptr<nn::Module> downsample, const ResNetOptions& opts);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<nn::Conv2d> conv1, conv2, conv3;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2, bn3;
  std::shared_ptr<nn::Module> downsample;
};

/// Which residual block a ResNet stacks.
enum class BlockKind { Basic, Bottleneck };

/// The ResNet trunk: stem, layer1..layer4, global average pool, fc. Input [N, 3, H, W]
/// (NCHW or channels-last), output logits [N, num_classes].
class ResNet : public nn::Module {
 public:
  ResNet(BlockKind block, std::array<int64_t, 4> layers, const ResNetOptions& opts = {});
  Tensor forward(const Tensor& x) override;
  /// Everything but fc: pooled features [N, 512 * expansion].
  Tensor features(const Tensor& x);

  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::Module> maxpool;
  std::shared_ptr<nn::Sequential> layer1, layer2, layer3, layer4;
  std::shared_ptr<nn::AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<nn::Linear> fc;

  /// Activation checkpointing of the trunk (include/dltrain/nn/checkpoint.hpp): 0 (default)
  /// keeps every activation; N >= 1 checkpoints the stem (conv1, bn1, relu, maxpool) and runs
  /// the residual blocks of layer1..layer4, as one chain (16 blocks for ResNet-50), through
  /// nn::checkpoint_sequential with N segments, so the first N - 1 segments keep only their
  /// boundaries and are recomputed in backward (N = the number of blocks saves the most).
  /// Applies while grad mode is on; the weights, results and state dict are unchanged by it.
  int64_t checkpoint_segments = 0;
  /// The residual blocks of layer1..layer4 in order.
  std::vector<std::shared_ptr<nn::Module>> blocks() const;

 private:
  std::shared_ptr<nn::Sequential> make_layer(int64_t planes, int64_t blocks, int64_t stride);
  BlockKind block_;
  ResNetOptions opts_;
  int64_t inplanes_ = 64;
};

std::shared_ptr<ResNet> resnet18(const ResNetOptions& opts = {});
std::shared_ptr<ResNet> resnet34(const ResNetOptions& opts = {});
std::shared_ptr<ResNet> resnet50(const ResNetOptions& opts = {});
std::shared_ptr<ResNet> resnet101(const ResNetOptions& opts = {});
std::shared_ptr<ResNet> resnet152(const ResNetOptions& opts = {});
/// A ResNet by name: "resnet18" ... "resnet152"; throws listing the names for others.
std::shared_ptr<ResNet> resnet(const std::string& name, const ResNetOptions& opts = {});

}  // namespace dltrain::models
