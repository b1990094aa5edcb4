// The MPI seam in builds without MPI: a world of one works, anything that needs MPI says how
// to get it.
#include <cstdio>
#include <cstdlib>

#include "src/distributed/internal.hpp"

namespace dltrain::distributed {

namespace {
[[noreturn]] void no_mpi(const char* what) {
  DLTRAIN_FAIL(what,
               ": this dltrain was built without MPI; install an MPI (Debian: "
               "libopenmpi-dev openmpi-bin) and reconfigure with -DDLTRAIN_MPI=ON");
}
}  // namespace

std::shared_ptr<ProcessGroup> new_mpi_group(std::chrono::milliseconds) { no_mpi("new_mpi_group"); }
bool mpi_available() { return false; }
bool mpi_cuda_aware() { return false; }

namespace detail {
bool mpi_compiled() { return false; }
void mpi_init() { no_mpi("distributed::init with several ranks"); }
bool mpi_initialized() { return false; }
int mpi_world_rank() { return 0; }
int mpi_world_size() { return 1; }
int mpi_node_rank() { return 0; }
int mpi_node_size() { return 1; }
void mpi_node_index(int& node, int& nodes) { node = 0, nodes = 1; }
std::vector<std::string> mpi_allgather_strings(const std::string& mine) { return {mine}; }
std::vector<std::string> mpi_node_allgather_strings(const std::string& mine) { return {mine}; }
std::string mpi_broadcast_bytes(const std::string& bytes) { return bytes; }
void mpi_abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}
void mpi_finalize() {}
}  // namespace detail
}  // namespace dltrain::distributed
