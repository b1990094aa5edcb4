// Batched matrix products on cuBLASLt (see blas.hpp).
//
// Row-major C = A x B is computed as the column-major product C^T = B^T x A^T, so the
// output needs no transpose: a row-major operand is, read column-major, already its own
// transpose (op N), a column-major one (a transposed view) takes op T. Per (device, dtype,
// TF32 flag, sizes, ops, leading dims, batch strides, pointer alignments, bias mode) one
// cache entry holds the matmul descriptor, the layouts and the heuristic's first algorithm
// for a workspace of at most kMaxWorkspace; entries are created once, under the cache lock,
// and never change afterwards, except the bias pointer of an epilogue entry, which is set
// and used under the entry's own lock. The bias is fused as CUBLASLT_EPILOGUE_BIAS when the
// heuristic offers an algorithm for it; otherwise the output is pre-filled with the
// broadcast bias and the product accumulated onto it (beta = 1). The workspace comes from
// the device's stream-ordered pool for each call.
#include "src/backend/cuda/blas.hpp"

#include <climits>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "dltrain/backend/cuda.hpp"
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/elementwise.hpp"
#include "src/backend/cuda/handles.hpp"
#include "src/backend/cuda/lib_check.hpp"
#include "src/backend/cuda/runtime.hpp"

namespace dltrain::backend::cuda {

namespace {

constexpr uint64_t kMaxWorkspace = 32ull << 20;

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f64:
      return CUDA_R_64F;
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      DLTRAIN_FAIL("gemm on CUDA: expected a floating dtype (f32, f64, f16, bf16) but got ", t);
  }
}

// One product operand X [batch, r, c] as a stored column-major cuBLASLt matrix whose op is
// X^T (see the file comment).
struct Operand {
  Tensor t;  // the tensor passed to cuBLASLt (X itself or a contiguous copy)
  cublasOperation_t op = CUBLAS_OP_N;
  uint64_t rows = 0, cols = 0;  // of the stored matrix
  int64_t ld = 0, batch_stride = 0;
};

Operand make_operand(const Tensor& x) {
  const int64_t r = x.size(1), c = x.size(2), s0 = x.stride(1), s1 = x.stride(2);
  Operand o;
  const bool row_major = (c <= 1 || s1 == 1) && (r <= 1 || s0 >= std::max<int64_t>(c, 1));
  const bool col_major = (r <= 1 || s0 == 1) && (c <= 1 || s1 >= std::max<int64_t>(r, 1));
  o.t = x;
  if (row_major) {
    o.op = CUBLAS_OP_N;
    o.rows = static_cast<uint64_t>(c);
    o.cols = static_cast<uint64_t>(r);
    o.ld = r <= 1 ? std::max<int64_t>(c, 1) : s0;
  } else if (col_major) {
    o.op = CUBLAS_OP_T;
    o.rows = static_cast<uint64_t>(r);
    o.cols = static_cast<uint64_t>(c);
    o.ld = c <= 1 ? std::max<int64_t>(r, 1) : s1;
  } else {
    o.t = x.contiguous();
    o.op = CUBLAS_OP_N;
    o.rows = static_cast<uint64_t>(c);
    o.cols = static_cast<uint64_t>(r);
    o.ld = std::max<int64_t>(c, 1);
  }
  o.batch_stride = x.size(0) > 1 ? o.t.stride(0) : 0;
  return o;
}

enum class BiasMode : int64_t { None = 0, Epilogue = 1, Prefill = 2 };

struct Entry {
  bool found = false;  // the heuristic offered an algorithm
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  std::mutex mu;  // guards the bias pointer of an epilogue entry between set and launch
};

struct Cache {
  std::mutex mu;
  std::map<std::vector<int64_t>, std::unique_ptr<Entry>> entries;
};
Cache& cache() {
  static auto* c = new Cache;  // process lifetime: entries hold library descriptors
  return *c;
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld,
                                   int64_t batch, int64_t batch_stride) {
  cublasLtMatrixLayout_t l = nullptr;
  DLTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    DLTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                          &count, sizeof(count)));
    DLTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride, sizeof(batch_stride)));
  }
  return l;
}

struct Problem {
  int dev;
  DType dtype;
  bool tf32;
  int64_t B, n, m, k;
  const Operand* la;  // from the product's right operand b: op(la) is [m, k]
  const Operand* lb;  // from the product's left operand a: op(lb) is [k, n]
  uint32_t align_a, align_b, align_d, align_bias;
  BiasMode bias;
  const void* bias_ptr;
};

std::vector<int64_t> key_of(const Problem& p) {
  return {p.dev,
          static_cast<int64_t>(p.dtype),
          p.tf32,
          p.B,
          p.n,
          p.m,
          p.k,
          static_cast<int64_t>(p.la->op),
          static_cast<int64_t>(p.lb->op),
          p.la->ld,
          p.lb->ld,
          p.la->batch_stride,
          p.lb->batch_stride,
          p.align_a,
          p.align_b,
          p.align_d,
          p.align_bias,
          static_cast<int64_t>(p.bias)};
}

// Builds the descriptors and asks the heuristic for an algorithm (entry->found says whether
// it offered one).
void build(Entry& e, const Problem& p) {
  const cudaDataType_t type = cuda_type(p.dtype);
  const bool dbl = p.dtype == DType::f64;
  const cublasComputeType_t compute = dbl ? CUBLAS_COMPUTE_64F
                                      : (p.dtype == DType::f32 && p.tf32)
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  const cudaDataType_t scale = dbl ? CUDA_R_64F : CUDA_R_32F;
  DLTRAIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&e.desc, compute, scale));
  const cublasOperation_t ta = p.la->op, tb = p.lb->op;
  DLTRAIN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  DLTRAIN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (p.bias == BiasMode::Epilogue) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    DLTRAIN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    DLTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &p.bias_ptr, sizeof(p.bias_ptr)));
  }
  e.la = make_layout(type, p.la->rows, p.la->cols, p.la->ld, p.B, p.la->batch_stride);
  e.lb = make_layout(type, p.lb->rows, p.lb->cols, p.lb->ld, p.B, p.lb->batch_stride);
  e.ld = make_layout(type, static_cast<uint64_t>(p.m), static_cast<uint64_t>(p.n), p.m, p.B,
                     p.n * p.m);

  cublasLtMatmulPreference_t pref = nullptr;
  DLTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
  } pref_guard{pref};
  const uint64_t ws = kMaxWorkspace;
  DLTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t aligns[4] = {p.align_a, p.align_b, p.align_d, p.align_d};
  const cublasLtMatmulPreferenceAttributes_t which[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i)
    DLTRAIN_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, which[i], &aligns[i], sizeof(aligns[i])));

  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      cublaslt_handle(p.dev), e.desc, e.la, e.lb, e.ld, e.ld, pref, 1, &result, &returned);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && returned == 0)) {
    e.found = false;
    return;
  }
  DLTRAIN_CUBLAS_CHECK(st);
  DLTRAIN_CUBLAS_CHECK(result.state);
  e.found = true;
  e.algo = result.algo;
  e.workspace = result.workspaceSize;
}

Entry& entry_for(const Problem& p) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  std::unique_ptr<Entry>& slot = c.entries[key_of(p)];
  if (!slot) {
    auto e = std::make_unique<Entry>();
    build(*e, p);
    slot = std::move(e);
  }
  return *slot;
}

void launch(Entry& e, const Problem& p, const Tensor& out, double beta) {
  const int dev = p.dev;
  Tensor ws;
  if (e.workspace > 0)
    ws = empty({static_cast<int64_t>(e.workspace)},
               TensorOptions(DType::u8).with_device(out.device()));
  void* ws_ptr = e.workspace > 0 ? ws.data_ptr() : nullptr;
  const float alpha_f = 1.0f, beta_f = static_cast<float>(beta);
  const double alpha_d = 1.0, beta_d = beta;
  const bool dbl = p.dtype == DType::f64;
  const void* alpha = dbl ? static_cast<const void*>(&alpha_d) : &alpha_f;
  const void* betap = dbl ? static_cast<const void*>(&beta_d) : &beta_f;
  void* d = out.data_ptr();
  std::unique_lock<std::mutex> lock(e.mu, std::defer_lock);
  if (p.bias == BiasMode::Epilogue) {
    lock.lock();
    DLTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &p.bias_ptr, sizeof(p.bias_ptr)));
  }
  DLTRAIN_CUBLAS_CHECK(cublasLtMatmul(cublaslt_handle(dev), e.desc, alpha, p.la->t.data_ptr(), e.la,
                                      p.lb->t.data_ptr(), e.lb, betap, d, e.ld, d, e.ld, &e.algo,
                                      ws_ptr, e.workspace, stream(dev)));
}

}  // namespace

void gemm(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  DLTRAIN_CHECK(out.device().is_cuda() && a.device() == out.device() &&
                    b.device() == out.device() &&
                    (!bias.defined() || bias.device() == out.device()),
                "gemm on CUDA: expected every operand on ", out.device(), " but got ", a.device(),
                " and ", b.device());
  DLTRAIN_CHECK(
      a.dim() == 3 && b.dim() == 3 && out.dim() == 3 && a.size(0) == b.size(0) &&
          a.size(0) == out.size(0) && a.size(2) == b.size(1) && out.size(1) == a.size(1) &&
          out.size(2) == b.size(2) && out.is_contiguous(),
      "gemm on CUDA: expected a [B, n, k], b [B, k, m] and a contiguous out [B, n, m] but "
      "got ",
      shape_str(a.shape()), ", ", shape_str(b.shape()), " and ", shape_str(out.shape()));
  DLTRAIN_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype() &&
                    (!bias.defined() || bias.dtype() == out.dtype()),
                "gemm on CUDA: operands must share one dtype but got ", a.dtype(), ", ", b.dtype(),
                " and ", out.dtype());
  DLTRAIN_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == out.size(2)),
                "gemm on CUDA: bias must be [", out.size(2), "] but got ",
                bias.defined() ? shape_str(bias.shape()) : std::string());
  const int64_t B = a.size(0), n = a.size(1), k = a.size(2), m = b.size(2);
  if (B == 0 || n == 0 || m == 0) return;
  const int dev = out.device().index;
  Guard g(dev);
  if (k == 0) {  // an empty sum: zeros, plus the bias
    fill(out.data_ptr(), out.dtype(), out.numel(), 0.0, out.device());
    if (bias.defined()) copy(out, bias);
    return;
  }
  DLTRAIN_CHECK(B <= INT_MAX, "gemm on CUDA: a batch of ", B,
                " matrices exceeds cuBLASLt's limit of 2^31-1; split it");
  (void)cuda_type(out.dtype());

  Operand la = make_operand(b), lb = make_operand(a);
  Problem p{dev,
            out.dtype(),
            dltrain::cuda::allow_tf32(),
            B,
            n,
            m,
            k,
            &la,
            &lb,
            address_alignment(la.t.data_ptr()),
            address_alignment(lb.t.data_ptr()),
            address_alignment(out.data_ptr()),
            0,
            BiasMode::None,
            nullptr};
  Tensor bias_c;
  if (bias.defined()) {
    bias_c = bias.contiguous();
    p.bias_ptr = bias_c.data_ptr();
    p.align_bias = address_alignment(p.bias_ptr);
    // An unaligned bias (a view into a larger buffer) is not worth an epilogue variant.
    if (p.align_bias >= 16) {
      p.bias = BiasMode::Epilogue;
      Entry& e = entry_for(p);
      if (e.found) {
        launch(e, p, out, 0.0);
        return;
      }
    }
    p.bias = BiasMode::Prefill;
    p.bias_ptr = nullptr;
    p.align_bias = 0;
  }
  Entry* e = &entry_for(p);
  if (!e->found) {
    // Retry once with dense copies in fresh (256-byte aligned) memory: views at odd offsets or
    // with odd strides can rule out every algorithm.
    la = make_operand(b.contiguous().clone());
    lb = make_operand(a.contiguous().clone());
    p.align_a = address_alignment(la.t.data_ptr());
    p.align_b = address_alignment(lb.t.data_ptr());
    e = &entry_for(p);
  }
  DLTRAIN_CHECK(e->found, "gemm on CUDA: cuBLASLt offers no algorithm for ", out.dtype(), " [", B,
                " x ", n, " x ", k, "] x [", k, " x ", m, "] (batch strides ", la.batch_stride,
                " and ", lb.batch_stride, ", alignments ", p.align_a, ", ", p.align_b, ", ",
                p.align_d, " bytes)");
  if (p.bias == BiasMode::Prefill) {
    copy(out, bias_c);  // broadcast [m] over [B, n, m]
    launch(*e, p, out, 1.0);
  } else {
    launch(*e, p, out, 0.0);
  }
}

}  // namespace dltrain::backend::cuda
