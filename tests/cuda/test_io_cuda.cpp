// safetensors export of CUDA tensors: contiguous and non-contiguous device tensors are
// written row-major and load back (on the CPU) equal to the same tensors made on the CPU.
#include <catch2/catch.hpp>

#include <unistd.h>
#include <filesystem>

#include "dltrain/dltrain.hpp"
#include "dltrain/io/safetensors.hpp"

using namespace dltrain;

TEST_CASE("save_safetensors writes CUDA tensors (contiguous or not) row-major", "[cuda][io]") {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("dltrain_cuda_io_" + std::to_string(::getpid()) + ".safetensors"))
                               .string();
  const Tensor a = arange(12.0).reshape({3, 4});
  const Tensor b = arange(24.0, DType::f64).reshape({2, 3, 4});
  const Tensor a_dev = a.to(Device::cuda());
  const Tensor b_dev = b.to(Device::cuda());
  StateDict sd;
  sd.insert("a", a_dev);
  sd.insert("a_t", a_dev.t());                    // non-contiguous device view
  sd.insert("b_perm", b_dev.permute({2, 0, 1}));  // non-contiguous, other dtype
  io::save_safetensors(path, sd);
  const StateDict back = io::load_safetensors(path);
  std::filesystem::remove(path);
  REQUIRE(back.at("a").device().is_cpu());
  REQUIRE(back.at("a").to_vector<float>() == a.to_vector<float>());
  REQUIRE(back.at("a_t").to_vector<float>() == a.t().to_vector<float>());
  REQUIRE(back.at("b_perm").shape() == Shape{4, 2, 3});
  REQUIRE(back.at("b_perm").to_vector<double>() == b.permute({2, 0, 1}).to_vector<double>());
}
