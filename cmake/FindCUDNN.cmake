# FindCUDNN: locates cuDNN headers and library.
# Looks in CUDNN_ROOT / CUDNN_HOME / CUDNN_PATH (CMake or environment), CUDA_HOME,
# CUDAToolkit's directories and the usual prefixes of HPC modules and Debian.
# Defines CUDNN_FOUND, CUDNN_INCLUDE_DIR, CUDNN_LIBRARY, CUDNN_VERSION and CUDNN::cudnn.
set(_cudnn_hints ${CUDNN_ROOT} $ENV{CUDNN_ROOT} $ENV{CUDNN_HOME} $ENV{CUDNN_PATH} $ENV{CUDA_HOME}
    ${CUDAToolkit_LIBRARY_ROOT} /usr/local/cuda /usr)
find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${_cudnn_hints} ${CUDAToolkit_INCLUDE_DIRS}
          PATH_SUFFIXES include include/x86_64-linux-gnu)
find_library(CUDNN_LIBRARY cudnn HINTS ${_cudnn_hints} ${CUDAToolkit_LIBRARY_DIR}
             PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu)
if(CUDNN_INCLUDE_DIR)
  foreach(_h cudnn_version.h cudnn.h)
    if(EXISTS "${CUDNN_INCLUDE_DIR}/${_h}")
      file(STRINGS "${CUDNN_INCLUDE_DIR}/${_h}" _v REGEX "define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ")
      if(_v)
        string(REGEX REPLACE ".*CUDNN_MAJOR ([0-9]+).*CUDNN_MINOR ([0-9]+).*CUDNN_PATCHLEVEL ([0-9]+).*"
                             "\\1.\\2.\\3" CUDNN_VERSION "${_v}")
        break()
      endif()
    endif()
  endforeach()
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR
                                  VERSION_VAR CUDNN_VERSION)
if(CUDNN_FOUND AND NOT TARGET CUDNN::cudnn)
  add_library(CUDNN::cudnn UNKNOWN IMPORTED)
  set_target_properties(CUDNN::cudnn PROPERTIES IMPORTED_LOCATION "${CUDNN_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
