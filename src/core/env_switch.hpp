// Default-on switches read from the environment (internal header): DLTRAIN_DNNL,
// DLTRAIN_F16C, DLTRAIN_DNNL_NCHW_BLOCKED, DLTRAIN_DNNL_CL_BWD_BLOCKED, DLTRAIN_MALLOC_TUNING.
#pragma once

#include <cstdlib>
#include <cstring>

namespace dltrain::detail {

/// False when the environment variable `name` is set to 0, OFF or off; true otherwise (unset
/// included). Callers read it once and cache the answer.
inline bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return !(v &&
           (std::strcmp(v, "0") == 0 || std::strcmp(v, "OFF") == 0 || std::strcmp(v, "off") == 0));
}

}  // namespace dltrain::detail
