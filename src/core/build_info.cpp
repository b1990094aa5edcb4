// dltrain::build_info(): the build's options, from the definitions CMake gives this file.
#include "dltrain/core/build_info.hpp"

#include "dltrain/version.hpp"

#ifndef DLTRAIN_BUILD_CPU_ARCH
#define DLTRAIN_BUILD_CPU_ARCH "unknown"
#endif
#ifndef DLTRAIN_BUILD_CUDA_ARCHS
#define DLTRAIN_BUILD_CUDA_ARCHS ""
#endif
#ifndef DLTRAIN_BUILD_TYPE
#define DLTRAIN_BUILD_TYPE ""
#endif

namespace dltrain {

namespace {

constexpr bool defined_cuda() {
#ifdef DLTRAIN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

BuildInfo make() {
  BuildInfo b;
  b.version = kVersion;
  b.cuda = defined_cuda();
#ifdef DLTRAIN_WITH_NCCL
  b.nccl = true;
#endif
#ifdef DLTRAIN_WITH_MPI
  b.mpi = true;
#endif
#ifdef DLTRAIN_WITH_HDF5
  b.hdf5 = true;
#endif
#ifdef DLTRAIN_WITH_JPEG
  b.jpeg = true;
#endif
#ifdef DLTRAIN_WITH_DNNL
  b.dnnl = true;
#endif
#ifdef DLTRAIN_WITH_ZLIB
  b.zlib = true;
#endif
#ifdef DLTRAIN_WITH_PROTOBUF
  b.protobuf = true;
#endif
#ifdef DLTRAIN_WITH_PNG
  b.png = true;
#endif
  b.cuda_architectures = DLTRAIN_BUILD_CUDA_ARCHS;
  b.cpu_arch = DLTRAIN_BUILD_CPU_ARCH;
  b.build_type = DLTRAIN_BUILD_TYPE;
#if defined(__clang__)
  b.compiler = "Clang " __clang_version__;
#elif defined(__GNUC__)
  b.compiler = "GCC " __VERSION__;
#else
  b.compiler = "unknown compiler";
#endif
  return b;
}

}  // namespace

std::string BuildInfo::str() const {
  std::string s = "dltrain " + version + " (" + (build_type.empty() ? "" : build_type + ", ") +
                  compiler + ", cpu arch " + cpu_arch + "):";
  auto item = [&s](const char* name, bool on) {
    s += std::string(" ") + name + (on ? " on," : " off,");
  };
  item("CUDA", cuda);
  if (cuda) s.insert(s.size() - 1, " [" + cuda_architectures + "]");
  item("NCCL", nccl);
  item("MPI", mpi);
  item("oneDNN", dnnl);
  item("HDF5", hdf5);
  item("TurboJPEG", jpeg);
  item("zlib", zlib);
  item("protobuf", protobuf);
  item("PNG", png);
  s.pop_back();
  return s;
}

const BuildInfo& build_info() {
  static const BuildInfo info = make();
  return info;
}

}  // namespace dltrain
