// How this process was launched: rank, world size, local rank, node, read from the
// variables that cluster launchers set.
//
// detect_environment() tries, in this order: Open MPI's mpirun (OMPI_COMM_WORLD_*), MPICH's or
// Intel MPI's mpiexec (Hydra: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS; also srun
// --mpi=pmi2, which sets PMI_RANK and PMI_SIZE beside Slurm's variables), a PMIx launcher
// (PMIX_RANK, with sizes from Slurm's variables or, failing those, from MPI once it is
// initialised), Slurm's srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS or SLURM_NTASKS,
// SLURM_LOCALID, SLURM_NODEID, ...), torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), and otherwise a world of one. It is a pure
// function of the variables (tests pass their own lookup), and every value it returns is
// checked: 0 <= rank < world_size, 0 <= local_rank < local_world_size, 0 <= node < nodes; a
// malformed or inconsistent variable raises dltrain::Error naming the variables and values.
// What the variables do not say (Hydra's node index, a bare PMIx launch's sizes) init() asks
// MPI for.
#pragma once

#include <functional>
#include <string>

namespace dltrain::distributed {

/// Which launcher's variables described the job.
enum class Launcher { Single, OpenMPI, PMIx, Slurm, TorchRun, Hydra };

/// "single", "openmpi", "pmix", "slurm", "torchrun", "hydra".
const char* launcher_name(Launcher l);

/// The job as the launcher describes it.
struct Environment {
  Launcher launcher = Launcher::Single;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  /// Ranks on this node (-1 when only MPI can tell: a bare PMIx launch).
  int local_world_size = 1;
  int node_id = 0;
  int num_nodes = 1;
  /// torchrun's rendezvous address (empty for the other launchers).
  std::string master_addr;
  int master_port = 0;
  /// True when world_size / local sizes are to be taken from MPI (a bare PMIx launch).
  bool sizes_from_mpi = false;
  /// True when node_id / num_nodes are to be taken from MPI (Hydra exports no node index).
  bool node_from_mpi = false;
  /// Slurm's variables without a job step's (no SLURM_STEP_ID, SLURM_STEPID or
  /// SLURM_STEP_NUM_TASKS): this process is the batch script's own (or was started from it
  /// without srun), so the other SLURM_NTASKS - 1 ranks do not exist. init() refuses such a
  /// launch when SLURM_NTASKS > 1; describe() says it.
  bool slurm_job_script = false;
  /// The variables that were read, e.g. "OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 ...".
  std::string source;

  /// One line: "rank 1 of 4 (local 1 of 2, node 0 of 2) from Open MPI's mpirun (...)".
  std::string describe() const;
};

/// Looks up an environment variable; returns null when unset.
using EnvLookup = std::function<const char*(const char*)>;

/// Reads the launch from `lookup` (see the file comment). Throws dltrain::Error on malformed
/// or inconsistent variables.
Environment detect_environment(const EnvLookup& lookup);
/// Reads the launch from this process's environment.
Environment detect_environment();

/// The CUDA device a rank should use, as IDRIS's idr_torch does: cuda:local_rank when the
/// node's visible GPUs are at least the ranks on it; device 0 when the launcher binds one GPU
/// per task (one visible GPU); -1 when `gpus_visible` is 0 (train on the CPU). Throws
/// dltrain::Error when several ranks would share a GPU (more ranks on the node than GPUs,
/// with more than one GPU visible), naming the variables and the fix.
int select_gpu(const Environment& env, int gpus_visible);

}  // namespace dltrain::distributed
