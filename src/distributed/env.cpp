// Launcher detection (see include/dltrain/distributed/env.hpp). Every value is parsed
// strictly and checked against the others, because a wrong rank or size does not fail
// here: it hangs the first collective, minutes later, on every other rank.
#include "dltrain/distributed/env.hpp"

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "dltrain/core/error.hpp"

namespace dltrain::distributed {

const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::Single:
      return "single";
    case Launcher::OpenMPI:
      return "openmpi";
    case Launcher::PMIx:
      return "pmix";
    case Launcher::Slurm:
      return "slurm";
    case Launcher::TorchRun:
      return "torchrun";
    case Launcher::Hydra:
      return "hydra";
  }
  return "?";
}

namespace {

const char* long_name(Launcher l) {
  switch (l) {
    case Launcher::Single:
      return "a single process (no launcher variables)";
    case Launcher::OpenMPI:
      return "Open MPI's mpirun";
    case Launcher::PMIx:
      return "a PMIx launcher";
    case Launcher::Slurm:
      return "Slurm's srun";
    case Launcher::TorchRun:
      return "torchrun-style variables";
    case Launcher::Hydra:
      return "MPICH's or Intel MPI's mpiexec (Hydra PMI)";
  }
  return "?";
}

// Reads the variables of one launcher and remembers what was read, for messages.
class Reader {
 public:
  explicit Reader(const EnvLookup& lookup) : lookup_(lookup) {}

  bool has(const char* name) const {
    const char* v = lookup_(name);
    return v != nullptr && *v != '\0';
  }
  // The first of `names` that is set, or null.
  const char* first(std::initializer_list<const char*> names) const {
    for (const char* n : names)
      if (has(n)) return n;
    return nullptr;
  }
  int integer(const char* name, int min_value) {
    const char* v = lookup_(name);
    DLTRAIN_CHECK(v != nullptr && *v != '\0', "distributed::init: ", name,
                  " is not set although the other variables of the launcher are (", read_,
                  "); launch with srun/mpirun/torchrun, or unset the partial variables");
    char* end = nullptr;
    long x = std::strtol(v, &end, 10);
    DLTRAIN_CHECK(end != v && *end == '\0' && x >= min_value && x <= 1'000'000'000,
                  "distributed::init: ", name, "='", v, "' is not an integer >= ", min_value,
                  "; fix or unset it");
    note(name, v);
    return static_cast<int>(x);
  }
  std::string text(const char* name) {
    const char* v = lookup_(name);
    if (v == nullptr) return "";
    note(name, v);
    return v;
  }
  void note(const char* name, const std::string& v) {
    if (!read_.empty()) read_ += ' ';
    read_ += std::string(name) + "=" + v;
  }
  const std::string& read() const { return read_; }

 private:
  const EnvLookup& lookup_;
  std::string read_;
};

// Slurm's compressed task counts, "2(x3),1": nodes 0-2 run 2 tasks, node 3 runs 1.
int slurm_tasks_on_node(const char* name, const std::string& spec, int node) {
  std::vector<int> counts;
  std::stringstream ss(spec);
  std::string item;
  auto bad = [&] {
    throw Error(std::string("distributed::init: ") + name + "='" + spec +
                "' is not a Slurm task list such as '2(x3),1'; fix or unset it");
  };
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    long n = std::strtol(item.c_str(), &end, 10);
    if (end == item.c_str() || n < 1) bad();
    long rep = 1;
    if (*end == '(') {
      if (end[1] != 'x') bad();
      char* e2 = nullptr;
      rep = std::strtol(end + 2, &e2, 10);
      if (e2 == end + 2 || *e2 != ')' || e2[1] != '\0' || rep < 1) bad();
    } else if (*end != '\0') {
      bad();
    }
    for (long r = 0; r < rep && counts.size() < 1'000'000; ++r)
      counts.push_back(static_cast<int>(n));
  }
  if (counts.empty()) bad();
  DLTRAIN_CHECK(node < static_cast<int>(counts.size()), "distributed::init: ", name, "='", spec,
                "' lists ", counts.size(), " nodes but SLURM_NODEID is ", node,
                "; the Slurm variables are inconsistent (launch with srun)");
  return counts[static_cast<size_t>(node)];
}

// Local rank, ranks on this node, node index and node count from an srun task's variables.
void read_slurm_layout(Reader& r, Environment& e) {
  e.local_rank = r.integer("SLURM_LOCALID", 0);
  e.node_id = r.integer("SLURM_NODEID", 0);
  if (const char* nn = r.first({"SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"}))
    e.num_nodes = r.integer(nn, 1);
  const char* t = r.first({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
  DLTRAIN_CHECK(t != nullptr,
                "distributed::init: SLURM_PROCID is set but neither "
                "SLURM_STEP_TASKS_PER_NODE nor SLURM_TASKS_PER_NODE is (",
                r.read(), "); launch the program with srun");
  e.local_world_size = slurm_tasks_on_node(t, r.text(t), e.node_id);
}

void check_consistent(const Environment& e) {
  auto where = [&] { return std::string(" (") + e.source + ")"; };
  DLTRAIN_CHECK(e.world_size >= 1, "distributed::init: world size ", e.world_size,
                " must be at least 1", where());
  DLTRAIN_CHECK(e.rank >= 0 && e.rank < e.world_size, "distributed::init: rank ", e.rank,
                " is not below the world size ", e.world_size, where(),
                "; the launcher variables are inconsistent");
  if (e.local_world_size >= 0) {
    DLTRAIN_CHECK(e.local_world_size >= 1 && e.local_world_size <= e.world_size,
                  "distributed::init: ", e.local_world_size, " ranks on this node but ",
                  e.world_size, " in the world", where());
    DLTRAIN_CHECK(e.local_rank >= 0 && e.local_rank < e.local_world_size,
                  "distributed::init: local rank ", e.local_rank,
                  " is not below the ranks on this node (", e.local_world_size, ")", where(),
                  "; the launcher variables are inconsistent");
  }
  DLTRAIN_CHECK(
      e.num_nodes >= 1 && e.num_nodes <= e.world_size && e.node_id >= 0 && e.node_id < e.num_nodes,
      "distributed::init: node ", e.node_id, " of ", e.num_nodes, " nodes with ", e.world_size,
      " ranks is impossible", where());
}

}  // namespace

std::string Environment::describe() const {
  std::ostringstream os;
  os << "rank " << rank << " of " << world_size << " (local " << local_rank << " of "
     << local_world_size << ", node " << node_id << " of " << num_nodes << ") from "
     << (slurm_job_script ? "a Slurm job script (not started by srun)" : long_name(launcher));
  if (!source.empty()) os << " [" << source << "]";
  return os.str();
}

Environment detect_environment(const EnvLookup& lookup) {
  Reader r(lookup);
  Environment e;
  if (r.has("OMPI_COMM_WORLD_RANK") || r.has("OMPI_COMM_WORLD_SIZE")) {
    e.launcher = Launcher::OpenMPI;
    e.rank = r.integer("OMPI_COMM_WORLD_RANK", 0);
    e.world_size = r.integer("OMPI_COMM_WORLD_SIZE", 1);
    e.local_rank = r.integer("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    e.local_world_size = r.integer("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
    // Open MPI exports neither the node index nor the node count (OMPI_COMM_WORLD_NODE_RANK
    // is the process's rank on its node across all jobs, a local rank, not a node index):
    // init() asks MPI.
    e.node_from_mpi = true;
  } else if (r.has("PMI_RANK") && r.has("PMI_SIZE")) {
    e.launcher = Launcher::Hydra;
    e.rank = r.integer("PMI_RANK", 0);
    e.world_size = r.integer("PMI_SIZE", 1);
    const char* procid = lookup("SLURM_PROCID");
    if (r.has("MPI_LOCALRANKID") || r.has("MPI_LOCALNRANKS")) {
      // mpiexec.hydra's own ranks (its proxies may be srun tasks, whose SLURM_PROCID is the
      // proxy's, not the rank's: Slurm's variables are not read).
      e.local_rank = r.integer("MPI_LOCALRANKID", 0);
      e.local_world_size = r.integer("MPI_LOCALNRANKS", 1);
      e.node_from_mpi = true;
    } else if (procid != nullptr && std::to_string(e.rank) == procid &&
               r.first({"SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_TASKS"})) {
      // srun --mpi=pmi2 started the ranks itself: its task layout is the ranks'.
      r.integer("SLURM_PROCID", 0);
      read_slurm_layout(r, e);
    } else {
      e.local_world_size = -1;
      e.sizes_from_mpi = true;
      e.node_from_mpi = true;
    }
  } else if (r.has("PMIX_RANK")) {
    e.launcher = Launcher::PMIx;
    e.rank = r.integer("PMIX_RANK", 0);
    if (const char* n = r.first({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"})) {
      e.world_size = r.integer(n, 1);
      e.local_rank = r.has("SLURM_LOCALID") ? r.integer("SLURM_LOCALID", 0) : 0;
      e.node_id = r.has("SLURM_NODEID") ? r.integer("SLURM_NODEID", 0) : 0;
      if (const char* t = r.first({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}))
        e.local_world_size = slurm_tasks_on_node(t, r.text(t), e.node_id);
      else
        e.local_world_size = -1;
      if (const char* nn = r.first({"SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"}))
        e.num_nodes = r.integer(nn, 1);
      e.sizes_from_mpi = e.local_world_size < 0;
      e.node_from_mpi = e.sizes_from_mpi;
    } else {
      // Only MPI knows the sizes; init() fills them in after MPI_Init_thread.
      e.world_size = e.rank + 1;
      e.local_world_size = -1;
      e.sizes_from_mpi = true;
      e.node_from_mpi = true;
    }
  } else if (r.has("SLURM_PROCID") && r.first({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"})) {
    e.launcher = Launcher::Slurm;
    e.rank = r.integer("SLURM_PROCID", 0);
    // Inside srun the step's own counts; in a batch script only the allocation's.
    e.world_size = r.integer(r.first({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}), 1);
    // srun exports the step's variables; the batch script (and anything it starts without
    // srun) has only the allocation's.
    e.slurm_job_script = !r.first({"SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_TASKS"});
    read_slurm_layout(r, e);
  } else if (r.has("RANK") && r.has("WORLD_SIZE")) {
    e.launcher = Launcher::TorchRun;
    e.rank = r.integer("RANK", 0);
    e.world_size = r.integer("WORLD_SIZE", 1);
    e.local_rank = r.has("LOCAL_RANK") ? r.integer("LOCAL_RANK", 0) : e.rank;
    e.local_world_size =
        r.has("LOCAL_WORLD_SIZE") ? r.integer("LOCAL_WORLD_SIZE", 1) : e.world_size;
    e.node_id = r.has("GROUP_RANK") ? r.integer("GROUP_RANK", 0) : 0;
    e.num_nodes = (e.world_size + e.local_world_size - 1) / e.local_world_size;
    if (e.node_id >= e.num_nodes) e.num_nodes = e.node_id + 1;
    e.master_addr = r.text("MASTER_ADDR");
    if (r.has("MASTER_PORT")) e.master_port = r.integer("MASTER_PORT", 1);
    DLTRAIN_CHECK(e.master_port <= 65535, "distributed::init: MASTER_PORT=", e.master_port,
                  " is not a TCP port (1-65535)");
  }
  e.source = r.read();
  check_consistent(e);
  return e;
}

Environment detect_environment() {
  return detect_environment([](const char* n) { return std::getenv(n); });
}

int select_gpu(const Environment& env, int gpus_visible) {
  if (gpus_visible <= 0) return -1;
  if (env.local_world_size < 0) return env.local_rank < gpus_visible ? env.local_rank : 0;
  // One visible GPU: either the launcher bound one per task (srun --gpus-per-task=1, a
  // CUDA_VISIBLE_DEVICES per rank) or several ranks would share it; init() tells the two
  // apart by comparing the ranks' choices across the node.
  if (gpus_visible == 1) return 0;
  DLTRAIN_CHECK(env.local_world_size <= gpus_visible, "distributed: ", env.local_world_size,
                " ranks run on this node but only ", gpus_visible,
                " GPUs are visible, so ranks would share a GPU (", env.source,
                "); start one task per GPU (srun --ntasks-per-node=", gpus_visible,
                " --gres=gpu:", gpus_visible, ", or mpirun -npernode ", gpus_visible, ")");
  return env.local_rank;
}

}  // namespace dltrain::distributed
