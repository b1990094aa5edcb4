# dltrain::mpi: the MPI C library as an imported target, found by name on the machine that
# uses it (no absolute path in the installed package: `module swap openmpi ...` or a relocated
# install keep working) and without FindMPI's C compiler probe. Search order: the hints
# DltrainMPI_HINT_INCLUDE_DIRS / DltrainMPI_HINT_LIBRARY_DIRS (dltrain's own build passes what
# FindMPI found), MPI_HOME / MPI_ROOT / I_MPI_ROOT (MPI modules, Spack), pkg-config (ompi-c,
# mpich, mpi-c), then the directory of `mpicc` and the system paths.
# Sets DltrainMPI_FOUND, DltrainMPI_INCLUDE_DIR, DltrainMPI_LIBRARY.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_search_module(PC_DLTRAIN_MPI QUIET ompi-c mpich mpi-c)
endif()
find_program(DltrainMPI_MPICC NAMES mpicc HINTS ENV MPI_HOME ENV MPI_ROOT ENV I_MPI_ROOT
             PATH_SUFFIXES bin)
set(_dltrain_mpi_prefix "")
if(DltrainMPI_MPICC)
  get_filename_component(_dltrain_mpi_prefix "${DltrainMPI_MPICC}" DIRECTORY)
  get_filename_component(_dltrain_mpi_prefix "${_dltrain_mpi_prefix}" DIRECTORY)
endif()
find_path(DltrainMPI_INCLUDE_DIR mpi.h
  HINTS ${DltrainMPI_HINT_INCLUDE_DIRS} ENV MPI_HOME ENV MPI_ROOT ENV I_MPI_ROOT
        ${PC_DLTRAIN_MPI_INCLUDE_DIRS} ${_dltrain_mpi_prefix}
  PATH_SUFFIXES include include/openmpi include/mpich)
find_library(DltrainMPI_LIBRARY NAMES mpi mpich
  HINTS ${DltrainMPI_HINT_LIBRARY_DIRS} ENV MPI_HOME ENV MPI_ROOT ENV I_MPI_ROOT
        ${PC_DLTRAIN_MPI_LIBRARY_DIRS} ${_dltrain_mpi_prefix}
  PATH_SUFFIXES lib lib64 lib/release)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(DltrainMPI
  REQUIRED_VARS DltrainMPI_LIBRARY DltrainMPI_INCLUDE_DIR
  REASON_FAILURE_MESSAGE "dltrain was built with MPI: install libopenmpi-dev (Debian), load an MPI module, or set MPI_HOME")
if(DltrainMPI_FOUND AND NOT TARGET dltrain::mpi)
  add_library(dltrain::mpi UNKNOWN IMPORTED)
  set_target_properties(dltrain::mpi PROPERTIES IMPORTED_LOCATION "${DltrainMPI_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${DltrainMPI_INCLUDE_DIR}")
endif()
mark_as_advanced(DltrainMPI_MPICC DltrainMPI_INCLUDE_DIR DltrainMPI_LIBRARY)
