// CPU benchmark of the issue-14 layers on the shapes a Fashion-MNIST VAE decoder and a small
// U-Net use: ConvTranspose2d, interpolate (nearest, bilinear), reflect pad, GroupNorm, SiLU
// and the VAE losses, and a TransformerEncoderLayer (batch 32, 128 tokens, d_model 256, 8
// heads, feed-forward 1024, dropout 0 and 0.1), forward + backward, f32, NCHW and
// channels-last. Prints one line per case (median ms over --iters runs after two warm-ups) and
// optionally writes JSON
// {"threads": N, "cases": {name: ms}} read by benchmarks/peers/pytorch_research_ops_cpu.py.
//
// Usage: research_ops_cpu [--threads N] [--iters N] [--json PATH]
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "apps/common/op_bench.hpp"
#include "dltrain/dltrain.hpp"

using namespace dltrain;

namespace {

Tensor leaf(const Shape& s, bool cl) {
  Tensor t = randn(s);
  if (cl) t = t.contiguous(MemoryFormat::ChannelsLast);
  t.requires_grad_();
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  apps::OpBench bench(
      "research_ops_cpu",
      "The research-model layers (ConvTranspose2d, interpolate, pad, GroupNorm, SiLU, "
      "VAE losses), forward + backward, median ms per case; compare with "
      "benchmarks/peers/pytorch_research_ops_cpu.py.");
  bench.parse(argc, argv);
  for (bool cl : {false, true}) {
    const std::string fmt = cl ? " CL" : " NCHW";
    {  // VAE decoder: 64x7x7 -> 32x14x14 -> 1x28x28, batch 64
      nn::ConvTranspose2d a(64, 32, 4, {.stride = 2, .padding = 1}),
          b(32, 1, 4, {.stride = 2, .padding = 1});
      Tensor x = leaf({64, 64, 7, 7}, cl);
      bench.run("convT decoder 64x7x7->1x28x28 b64" + fmt,
                [&] { sum(b.forward(relu(a.forward(x)))).backward(); });
    }
    {  // U-Net up-conv 2x2/2, 128 -> 64 channels, 32x32 -> 64x64, batch 8
      nn::ConvTranspose2d up(128, 64, 2, {.stride = 2});
      Tensor x = leaf({8, 128, 32, 32}, cl);
      bench.run("convT 2x2/2 128->64 32x32 b8" + fmt, [&] { sum(up.forward(x)).backward(); });
    }
    Tensor u = leaf({8, 64, 32, 32}, cl);
    bench.run("bilinear x2 64x32x32 b8" + fmt, [&] {
      sum(interpolate(u, {.scale_factor = 2.0, .mode = InterpolateMode::Bilinear})).backward();
    });
    bench.run("nearest x2 64x32x32 b8" + fmt,
              [&] { sum(interpolate(u, {.scale_factor = 2.0})).backward(); });
    bench.run("reflect pad 1 64x32x32 b8" + fmt, [&] {
      sum(pad(u, {1, 1, 1, 1}, PadMode::Reflect)).backward();
    });
    nn::GroupNorm gn(8, 64);
    bench.run("GroupNorm(8, 64) 64x32x32 b8" + fmt, [&] { sum(gn.forward(u)).backward(); });
    bench.run("SiLU 64x32x32 b8" + fmt, [&] { sum(silu(u)).backward(); });
  }
  for (double p : {0.0, 0.1}) {  // a Transformer encoder layer: batch 32, 128 tokens, d 256
    nn::TransformerEncoderLayer layer(256, 8,
                                      {.dim_feedforward = 1024, .dropout = p, .batch_first = true});
    Tensor x = leaf({32, 128, 256}, false);
    char name[80];
    std::snprintf(name, sizeof name, "TransformerEncoderLayer d256 h8 b32 L128 p%.1f", p);
    bench.run(name, [&] { sum(layer.forward(x)).backward(); });
  }
  {  // VAE losses on a batch of 64 Fashion-MNIST images and a 16-d latent
    Tensor logits = leaf({64, 1, 28, 28}, false), target = rand({64, 1, 28, 28});
    Tensor mu = leaf({64, 16}, false), logvar = leaf({64, 16}, false);
    bench.run("BCE(sigmoid) + KL, b64 28x28 z16", [&] {
      Tensor rec = binary_cross_entropy(sigmoid(logits), target, {.reduction = Reduction::Sum});
      Tensor kl = mul(sum(sub(sub(add(logvar, 1.0), mul(mu, mu)), exp(logvar))), -0.5);
      add(rec, kl).backward();
    });
  }
  return bench.finish();
}
