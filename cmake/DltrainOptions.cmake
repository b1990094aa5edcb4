# dltrain's build options and compiler settings (included by the root CMakeLists.txt before
# anything is probed): what a user sets with -D, and the flags every target gets.
set(DLTRAIN_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO (when nvcc is found), ON, OFF")
set_property(CACHE DLTRAIN_CUDA PROPERTY STRINGS AUTO ON OFF)
option(DLTRAIN_MPI "Build MPI process groups when MPI is found" ON)
set(DLTRAIN_DNNL AUTO CACHE STRING "oneDNN CPU convolutions: AUTO (when found), ON, OFF")
set_property(CACHE DLTRAIN_DNNL PROPERTY STRINGS AUTO ON OFF)
option(DLTRAIN_HDF5 "Build HDF5 checkpoints when HDF5 is found" ON)
option(DLTRAIN_JPEG "Build JPEG decoding when TurboJPEG is found" ON)
option(DLTRAIN_PROTOBUF "Build the TensorBoard event-file sink when protobuf and ISA-L are found" ON)
option(DLTRAIN_BUILD_TESTS "Build the Catch2 tests" ON)
option(DLTRAIN_BUILD_EXAMPLES "Build the examples" ON)
option(DLTRAIN_BUILD_BENCHMARKS "Build the benchmarks" ON)
option(DLTRAIN_BUILD_TOOLS "Build the command-line tools (tools/)" ON)
# libdltrain.so instead of libdltrain.a; BUILD_SHARED_LIBS, when set, gives the default.
if(DEFINED BUILD_SHARED_LIBS AND BUILD_SHARED_LIBS)
  option(DLTRAIN_SHARED "Build libdltrain as a shared library (libdltrain.so)" ON)
else()
  option(DLTRAIN_SHARED "Build libdltrain as a shared library (libdltrain.so)" OFF)
endif()
# Portable by default: a library built on a login node must run on every compute node.
# DLTRAIN_NATIVE=ON (-march=native) is for a build that runs where it is built (scripts/test.sh,
# the benchmarks); DLTRAIN_CPU_ARCH names a tuned target instead (-march=x86-64-v3 for AVX2
# nodes, -march=sapphirerapids, -march=znver4, ...). oneDNN dispatches on the CPU at run time
# either way.
option(DLTRAIN_NATIVE "Optimise for the build machine's CPU (-march=native)" OFF)
set(DLTRAIN_CPU_ARCH "" CACHE STRING
    "-march value for the CPU kernels when DLTRAIN_NATIVE is OFF (e.g. x86-64-v3); empty: the compiler's default")
# Empty: V100 (sm_70, with CUDA < 13), T4 (sm_75, the oldest CUDA 13 compiles for), A100, and
# H100 with PTX for newer GPUs (chosen once nvcc's version is known, below).
set(DLTRAIN_CUDA_ARCHITECTURES "" CACHE STRING
    "CUDA architectures to build for (CMake syntax, e.g. 80;90); empty: 70/75-real;80-real;90")
set(DLTRAIN_SANITIZE "" CACHE STRING
    "Sanitizers for every target (-fsanitize=...): e.g. address,undefined or thread; empty: none")
option(DLTRAIN_FUZZ "Build the libFuzzer targets (tests/fuzz/); needs clang" OFF)

if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE Release CACHE STRING "Build type" FORCE)
endif()
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
# __FILE__ (CUDA error checks, asserts) relative to the source tree, in host and device code:
# installed binaries then name no build checkout (tests/install/check_install.sh greps them),
# and one commit built in two places gives the same strings.
add_compile_options(
  $<$<COMPILE_LANGUAGE:C,CXX>:-fmacro-prefix-map=${CMAKE_SOURCE_DIR}/=>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fmacro-prefix-map=${CMAKE_SOURCE_DIR}/=>)

if(DLTRAIN_SANITIZE)
  # Whole-build instrumentation (scripts/sanitize.sh): the library, the tests and the tools.
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${DLTRAIN_SANITIZE}>
                      $<$<COMPILE_LANGUAGE:C,CXX>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize-recover=all>)
  add_link_options(-fsanitize=${DLTRAIN_SANITIZE})
endif()
if(DLTRAIN_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "DLTRAIN_FUZZ=ON needs clang (libFuzzer): configure with "
                        "CXX=clang++-14 CC=clang-14, or -DDLTRAIN_FUZZ=OFF")
  endif()
  # Coverage feedback everywhere; only the fuzz targets link libFuzzer's main.
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>)
endif()

find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
endif()

