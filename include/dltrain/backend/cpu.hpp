// dltrain::cpu: switches of the CPU backend.
//
// With oneDNN built in (DLTRAIN_DNNL), f32 and bf16 convolutions run through it, in the
// input's own layout (NCHW or channels-last); without it, or switched off, they use dltrain's
// im2col + Eigen GEMM path, which also serves f64 and f16. Conversions between f32 and f16
// (to(), copy_, copy_scaled_) use the CPU's F16C instructions where it has them, chosen at run
// time, with the same results as the portable code.
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
/// The instruction set oneDNN's kernels use on this CPU, as oneDNN names it ("avx2",
/// "avx512_core", "avx512_core_bf16", "avx512_core_amx", ...; capped by the environment
/// variable ONEDNN_MAX_CPU_ISA), or "" without oneDNN. bf16 convolutions take oneDNN from
/// "avx512_core" on; below it they use the im2col path.
const char* dnnl_isa();

/// True when this CPU has F16C (and AVX), which the f32 <-> f16 conversions use.
bool f16c_supported();
/// True when the f32 <-> f16 conversions use F16C now (supported, and not switched off by
/// DLTRAIN_F16C=0 or set_f16c_enabled(false)). Results are the same bits either way.
bool f16c_enabled();
/// Turns the F16C conversion loops on or off for the whole process (benchmarks, tests
/// comparing the two). Turning it on where the CPU lacks F16C does nothing.
void set_f16c_enabled(bool on);

}  // namespace dltrain::cpu
