// The image pipeline on the GPU: to_float_batch's kernel against the CPU table, pinned
// batches, and DevicePrefetcher delivering the loader's batches into device memory.
#include <catch2/catch.hpp>

#include "dltrain/dltrain.hpp"

using namespace dltrain;

TEST_CASE("to_float_batch on CUDA matches the CPU in every layout and dtype", "[cuda][gpu]") {
  const std::vector<float> mean{0.485f, 0.456f, 0.406f}, sd{0.229f, 0.224f, 0.225f};
  Tensor host = randint(0, 256, {3, 17, 13, 3}, DType::u8);
  // A non-contiguous source too: every other row of a taller batch.
  Tensor tall = randint(0, 256, {3, 34, 13, 3}, DType::u8);
  for (const Tensor& src : {host, tall.slice(1, 0, 34, 2)}) {
    Tensor dev = src.to(Device::cuda(0));
    if (!src.is_contiguous()) dev = tall.to(Device::cuda(0)).slice(1, 0, 34, 2);
    for (MemoryFormat fmt : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
      Tensor want = data::to_float_batch(src, mean, sd, fmt);
      for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
        Tensor got = data::to_float_batch(dev, mean, sd, fmt, dt);
        REQUIRE(got.device() == Device::cuda(0));
        REQUIRE(got.dtype() == dt);
        REQUIRE(got.is_contiguous(fmt));
        const double tol = dt == DType::f32 ? 1e-5 : (dt == DType::f16 ? 2e-3 : 1e-2);
        REQUIRE(allclose(got.to(Device::cpu()).to(DType::f32), want, tol, tol));
      }
    }
  }
}

TEST_CASE("pinned tensors copy asynchronously and round-trip", "[cuda][gpu]") {
  Tensor x = randn({64, 33});
  Tensor p = x.pin_memory();
  REQUIRE(p.is_pinned());
  REQUIRE(p.to_vector<float>() == x.to_vector<float>());
  Tensor d = p.to(Device::cuda(0), /*non_blocking=*/true);
  Tensor back = empty({64, 33}).pin_memory();
  back.copy_(d, /*non_blocking=*/true);
  cuda::synchronize();
  REQUIRE(back.to_vector<float>() == x.to_vector<float>());
  REQUIRE(cuda::memory_allocated() > 0);
  REQUIRE(cuda::max_memory_allocated() >= cuda::memory_allocated());
}

TEST_CASE("DevicePrefetcher delivers the loader's batches on the GPU", "[cuda][gpu]") {
  Tensor images = randint(0, 256, {50, 8, 8, 3}, DType::u8);
  Tensor labels = randint(0, 10, {50}, DType::i64);
  auto ds = std::make_shared<data::TensorDataset>(images, labels);
  for (bool pin : {false, true}) {
    data::DataLoader loader(
        ds, {.batch_size = 8, .shuffle = true, .seed = 5, .num_workers = 2, .pin_memory = pin});
    std::vector<data::Batch> want;
    for (const data::Batch& b : loader) want.push_back(b);
    data::DevicePrefetcher prefetch(loader, Device::cuda(0));
    size_t k = 0;
    for (const data::Batch& b : prefetch) {
      REQUIRE(k < want.size());
      REQUIRE(b.data.device() == Device::cuda(0));
      REQUIRE(b.data.to(Device::cpu()).to_vector<int>() == want[k].data.to_vector<int>());
      REQUIRE(b.target.to(Device::cpu()).to_vector<int64_t>() ==
              want[k].target.to_vector<int64_t>());
      ++k;
    }
    REQUIRE(k == want.size());
    // Stopping after the first batch drops the staged second one while its copy may still
    // run: the prefetcher orders that release after the copy.
    for (int rep = 0; rep < 3; ++rep) {
      data::DevicePrefetcher early(loader, Device::cuda(0));
      auto it = early.begin();
      REQUIRE(it->data.to(Device::cpu()).to_vector<int>() == want[0].data.to_vector<int>());
    }
    cuda::synchronize();
  }
}
