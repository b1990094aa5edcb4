# The library target, dltrain (included by the root CMakeLists.txt once the dependencies are
# probed): static or shared, its compile settings, and its link interface, one block per
# optional dependency (DLTRAIN_WITH_*, cmake/DltrainDependencies.cmake). Its sources are added
# folder by folder (src/CMakeLists.txt and the CMakeLists.txt of each folder it adds), which is
# where the backends' variants are chosen.
if(DLTRAIN_SHARED)
  add_library(dltrain SHARED)
  # libdltrain.so.0.1 while the version is 0.x (every minor release may change the ABI, as
  # the package's SameMinorVersion compatibility says), libdltrain.so.<major> from 1.0 on.
  if(PROJECT_VERSION_MAJOR EQUAL 0)
    set(_dltrain_soversion ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
  else()
    set(_dltrain_soversion ${PROJECT_VERSION_MAJOR})
  endif()
  # No dltrain_EXPORTS define: the objects compile exactly as the static library's, so a
  # second tree (scripts/test.sh's shared consumer check) is all ccache hits.
  set_target_properties(dltrain PROPERTIES VERSION ${PROJECT_VERSION}
                        SOVERSION ${_dltrain_soversion} DEFINE_SYMBOL "")
  # Visibility by a version script rather than export macros on every public name: what is
  # in namespace dltrain is exported (functions, classes' typeinfo and vtables, and template
  # instantiations that involve dltrain types), everything else is local: the header-only
  # libraries compiled into it (Eigen, nlohmann/json), the protobuf messages, and the
  # objects of static archives it links (--exclude-libs). A consumer using another
  # nlohmann/json or Eigen version never binds to dltrain's copies. --no-undefined: every
  # dependency is on the library's own link line.
  set(_dltrain_map ${PROJECT_SOURCE_DIR}/cmake/dltrain.map)
  target_link_options(dltrain PRIVATE "LINKER:--version-script=${_dltrain_map}"
                      "LINKER:--exclude-libs,ALL")
  if(NOT DLTRAIN_SANITIZE AND NOT DLTRAIN_FUZZ)  # clang leaves the sanitizer runtimes to the executables
    target_link_options(dltrain PRIVATE "LINKER:--no-undefined")
  endif()
  set_property(TARGET dltrain APPEND PROPERTY LINK_DEPENDS ${_dltrain_map})
else()
  add_library(dltrain STATIC)
endif()
add_library(dltrain::dltrain ALIAS dltrain)

# dltrain_backend(<DLTRAIN_WITH_X> <sources with X>... NO <sources without X>...): the one way
# an optional backend enters the library (docs/design.md, "Build layout"). The folder that
# calls it adds the first list when X was found, the second (its no_<x> refusals) otherwise.
# The no_<x> files a build with X does not link are collected (DLTRAIN_UNUSED_NO_SOURCES) and
# compiled anyway by the root CMakeLists.txt, so that CI, which has every backend, still
# compiles every refusal.
function(dltrain_backend with_var)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "NO")
  if(${with_var})
    target_sources(dltrain PRIVATE ${arg_UNPARSED_ARGUMENTS})
    list(TRANSFORM arg_NO PREPEND "${CMAKE_CURRENT_SOURCE_DIR}/")
    set_property(GLOBAL APPEND PROPERTY DLTRAIN_UNUSED_NO_SOURCES ${arg_NO})
  else()
    target_sources(dltrain PRIVATE ${arg_NO})
  endif()
endfunction()
target_include_directories(dltrain
  PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:include>
  PRIVATE ${PROJECT_SOURCE_DIR})
target_compile_features(dltrain INTERFACE cxx_std_20)
target_compile_options(dltrain PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr --extended-lambda -Xcompiler=-Wall,-Wextra>)
target_link_libraries(dltrain PUBLIC Threads::Threads PRIVATE Eigen3::Eigen)
target_compile_options(dltrain PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
# dltrain never reads errno after math calls; without this GCC will not vectorise sqrt
# (the Adam update, normalisation layers).
target_compile_options(dltrain PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fno-math-errno>)
if(DLTRAIN_NATIVE)
  target_compile_options(dltrain PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
  set(DLTRAIN_BUILD_CPU_ARCH native)
elseif(DLTRAIN_CPU_ARCH)
  target_compile_options(dltrain PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=${DLTRAIN_CPU_ARCH}>)
  set(DLTRAIN_BUILD_CPU_ARCH ${DLTRAIN_CPU_ARCH})
else()
  set(DLTRAIN_BUILD_CPU_ARCH default)
endif()
# dltrain::build_info(): what this build has, readable at run time (src/core/build_info.cpp
# only, so that changing them recompiles one file).
set(DLTRAIN_CUDA_ARCHITECTURES_USED "")
if(DLTRAIN_WITH_CUDA)
  set(DLTRAIN_CUDA_ARCHITECTURES_USED "${DLTRAIN_CUDA_ARCHITECTURES}")
endif()
string(REPLACE ";" "," _dltrain_cuda_archs "${DLTRAIN_CUDA_ARCHITECTURES_USED}")
set_property(SOURCE ${PROJECT_SOURCE_DIR}/src/core/build_info.cpp APPEND PROPERTY
  COMPILE_DEFINITIONS DLTRAIN_BUILD_CPU_ARCH="${DLTRAIN_BUILD_CPU_ARCH}"
  DLTRAIN_BUILD_CUDA_ARCHS="${_dltrain_cuda_archs}" DLTRAIN_BUILD_TYPE="${CMAKE_BUILD_TYPE}")
# Eigen's own OpenMP threading is off: dltrain splits work on its own pool.
target_compile_definitions(dltrain PRIVATE EIGEN_DONT_PARALLELIZE)
if(DLTRAIN_WITH_HDF5)
  # dltrain::hdf5 (cmake/FindDltrainHDF5.cmake) rather than HDF5::HDF5 or plain paths: the
  # installed package finds libhdf5 again by name on the consumer's machine (no absolute path
  # recorded, no FindHDF5 compiler probe that needs the C language). Hinted with what FindHDF5
  # found, so both agree.
  set(DltrainHDF5_HINT_INCLUDE_DIRS ${HDF5_C_INCLUDE_DIRS} ${HDF5_INCLUDE_DIRS})
  set(DltrainHDF5_HINT_LIBRARY_DIRS "")
  foreach(_lib IN LISTS HDF5_C_LIBRARIES)
    if(_lib MATCHES "hdf5[^/]*$")
      get_filename_component(_dir "${_lib}" DIRECTORY)
      list(APPEND DltrainHDF5_HINT_LIBRARY_DIRS "${_dir}")
    endif()
  endforeach()
  find_package(DltrainHDF5 REQUIRED)
  target_compile_definitions(dltrain PRIVATE DLTRAIN_WITH_HDF5=1 ${HDF5_C_DEFINITIONS})
  target_link_libraries(dltrain PRIVATE dltrain::hdf5)
endif()
if(DLTRAIN_WITH_JPEG)
  target_compile_definitions(dltrain PRIVATE DLTRAIN_WITH_JPEG=1)
  target_link_libraries(dltrain PRIVATE TurboJPEG::turbojpeg)
  # libjpeg(-turbo)'s own API decodes only the rows a crop needs (TurboJPEG 2.1 cannot).
  find_package(JPEG QUIET)
  if(JPEG_FOUND)
    set(DLTRAIN_WITH_LIBJPEG ON)
    target_compile_definitions(dltrain PRIVATE DLTRAIN_WITH_LIBJPEG=1)
    target_link_libraries(dltrain PRIVATE JPEG::JPEG)
  endif()
endif()
if(DLTRAIN_WITH_DNNL)
  # oneDNN runs on libgomp; the thread pool (src/core/parallel.cpp, its only OpenMP pragma) is
  # compiled with -fopenmp so dltrain's kernels run on the same OpenMP threads as oneDNN's.
  set_source_files_properties(${PROJECT_SOURCE_DIR}/src/core/parallel.cpp
                              PROPERTIES COMPILE_OPTIONS "${OpenMP_CXX_FLAGS}")
  target_compile_definitions(dltrain PRIVATE DLTRAIN_WITH_DNNL=1)
  # dltrain::dnnl rather than DNNL::dnnl in the link interface, so that the installed package
  # says what it is: the libdnnl.so.N installed beside dltrain, or oneDNN's own package found
  # again by name (cmake/dltrainConfig.cmake.in).
  add_library(dltrain::dnnl INTERFACE IMPORTED)
  set_target_properties(dltrain::dnnl PROPERTIES INTERFACE_LINK_LIBRARIES DNNL::dnnl)
  # Link-only: libgomp for the consumers' link line, no -fopenmp for dltrain's other sources.
  target_link_libraries(dltrain PRIVATE dltrain::dnnl $<LINK_ONLY:OpenMP::OpenMP_CXX>)
  if(DLTRAIN_SHARED AND DLTRAIN_DNNL_BUNDLED)
    # The installed libdltrain.so finds the libdnnl.so.N installed beside it.
    set_property(TARGET dltrain PROPERTY INSTALL_RPATH "$ORIGIN")
  elseif(DLTRAIN_SHARED)
    # ... or where it is: CMAKE_INSTALL_RPATH_USE_LINK_PATH leaves out directories inside the
    # project (.deps/onednn/lib with -DDLTRAIN_INSTALL_DNNL=OFF).
    get_filename_component(_dltrain_dnnl_dir "${_dltrain_dnnl_file}" DIRECTORY)
    set_property(TARGET dltrain APPEND PROPERTY INSTALL_RPATH "${_dltrain_dnnl_dir}")
  endif()
endif()
if(DLTRAIN_WITH_MPI)
  # Plain paths rather than MPI::MPI_C (as for HDF5): the installed package then needs no
  # find_package(MPI COMPONENTS C), which would require consumers to enable the C language.
  # dltrain::mpi (cmake/FindDltrainMPI.cmake): found by name again where the package is used.
  set(DltrainMPI_HINT_INCLUDE_DIRS ${MPI_C_INCLUDE_DIRS})
  set(DltrainMPI_HINT_LIBRARY_DIRS "")
  foreach(_lib IN LISTS MPI_C_LIBRARIES)
    get_filename_component(_dir "${_lib}" DIRECTORY)
    list(APPEND DltrainMPI_HINT_LIBRARY_DIRS "${_dir}")
  endforeach()
  find_package(DltrainMPI REQUIRED)
  target_compile_definitions(dltrain PRIVATE DLTRAIN_WITH_MPI=1)
  target_include_directories(dltrain SYSTEM PRIVATE ${MPI_C_INCLUDE_DIRS})
  target_compile_options(dltrain PRIVATE ${MPI_C_COMPILE_OPTIONS})
  target_link_libraries(dltrain PRIVATE dltrain::mpi)
endif()
if(DLTRAIN_WITH_NCCL)
  target_compile_definitions(dltrain PRIVATE DLTRAIN_WITH_NCCL=1)
  target_link_libraries(dltrain PRIVATE NCCL::nccl)
endif()
if(DLTRAIN_WITH_ZLIB)
  target_compile_definitions(dltrain PRIVATE DLTRAIN_WITH_ZLIB=1)
  target_link_libraries(dltrain PRIVATE ZLIB::ZLIB)
endif()
# Header-only: BUILD_INTERFACE keeps it out of the exported link interface of the static library.
target_link_libraries(dltrain PRIVATE $<BUILD_INTERFACE:nlohmann_json::nlohmann_json>)
if(DLTRAIN_WITH_PROTOBUF)
  # The few TensorBoard messages (src/train/proto/tensorboard.proto), lite runtime. Generated
  # here rather than in src/train/CMakeLists.txt: CMake attaches a custom command's rule only to
  # targets of the directory that defines it, and the library target is defined here.
  set(DLTRAIN_PROTO_OUT ${PROJECT_BINARY_DIR}/proto)
  file(MAKE_DIRECTORY ${DLTRAIN_PROTO_OUT})
  add_custom_command(
    OUTPUT ${DLTRAIN_PROTO_OUT}/tensorboard.pb.cc ${DLTRAIN_PROTO_OUT}/tensorboard.pb.h
    COMMAND ${Protobuf_PROTOC_EXECUTABLE} --cpp_out=${DLTRAIN_PROTO_OUT}
            -I ${PROJECT_SOURCE_DIR}/src/train/proto tensorboard.proto
    DEPENDS ${PROJECT_SOURCE_DIR}/src/train/proto/tensorboard.proto
    COMMENT "protoc: the TensorBoard event messages" VERBATIM)
  target_sources(dltrain PRIVATE ${DLTRAIN_PROTO_OUT}/tensorboard.pb.cc
                                 ${DLTRAIN_PROTO_OUT}/tensorboard.pb.h)
  # C++ only: nvcc takes its include list from a response file that ccache hashes as it is, so
  # this build-tree path made every CUDA object a miss in a second tree (the shared-library
  # check of scripts/test.sh recompiled all kernels); the kernels do not include the messages.
  target_include_directories(dltrain SYSTEM PRIVATE
                             $<$<COMPILE_LANGUAGE:CXX>:${DLTRAIN_PROTO_OUT}>)
  target_compile_definitions(dltrain PRIVATE DLTRAIN_WITH_PROTOBUF=1)
  target_link_libraries(dltrain PRIVATE protobuf::libprotobuf-lite ISAL::isal)
endif()
if(DLTRAIN_WITH_ONNX)
  # ONNX's ModelProto messages (io::export_onnx's writer, src/io/onnx_write.cpp), generated from
  # the system's onnx.proto into the TensorBoard messages' folder; the same lite runtime.
  add_custom_command(
    OUTPUT ${DLTRAIN_PROTO_OUT}/onnx/onnx.pb.cc ${DLTRAIN_PROTO_OUT}/onnx/onnx.pb.h
    COMMAND ${Protobuf_PROTOC_EXECUTABLE} --cpp_out=${DLTRAIN_PROTO_OUT}
            -I ${DLTRAIN_ONNX_PROTO_DIR} onnx/onnx.proto
    DEPENDS ${DLTRAIN_ONNX_PROTO_DIR}/onnx/onnx.proto
    COMMENT "protoc: ONNX's ModelProto messages" VERBATIM)
  target_sources(dltrain PRIVATE ${DLTRAIN_PROTO_OUT}/onnx/onnx.pb.cc
                                 ${DLTRAIN_PROTO_OUT}/onnx/onnx.pb.h)
endif()
if(DLTRAIN_WITH_PNG)
  target_compile_definitions(dltrain PRIVATE DLTRAIN_WITH_PNG=1)
  target_link_libraries(dltrain PRIVATE PNG::PNG)
endif()
if(DLTRAIN_WITH_CUDA)
  target_compile_definitions(dltrain PUBLIC DLTRAIN_WITH_CUDA=1)
  target_link_libraries(dltrain PRIVATE ${DLTRAIN_CUDART} CUDA::cublasLt CUDA::cublas)
  # NVTX3 (src/backend/cuda/trace.cpp) is header-only and dlopen()s a profiler's injection library.
  target_link_libraries(dltrain PRIVATE ${CMAKE_DL_LIBS})
  if(NOT CUDNN_FOUND)
    message(FATAL_ERROR "The CUDA backend needs cuDNN (convolution, batch norm, pooling): install "
                        "cuDNN 9 or set CUDNN_ROOT, or configure with -DDLTRAIN_CUDA=OFF")
  endif()
  if(CUDNN_VERSION AND CUDNN_VERSION VERSION_LESS 9)
    message(FATAL_ERROR "The CUDA backend needs cuDNN 9 or newer (its conv/batch-norm calls use "
                        "the cuDNN 9 API), but found cuDNN ${CUDNN_VERSION} at ${CUDNN_INCLUDE_DIR}; "
                        "install cuDNN 9 or point CUDNN_ROOT at one, or configure with -DDLTRAIN_CUDA=OFF")
  endif()
  target_link_libraries(dltrain PRIVATE CUDNN::cudnn)
  set_target_properties(dltrain PROPERTIES CUDA_ARCHITECTURES "${DLTRAIN_CUDA_ARCHITECTURES}")
endif()

