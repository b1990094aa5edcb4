# dltrain's dependencies (included by the root CMakeLists.txt): the required ones, then one
# probe per optional one, each ending in DLTRAIN_WITH_<NAME> ON or OFF. The library's link
# interface (cmake/DltrainLibrary.cmake) and its sources (src/*/CMakeLists.txt: the backend
# variants) follow these variables and nothing else.
find_package(Threads REQUIRED)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)

set(DLTRAIN_WITH_CUDA OFF)
if(NOT DLTRAIN_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DLTRAIN_CUDA_ARCHITECTURES)
      execute_process(COMMAND ${CMAKE_CUDA_COMPILER} --version OUTPUT_VARIABLE _dltrain_nvcc_v
                      ERROR_QUIET)
      string(REGEX MATCH "release ([0-9]+)" _dltrain_nvcc_release "${_dltrain_nvcc_v}")
      if(CMAKE_MATCH_1 AND CMAKE_MATCH_1 GREATER_EQUAL 13)
        set(DLTRAIN_CUDA_ARCHITECTURES "75-real;80-real;90")  # CUDA 13 dropped sm_70
      else()
        set(DLTRAIN_CUDA_ARCHITECTURES "70-real;80-real;90")
      endif()
    endif()
    set(CMAKE_CUDA_ARCHITECTURES ${DLTRAIN_CUDA_ARCHITECTURES})
    enable_language(CUDA)
    # CMake 3.25 predates nvcc's C++20 support; teach it the flag (nvcc >= 12 accepts it).
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    # The CUDA runtime library: libcudart.so unless CMAKE_CUDA_RUNTIME_LIBRARY is Static, which
    # links libcudart_static.a into the programs instead, so that a binary built on one machine
    # needs only the driver (and cuBLAS, cuDNN, NCCL) on the machine it is carried to
    # (scripts/gpu/build_here.sh).
    string(TOLOWER "${CMAKE_CUDA_RUNTIME_LIBRARY}" _dltrain_cudart_kind)
    if(_dltrain_cudart_kind STREQUAL "static")
      set(DLTRAIN_CUDART CUDA::cudart_static)
    else()
      set(DLTRAIN_CUDART CUDA::cudart)
    endif()
    find_package(CUDNN)
    find_package(NCCL)
    set(DLTRAIN_WITH_CUDA ON)
  elseif(DLTRAIN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DLTRAIN_CUDA=ON but no CUDA compiler was found; set CUDACXX or CUDA_HOME, "
                        "or configure with -DDLTRAIN_CUDA=OFF")
  endif()
endif()

set(DLTRAIN_WITH_MPI OFF)
if(DLTRAIN_MPI)
  # The C API only (the C++ bindings are deprecated); MPI is private to the library.
  find_package(MPI COMPONENTS C QUIET)
  if(MPI_C_FOUND)
    set(DLTRAIN_WITH_MPI ON)
  endif()
endif()
# oneDNN: PyPI's oneDNN 3.x built on GNU OpenMP (onednn-devel-cpu-gomp), which scripts/setup.sh
# installs into .deps/onednn, is preferred; Debian's libdnnl-dev (2.6) is the fallback. Both
# run on libgomp, the OpenMP team dltrain's parallel_for shares (docs/design.md, "CPU ops").
# DLTRAIN_DNNL_ROOT names the prefix to take it from (/usr: Debian's); empty: .deps/onednn
# when present, else the default search.
set(DLTRAIN_DNNL_ROOT "" CACHE PATH "oneDNN prefix (default: .deps/onednn if present, else the system's)")
# The installed package carries the oneDNN runtime (libdnnl.so.N) in its lib directory when
# the oneDNN is private to this checkout (.deps/onednn, inside the source or build tree), which
# is gone once the module is installed and the checkout deleted; a system or site oneDNN stays
# where it is and is found by name again (docs/design.md, "Packaging").
set(DLTRAIN_INSTALL_DNNL AUTO CACHE STRING
    "Install the oneDNN runtime beside dltrain: AUTO (when it lies in the source or build tree), ON, OFF")
set_property(CACHE DLTRAIN_INSTALL_DNNL PROPERTY STRINGS AUTO ON OFF)
set(DLTRAIN_WITH_DNNL OFF)
set(DLTRAIN_DNNL_BUNDLED OFF)
if(NOT DLTRAIN_DNNL STREQUAL "OFF")
  set(_dltrain_dnnl_root "${DLTRAIN_DNNL_ROOT}")
  if(NOT _dltrain_dnnl_root AND EXISTS "${PROJECT_SOURCE_DIR}/.deps/onednn/lib/cmake/dnnl")
    set(_dltrain_dnnl_root "${PROJECT_SOURCE_DIR}/.deps/onednn")
  endif()
  if(_dltrain_dnnl_root)
    # A dnnl_DIR cached from another prefix (an older configure) would win over the root.
    string(FIND "${dnnl_DIR}" "${_dltrain_dnnl_root}" _dltrain_at)
    if(NOT _dltrain_at EQUAL 0)
      unset(dnnl_DIR CACHE)
    endif()
    find_package(dnnl CONFIG QUIET PATHS "${_dltrain_dnnl_root}" NO_DEFAULT_PATH)
  endif()
  if(NOT dnnl_FOUND)
    find_package(dnnl CONFIG QUIET)
  endif()
  find_package(OpenMP QUIET)  # oneDNN's CPU runtime; dltrain sets its thread count
  if(dnnl_FOUND AND NOT DNNL_CPU_THREADING_RUNTIME STREQUAL "OMP")
    # dltrain shares oneDNN's OpenMP team (parallel_for, the thread count): a TBB or SYCL
    # build would run a second pool beside it.
    message(WARNING "dltrain: the oneDNN at ${dnnl_DIR} uses ${DNNL_CPU_THREADING_RUNTIME} "
                    "threading, not OpenMP; not using it")
    set(dnnl_FOUND OFF)
  endif()
  if(dnnl_FOUND AND OpenMP_CXX_FOUND)
    set(DLTRAIN_WITH_DNNL ON)
    message(STATUS "dltrain: oneDNN ${dnnl_VERSION} from ${dnnl_DIR}")
    # The library file behind DNNL::dnnl (symlinks resolved) and its SONAME: what an install
    # copies, and the name programs load it by.
    get_target_property(_dltrain_dnnl_file DNNL::dnnl LOCATION)
    get_target_property(_dltrain_dnnl_soname DNNL::dnnl IMPORTED_SONAME)
    get_target_property(_dltrain_cfgs DNNL::dnnl IMPORTED_CONFIGURATIONS)
    foreach(_cfg IN LISTS _dltrain_cfgs)
      get_target_property(_dltrain_dnnl_soname_cfg DNNL::dnnl IMPORTED_SONAME_${_cfg})
      if(_dltrain_dnnl_soname_cfg AND NOT _dltrain_dnnl_soname)
        set(_dltrain_dnnl_soname "${_dltrain_dnnl_soname_cfg}")
      endif()
    endforeach()
    file(REAL_PATH "${_dltrain_dnnl_file}" _dltrain_dnnl_file)
    get_filename_component(_dltrain_dnnl_file_name "${_dltrain_dnnl_file}" NAME)
    if(NOT _dltrain_dnnl_soname)
      set(_dltrain_dnnl_soname "${_dltrain_dnnl_file_name}")
    endif()
    if(DLTRAIN_INSTALL_DNNL STREQUAL "AUTO")
      foreach(_dir IN ITEMS "${CMAKE_SOURCE_DIR}" "${CMAKE_BINARY_DIR}")
        file(REAL_PATH "${_dir}" _dir)
        cmake_path(IS_PREFIX _dir "${_dltrain_dnnl_file}" NORMALIZE _dltrain_inside)
        if(_dltrain_inside)
          set(DLTRAIN_DNNL_BUNDLED ON)
        endif()
      endforeach()
    elseif(DLTRAIN_INSTALL_DNNL)
      set(DLTRAIN_DNNL_BUNDLED ON)
    endif()
    if(DLTRAIN_DNNL_BUNDLED)
      message(STATUS "dltrain: installs ${_dltrain_dnnl_soname} (${_dltrain_dnnl_file}) beside itself")
      set(DLTRAIN_DNNL_CONFIG_HINT "")
    else()
      set(DLTRAIN_DNNL_CONFIG_HINT "${dnnl_DIR}")
    endif()
  elseif(DLTRAIN_DNNL STREQUAL "ON")
    message(FATAL_ERROR "DLTRAIN_DNNL=ON but oneDNN (OpenMP build) was not found: run "
                        "scripts/setup.sh (PyPI's onednn-devel-cpu-gomp into .deps/onednn) or "
                        "install Debian's libdnnl-dev, or set DLTRAIN_DNNL_ROOT, or configure "
                        "with -DDLTRAIN_DNNL=OFF")
  endif()
endif()
# Installed executables keep the run path to libraries outside the system's directories (an
# HDF5 or MPI module; CMake leaves out directories inside the source and build trees) ...
set(CMAKE_INSTALL_RPATH_USE_LINK_PATH ON)
if(DLTRAIN_SHARED OR DLTRAIN_DNNL_BUNDLED)
  # ... and find libdltrain.so and the bundled libdnnl.so.N in the prefix's lib directory
  # relative to themselves, wherever the prefix is moved.
  include(GNUInstallDirs)
  file(RELATIVE_PATH _dltrain_bin_to_lib "/prefix/${CMAKE_INSTALL_BINDIR}" "/prefix/${CMAKE_INSTALL_LIBDIR}")
  list(APPEND CMAKE_INSTALL_RPATH "$ORIGIN/${_dltrain_bin_to_lib}")
endif()
set(DLTRAIN_WITH_HDF5 OFF)
if(DLTRAIN_HDF5)
  find_package(HDF5 COMPONENTS C QUIET)
  if(HDF5_FOUND)
    set(DLTRAIN_WITH_HDF5 ON)
  endif()
endif()
set(DLTRAIN_WITH_JPEG OFF)
set(DLTRAIN_WITH_LIBJPEG OFF)
if(DLTRAIN_JPEG)
  find_package(TurboJPEG QUIET)
  if(TurboJPEG_FOUND)
    set(DLTRAIN_WITH_JPEG ON)
  endif()
endif()

# zlib reads gzip-compressed dataset files (MNIST/Fashion-MNIST IDX); without it those
# files raise an error that says to gunzip them.
set(DLTRAIN_WITH_ZLIB OFF)
find_package(ZLIB QUIET)
if(ZLIB_FOUND)
  set(DLTRAIN_WITH_ZLIB ON)
endif()
# Checkpoints carry a zlib CRC-32 of their bytes (src/io/checkpoint_header.hpp). libhdf5-dev
# depends on zlib1g-dev, so this only bites hand-built HDF5s.
if(DLTRAIN_WITH_HDF5 AND NOT DLTRAIN_WITH_ZLIB)
  message(WARNING "dltrain: HDF5 was found but zlib was not; checkpoints need zlib, so HDF5 "
                  "support is off. Install zlib1g-dev (or zlib-devel) and reconfigure.")
  set(DLTRAIN_WITH_HDF5 OFF)
endif()

# JSON output (metrics JSON lines, chronometer summaries): nlohmann/json, header-only, required
# at build time only (private to the library; consumers of the installed package need nothing).
find_package(nlohmann_json 3.2 QUIET)
if(NOT nlohmann_json_FOUND)
  message(FATAL_ERROR "dltrain needs nlohmann/json (header-only) to write JSON: install "
                      "nlohmann-json3-dev (Debian) or nlohmann-json (Spack), or set nlohmann_json_DIR")
endif()
# TensorBoard event files (train::MetricsWriter): protobuf records framed with CRC32C, which comes
# from ISA-L (Debian 12 packages no CRC32C library of its own, see docs/design.md). Without
# either, the TensorBoard sink raises an error naming the missing package; CSV and JSON lines
# always work. PNG images in those files are encoded with libpng.
set(DLTRAIN_WITH_PROTOBUF OFF)
if(DLTRAIN_PROTOBUF)
  find_package(Protobuf QUIET)
  find_package(ISAL QUIET)
  if(Protobuf_FOUND AND Protobuf_PROTOC_EXECUTABLE AND ISAL_FOUND)
    set(DLTRAIN_WITH_PROTOBUF ON)
  else()
    message(STATUS "dltrain: TensorBoard sink off (protobuf=${Protobuf_FOUND} "
                   "protoc=${Protobuf_PROTOC_EXECUTABLE} ISA-L=${ISAL_FOUND}); install "
                   "libprotobuf-dev protobuf-compiler libisal-dev to build it")
  endif()
endif()
# ONNX export (io::export_onnx, issue 32): ONNX's own onnx.proto (Debian's libonnx-dev ships
# /usr/include/onnx/onnx.proto, already optimize_for = LITE_RUNTIME), compiled with the protoc and
# protobuf-lite runtime of the TensorBoard sink. Without it, export_onnx raises an error naming
# the packages.
set(DLTRAIN_WITH_ONNX OFF)
if(DLTRAIN_WITH_PROTOBUF)
  find_path(DLTRAIN_ONNX_PROTO_DIR onnx/onnx.proto
            DOC "Folder holding onnx/onnx.proto (libonnx-dev: /usr/include)")
  if(DLTRAIN_ONNX_PROTO_DIR)
    set(DLTRAIN_WITH_ONNX ON)
  endif()
endif()
set(DLTRAIN_WITH_PNG OFF)
find_package(PNG QUIET)
if(PNG_FOUND)
  set(DLTRAIN_WITH_PNG ON)
endif()

# NCCL process groups: with the CUDA backend and NCCL found.
set(DLTRAIN_WITH_NCCL OFF)
if(DLTRAIN_WITH_CUDA AND NCCL_FOUND)
  set(DLTRAIN_WITH_NCCL ON)
endif()

message(STATUS "dltrain: CUDA=${DLTRAIN_WITH_CUDA} cuDNN=${CUDNN_FOUND} NCCL=${NCCL_FOUND} "
               "MPI=${DLTRAIN_WITH_MPI} oneDNN=${DLTRAIN_WITH_DNNL} HDF5=${DLTRAIN_WITH_HDF5} TurboJPEG=${DLTRAIN_WITH_JPEG} "
               "zlib=${DLTRAIN_WITH_ZLIB} protobuf=${DLTRAIN_WITH_PROTOBUF} ONNX=${DLTRAIN_WITH_ONNX} "
               "PNG=${DLTRAIN_WITH_PNG}")
