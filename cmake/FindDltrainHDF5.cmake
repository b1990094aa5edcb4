# dltrain::hdf5: HDF5's C library as an imported target, found by name on the machine that
# uses it (no absolute path recorded in the installed package, so a relocated install or a
# swapped `module load hdf5` keeps working) and without FindHDF5's compiler probe, which needs
# the C language enabled in the consumer's project. Search order: the hints
# DltrainHDF5_HINT_INCLUDE_DIRS / DltrainHDF5_HINT_LIBRARY_DIRS (dltrain's own build passes
# what FindHDF5 found), HDF5_ROOT / HDF5_DIR (set by most HDF5 modules and Spack), pkg-config
# (hdf5, hdf5-serial), then the system paths (Debian keeps it under hdf5/serial).
# Sets DltrainHDF5_FOUND, DltrainHDF5_INCLUDE_DIR, DltrainHDF5_LIBRARY.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_search_module(PC_DLTRAIN_HDF5 QUIET hdf5 hdf5-serial)
endif()
find_path(DltrainHDF5_INCLUDE_DIR hdf5.h
  HINTS ${DltrainHDF5_HINT_INCLUDE_DIRS} ENV HDF5_ROOT ENV HDF5_DIR ${PC_DLTRAIN_HDF5_INCLUDE_DIRS}
  PATH_SUFFIXES include include/hdf5/serial hdf5/serial)
find_library(DltrainHDF5_LIBRARY NAMES hdf5 hdf5_serial
  HINTS ${DltrainHDF5_HINT_LIBRARY_DIRS} ENV HDF5_ROOT ENV HDF5_DIR ${PC_DLTRAIN_HDF5_LIBRARY_DIRS}
  PATH_SUFFIXES lib lib64 hdf5/serial)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(DltrainHDF5
  REQUIRED_VARS DltrainHDF5_LIBRARY DltrainHDF5_INCLUDE_DIR
  REASON_FAILURE_MESSAGE "dltrain was built with HDF5: install libhdf5-dev (Debian), load an HDF5 module, or set HDF5_ROOT")
if(DltrainHDF5_FOUND AND NOT TARGET dltrain::hdf5)
  add_library(dltrain::hdf5 UNKNOWN IMPORTED)
  set_target_properties(dltrain::hdf5 PROPERTIES IMPORTED_LOCATION "${DltrainHDF5_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${DltrainHDF5_INCLUDE_DIR}")
endif()
mark_as_advanced(DltrainHDF5_INCLUDE_DIR DltrainHDF5_LIBRARY)
