// The checkpoint integrity header: src/io/verified_header.cpp's header with the checkpoint
// magic and the advice that fits checkpoints (an older rotated file, or a good copy).
#include "src/io/checkpoint_header.hpp"

namespace dltrain::io::detail {

namespace {
HeaderKind checkpoint_kind(const std::string& path) {
  return {kCheckpointMagic,
          "checkpoint",
          "write_checkpoint",
          "read_checkpoint",
          "use an older checkpoint ('" + path + ".1', ...) or a good copy",
          /*weights_hint=*/true};
}
}  // namespace

void stamp_checkpoint_header(const std::string& path, int64_t format_version) {
  stamp_verified_header(path, checkpoint_kind(path), format_version);
}

std::optional<int64_t> verify_checkpoint_header(const std::string& path) {
  return verify_header(path, checkpoint_kind(path));
}

}  // namespace dltrain::io::detail
