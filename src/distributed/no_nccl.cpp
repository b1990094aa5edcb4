// NCCL process groups in builds without CUDA or NCCL.
#include "src/distributed/internal.hpp"

namespace dltrain::distributed {

std::shared_ptr<ProcessGroup> new_nccl_group(
    int, int, int, std::chrono::milliseconds,
    const std::function<std::string(const std::string&)>&) {
  DLTRAIN_FAIL(
      "new_nccl_group: this dltrain was built without NCCL; install CUDA with NCCL and "
      "reconfigure with -DDLTRAIN_CUDA=ON (or set NCCL_ROOT), or use the MPI backend");
}

bool nccl_available() { return false; }

}  // namespace dltrain::distributed
