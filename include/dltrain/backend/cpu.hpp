// dltrain::cpu: switches of the CPU backend.
//
// With oneDNN built in (DLTRAIN_DNNL), f32 and bf16 convolutions run through it, in the
// input's own layout (NCHW or channels-last); without it, or switched off, they use dltrain's
// im2col + Eigen GEMM path, which also serves f64 and f16.
#pragma once

namespace dltrain::cpu {

/// True when this build has oneDNN.
bool dnnl_compiled();
/// True when convolutions use oneDNN now (built in, and not switched off by
/// DLTRAIN_DNNL=0 or set_dnnl_enabled(false)).
bool dnnl_enabled();
/// Turns the oneDNN path on or off for the whole process (benchmarks, tests comparing the
/// two paths). Turning it on in a build without oneDNN does nothing.
void set_dnnl_enabled(bool on);

}  // namespace dltrain::cpu
