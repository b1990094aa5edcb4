// Library version.
#pragma once

namespace dltrain {
/// "major.minor.patch"
inline constexpr const char* kVersion = "0.1.0";
}  // namespace dltrain
