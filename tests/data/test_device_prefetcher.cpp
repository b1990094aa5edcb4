// DevicePrefetcher on the CPU (pass-through, same batches as the loader) and the
// pin_memory option's clear error on a machine without a CUDA device. The CUDA paths are
// in tests/cuda/test_data_cuda.cpp.
#include <catch2/catch.hpp>

#include "dltrain/dltrain.hpp"

using namespace dltrain;

TEST_CASE("DevicePrefetcher on the CPU delivers exactly the loader's batches", "[data]") {
  auto ds = std::make_shared<data::TensorDataset>(arange(0, 40, 1, DType::f32).view({20, 2}),
                                                  arange(0, 20, 1, DType::i64));
  data::DataLoader loader(ds, {.batch_size = 6, .shuffle = true, .seed = 3, .num_workers = 2});
  std::vector<std::vector<float>> want, got;
  for (const data::Batch& b : loader) want.push_back(b.data.to_vector<float>());
  data::DevicePrefetcher prefetch(loader, Device::cpu());
  REQUIRE(prefetch.size() == 4);
  for (const data::Batch& b : prefetch) {
    REQUIRE(b.data.device().is_cpu());
    got.push_back(b.data.to_vector<float>());
  }
  REQUIRE(got == want);
}

TEST_CASE("pin_memory and CUDA prefetching need a device and say so", "[data]") {
  auto ds = std::make_shared<data::TensorDataset>(zeros({4, 2}), zeros({4}, DType::i64));
  if (cuda::is_available()) {
    data::DataLoader loader(ds, {.batch_size = 2, .pin_memory = true});
    for (const data::Batch& b : loader) REQUIRE(b.data.is_pinned());
  } else {
    REQUIRE_THROWS_WITH(data::DataLoader(ds, {.batch_size = 2, .pin_memory = true}),
                        Catch::Contains("pin_memory needs a CUDA device"));
    data::DataLoader loader(ds, {.batch_size = 2});
    REQUIRE_THROWS_WITH(data::DevicePrefetcher(loader, Device::cuda(0)),
                        Catch::Contains("CUDA device(s) are visible"));
    REQUIRE_THROWS_WITH(zeros({2}).pin_memory(), Catch::Contains("CUDA"));
  }
}

TEST_CASE("to_float_batch converts to f16 and bf16 on the CPU", "[data]") {
  Tensor u8 = randint(0, 256, {2, 5, 4, 3}, DType::u8);
  const std::vector<float> mean{0.485f, 0.456f, 0.406f}, sd{0.229f, 0.224f, 0.225f};
  Tensor f32 = data::to_float_batch(u8, mean, sd, MemoryFormat::ChannelsLast);
  for (DType dt : {DType::f16, DType::bf16}) {
    Tensor h = data::to_float_batch(u8, mean, sd, MemoryFormat::ChannelsLast, dt);
    REQUIRE(h.dtype() == dt);
    REQUIRE(h.is_contiguous(MemoryFormat::ChannelsLast));
    REQUIRE(allclose(h.to(DType::f32), f32.to(dt).to(DType::f32), 0, 0));
  }
  REQUIRE_THROWS_WITH(data::to_float_batch(u8, mean, sd, MemoryFormat::Contiguous, DType::i32),
                      Catch::Contains("f32, f16 or bf16"));
}
