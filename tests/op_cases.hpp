// The op-case registry (issue 27): one list of op cases that every op test and every backend
// runs. A case is a small call of one public op (one mode of it: gelu's tanh form, a pooling
// kind, a loss reduction) with an input generator by seed, the inputs it differentiates, the
// dtypes and layouts it takes, and a tolerance model from its arithmetic. It drives:
//   - tests/ops/test_op_registry.cpp (CPU, CI): the f64 gradcheck (and gradgradcheck) of every
//     case, every case in every dtype and layout against the exact f64 result on the same
//     values, oneDNN against the native kernels, and the completeness checks (every public op
//     of include/dltrain/ops/*.hpp and every autocast policy row has a case or a reviewed
//     exclusion);
//   - tests/cuda/test_backend_ops.cpp ([backend_ops]): every case on CUDA against the CPU.
// Adding an op: add its case(s) to op_cases.cpp (the completeness test names what is missing).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dltrain/dltrain.hpp"

namespace dltrain::testing {

using CaseFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
/// The inputs of a case from a seed: floating inputs drawn in f64 and rounded to `dt` (so an f64
/// run of them is the exact reference of a dt run), integer/bool inputs as the op wants them, on
/// `dev`; 4-d activations laid out as `fmt`.
using MakeInputs =
    std::function<std::vector<Tensor>(uint64_t seed, DType dt, Device dev, MemoryFormat fmt)>;

/// How far a result may be from the exact result (the op in f64 on the same rounded inputs).
/// A result computed in the accumulation type (float for f32/f16/bf16: PyTorch's opmath rule;
/// double for f64) from K terms and rounded once to its dtype satisfies, element by element,
///   |got - exact| <= |round_dt(exact) - exact| + 2 * slack,
///   slack = cond * ((K + 2) * u_acc + roundings * u_dt) * S
/// (tests/rounding.hpp; Higham 3.1): u_acc, u_dt the unit roundoffs of the accumulation type and
/// of the dtype, S the scale of the terms (below). The "+ 2" covers the few roundings of the
/// per-element math (a product, a quotient, a libm call accurate to ~1 ulp).
/// Gradients come from autograd formulas that are themselves ops on tensors of the dtype (as in
/// PyTorch: g * exp(x) multiplies by the saved, rounded output; a broadcast operand's gradient
/// is a sum_to of rounded products), so for a gradient `roundings` grows by grad_terms + 2: each
/// of its K terms and the formula's steps may round to the dtype. For f32 and f64 this changes
/// nothing that matters (u_dt = u_acc); for 16-bit dtypes it is the honest bound.
struct Tolerance {
  /// K: the most terms summed into one output element (a reduction's size, a GEMM's k...).
  int64_t terms = 1;
  /// The same for one element of an input's gradient (sums over broadcast or reduced dims).
  int64_t grad_terms = 1;
  /// Intermediate results stored in the dtype inside the op (composite ops built from several
  /// ops, each rounding to a 16-bit dtype), each a relative error of u_dt at scale S.
  int roundings = 0;
  /// Growth of relative errors through the op (cancellation: a variance, a softmax backward,
  /// a normalisation), the factor on the bound; stated and derived at each case.
  double cond = 1;
  /// S: true when the op is a sum of products of its floating inputs (multilinear: matmul,
  /// conv, pooling averages...): then S is, element by element, the same op on |inputs| (and
  /// |w| backward), which is exactly sum |t_i| of Higham's bound. False: S is max |exact| over
  /// the tensor (a normwise bound).
  bool multilinear = false;
};

struct OpCase {
  /// Unique, [a-z0-9_.] only (ctest splits test names on ';').
  std::string name{};
  /// The public op names this case covers ("add", "operator+").
  std::vector<std::string> ops{};
  CaseFn fn{};
  MakeInputs make_inputs{};
  /// Indices of the inputs the gradient checks differentiate (empty: forward only).
  std::vector<int> grad_inputs{};
  std::vector<DType> dtypes{DType::f32, DType::f16, DType::bf16, DType::f64};
  /// Has 4-d activations: also runs them channels-last.
  bool four_d = false;
  /// Runs gradgradcheck too (the op's backward is differentiable).
  bool higher_order = false;
  /// Has a oneDNN CPU path (src/backend/cpu/dnnl.*: conv, batch_norm, pooling, f32 GEMM).
  bool dnnl = false;
  Tolerance tol{};
  /// Why the f64 gradcheck does not apply (a gradient that is not the derivative by definition),
  /// or null. The other checks still compare its gradients with the reference's.
  const char* no_gradcheck = nullptr;
};

/// Every case, in a stable order.
const std::vector<OpCase>& op_cases();

/// A public op with no case, and why.
struct OpExclusion {
  const char* op;
  const char* reason;
};
/// Reviewed: ops that cannot be compared as a case.
const std::vector<OpExclusion>& op_exclusions();
/// Not yet covered: ops still owed a case (to be emptied, not grown).
const std::vector<OpExclusion>& op_not_yet_covered();

/// The floating inputs of `in` converted to f64 on the CPU (integer and bool inputs moved to
/// the CPU unchanged): the exact reference's inputs.
std::vector<Tensor> to_reference(const std::vector<Tensor>& in);

/// One run of a case: outputs and the gradients of its grad_inputs, as CPU f64 contiguous
/// tensors, with the dtypes they had.
struct CaseRun {
  std::vector<Tensor> out, grad;
  std::vector<DType> out_dtype, grad_dtype;
};
/// Runs c.fn on `in` (grad_inputs made leaves that require grad) and, when `backward`, the
/// backward of sum_k sum(out_k * w_k) over the floating outputs that require grad, w_k fixed
/// random (seed 1234 + k) rounded to out_k's dtype, or to w_dtypes[k] when given (a reference
/// run uses the w of the run it checks: w_dtypes = that run's out_dtype). abs_terms: |inputs| and
/// |w_k| (the scale run of a multilinear case).
CaseRun run_case(const OpCase& c, std::vector<Tensor> in, bool backward, bool abs_terms = false,
                 const std::vector<DType>* w_dtypes = nullptr);

/// The accumulation type's unit roundoff of dtype dt (f64: 2^-53, else 2^-24) and dt's own.
double acc_unit(DType dt);
double dtype_unit(DType dt);

/// Checks `got` (a run in dtype dt) against `exact` (the f64 run on the same values; `scale`
/// the abs run for multilinear cases, else unused) with the case's tolerance. Returns one line
/// per tensor beyond the bound (output or gradient, the worst element, its error and bound);
/// empty when all hold. Integer and bool outputs must be equal.
std::vector<std::string> check_run(const OpCase& c, const CaseRun& got, const CaseRun& exact,
                                   const CaseRun* scale);

/// The formats a case runs in: contiguous, and channels-last when it has 4-d inputs.
std::vector<MemoryFormat> case_formats(const OpCase& c);
const char* format_name(MemoryFormat f);

}  // namespace dltrain::testing
