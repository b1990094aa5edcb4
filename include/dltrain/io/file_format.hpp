// What kind of file a path holds, told from its first bytes, never from its name: the
// loaders use it to say "this is an HDF5 file, not safetensors" instead of a parse error,
// and tools such as dltrain-convert pick the reader with it.
#pragma once

#include <string>

namespace dltrain::io {

/// The file kinds dltrain reads or recognises.
enum class FileFormat {
  /// A dltrain checkpoint with its integrity header ("dltrain ckpt" magic; io::read_checkpoint).
  Checkpoint,
  /// Another HDF5 file: a checkpoint written before integrity headers, or a packed image shard.
  Hdf5,
  /// torch.save's ZIP format (PyTorch >= 1.6; io::load_pth).
  TorchZip,
  /// torch.save's legacy pickle or tar format (PyTorch < 1.6), which dltrain does not read.
  TorchLegacy,
  /// safetensors (an 8-byte header length, then a JSON object; io::load_safetensors).
  Safetensors,
  /// None of the above (empty, text, gzip, an image, ...).
  Other,
};

/// The kind of file at `path`, from its content. Throws dltrain::Error when the file is
/// missing or unreadable.
FileFormat detect_file_format(const std::string& path);

/// A phrase for error messages: "a dltrain checkpoint (HDF5)", "a safetensors file", ...; for
/// FileFormat::Other it describes the content of `path` when given (empty, gzip, JPEG, PNG,
/// text, or its first bytes in hex).
std::string describe_file_format(FileFormat f, const std::string& path = "");

}  // namespace dltrain::io
