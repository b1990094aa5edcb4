// A build without CUDA (CI's sanitizer trees): every CUDA entry point of the backend headers is
// defined by src/backend/no_cuda/no_cuda.cpp from its own declaration (src/backend/cuda/
// entry.hpp). This checks what those generated definitions do: one entry point of each header
// raises "built without CUDA" naming what was asked, and the queries answer "no CUDA". In a CUDA
// build the case is skipped visibly (the CUDA tests cover the real definitions).
#include <catch2/catch.hpp>

#include "src/backend/cuda/amp.hpp"
#include "src/backend/cuda/blas.hpp"
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/dnn.hpp"
#include "src/backend/cuda/elementwise.hpp"
#include "src/backend/cuda/image.hpp"
#include "src/backend/cuda/indexing.hpp"
#include "src/backend/cuda/loss.hpp"
#include "src/backend/cuda/optim.hpp"
#include "src/backend/cuda/random.hpp"
#include "src/backend/cuda/reduce.hpp"
#include "src/backend/cuda/resample.hpp"
#include "src/backend/cuda/scan.hpp"
#include "src/backend/cuda/trace.hpp"
#include "tests/skip.hpp"

using namespace dltrain;
namespace bc = dltrain::backend::cuda;

namespace {
Catch::Matchers::StdString::ContainsMatcher refused(const std::string& what) {
  return Catch::Contains(what + ": this dltrain was built without CUDA support");
}
}  // namespace

TEST_CASE("a build without CUDA refuses every backend entry point by name", "[core][no_cuda]") {
  if (bc::compiled()) {
    testing::skip("this build has the CUDA backend; its refusals exist only without it");
    return;
  }
  // The answers: no device, tracing off.
  REQUIRE(bc::device_count() == 0);
  REQUIRE_FALSE(bc::trace::usable());
  REQUIRE(bc::trace::current_device() == 0);
  REQUIRE(bc::trace::mark() == nullptr);
  REQUIRE(bc::trace::elapsed_ms(nullptr, nullptr) == -1.0);
  REQUIRE_NOTHROW(bc::trace::range_push("x"));
  REQUIRE_NOTHROW(bc::trace::range_pop());
  REQUIRE_NOTHROW(bc::trace::recycle(nullptr));

  // One entry point per header, with the words each declaration gives (undefined tensors: a
  // refusal never looks at its arguments).
  const Tensor t;
  REQUIRE_THROWS_WITH(bc::allocate(16, Device::cuda(0)), refused("allocating CUDA memory"));
  REQUIRE_THROWS_WITH(bc::copy_bytes(nullptr, Device::cuda(0), nullptr, Device::cpu(), 4),
                      refused("copying to a CUDA device"));
  // `what` computed from the parameters (the op's name).
  REQUIRE_THROWS_WITH(bc::unary(bc::UnaryOp::Exp, t, t), refused("exp"));
  REQUIRE_THROWS_WITH(bc::binary(bc::BinaryOp::Max, t, t, t), refused("maximum"));
  REQUIRE_THROWS_WITH(bc::extreme(t, t, t, 0, /*is_max=*/false), refused("min"));
  REQUIRE_THROWS_WITH(bc::gemm(t, t, t, t), refused("matrix product on a CUDA tensor"));
  REQUIRE_THROWS_WITH(bc::conv2d_forward(t, t, t, t, bc::ConvParams{}),
                      refused("conv2d on a CUDA tensor"));
  REQUIRE_THROWS_WITH(bc::softmax_forward(t, t, 1, 1, 1, false),
                      refused("softmax on a CUDA tensor"));
  REQUIRE_THROWS_WITH(bc::sgd_step(bc::SgdHyper{}, {}), refused("stepping SGD on CUDA parameters"));
  REQUIRE_THROWS_WITH(bc::random_fill(t, bc::RandomKind::Normal, 0, 1, 0, 0),
                      refused("drawing random numbers on a CUDA device"));
  REQUIRE_THROWS_WITH(bc::amp_unscale({}, t, t), refused("GradScaler::unscale_ on CUDA gradients"));
  REQUIRE_THROWS_WITH(bc::normalize_image(t, t, {}, {}),
                      refused("normalising an image batch on a CUDA device"));
  REQUIRE_THROWS_WITH(bc::one_hot(t, t, 3), refused("one_hot on a CUDA tensor"));
  REQUIRE_THROWS_WITH(bc::upsample2d_forward(t, t, bc::Upsample2d{}),
                      refused("interpolate on a CUDA device"));
  REQUIRE_THROWS_WITH(bc::sort_lines(t, t, 1, 1, false), refused("sort on a CUDA tensor"));
}
