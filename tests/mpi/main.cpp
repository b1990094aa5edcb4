// Catch2 main for the multi-rank tests: every rank runs the same test cases in the same order
// (so their collectives match), after distributed::init(). Run under mpirun; a failing
// assertion on any rank makes that rank, and so mpirun, exit non-zero. With a GPU-only test
// binary (DLTRAIN_MPI_TESTS_NEED_GPU) and no device, every rank exits with ctest's skip code.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "dltrain/backend/cuda.hpp"
#include "dltrain/distributed/process_group.hpp"
#include "src/distributed/internal.hpp"

int main(int argc, char** argv) {
#ifdef DLTRAIN_MPI_TESTS_NEED_GPU
  if (dltrain::cuda::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device visible\n");
    return 4;
  }
#endif
  try {
    dltrain::distributed::init({.verbose = true});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distributed::init failed: %s\n", e.what());
    return 1;
  }
  const int failed = Catch::Session().run(argc, argv);
  // Every rank reaches finalize's barrier only after all its tests: a rank that failed early
  // still waits for the others instead of leaving them in a collective.
  dltrain::distributed::finalize();
  // MPI started by a test case in a world of one ("[world1]"), which init() left alone.
  dltrain::distributed::detail::mpi_finalize();
  return failed == 0 ? 0 : 1;
}
