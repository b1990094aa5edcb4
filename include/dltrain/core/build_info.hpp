// What this build of dltrain has: optional backends and libraries, target architectures,
// compiler. The same facts the CMake package exports as DLTRAIN_WITH_* variables, readable by
// a program at run time (a job script can log them; a test can skip what is missing).
#pragma once

#include <string>

namespace dltrain {

struct BuildInfo {
  std::string version;             ///< kVersion
  bool cuda = false;               ///< CUDA backend (cuDNN, cuBLAS)
  bool nccl = false;               ///< NCCL process groups
  bool mpi = false;                ///< MPI process groups
  bool hdf5 = false;               ///< HDF5 checkpoints and packed shards
  bool jpeg = false;               ///< TurboJPEG decoding
  bool dnnl = false;               ///< oneDNN CPU convolution / norm / pooling
  bool zlib = false;               ///< gzip-compressed IDX files
  bool protobuf = false;           ///< TensorBoard event files
  bool png = false;                ///< PNG images (TensorBoard, example grids)
  std::string cuda_architectures;  ///< e.g. "75-real,80-real,90"; empty without CUDA
  std::string cpu_arch;            ///< "native", a -march value, or "default"
  std::string compiler;            ///< e.g. "GCC 12.2.0"
  std::string build_type;          ///< e.g. "Release"

  /// One line: "dltrain 0.1.0 (Release, GCC 12.2.0, cpu arch default): CUDA off, ...".
  std::string str() const;
};

/// The facts of the library this program is linked with.
const BuildInfo& build_info();

}  // namespace dltrain
