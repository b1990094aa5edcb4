// oneDNN convolutions (see dnnl.hpp). One CPU engine for the process and one stream per thread;
// every call waits for its stream before returning, so tensors never outlive their use.
// oneDNN's OpenMP runtime is given dltrain's thread count before each primitive runs, so the
// two pools never use more threads than get_num_threads() (two ranks on two cores, one each).
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "dltrain/backend/cpu.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/ops/reduction.hpp"
#include "src/backend/cpu/dnnl.hpp"

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

dnnl::convolution_forward::primitive_desc forward_pd(const memory::desc& src,
                                                     const memory::desc& wei,
                                                     const memory::desc& bias,
                                                     const memory::desc& dst,
                                                     const DnnlConvShape& s) {
  dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training,
                                    dnnl::algorithm::convolution_direct, src, wei, bias, dst,
                                    strides(s), dilates(s), pad_l(s), pad_r(s));
  return dnnl::convolution_forward::primitive_desc(d, engine());
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

}  // namespace

namespace {
std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("DLTRAIN_DNNL");
    return !(v && (std::strcmp(v, "0") == 0 || std::strcmp(v, "OFF") == 0 ||
                   std::strcmp(v, "off") == 0));
  }()};
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

Tensor dnnl_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b,
                           const DnnlConvShape& s) {
  use_our_threads();
  const MemoryFormat fmt = x.suggest_memory_format();
  Tensor xd = x.contiguous(fmt), wd = w.contiguous(w.suggest_memory_format());
  Tensor y = empty({s.N, s.Cout, s.Ho, s.Wo}, fmt, x.options());
  try {
    const memory::desc src = act_desc(xd), dst = act_desc(y);
    const memory::desc bias =
        b.defined() ? memory::desc({s.Cout}, dnnl_dtype(b.dtype()), tag::a) : memory::desc();
    auto pd = forward_pd(src, any_weights(s, x.dtype()), bias, dst, s);
    memory wuser(weight_desc(wd, s), engine(), wd.data_ptr());
    memory wmem = as_layout(wuser, pd.weights_desc());
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(src, engine(), xd.data_ptr())},
                                         {DNNL_ARG_WEIGHTS, wmem},
                                         {DNNL_ARG_DST, memory(dst, engine(), y.data_ptr())}};
    Tensor bd;
    if (b.defined()) {
      bd = b.contiguous();
      args.emplace(DNNL_ARG_BIAS, memory(bias, engine(), bd.data_ptr()));
    }
    dnnl::convolution_forward(pd).execute(stream(), args);
    stream().wait();
  } catch (const dnnl::error& e) {
    rethrow(e, "convolution forward", s);
  }
  return y;
}

void dnnl_conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& gy0,
                          const DnnlConvShape& s, Tensor* gx, Tensor* gw, Tensor* gb) {
  use_our_threads();
  const MemoryFormat fmt = x.suggest_memory_format();
  Tensor xd = x.contiguous(fmt), wd = w.contiguous(w.suggest_memory_format());
  Tensor gy = gy0.to(x.dtype()).contiguous(fmt);
  try {
    const memory::desc src = act_desc(xd), ddst = act_desc(gy);
    const memory::desc bias =
        gb ? memory::desc({s.Cout}, dnnl_dtype(w.dtype()), tag::a) : memory::desc();
    auto fwd = forward_pd(src, any_weights(s, x.dtype()), bias, ddst, s);
    memory gy_mem(ddst, engine(), gy.data_ptr());
    if (gx) {
      *gx = empty({s.N, s.Cin, s.H, s.W}, fmt, x.options());
      const memory::desc dsrc = act_desc(*gx);
      dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, dsrc,
                                              any_weights(s, x.dtype()), ddst, strides(s),
                                              dilates(s), pad_l(s), pad_r(s));
      dnnl::convolution_backward_data::primitive_desc pd(d, engine(), fwd);
      memory wuser(weight_desc(wd, s), engine(), wd.data_ptr());
      memory wmem = as_layout(wuser, pd.weights_desc());
      dnnl::convolution_backward_data(pd).execute(
          stream(), {{DNNL_ARG_DIFF_DST, gy_mem},
                     {DNNL_ARG_WEIGHTS, wmem},
                     {DNNL_ARG_DIFF_SRC, memory(dsrc, engine(), gx->data_ptr())}});
    }
    if (gw) {
      *gw = empty(w.shape(), w.suggest_memory_format(), w.options());
      dnnl::convolution_backward_weights::desc d(dnnl::algorithm::convolution_direct, src,
                                                 any_weights(s, w.dtype()), bias, ddst, strides(s),
                                                 dilates(s), pad_l(s), pad_r(s));
      dnnl::convolution_backward_weights::primitive_desc pd(d, engine(), fwd);
      memory guser(weight_desc(*gw, s), engine(), gw->data_ptr());
      const bool direct = pd.diff_weights_desc() == guser.get_desc();
      memory gmem = direct ? guser : memory(pd.diff_weights_desc(), engine());
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(src, engine(), xd.data_ptr())},
                                           {DNNL_ARG_DIFF_DST, gy_mem},
                                           {DNNL_ARG_DIFF_WEIGHTS, gmem}};
      if (gb) {
        *gb = empty({s.Cout}, w.options());
        args.emplace(DNNL_ARG_DIFF_BIAS, memory(bias, engine(), gb->data_ptr()));
      }
      dnnl::convolution_backward_weights(pd).execute(stream(), args);
      if (!direct) dnnl::reorder(gmem, guser).execute(stream(), gmem, guser);
    } else if (gb) {
      *gb = sum(gy, {0, 2, 3}).to(w.dtype());
    }
    stream().wait();
  } catch (const dnnl::error& e) {
    rethrow(e, "convolution backward", s);
  }
}

}  // namespace dltrain::backend::cpu

namespace dltrain::cpu {
bool dnnl_compiled() { return true; }
bool dnnl_enabled() { return backend::cpu::dnnl_available(); }
void set_dnnl_enabled(bool on) { backend::cpu::enabled_flag() = on; }
}  // namespace dltrain::cpu
