// Launcher detection and GPU selection from scripted environments (no MPI needed).
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "dltrain/core/error.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/distributed/env.hpp"
#include "src/distributed/internal.hpp"

using namespace dltrain;
using namespace dltrain::distributed;

namespace {

Environment detect(const std::map<std::string, std::string>& vars) {
  return detect_environment([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    detect(vars);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("no launcher variables: a world of one", "[distributed][env]") {
  Environment e = detect({});
  CHECK(e.launcher == Launcher::Single);
  CHECK(e.rank == 0);
  CHECK(e.world_size == 1);
  CHECK(e.local_rank == 0);
  CHECK(e.local_world_size == 1);
  CHECK(e.num_nodes == 1);
  CHECK(e.describe().find("single process") != std::string::npos);
}

TEST_CASE("Open MPI's mpirun variables", "[distributed][env]") {
  Environment e = detect({{"OMPI_COMM_WORLD_RANK", "5"},
                          {"OMPI_COMM_WORLD_SIZE", "8"},
                          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                          {"OMPI_COMM_WORLD_NODE_RANK", "1"},
                          // Slurm variables of the surrounding allocation are ignored.
                          {"SLURM_PROCID", "0"},
                          {"SLURM_NTASKS", "8"}});
  CHECK(e.launcher == Launcher::OpenMPI);
  CHECK(e.rank == 5);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world_size == 4);
  // OMPI_COMM_WORLD_NODE_RANK is a rank on the node, not the node's index: init() asks MPI.
  CHECK(e.node_from_mpi);
  CHECK(e.node_id == 0);
  CHECK(e.source.find("OMPI_COMM_WORLD_RANK=5") != std::string::npos);
  CHECK(std::string(launcher_name(e.launcher)) == "openmpi");
}

TEST_CASE("Slurm srun variables, with compressed task lists", "[distributed][env]") {
  Environment e = detect({{"SLURM_PROCID", "6"},
                          {"SLURM_NTASKS", "16"},
                          {"SLURM_STEP_NUM_TASKS", "7"},
                          {"SLURM_LOCALID", "0"},
                          {"SLURM_NODEID", "3"},
                          {"SLURM_STEP_NUM_NODES", "4"},
                          {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"}});
  CHECK(e.launcher == Launcher::Slurm);
  CHECK(e.rank == 6);
  CHECK(e.world_size == 7);  // the step's count wins over the allocation's
  CHECK(e.local_world_size == 1);
  CHECK(e.node_id == 3);
  CHECK(e.num_nodes == 4);
  CHECK_FALSE(e.slurm_job_script);  // srun's step variables are there

  Environment b = detect({{"SLURM_PROCID", "1"},
                          {"SLURM_NTASKS", "4"},
                          {"SLURM_LOCALID", "1"},
                          {"SLURM_NODEID", "0"},
                          {"SLURM_JOB_NUM_NODES", "2"},
                          {"SLURM_TASKS_PER_NODE", "2(x2)"}});
  CHECK(b.world_size == 4);
  CHECK(b.local_world_size == 2);
  CHECK(b.num_nodes == 2);
  // Only the allocation's variables: the batch script itself, not a task srun started.
  CHECK(b.slurm_job_script);
  CHECK(b.describe().find("from a Slurm job script (not started by srun)") != std::string::npos);
  Environment step = detect({{"SLURM_PROCID", "1"},
                             {"SLURM_NTASKS", "4"},
                             {"SLURM_STEP_ID", "0"},
                             {"SLURM_LOCALID", "1"},
                             {"SLURM_NODEID", "0"},
                             {"SLURM_TASKS_PER_NODE", "2(x2)"}});
  CHECK_FALSE(step.slurm_job_script);
  CHECK(step.describe().find("from Slurm's srun") != std::string::npos);
}

TEST_CASE("PMIx rank with Slurm sizes, or sizes left to MPI", "[distributed][env]") {
  Environment e = detect({{"PMIX_RANK", "3"},
                          {"SLURM_NTASKS", "4"},
                          {"SLURM_LOCALID", "1"},
                          {"SLURM_NODEID", "1"},
                          {"SLURM_NNODES", "2"},
                          {"SLURM_TASKS_PER_NODE", "2(x2)"}});
  CHECK(e.launcher == Launcher::PMIx);
  CHECK(e.rank == 3);
  CHECK(e.world_size == 4);
  CHECK(e.local_world_size == 2);
  CHECK_FALSE(e.sizes_from_mpi);

  Environment bare = detect({{"PMIX_RANK", "2"}});
  CHECK(bare.launcher == Launcher::PMIx);
  CHECK(bare.sizes_from_mpi);
}

TEST_CASE("MPICH / Intel MPI mpiexec (Hydra) and srun --mpi=pmi2", "[distributed][env]") {
  // mpiexec.hydra inside a Slurm job: its proxies are srun tasks (one per node), so the ranks
  // inherit the proxy's SLURM_PROCID/SLURM_LOCALID; only the PMI variables are the rank's.
  Environment e = detect({{"PMI_RANK", "5"},
                          {"PMI_SIZE", "8"},
                          {"MPI_LOCALRANKID", "1"},
                          {"MPI_LOCALNRANKS", "4"},
                          {"SLURM_PROCID", "1"},
                          {"SLURM_NTASKS", "2"},
                          {"SLURM_STEP_ID", "0"},
                          {"SLURM_LOCALID", "0"},
                          {"SLURM_NODEID", "1"},
                          {"SLURM_TASKS_PER_NODE", "1(x2)"}});
  CHECK(e.launcher == Launcher::Hydra);
  CHECK(std::string(launcher_name(e.launcher)) == "hydra");
  CHECK(e.rank == 5);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world_size == 4);
  CHECK(e.node_from_mpi);  // Hydra exports no node index: init() asks MPI
  CHECK_FALSE(e.sizes_from_mpi);
  CHECK(e.describe().find("Intel MPI") != std::string::npos);
  CHECK(e.source.find("SLURM_PROCID") == std::string::npos);

  // srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE beside its own task variables: its layout is used.
  Environment p = detect({{"PMI_RANK", "3"},
                          {"PMI_SIZE", "4"},
                          {"SLURM_PROCID", "3"},
                          {"SLURM_NTASKS", "4"},
                          {"SLURM_STEP_NUM_TASKS", "4"},
                          {"SLURM_LOCALID", "1"},
                          {"SLURM_NODEID", "1"},
                          {"SLURM_STEP_NUM_NODES", "2"},
                          {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}});
  CHECK(p.launcher == Launcher::Hydra);
  CHECK(p.rank == 3);
  CHECK(p.local_rank == 1);
  CHECK(p.local_world_size == 2);
  CHECK(p.node_id == 1);
  CHECK(p.num_nodes == 2);
  CHECK_FALSE(p.node_from_mpi);

  // Only PMI_RANK / PMI_SIZE (another PMI-1 launcher): the node layout comes from MPI.
  Environment bare = detect({{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}});
  CHECK(bare.launcher == Launcher::Hydra);
  CHECK(bare.world_size == 3);
  CHECK(bare.sizes_from_mpi);
  CHECK(bare.node_from_mpi);

  // Open MPI's own variables come first; PMI_RANK alone (no PMI_SIZE) is not a launch.
  CHECK(detect({{"OMPI_COMM_WORLD_RANK", "0"},
                {"OMPI_COMM_WORLD_SIZE", "2"},
                {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                {"PMI_RANK", "0"},
                {"PMI_SIZE", "2"}})
            .launcher == Launcher::OpenMPI);
  CHECK(detect({{"PMI_RANK", "0"}}).launcher == Launcher::Single);

  // Inconsistent values are named.
  CHECK_THROWS_WITH(
      detect({{"PMI_RANK", "4"}, {"PMI_SIZE", "4"}}),
      Catch::Contains("rank 4 is not below the world size 4") && Catch::Contains("PMI_RANK=4"));
  CHECK_THROWS_WITH(detect({{"PMI_RANK", "1"},
                            {"PMI_SIZE", "4"},
                            {"MPI_LOCALRANKID", "2"},
                            {"MPI_LOCALNRANKS", "2"}}),
                    Catch::Contains("local rank 2") && Catch::Contains("MPI_LOCALNRANKS=2"));
  CHECK_THROWS_WITH(detect({{"PMI_RANK", "x"}, {"PMI_SIZE", "4"}}),
                    Catch::Contains("PMI_RANK='x' is not an integer"));
}

TEST_CASE("torchrun-style variables", "[distributed][env]") {
  Environment e = detect({{"RANK", "3"},
                          {"WORLD_SIZE", "4"},
                          {"LOCAL_RANK", "1"},
                          {"LOCAL_WORLD_SIZE", "2"},
                          {"GROUP_RANK", "1"},
                          {"MASTER_ADDR", "127.0.0.1"},
                          {"MASTER_PORT", "29500"}});
  CHECK(e.launcher == Launcher::TorchRun);
  CHECK(e.rank == 3);
  CHECK(e.local_rank == 1);
  CHECK(e.num_nodes == 2);
  CHECK(e.node_id == 1);
  CHECK(e.master_addr == "127.0.0.1");
  CHECK(e.master_port == 29500);
}

TEST_CASE("inconsistent or malformed variables name the variables", "[distributed][env]") {
  std::string m = error_of({{"OMPI_COMM_WORLD_RANK", "4"},
                            {"OMPI_COMM_WORLD_SIZE", "4"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
  CHECK(m.find("rank 4 is not below the world size 4") != std::string::npos);
  CHECK(m.find("OMPI_COMM_WORLD_RANK=4") != std::string::npos);

  m = error_of({{"RANK", "x1"}, {"WORLD_SIZE", "2"}});
  CHECK(m.find("RANK='x1' is not an integer") != std::string::npos);

  m = error_of({{"SLURM_PROCID", "0"},
                {"SLURM_NTASKS", "4"},
                {"SLURM_LOCALID", "3"},
                {"SLURM_NODEID", "0"},
                {"SLURM_TASKS_PER_NODE", "2(x2)"}});
  CHECK(m.find("local rank 3 is not below the ranks on this node (2)") != std::string::npos);

  m = error_of({{"SLURM_PROCID", "0"},
                {"SLURM_NTASKS", "4"},
                {"SLURM_LOCALID", "0"},
                {"SLURM_NODEID", "0"},
                {"SLURM_TASKS_PER_NODE", "2(y2)"}});
  CHECK(m.find("is not a Slurm task list") != std::string::npos);

  m = error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  CHECK(m.find("OMPI_COMM_WORLD_LOCAL_RANK is not set") != std::string::npos);

  m = error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}});
  CHECK(m.find("MASTER_PORT") != std::string::npos);
}

TEST_CASE("GPU selection: local rank, one bound GPU, or refusal to share", "[distributed][env]") {
  Environment e = detect({{"OMPI_COMM_WORLD_RANK", "3"},
                          {"OMPI_COMM_WORLD_SIZE", "4"},
                          {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  CHECK(select_gpu(e, 0) == -1);
  CHECK(select_gpu(e, 4) == 3);
  CHECK(select_gpu(e, 8) == 3);
  CHECK(select_gpu(e, 1) == 0);  // srun --gpus-per-task=1: each rank sees its own GPU
  try {
    select_gpu(e, 2);
    FAIL("four ranks on two GPUs must be refused");
  } catch (const Error& err) {
    CHECK(std::string(err.what()).find("4 ranks run on this node but only 2 GPUs") !=
          std::string::npos);
  }
}

TEST_CASE("usable_cpus follows the affinity mask and SLURM_CPUS_PER_TASK", "[distributed][env]") {
  const int all = usable_cpus();
  CHECK(all >= 1);
  setenv("SLURM_CPUS_PER_TASK", "1", 1);
  CHECK(usable_cpus() == 1);
  unsetenv("SLURM_CPUS_PER_TASK");
  CHECK(usable_cpus() == all);
}

TEST_CASE(
    "a rank's threads: its mask shared among overlapping ranks, capped by "
    "SLURM_CPUS_PER_TASK",
    "[distributed][env]") {
  // Two ranks on a 2-core machine, unbound: one thread each, not 2 x 2.
  CHECK(distributed::detail::rank_thread_share(2, 2, 2) == 1);
  // Bound ranks (no overlap): each its whole mask.
  CHECK(distributed::detail::rank_thread_share(8, 1, 8) == 8);
  // srun --cpus-per-task=4 with 2 unbound tasks on a 16-CPU node: SLURM_CPUS_PER_TASK is
  // already each task's share (usable 4), not to be halved again.
  CHECK(distributed::detail::rank_thread_share(16, 2, 4) == 4);
  // More ranks than CPUs: at least one thread.
  CHECK(distributed::detail::rank_thread_share(2, 3, 2) == 1);
  CHECK(distributed::detail::rank_thread_share(16, 8, 16) == 2);
}

TEST_CASE("collective descriptions in timeout messages: sizes with three digits",
          "[distributed][env]") {
  using distributed::detail::describe_collective;
  CHECK(describe_collective("all_reduce", zeros({1000}), "sum") ==
        "all_reduce(sum) of 1000 float32 elements (3.91 KiB, shape [1000], on cpu)");
  CHECK(describe_collective("broadcast", zeros({3}, DType::i64), nullptr) ==
        "broadcast of 3 int64 elements (24 bytes, shape [3], on cpu)");
  CHECK(describe_collective("all_gather", zeros({1, 1}).expand({25, 1 << 20}), nullptr)
            .find("(100 MiB,") != std::string::npos);
}
