// Tensor metadata, views, layouts, dtypes, factories, RNG and errors.
#include <catch2/catch.hpp>

#include <thread>

#include "dltrain/dltrain.hpp"

using namespace dltrain;
using Catch::Contains;

TEST_CASE("factories fill shapes and values", "[core]") {
  Tensor z = zeros({2, 3});
  REQUIRE(z.shape() == Shape{2, 3});
  REQUIRE(z.dtype() == DType::f32);
  REQUIRE(z.numel() == 6);
  REQUIRE(z.to_vector<float>() == std::vector<float>(6, 0.f));
  REQUIRE(ones({4}, DType::i64).to_vector<int64_t>() == std::vector<int64_t>(4, 1));
  REQUIRE(full({2}, 2.5, DType::f64).to_vector<double>() == std::vector<double>{2.5, 2.5});
  REQUIRE(arange(5, DType::i64).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4});
  REQUIRE(arange(1, 2, 0.25).to_vector<float>() == std::vector<float>{1, 1.25, 1.5, 1.75});
  auto l = linspace(0, 1, 5, DType::f64).to_vector<double>();
  REQUIRE(l == std::vector<double>{0, 0.25, 0.5, 0.75, 1.0});
  REQUIRE(scalar_tensor(3.0).dim() == 0);
  REQUIRE(scalar_tensor(3.0).item<float>() == 3.f);
  Tensor v = from_vector(std::vector<int32_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  REQUIRE(v.dtype() == DType::i32);
  REQUIRE(v.shape() == Shape{2, 3});
  REQUIRE(tensor({1, 2}).shape() == Shape{2});
}

TEST_CASE("views share storage and have the right strides", "[core]") {
  Tensor x = arange(24).reshape({2, 3, 4});
  REQUIRE(x.strides() == Shape{12, 4, 1});
  Tensor p = x.permute({2, 0, 1});
  REQUIRE(p.shape() == Shape{4, 2, 3});
  REQUIRE(p.strides() == Shape{1, 12, 4});
  REQUIRE(p.storage().data() == x.storage().data());
  REQUIRE_FALSE(p.is_contiguous());
  REQUIRE(p.contiguous().is_contiguous());
  REQUIRE(p.contiguous().to_vector<float>()[1] == 4.f);  // p[0][0][1] = x[0][1][0]
  Tensor t = x.transpose(0, 2);
  REQUIRE(t.shape() == Shape{4, 3, 2});
  Tensor n = x.narrow(2, 1, 2);
  REQUIRE(n.shape() == Shape{2, 3, 2});
  REQUIRE(n.storage_offset() == 1);
  REQUIRE(n.contiguous().to_vector<float>()[0] == 1.f);
  Tensor s = x.slice(1, 0, 3, 2);
  REQUIRE(s.shape() == Shape{2, 2, 4});
  REQUIRE(s.contiguous().to_vector<float>()[4] == 8.f);
  REQUIRE(x.select(0, 1).shape() == Shape{3, 4});
  REQUIRE(x.select(0, -1).contiguous().to_vector<float>()[0] == 12.f);
  Tensor e = arange(3).reshape({3, 1}).expand({3, 4});
  REQUIRE(e.strides() == Shape{1, 0});
  REQUIRE(e.contiguous().to_vector<float>()[5] == 1.f);
  REQUIRE(x.unsqueeze(0).shape() == Shape{1, 2, 3, 4});
  REQUIRE(x.unsqueeze(-1).shape() == Shape{2, 3, 4, 1});
  REQUIRE(x.unsqueeze(1).squeeze(1).shape() == x.shape());
  REQUIRE(zeros({1, 3, 1}).squeeze().shape() == Shape{3});
  REQUIRE(x.flatten().shape() == Shape{24});
  REQUIRE(x.flatten(1).shape() == Shape{2, 12});
  REQUIRE(x.view({-1, 4}).shape() == Shape{6, 4});
  // A transposed tensor cannot be viewed but can be reshaped (copy).
  REQUIRE_THROWS_WITH(x.transpose(0, 1).view({24}), Contains("view") && Contains("reshape"));
  REQUIRE(x.transpose(0, 1).reshape({24}).to_vector<float>()[1] == 1.f);
  REQUIRE(x.transpose(0, 1).reshape({24}).to_vector<float>()[4] == 12.f);
}

TEST_CASE("channels-last is a stride order on NCHW", "[core]") {
  Tensor x = arange(2 * 3 * 4 * 5).reshape({2, 3, 4, 5});
  Tensor cl = x.contiguous(MemoryFormat::ChannelsLast);
  REQUIRE(cl.shape() == x.shape());
  REQUIRE(cl.strides() == Shape{60, 1, 15, 3});
  REQUIRE(cl.is_contiguous(MemoryFormat::ChannelsLast));
  REQUIRE_FALSE(cl.is_contiguous());
  REQUIRE(cl.suggest_memory_format() == MemoryFormat::ChannelsLast);
  REQUIRE(cl.to_vector<float>() == x.to_vector<float>());  // same logical values
  REQUIRE(cl.to(MemoryFormat::Contiguous).is_contiguous());
  REQUIRE(empty_like(cl).is_contiguous(MemoryFormat::ChannelsLast));
  REQUIRE(cl.clone().is_contiguous(MemoryFormat::ChannelsLast));
  REQUIRE_THROWS_AS(zeros({2, 3}).contiguous(MemoryFormat::ChannelsLast), Error);
}

TEST_CASE("a tensor dense in both layouts is labelled by its strides", "[core]") {
  // One channel, or a 1x1 image: both layouts address the same elements; as in PyTorch, the
  // strides of the size-1 dims say which one it is, and contiguous(fmt) re-labels it (a view).
  for (const Shape& s : {Shape{2, 1, 4, 5}, Shape{3, 6, 1, 1}}) {
    INFO(shape_str(s));
    Tensor x = arange(static_cast<double>(s[0] * s[1] * s[2] * s[3])).reshape(s);
    REQUIRE(x.is_contiguous(MemoryFormat::ChannelsLast));
    REQUIRE(x.suggest_memory_format() == MemoryFormat::Contiguous);
    Tensor cl = x.contiguous(MemoryFormat::ChannelsLast);
    REQUIRE(cl.data_ptr() == x.data_ptr());  // no copy
    REQUIRE(cl.strides() == channels_last_strides(s));
    REQUIRE(cl.suggest_memory_format() == MemoryFormat::ChannelsLast);
    REQUIRE(cl.to_vector<float>() == x.to_vector<float>());
    REQUIRE(empty_like(cl).suggest_memory_format() == MemoryFormat::ChannelsLast);
    Tensor back = cl.contiguous();
    REQUIRE(back.data_ptr() == x.data_ptr());
    REQUIRE(back.strides() == x.strides());
    REQUIRE(back.suggest_memory_format() == MemoryFormat::Contiguous);
    // The re-label is differentiable: the gradient passes through unchanged.
    Tensor leaf = x.to(DType::f64).detach().requires_grad_();
    sum(mul(leaf.contiguous(MemoryFormat::ChannelsLast), leaf)).backward();
    REQUIRE(allclose(leaf.grad(), mul(leaf.detach(), 2.0), 0, 0));
  }
  // [N, 1, 1, 1]: the two layouts' strides coincide; NCHW.
  REQUIRE(zeros({4, 1, 1, 1}).contiguous(MemoryFormat::ChannelsLast).suggest_memory_format() ==
          MemoryFormat::Contiguous);
}

TEST_CASE("dtype conversion round-trips and rounds", "[core]") {
  Tensor x = tensor({1.5, -2.25, 3.0, 65504.0, 1e-8}, DType::f64);
  REQUIRE(x.to(DType::f32).to(DType::f64).to_vector<double>()[3] == 65504.0);
  REQUIRE(x.to(DType::f32).to(DType::f64).to_vector<double>()[4] == double(1e-8f));
  auto h = x.to(DType::f16).to_vector<double>();
  REQUIRE(h[0] == 1.5);
  REQUIRE(h[3] == 65504.0);
  REQUIRE(h[4] == 0.0);  // below the smallest f16 subnormal -> 0 (after rounding)
  REQUIRE(tensor({1e5}).to(DType::f16).item<double>() == std::numeric_limits<double>::infinity());
  REQUIRE(tensor({1.0 + 1.0 / 256}).to(DType::bf16).item<double>() == 1.0);  // ties to even
  REQUIRE(tensor({1.0 + 3.0 / 256}).to(DType::bf16).item<double>() == 1.015625);
  REQUIRE(tensor({2.7, -1.2}).to(DType::i32).to_vector<int32_t>() == std::vector<int32_t>{2, -1});
  REQUIRE(tensor({0.0, 2.0}).to(DType::b8).to_vector<bool>() == std::vector<bool>{false, true});
  REQUIRE(tensor({3.0}).to(DType::u8).item<int>() == 3);
  REQUIRE(promote_types(DType::i64, DType::f16) == DType::f16);
  REQUIRE(promote_types(DType::f16, DType::bf16) == DType::f32);
  REQUIRE(promote_types(DType::f32, DType::f64) == DType::f64);
  REQUIRE(std::string(dtype_name(DType::bf16)) == "bfloat16");
  // Every f16 bit pattern that is finite survives float and back.
  for (uint32_t b = 0; b < 0x7c00u; b += 7) {
    Half h2;
    h2.bits = static_cast<uint16_t>(b);
    REQUIRE(Half(static_cast<float>(h2)).bits == h2.bits);
  }
}

TEST_CASE("copy_ broadcasts and converts, clone owns its data", "[core]") {
  Tensor dst = zeros({2, 3}, DType::f64);
  dst.copy_(tensor({1, 2, 3}, DType::i64));
  REQUIRE(dst.to_vector<double>() == std::vector<double>{1, 2, 3, 1, 2, 3});
  Tensor c = dst.clone();
  c.fill_(7);
  REQUIRE(dst.to_vector<double>()[0] == 1.0);
  REQUIRE_THROWS_WITH(dst.copy_(zeros({4})), Contains("copy_"));
}

TEST_CASE("item, printing and undefined tensors", "[core]") {
  REQUIRE(tensor({4.5}).item() == 4.5);
  REQUIRE_THROWS_WITH(zeros({2}).item(), Contains("item()") && Contains("2 elements"));
  const std::string s = arange(4, DType::i64).reshape({2, 2}).str();
  REQUIRE(s.find("[[0, 1],") != std::string::npos);
  REQUIRE(s.find("int64") != std::string::npos);
  Tensor u;
  REQUIRE_FALSE(u.defined());
  REQUIRE_THROWS_WITH(u.numel(), Contains("undefined"));
  REQUIRE(u.str() == "Tensor(undefined)");
}

TEST_CASE("random tensors depend only on the seed, not on threads", "[core][random]") {
  const int saved = get_num_threads();
  std::vector<float> a, b;
  {
    set_num_threads(1);
    Generator g(42);
    a = randn({10001}, {}, &g).to_vector<float>();
  }
  {
    set_num_threads(2);
    Generator g(42);
    b = randn({10001}, {}, &g).to_vector<float>();
  }
  set_num_threads(saved);
  REQUIRE(a == b);
  double m = 0, v = 0;
  for (float x : a) m += x;
  m /= a.size();
  for (float x : a) v += (x - m) * (x - m);
  v /= a.size();
  REQUIRE(std::abs(m) < 0.05);
  REQUIRE(std::abs(v - 1.0) < 0.05);
  Generator g1(7);
  Tensor u = rand({20000}, DType::f64, &g1);
  REQUIRE(min(u).item() >= 0.0);
  REQUIRE(max(u).item() < 1.0);
  REQUIRE(std::abs(mean(u).item() - 0.5) < 0.02);
  // Successive draws differ; reseeding repeats them.
  manual_seed(3);
  Tensor r1 = rand({5}), r2 = rand({5});
  REQUIRE(r1.to_vector<float>() != r2.to_vector<float>());
  manual_seed(3);
  REQUIRE(rand({5}).to_vector<float>() == r1.to_vector<float>());
  Generator g2(9);
  Tensor ri = randint(3, 7, {1000}, DType::i64, &g2);
  REQUIRE(min(ri).item() == 3);
  REQUIRE(max(ri).item() == 6);
  auto perm = randperm(50, &g2).to_vector<int64_t>();
  std::sort(perm.begin(), perm.end());
  for (int64_t i = 0; i < 50; ++i) REQUIRE(perm[i] == i);
}

TEST_CASE("thread pool runs every index once and propagates errors", "[core][parallel]") {
  std::vector<int> hits(100000, 0);
  parallel_for(0, 100000, 1000, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (int h : hits) REQUIRE(h == 1);
  REQUIRE_THROWS_WITH(parallel_for(0, 10, 1,
                                   [](int64_t b, int64_t) {
                                     if (b > 0) throw Error("boom in chunk");
                                   }),
                      Contains("boom"));
  REQUIRE_THROWS_AS(set_num_threads(0), Error);
}

TEST_CASE("misuse raises dltrain::Error with the fix", "[core][errors]") {
  REQUIRE_THROWS_WITH(zeros({2, 3}).view({4}), Contains("view") && Contains("[4]"));
  REQUIRE_THROWS_WITH(zeros({2}).permute({0, 0}), Contains("permute"));
  REQUIRE_THROWS_WITH(zeros({2, 3}).size(2), Contains("out of range"));
  REQUIRE_THROWS_WITH(zeros({2, 3}).expand({4, 3}), Contains("expand"));
  REQUIRE_THROWS_WITH(zeros({2}).data<double>(), Contains("float32"));
  REQUIRE_THROWS_WITH(zeros({2}, DType::i64).requires_grad_(), Contains("floating"));
  REQUIRE_THROWS_WITH(zeros({2}, Device::cuda(0)), Contains("cuda:0"));
  REQUIRE_THROWS_WITH(zeros({2}).to(Device::cuda(0)), Contains("cuda"));
}
