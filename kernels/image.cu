// Image batch normalisation on the GPU: u8 [N, H, W, C] in (any strides), f32/f16/bf16
// [N, C, H, W] out, dense NCHW or channels-last, y = x * scale[c] + shift[c] in float, rounded
// once. One thread per output element in output memory order, so writes coalesce in either
// layout; the per-channel constants travel in the kernel parameters (no host sync, no copy).
#include "kernels/common.cuh"
#include "src/backend/cuda/image.hpp"

namespace dltrain::backend::cuda {

namespace {
constexpr int kMaxChannels = 64;

struct Affine {
  float scale[kMaxChannels];
  float shift[kMaxChannels];
};

struct Geometry {
  int64_t n, c, h, w;
  int64_t sn, sh, sw, sc;  // input strides (elements) of dims N, H, W, C
  bool channels_last;      // output layout
};

template <class T>
__global__ void normalize_kernel(T* out, const uint8_t* in, Geometry g, Affine a, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, h, w, r = i;
    if (g.channels_last) {
      c = r % g.c;
      r /= g.c;
      w = r % g.w;
      r /= g.w;
      h = r % g.h;
      n = r / g.h;
    } else {
      w = r % g.w;
      r /= g.w;
      h = r % g.h;
      r /= g.h;
      c = r % g.c;
      n = r / g.c;
    }
    const uint8_t v = in[n * g.sn + h * g.sh + w * g.sw + c * g.sc];
    out[i] = convert<T>(static_cast<float>(v) * a.scale[c] + a.shift[c]);
  }
}
}  // namespace

void normalize_image(const Tensor& out, const Tensor& in, const std::vector<float>& scale,
                     const std::vector<float>& shift) {
  const int64_t c = in.size(3);
  DLTRAIN_CHECK(c <= kMaxChannels, "to_float_batch: at most ", kMaxChannels,
                " channels on CUDA, got ", c);
  DLTRAIN_CHECK(in.device() == out.device(), "to_float_batch: output on ", out.device(),
                " but the batch is on ", in.device());
  Affine a{};
  for (int64_t k = 0; k < c; ++k) {
    a.scale[k] = scale[static_cast<size_t>(k)];
    a.shift[k] = shift[static_cast<size_t>(k)];
  }
  const bool cl = !out.is_contiguous() && out.is_contiguous(MemoryFormat::ChannelsLast);
  DLTRAIN_CHECK(cl || out.is_contiguous(), "to_float_batch: the output must be dense");
  const Geometry g{
      in.size(0),   c, in.size(1), in.size(2), in.stride(0), in.stride(1), in.stride(2),
      in.stride(3), cl};
  const int64_t total = out.numel();
  if (total == 0) return;
  const int dev = out.device().index;
  Guard guard(dev);
  cu_dispatch_floating(out.dtype(), "to_float_batch", [&]<class T>() {
    normalize_kernel<T><<<grid_for(total, 256, dev), 256, 0, stream(dev)>>>(
        static_cast<T*>(out.data_ptr()), static_cast<const uint8_t*>(in.data_ptr()), g, a, total);
  });
  DLTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dltrain::backend::cuda
