// CUDA entry points of GradScaler (internal header, no CUDA types; kernels in kernels/amp.cu,
// refusals from entry.hpp). Callers (src/amp/grad_scaler.cpp) group gradients by device and
// dtype and keep the scale, growth tracker, inverse scale and found-inf flag on the device:
// nothing here reads a value back to the host.
#pragma once

#include <cstdint>
#include <vector>

#include "dltrain/core/tensor.hpp"
#include "src/backend/cuda/entry.hpp"

namespace dltrain::backend::cuda {

/// PyTorch's _amp_foreach_non_finite_check_and_unscale_: for every tensor of `grads` (one
/// floating dtype, the device of `found_inf`, any layout), in place, g = g * inv_scale (g
/// itself when inv_scale == 1), computed in float (double for f64), and found_inf = 1 when any
/// element was inf or NaN. `found_inf` and `inv_scale` are 0-d f32 tensors on that device.
/// Dense gradients go through multi-tensor launches (one per table of up to 64 tensors /
/// 320 chunks of 64K elements), others through one strided launch each.
DLTRAIN_CUDA_ENTRY(void, amp_unscale,
                   (const std::vector<Tensor>& grads, const Tensor& found_inf,
                    const Tensor& inv_scale),
                   "GradScaler::unscale_ on CUDA gradients");

/// PyTorch's _amp_update_scale_ as one single-thread kernel on the device of `scale` (0-d f32),
/// `growth_tracker` (0-d i32) and `found_inf` (0-d f32): when found_inf > 0, scale *=
/// backoff_factor and the tracker resets; otherwise the tracker counts up and, on reaching
/// growth_interval, resets and scale *= growth_factor if that product is finite.
DLTRAIN_CUDA_ENTRY(void, amp_update_scale,
                   (const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                    double growth_factor, double backoff_factor, int64_t growth_interval),
                   "GradScaler::update with a scale on a CUDA device");

}  // namespace dltrain::backend::cuda
