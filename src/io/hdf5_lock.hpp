// The one lock around every HDF5 call dltrain makes (checkpoints, packed image shards).
// Serial HDF5 builds are not thread-safe, and a checkpoint may be saved while loader
// workers read shards; one process-wide mutex keeps them apart. Decoding and other work
// on the data read happen outside it.
#pragma once

#include <mutex>

namespace dltrain::io {

/// The process-wide HDF5 mutex (inline: one instance across translation units).
inline std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace dltrain::io
