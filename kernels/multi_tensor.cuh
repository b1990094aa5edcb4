// Multi-tensor apply, shared by the fused optimizers (optim.cu) and GradScaler's unscale
// (amp.cu); internal header for kernels/*.cu.
//
// As PyTorch's multi_tensor_apply: the tensors of one call are cut into chunks of kChunk
// elements, one block per chunk, and a launch carries in its kernel parameters a table of up
// to kMaxT tensors (kDepth addresses each, sizes, two per-tensor coefficients) and, per block,
// which tensor and chunk it works on; a call needs as many launches as tables it fills (one
// for up to kMaxT tensors and kMaxBlocks chunks), and no device memory, copy or host sync.
// Every tensor is dense, and tensors addressed together (a parameter, its gradient and its
// state) share one layout, so element k of a chunk is the same logical element in all.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "dltrain/core/tensor.hpp"
#include "src/backend/cuda/check.hpp"
#include "src/core/layout.hpp"

namespace dltrain::backend::cuda::mta {

constexpr int64_t kChunk = 65536;
constexpr int kMaxBlocks = 320;
constexpr int kBlockThreads = 512;
constexpr int kMaxDepth = 5;

template <int kDepth, int kMaxT>
struct TensorTable {
  void* ptr[kDepth][kMaxT];
  int64_t numel[kMaxT];
  double c0[kMaxT];
  double c1[kMaxT];
  int32_t block_chunk[kMaxBlocks];
  uint8_t block_tensor[kMaxBlocks];
};

/// One tensor (and its companions) of a call.
struct Entry {
  void* ptr[kMaxDepth] = {};
  int64_t numel = 0;
  double c0 = 0, c1 = 0;
};

/// Fills tables from `entries` and calls launch(table, blocks, first_block) for each, where
/// first_block counts the blocks of the earlier launches of this call.
template <int kDepth, int kMaxT, class Launch>
void multi_tensor_apply(const std::vector<Entry>& entries, Launch&& launch) {
  static_assert(kMaxT <= 256 && kDepth <= kMaxDepth);
  TensorTable<kDepth, kMaxT> tt{};
  int nt = 0, nb = 0;
  int64_t first_block = 0;
  for (const Entry& e : entries) {
    if (e.numel == 0) continue;
    for (int d = 0; d < kDepth; ++d) tt.ptr[d][nt] = e.ptr[d];
    tt.numel[nt] = e.numel;
    tt.c0[nt] = e.c0;
    tt.c1[nt] = e.c1;
    ++nt;
    const int64_t chunks = (e.numel + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      tt.block_tensor[nb] = static_cast<uint8_t>(nt - 1);
      tt.block_chunk[nb] = static_cast<int32_t>(c);
      ++nb;
      const bool last_chunk = c == chunks - 1;
      if (nb == kMaxBlocks || (nt == kMaxT && last_chunk)) {
        launch(tt, nb, first_block);
        first_block += nb;
        nb = 0;
        if (last_chunk) {
          nt = 0;
        } else {  // the tensor goes on in the next table, in slot 0
          for (int d = 0; d < kDepth; ++d) tt.ptr[d][0] = tt.ptr[d][nt - 1];
          tt.numel[0] = tt.numel[nt - 1];
          tt.c0[0] = tt.c0[nt - 1];
          tt.c1[0] = tt.c1[nt - 1];
          nt = 1;
        }
      }
    }
  }
  if (nb > 0) launch(tt, nb, first_block);
}

inline int64_t chunks_of(int64_t n) { return (n + kChunk - 1) / kChunk; }

/// The chunk of this block: its tensor slot, first element and length.
template <class Table>
__device__ __forceinline__ int chunk_of(const Table& tt, int64_t& start, int64_t& n) {
  const int t = tt.block_tensor[blockIdx.x];
  start = static_cast<int64_t>(tt.block_chunk[blockIdx.x]) * kChunk;
  n = tt.numel[t] - start;
  if (n > kChunk) n = kChunk;
  return t;
}

inline void check_launch() { DLTRAIN_CUDA_CHECK(cudaGetLastError()); }

/// True when t's elements fill [data_ptr, data_ptr + numel) exactly once (any dim order).
inline bool dense(const Tensor& t) { return dltrain::detail::is_dense(t); }

/// Tensors grouped by dtype (order kept within a dtype), for one table per dtype.
inline std::map<DType, std::vector<const Tensor*>> by_dtype(const std::vector<Tensor>& ts) {
  std::map<DType, std::vector<const Tensor*>> out;
  for (const Tensor& t : ts) out[t.dtype()].push_back(&t);
  return out;
}

/// One depth-1 entry per tensor.
inline std::vector<Entry> list_entries(const std::vector<const Tensor*>& ts) {
  std::vector<Entry> es;
  for (const Tensor* t : ts) {
    Entry e;
    e.ptr[0] = t->data_ptr();
    e.numel = t->numel();
    es.push_back(e);
  }
  return es;
}

}  // namespace dltrain::backend::cuda::mta
