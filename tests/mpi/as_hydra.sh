#!/usr/bin/env bash
# Runs PROGRAM (under Open MPI's mpirun) with the variables MPICH's or Intel MPI's
# mpiexec.hydra gives its ranks instead of Open MPI's own ones, so that init()'s Hydra path
# (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS; the node index from MPI) runs against
# a real MPI here. --no-local leaves out the MPI_LOCAL* pair (a bare PMI-1 launch: the node
# layout comes from MPI too). DLTRAIN_TEST_LAUNCHER tells the test which launcher to expect.
# Usage: as_hydra.sh [--no-local] PROGRAM [ARGS...]
set -euo pipefail
export PMI_RANK=$OMPI_COMM_WORLD_RANK PMI_SIZE=$OMPI_COMM_WORLD_SIZE
if [[ ${1:-} == --no-local ]]; then
  shift
else
  export MPI_LOCALRANKID=$OMPI_COMM_WORLD_LOCAL_RANK MPI_LOCALNRANKS=$OMPI_COMM_WORLD_LOCAL_SIZE
fi
unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK \
  OMPI_COMM_WORLD_LOCAL_SIZE OMPI_COMM_WORLD_NODE_RANK
export DLTRAIN_TEST_LAUNCHER=hydra
exec "$@"
