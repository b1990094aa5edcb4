// oneDNN convolution, batch norm, pooling and float GEMM (see dnnl.hpp). One CPU engine for the
// process and one stream per thread; every call waits for its stream before returning, so tensors
// never outlive their use. oneDNN's OpenMP runtime is given dltrain's thread count before each
// primitive runs, so the two pools never use more threads than get_num_threads() (two ranks on
// two cores, one each).
//
// Primitive cache: creating a primitive descriptor walks oneDNN's implementation list (and a
// backward one first needs its forward hint), which costs far more than a small layer's
// execution; oneDNN's own cache only skips the primitive's JIT, not that walk. So each
// (operation, shapes, strides, dtypes, flags) key maps to its descriptor and primitive once,
// including the answer "oneDNN has no implementation" (then the op uses its own kernel).
// Primitives are immutable and may run concurrently on several threads.
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <atomic>
#include <bit>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "dltrain/backend/cpu.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/ops/reduction.hpp"
#include "src/backend/cpu/dnnl.hpp"
#include "src/core/env_switch.hpp"

namespace dltrain::backend::cpu {

namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

void use_our_threads() {
  const int n = get_num_threads();
  if (omp_get_max_threads() != n) omp_set_num_threads(n);
}

memory::data_type dnnl_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return memory::data_type::f32;
    case DType::bf16:
      return memory::data_type::bf16;
    case DType::f16:
      return memory::data_type::f16;
    default:
      break;
  }
  DLTRAIN_FAIL("oneDNN convolution: unsupported dtype ", t);
}

// The tensor's own dense layout (nchw or nhwc), by its strides.
memory::desc act_desc(const Tensor& t) {
  return memory::desc(memory::dims(t.shape().begin(), t.shape().end()), dnnl_dtype(t.dtype()),
                      memory::dims(t.strides().begin(), t.strides().end()));
}

// NCHW activations: oneDNN's convolutions for plain nchw are gemm-based (im2col, "x64:gemm:jit");
// its blocked kernels (nChw8c, "jit:avx2", "jit_1x1:avx2") are faster even with a reorder of
// the activations in and out around each call, which is what PyTorch does. So for nchw input
// the convolution's activation layouts are left to oneDNN (format "any") and reordered;
// channels-last (nhwc) has direct kernels and keeps its own layout. DLTRAIN_DNNL_NCHW_BLOCKED=0
// keeps nchw too (the measurement in docs/performance.md).
bool nchw_blocked() {
  static const bool on = detail::env_switch_on("DLTRAIN_DNNL_NCHW_BLOCKED");
  return on;
}

// A 4-d tensor dense in fmt as oneDNN's nchw or nhwc. By the tag, not the strides: a tensor
// with one channel (or a 1x1 image) is dense in both, and its strides may say either; the
// convolution's format (detail::conv_memory_format) says which one its kernels run in.
memory::desc dense_desc(const Tensor& t, MemoryFormat fmt) {
  return memory::desc(memory::dims(t.shape().begin(), t.shape().end()), dnnl_dtype(t.dtype()),
                      fmt == MemoryFormat::ChannelsLast ? tag::nhwc : tag::nchw);
}

// The layout a convolution is asked to take t (dense in fmt) in: fmt's, or "any" for nchw
// (above) unless t is channels-last too (one channel: the plain kernels take it as it is).
memory::desc conv_act_desc(const Tensor& t, MemoryFormat fmt) {
  if (fmt == MemoryFormat::Contiguous && nchw_blocked() &&
      !t.is_contiguous(MemoryFormat::ChannelsLast))
    return memory::desc(memory::dims(t.shape().begin(), t.shape().end()), dnnl_dtype(t.dtype()),
                        tag::any);
  return dense_desc(t, fmt);
}

// Channels-last backward: for wide convolutions oneDNN's nhwc backward kernels (data, weights;
// f32 on AVX2) measured slower than its blocked ones even with the reorders around them
// (ResNet-50, batch 8, 2 threads: backward 1047-1064 -> 989-991 ms a step), while its nhwc
// forward beats the blocked one with reorders (conv2d 1143 against 1299 ms for 3 steps). For
// narrow ones the reorders dominate (the VAE's 1/32/64-channel convolutions at 28x28 and less:
// backward 16.7 -> 20.3 ms a step), so the f32 backward primitives of a channels-last
// convolution take "any" (blocked) only when every group has at least 64 input and 64 output
// channels. DLTRAIN_DNNL_CL_BWD_BLOCKED=0 keeps nhwc always (bf16 keeps nhwc: unmeasured here,
// no AVX-512 on this machine).
bool cl_backward_blocked() {
  static const bool on = detail::env_switch_on("DLTRAIN_DNNL_CL_BWD_BLOCKED");
  return on;
}

// The layout a backward primitive of convolution `s` is asked to take t (dense in fmt) in.
memory::desc conv_bwd_act_desc(const Tensor& t, MemoryFormat fmt, const DnnlConvShape& s) {
  const bool wide = s.Cin / s.groups >= 64 && s.Cout / s.groups >= 64;
  if (fmt == MemoryFormat::ChannelsLast && t.dtype() == DType::f32 && wide && cl_backward_blocked())
    return memory::desc(memory::dims(t.shape().begin(), t.shape().end()), dnnl_dtype(t.dtype()),
                        tag::any);
  return conv_act_desc(t, fmt);
}

memory::dims weight_dims(const DnnlConvShape& s) {
  if (s.groups == 1) return {s.Cout, s.Cin, s.kh, s.kw};
  return {s.groups, s.Cout / s.groups, s.Cin / s.groups, s.kh, s.kw};
}

// The weight tensor [O, I/g, kh, kw] as oneDNN's (grouped) weights, in its own strides.
memory::desc weight_desc(const Tensor& w, const DnnlConvShape& s) {
  const auto& st = w.strides();
  if (s.groups == 1)
    return memory::desc(weight_dims(s), dnnl_dtype(w.dtype()), memory::dims(st.begin(), st.end()));
  return memory::desc(weight_dims(s), dnnl_dtype(w.dtype()),
                      {st[0] * (s.Cout / s.groups), st[0], st[1], st[2], st[3]});
}

memory::dims strides(const DnnlConvShape& s) { return {s.sh, s.sw}; }
memory::dims dilates(const DnnlConvShape& s) { return {s.dh - 1, s.dw - 1}; }
memory::dims pad_l(const DnnlConvShape& s) { return {s.ph, s.pw}; }
// The right/bottom padding that makes oneDNN's output size equal Ho x Wo (floor division).
memory::dims pad_r(const DnnlConvShape& s) {
  return {(s.Ho - 1) * s.sh + (s.kh - 1) * s.dh + 1 - s.H - s.ph,
          (s.Wo - 1) * s.sw + (s.kw - 1) * s.dw + 1 - s.W - s.pw};
}

// `user` in the layout `want`, reordered when they differ.
memory as_layout(const memory& user, const memory::desc& want) {
  if (user.get_desc() == want) return user;
  memory m(want, engine());
  dnnl::reorder(user, m).execute(stream(), const_cast<memory&>(user), m);
  return m;
}

// Memory in layout `want` for writing the result that belongs in `user`; finish_output()
// reorders it into `user` when they differ.
memory output_in(const memory& user, const memory::desc& want) {
  return user.get_desc() == want ? user : memory(want, engine());
}
void finish_output(memory& m, const memory& user) {
  if (m.get_desc() != user.get_desc())
    dnnl::reorder(m, user).execute(stream(), m, const_cast<memory&>(user));
}

// --- oneDNN 2.x and 3.x ------------------------------------------------------------------
// The only API differences dltrain meets: 2.x builds an operation descriptor and then its
// primitive descriptor, 3.x (descriptors folded into primitive descriptors) takes the same
// arguments, engine first, in one constructor; 3.x pooling always takes a dilation; and the
// batch-norm backward's arguments differ by one. Every primitive descriptor is made here, so
// the rest of this file is the same for both.
using ConvFwdPd = dnnl::convolution_forward::primitive_desc;
using ConvBwdDataPd = dnnl::convolution_backward_data::primitive_desc;
using ConvBwdWeightsPd = dnnl::convolution_backward_weights::primitive_desc;
using BnFwdPd = dnnl::batch_normalization_forward::primitive_desc;
using BnBwdPd = dnnl::batch_normalization_backward::primitive_desc;
using PoolFwdPd = dnnl::pooling_forward::primitive_desc;
using PoolBwdPd = dnnl::pooling_backward::primitive_desc;

#if DNNL_VERSION_MAJOR >= 3
// 3.x refuses arguments a primitive does not read; 2.x's batch-norm backward refuses to run
// without DNNL_ARG_SHIFT although it does not read it.
constexpr bool kBnBackwardTakesShift = false;

ConvFwdPd conv_fwd_pd(const memory::desc& src, const memory::desc& wei, const memory::desc& bias,
                      const memory::desc& dst, const memory::dims& st, const memory::dims& di,
                      const memory::dims& pl, const memory::dims& pr) {
  return ConvFwdPd(engine(), dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                   src, wei, bias, dst, st, di, pl, pr);
}
ConvBwdDataPd conv_bwd_data_pd(const memory::desc& dsrc, const memory::desc& wei,
                               const memory::desc& ddst, const memory::dims& st,
                               const memory::dims& di, const memory::dims& pl,
                               const memory::dims& pr, const ConvFwdPd& hint) {
  return ConvBwdDataPd(engine(), dnnl::algorithm::convolution_direct, dsrc, wei, ddst, st, di, pl,
                       pr, hint);
}
ConvBwdWeightsPd conv_bwd_weights_pd(const memory::desc& src, const memory::desc& dwei,
                                     const memory::desc& dbias, const memory::desc& ddst,
                                     const memory::dims& st, const memory::dims& di,
                                     const memory::dims& pl, const memory::dims& pr,
                                     const ConvFwdPd& hint) {
  return ConvBwdWeightsPd(engine(), dnnl::algorithm::convolution_direct, src, dwei, dbias, ddst, st,
                          di, pl, pr, hint);
}
BnFwdPd bn_fwd_pd(const memory::desc& x, float eps, dnnl::normalization_flags f) {
  return BnFwdPd(engine(), dnnl::prop_kind::forward_training, x, x, eps, f);
}
BnBwdPd bn_bwd_pd(const memory::desc& x, float eps, dnnl::normalization_flags f,
                  const BnFwdPd& hint) {
  return BnBwdPd(engine(), dnnl::prop_kind::backward, x, x, x, eps, f, hint);
}
PoolFwdPd pool_fwd_pd(dnnl::algorithm alg, const memory::desc& src, const memory::desc& dst,
                      const memory::dims& st, const memory::dims& k, const memory::dims& pl,
                      const memory::dims& pr) {
  return PoolFwdPd(engine(), dnnl::prop_kind::forward_training, alg, src, dst, st, k, {0, 0}, pl,
                   pr);
}
PoolBwdPd pool_bwd_pd(dnnl::algorithm alg, const memory::desc& dsrc, const memory::desc& ddst,
                      const memory::dims& st, const memory::dims& k, const memory::dims& pl,
                      const memory::dims& pr, const PoolFwdPd& hint) {
  return PoolBwdPd(engine(), alg, dsrc, ddst, st, k, {0, 0}, pl, pr, hint);
}
#else
constexpr bool kBnBackwardTakesShift = true;

ConvFwdPd conv_fwd_pd(const memory::desc& src, const memory::desc& wei, const memory::desc& bias,
                      const memory::desc& dst, const memory::dims& st, const memory::dims& di,
                      const memory::dims& pl, const memory::dims& pr) {
  dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training,
                                    dnnl::algorithm::convolution_direct, src, wei, bias, dst, st,
                                    di, pl, pr);
  return ConvFwdPd(d, engine());
}
ConvBwdDataPd conv_bwd_data_pd(const memory::desc& dsrc, const memory::desc& wei,
                               const memory::desc& ddst, const memory::dims& st,
                               const memory::dims& di, const memory::dims& pl,
                               const memory::dims& pr, const ConvFwdPd& hint) {
  dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, dsrc, wei, ddst, st,
                                          di, pl, pr);
  return ConvBwdDataPd(d, engine(), hint);
}
ConvBwdWeightsPd conv_bwd_weights_pd(const memory::desc& src, const memory::desc& dwei,
                                     const memory::desc& dbias, const memory::desc& ddst,
                                     const memory::dims& st, const memory::dims& di,
                                     const memory::dims& pl, const memory::dims& pr,
                                     const ConvFwdPd& hint) {
  dnnl::convolution_backward_weights::desc d(dnnl::algorithm::convolution_direct, src, dwei, dbias,
                                             ddst, st, di, pl, pr);
  return ConvBwdWeightsPd(d, engine(), hint);
}
BnFwdPd bn_fwd_pd(const memory::desc& x, float eps, dnnl::normalization_flags f) {
  dnnl::batch_normalization_forward::desc d(dnnl::prop_kind::forward_training, x, eps, f);
  return BnFwdPd(d, engine());
}
BnBwdPd bn_bwd_pd(const memory::desc& x, float eps, dnnl::normalization_flags f,
                  const BnFwdPd& hint) {
  dnnl::batch_normalization_backward::desc d(dnnl::prop_kind::backward, x, x, eps, f);
  return BnBwdPd(d, engine(), hint);
}
PoolFwdPd pool_fwd_pd(dnnl::algorithm alg, const memory::desc& src, const memory::desc& dst,
                      const memory::dims& st, const memory::dims& k, const memory::dims& pl,
                      const memory::dims& pr) {
  dnnl::pooling_forward::desc d(dnnl::prop_kind::forward_training, alg, src, dst, st, k, pl, pr);
  return PoolFwdPd(d, engine());
}
PoolBwdPd pool_bwd_pd(dnnl::algorithm alg, const memory::desc& dsrc, const memory::desc& ddst,
                      const memory::dims& st, const memory::dims& k, const memory::dims& pl,
                      const memory::dims& pr, const PoolFwdPd& hint) {
  dnnl::pooling_backward::desc d(alg, dsrc, ddst, st, k, pl, pr);
  return PoolBwdPd(d, engine(), hint);
}
#endif
// ------------------------------------------------------------------------------------------

ConvFwdPd forward_pd(const memory::desc& src, const memory::desc& wei, const memory::desc& bias,
                     const memory::desc& dst, const DnnlConvShape& s) {
  return conv_fwd_pd(src, wei, bias, dst, strides(s), dilates(s), pad_l(s), pad_r(s));
}

memory::desc any_weights(const DnnlConvShape& s, DType dt) {
  return memory::desc(weight_dims(s), dnnl_dtype(dt), tag::any);
}

[[noreturn]] void rethrow(const dnnl::error& e, const char* what, const DnnlConvShape& s) {
  DLTRAIN_FAIL("oneDNN ", what, " failed for input [", s.N, ", ", s.Cin, ", ", s.H, ", ", s.W,
               "], weight [", s.Cout, ", ", s.Cin / s.groups, ", ", s.kh, ", ", s.kw, "], groups ",
               s.groups, ": ", e.what(), " (status ", static_cast<int>(e.status),
               "); DLTRAIN_DNNL=0 uses the built-in path");
}

// A cache key: the raw bytes of the values that select a primitive.
class Key {
 public:
  explicit Key(char op) { s_.push_back(op); }
  Key& add(int64_t v) {
    s_.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Key& add(const Tensor& t) {
    add(t.dim()).add(static_cast<int64_t>(t.dtype()));
    for (int64_t d : t.shape()) add(d);
    for (int64_t d : t.strides()) add(d);
    return *this;
  }
  Key& add(const DnnlConvShape& c) {
    for (int64_t v : {c.N, c.Cin, c.H, c.W, c.Cout, c.kh, c.kw, c.Ho, c.Wo, c.groups, c.sh, c.sw,
                      c.ph, c.pw, c.dh, c.dw})
      add(v);
    return *this;
  }
  const std::string& str() const { return s_; }

 private:
  std::string s_;
};

template <class PD, class P>
struct Cached {
  using pd_type = PD;
  PD pd;
  P prim;
};

// The cached (pd, primitive) for key, made by make() on first use; nullopt when make() threw
// dnnl::error (no implementation), also cached. Bounded: cleared past 4096 entries (a
// program whose shapes never repeat then recreates, as without a cache).
template <class PD, class P, class Make>
std::optional<Cached<PD, P>> cached(const Key& key, Make&& make) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::optional<Cached<PD, P>>> map;
  {
    std::lock_guard<std::mutex> lk(mu);
    auto it = map.find(key.str());
    if (it != map.end()) return it->second;
  }
  std::optional<Cached<PD, P>> v;
  try {
    PD pd = make();
    v = Cached<PD, P>{pd, P(pd)};
  } catch (const dnnl::error&) {
    v.reset();
  }
  std::lock_guard<std::mutex> lk(mu);
  if (map.size() >= 4096) map.clear();
  map.emplace(key.str(), v);
  return v;
}

// For batch norm and pooling, oneDNN falls back to plain C++ implementations ("ncsp_bnorm",
// "simple_nchw") on layouts its JIT kernels do not take (nchw on AVX2); those measured 2-4x
// slower than dltrain's own kernels (ResNet-50, batch 8: batch norm ~300 vs ~70 ms a step), so
// only JIT implementations are taken and the rest is answered "not taken".
template <class PD>
PD jit_only(PD pd) {
  if (std::string(pd.impl_info_str()).find("jit") == std::string::npos)
    throw dnnl::error(dnnl_unimplemented, "no JIT implementation");
  return pd;
}

memory mem(const memory::desc& d, const Tensor& t) { return memory(d, engine(), t.data_ptr()); }

}  // namespace

namespace {
std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> on{detail::env_switch_on("DLTRAIN_DNNL")};
  return on;
}
}  // namespace

bool dnnl_available() { return enabled_flag().load(std::memory_order_relaxed); }

const char* dnnl_version() {
  static const std::string v = [] {
    const dnnl_version_t* ver = ::dnnl_version();
    return std::to_string(ver->major) + "." + std::to_string(ver->minor) + "." +
           std::to_string(ver->patch);
  }();
  return v.c_str();
}

bool dnnl_conv_supported(DType dt) {
  if (dt == DType::f32) return true;
  if (dt != DType::bf16) return false;
  // bf16 convolution needs at least AVX-512 (emulated below AVX-512 BF16, native above).
  static const bool ok = dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core;
  return ok;
}

namespace {

using ConvFwd = Cached<dnnl::convolution_forward::primitive_desc, dnnl::convolution_forward>;
using ConvBwdData =
    Cached<dnnl::convolution_backward_data::primitive_desc, dnnl::convolution_backward_data>;
using ConvBwdWeights =
    Cached<dnnl::convolution_backward_weights::primitive_desc, dnnl::convolution_backward_weights>;

memory::desc bias_desc(bool defined, DType dt, const DnnlConvShape& s) {
  return defined ? memory::desc({s.Cout}, dnnl_dtype(dt), tag::a) : memory::desc();
}

// The forward primitive for x -> y (both dense in fmt); also the hint of the backward ones.
ConvFwd conv_forward(const Tensor& xd, const Tensor& y, const DnnlConvShape& s, bool bias,
                     DType bias_dt, MemoryFormat fmt) {
  const Key key = Key('F')
                      .add(xd)
                      .add(y)
                      .add(s)
                      .add(int64_t{bias})
                      .add(static_cast<int64_t>(bias_dt))
                      .add(static_cast<int64_t>(fmt));
  auto c = cached<ConvFwd::pd_type, dnnl::convolution_forward>(key, [&] {
    return forward_pd(conv_act_desc(xd, fmt), any_weights(s, xd.dtype()),
                      bias_desc(bias, bias_dt, s), conv_act_desc(y, fmt), s);
  });
  if (!c) rethrow(dnnl::error(dnnl_unimplemented, "no implementation"), "convolution forward", s);
  return *c;
}

}  // namespace

Tensor dnnl_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b,
                           const DnnlConvShape& s, MemoryFormat fmt) {
  use_our_threads();
  Tensor xd = x.contiguous(fmt), wd = w.contiguous(w.suggest_memory_format());
  Tensor y = empty({s.N, s.Cout, s.Ho, s.Wo}, fmt, x.options());
  try {
    const ConvFwd c = conv_forward(xd, y, s, b.defined(), b.defined() ? b.dtype() : x.dtype(), fmt);
    memory wuser(weight_desc(wd, s), engine(), wd.data_ptr());
    memory wmem = as_layout(wuser, c.pd.weights_desc());
    const memory yuser = mem(dense_desc(y, fmt), y);
    memory ymem = output_in(yuser, c.pd.dst_desc());
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, as_layout(mem(dense_desc(xd, fmt), xd), c.pd.src_desc())},
        {DNNL_ARG_WEIGHTS, wmem},
        {DNNL_ARG_DST, ymem}};
    Tensor bd;
    if (b.defined()) {
      bd = b.contiguous();
      args.emplace(DNNL_ARG_BIAS, mem(c.pd.bias_desc(), bd));
    }
    c.prim.execute(stream(), args);
    finish_output(ymem, yuser);
    stream().wait();
  } catch (const dnnl::error& e) {
    rethrow(e, "convolution forward", s);
  }
  return y;
}

void dnnl_conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& gy0,
                          const DnnlConvShape& s, MemoryFormat fmt, Tensor* gx, Tensor* gw,
                          Tensor* gb) {
  use_our_threads();
  // x's data is read only for gw; otherwise a tensor in the convolution's format stands in
  // for it in the primitive descriptors (no copy of data nobody reads).
  Tensor xd = gw || x.is_contiguous(fmt) ? x.contiguous(fmt) : empty(x.shape(), fmt, x.options());
  Tensor wd = w.contiguous(w.suggest_memory_format());
  Tensor gy = gy0.to(x.dtype()).contiguous(fmt);
  // gx in x's own format, seen by oneDNN in the convolution's when x is dense in both (one
  // channel).
  const MemoryFormat x_own = x.suggest_memory_format();
  const MemoryFormat gx_fmt = x.is_contiguous(fmt) ? fmt : x_own;
  try {
    const memory xuser = mem(dense_desc(xd, fmt), xd), gyuser = mem(dense_desc(gy, fmt), gy);
    const memory::desc src = conv_bwd_act_desc(xd, fmt, s), ddst = conv_bwd_act_desc(gy, fmt, s);
    memory gy_mem = gyuser;  // gy in the layout the last primitive asked for
    if (gx) {
      *gx = empty({s.N, s.Cin, s.H, s.W}, x_own, x.options());
      const Key key = Key('D')
                          .add(xd)
                          .add(gy)
                          .add(*gx)
                          .add(s)
                          .add(static_cast<int64_t>(fmt))
                          .add(static_cast<int64_t>(gx_fmt));
      auto c = cached<ConvBwdData::pd_type, dnnl::convolution_backward_data>(key, [&] {
        const ConvFwd f = conv_forward(xd, gy, s, false, x.dtype(), fmt);
        return conv_bwd_data_pd(conv_bwd_act_desc(*gx, gx_fmt, s), any_weights(s, x.dtype()), ddst,
                                strides(s), dilates(s), pad_l(s), pad_r(s), f.pd);
      });
      if (!c) DLTRAIN_FAIL("oneDNN has no convolution backward-data for this case");
      memory wuser(weight_desc(wd, s), engine(), wd.data_ptr());
      memory wmem = as_layout(wuser, c->pd.weights_desc());
      gy_mem = as_layout(gyuser, c->pd.diff_dst_desc());
      const memory gxuser = mem(dense_desc(*gx, gx_fmt), *gx);
      memory gxmem = output_in(gxuser, c->pd.diff_src_desc());
      c->prim.execute(
          stream(),
          {{DNNL_ARG_DIFF_DST, gy_mem}, {DNNL_ARG_WEIGHTS, wmem}, {DNNL_ARG_DIFF_SRC, gxmem}});
      finish_output(gxmem, gxuser);
    }
    if (gw) {
      *gw = empty(w.shape(), w.suggest_memory_format(), w.options());
      const Key key = Key('W')
                          .add(xd)
                          .add(gy)
                          .add(*gw)
                          .add(s)
                          .add(int64_t{gb != nullptr})
                          .add(static_cast<int64_t>(fmt));
      auto c = cached<ConvBwdWeights::pd_type, dnnl::convolution_backward_weights>(key, [&] {
        const ConvFwd f = conv_forward(xd, gy, s, gb != nullptr, w.dtype(), fmt);
        return conv_bwd_weights_pd(src, any_weights(s, w.dtype()),
                                   bias_desc(gb != nullptr, w.dtype(), s), ddst, strides(s),
                                   dilates(s), pad_l(s), pad_r(s), f.pd);
      });
      if (!c) DLTRAIN_FAIL("oneDNN has no convolution backward-weights for this case");
      memory guser(weight_desc(*gw, s), engine(), gw->data_ptr());
      const bool direct = c->pd.diff_weights_desc() == guser.get_desc();
      memory gmem = direct ? guser : memory(c->pd.diff_weights_desc(), engine());
      if (gy_mem.get_desc() != c->pd.diff_dst_desc())
        gy_mem = as_layout(gyuser, c->pd.diff_dst_desc());
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, as_layout(xuser, c->pd.src_desc())},
                                           {DNNL_ARG_DIFF_DST, gy_mem},
                                           {DNNL_ARG_DIFF_WEIGHTS, gmem}};
      if (gb) {
        *gb = empty({s.Cout}, w.options());
        args.emplace(DNNL_ARG_DIFF_BIAS, mem(c->pd.diff_bias_desc(), *gb));
      }
      c->prim.execute(stream(), args);
      if (!direct) dnnl::reorder(gmem, guser).execute(stream(), gmem, guser);
    } else if (gb) {
      *gb = sum(gy, {0, 2, 3}).to(w.dtype());
    }
    stream().wait();
  } catch (const dnnl::error& e) {
    rethrow(e, "convolution backward", s);
  }
}

// --- batch norm ------------------------------------------------------------------------

namespace {

using BnFwd =
    Cached<dnnl::batch_normalization_forward::primitive_desc, dnnl::batch_normalization_forward>;
using BnBwd =
    Cached<dnnl::batch_normalization_backward::primitive_desc, dnnl::batch_normalization_backward>;
dnnl::normalization_flags scale_shift() {
  return dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
}

bool bn_dtype_ok(const Tensor& x) { return x.dtype() == DType::f32 || x.dtype() == DType::bf16; }

std::optional<BnFwd> bn_forward(const Tensor& x, float eps) {
  const Key key = Key('B').add(x).add(static_cast<int64_t>(std::bit_cast<uint32_t>(eps)));
  return cached<BnFwd::pd_type, dnnl::batch_normalization_forward>(
      key, [&] { return jit_only(bn_fwd_pd(act_desc(x), eps, scale_shift())); });
}

std::optional<BnBwd> bn_backward(const Tensor& x, float eps) {
  const Key key = Key('b').add(x).add(static_cast<int64_t>(std::bit_cast<uint32_t>(eps)));
  return cached<BnBwd::pd_type, dnnl::batch_normalization_backward>(key, [&] {
    const auto f = bn_forward(x, eps);
    if (!f) throw dnnl::error(dnnl_unimplemented, "no batch norm forward");
    return jit_only(bn_bwd_pd(act_desc(x), eps, scale_shift(), f->pd));
  });
}

}  // namespace

bool dnnl_batch_norm_forward_training(const Tensor& x, const Tensor& scale, const Tensor& shift,
                                      double eps, Tensor& y, Tensor& mean, Tensor& var) {
  if (!bn_dtype_ok(x)) return false;
  const auto c = bn_forward(x, static_cast<float>(eps));
  if (!c || !bn_backward(x, static_cast<float>(eps))) return false;  // both, or neither
  use_our_threads();
  const int64_t C = x.size(1);
  const TensorOptions f32(DType::f32);
  y = empty_strided(x.shape(), x.strides(), x.options());
  mean = empty({C}, f32);
  var = empty({C}, f32);
  const memory::desc stat = c->pd.mean_desc();
  c->prim.execute(stream(), {{DNNL_ARG_SRC, mem(c->pd.src_desc(), x)},
                             {DNNL_ARG_DST, mem(c->pd.dst_desc(), y)},
                             {DNNL_ARG_SCALE, mem(stat, scale)},
                             {DNNL_ARG_SHIFT, mem(stat, shift)},
                             {DNNL_ARG_MEAN, mem(stat, mean)},
                             {DNNL_ARG_VARIANCE, mem(stat, var)}});
  stream().wait();
  return true;
}

bool dnnl_batch_norm_backward(const Tensor& x, const Tensor& gy, const Tensor& scale,
                              const Tensor& mean, const Tensor& var, double eps, Tensor& gx,
                              Tensor& gscale, Tensor& gshift) {
  if (!bn_dtype_ok(x) || gy.dtype() != x.dtype() || gy.strides() != x.strides()) return false;
  const auto c = bn_backward(x, static_cast<float>(eps));
  if (!c) return false;
  use_our_threads();
  const int64_t C = x.size(1);
  const TensorOptions f32(DType::f32);
  gx = empty_strided(x.shape(), x.strides(), x.options());
  gscale = empty({C}, f32);
  gshift = empty({C}, f32);
  const memory::desc stat = c->pd.mean_desc();
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, mem(c->pd.src_desc(), x)}, {DNNL_ARG_DIFF_DST, mem(c->pd.diff_dst_desc(), gy)},
      {DNNL_ARG_SCALE, mem(stat, scale)},       {DNNL_ARG_MEAN, mem(stat, mean)},
      {DNNL_ARG_VARIANCE, mem(stat, var)},      {DNNL_ARG_DIFF_SRC, mem(c->pd.diff_src_desc(), gx)},
      {DNNL_ARG_DIFF_SCALE, mem(stat, gscale)}, {DNNL_ARG_DIFF_SHIFT, mem(stat, gshift)}};
  if (kBnBackwardTakesShift) args.emplace(DNNL_ARG_SHIFT, mem(stat, scale));  // unread
  c->prim.execute(stream(), args);
  stream().wait();
  return true;
}

// --- pooling ---------------------------------------------------------------------------

namespace {

using PoolFwd = Cached<dnnl::pooling_forward::primitive_desc, dnnl::pooling_forward>;
using PoolBwd = Cached<dnnl::pooling_backward::primitive_desc, dnnl::pooling_backward>;

dnnl::algorithm pool_alg(DnnlPool k) {
  switch (k) {
    case DnnlPool::Max:
      return dnnl::algorithm::pooling_max;
    case DnnlPool::AvgIncludePad:
      return dnnl::algorithm::pooling_avg_include_padding;
    case DnnlPool::AvgExcludePad:
      break;
  }
  return dnnl::algorithm::pooling_avg_exclude_padding;
}

Key pool_key(char op, const DnnlPoolShape& s, DnnlPool k, DType dt) {
  Key key(op);
  for (int64_t v : {s.N, s.C, s.H, s.W, s.Ho, s.Wo, s.kh, s.kw, s.sh, s.sw, s.ph, s.pw}) key.add(v);
  return key.add(static_cast<int64_t>(k))
      .add(static_cast<int64_t>(dt))
      .add(int64_t{s.channels_last});
}

memory::desc pool_desc(int64_t N, int64_t C, int64_t H, int64_t W, DType dt, bool cl) {
  return memory::desc({N, C, H, W}, dnnl_dtype(dt), cl ? tag::nhwc : tag::nchw);
}

std::optional<PoolFwd> pool_forward(const DnnlPoolShape& s, DnnlPool k, DType dt, bool cl) {
  return cached<PoolFwd::pd_type, dnnl::pooling_forward>(pool_key('P', s, k, dt), [&] {
    const memory::dims pr{(s.Ho - 1) * s.sh + s.kh - s.H - s.ph,
                          (s.Wo - 1) * s.sw + s.kw - s.W - s.pw};
    return jit_only(pool_fwd_pd(pool_alg(k), pool_desc(s.N, s.C, s.H, s.W, dt, cl),
                                pool_desc(s.N, s.C, s.Ho, s.Wo, dt, cl), {s.sh, s.sw}, {s.kh, s.kw},
                                {s.ph, s.pw}, pr));
  });
}

std::optional<PoolBwd> pool_backward(const DnnlPoolShape& s, DnnlPool k, DType dt, bool cl) {
  return cached<PoolBwd::pd_type, dnnl::pooling_backward>(pool_key('p', s, k, dt), [&] {
    const auto f = pool_forward(s, k, dt, cl);
    if (!f) throw dnnl::error(dnnl_unimplemented, "no pooling forward");
    const memory::dims pr{(s.Ho - 1) * s.sh + s.kh - s.H - s.ph,
                          (s.Wo - 1) * s.sw + s.kw - s.W - s.pw};
    return jit_only(pool_bwd_pd(pool_alg(k), pool_desc(s.N, s.C, s.H, s.W, dt, cl),
                                pool_desc(s.N, s.C, s.Ho, s.Wo, dt, cl), {s.sh, s.sw}, {s.kh, s.kw},
                                {s.ph, s.pw}, pr, f->pd));
  });
}

bool is_dense(const Tensor& t, bool cl) {
  return t.is_contiguous(cl ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous);
}

}  // namespace

bool dnnl_pool2d_supported(const DnnlPoolShape& s, DnnlPool kind, DType dt) {
  if (dt != DType::f32 && dt != DType::bf16) return false;
  return pool_forward(s, kind, dt, s.channels_last) && pool_backward(s, kind, dt, s.channels_last);
}

bool dnnl_pool2d_forward(const Tensor& x, const DnnlPoolShape& s, DnnlPool kind, Tensor& y,
                         Tensor& ws) {
  if (!bn_dtype_ok(x)) return false;
  const bool cl = s.channels_last;
  if (!is_dense(x, cl)) return false;
  const auto c = pool_forward(s, kind, x.dtype(), cl);
  if (!c || !pool_backward(s, kind, x.dtype(), cl)) return false;  // both, or neither
  use_our_threads();
  y = empty({s.N, s.C, s.Ho, s.Wo}, cl ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous,
            x.options());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, mem(c->pd.src_desc(), x)},
                                       {DNNL_ARG_DST, mem(c->pd.dst_desc(), y)}};
  const memory::desc wsd = c->pd.workspace_desc();
  if (wsd.get_size() > 0) {
    ws = empty({static_cast<int64_t>(wsd.get_size())}, TensorOptions(DType::u8));
    args.emplace(DNNL_ARG_WORKSPACE, mem(wsd, ws));
  }
  c->prim.execute(stream(), args);
  stream().wait();
  return true;
}

bool dnnl_pool2d_backward(const Tensor& gy, const DnnlPoolShape& s, DnnlPool kind, const Tensor& ws,
                          Tensor& gx) {
  if (!bn_dtype_ok(gy)) return false;
  const bool cl = s.channels_last;
  if (!is_dense(gy, cl)) return false;
  const auto c = pool_backward(s, kind, gy.dtype(), cl);
  if (!c) return false;
  const memory::desc wsd = c->pd.workspace_desc();
  if (wsd.get_size() > 0 && (!ws.defined() || ws.numel() != static_cast<int64_t>(wsd.get_size())))
    return false;
  use_our_threads();
  gx = empty({s.N, s.C, s.H, s.W}, cl ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous,
             gy.options());
  std::unordered_map<int, memory> args{{DNNL_ARG_DIFF_DST, mem(c->pd.diff_dst_desc(), gy)},
                                       {DNNL_ARG_DIFF_SRC, mem(c->pd.diff_src_desc(), gx)}};
  if (wsd.get_size() > 0) args.emplace(DNNL_ARG_WORKSPACE, mem(wsd, ws));
  c->prim.execute(stream(), args);
  stream().wait();
  return true;
}

bool dnnl_gemm_f32(char transa, char transb, int64_t M, int64_t N, int64_t K, const float* A,
                   int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (!dnnl_available()) return false;
  use_our_threads();
  return ::dnnl_sgemm(transa, transb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc) == dnnl_success;
}

}  // namespace dltrain::backend::cpu

namespace dltrain::cpu {
bool dnnl_compiled() { return true; }
const char* dnnl_isa() {
  // The highest named level the effective ISA reaches (the values are bit sets that grow with
  // each level; oneDNN 2.6 and 3.x both name these).
  using dnnl::cpu_isa;
  const cpu_isa isa = dnnl::get_effective_cpu_isa();
  constexpr std::pair<cpu_isa, const char*> levels[] = {
      {cpu_isa::avx512_core_amx, "avx512_core_amx"},
      {cpu_isa::avx512_core_bf16, "avx512_core_bf16"},
      {cpu_isa::avx512_core_vnni, "avx512_core_vnni"},
      {cpu_isa::avx512_core, "avx512_core"},
      {cpu_isa::avx2, "avx2"},
      {cpu_isa::avx, "avx"},
      {cpu_isa::sse41, "sse41"}};
  for (const auto& [level, name] : levels)
    if ((static_cast<unsigned>(isa) & static_cast<unsigned>(level)) == static_cast<unsigned>(level))
      return name;
  return "unknown";
}
bool dnnl_enabled() { return backend::cpu::dnnl_available(); }
void set_dnnl_enabled(bool on) { backend::cpu::enabled_flag() = on; }
}  // namespace dltrain::cpu
