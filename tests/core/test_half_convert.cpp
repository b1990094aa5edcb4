// float <-> half conversion: the bulk loops (F16C where the CPU has it, chosen at run time)
// against Half's scalar code, bit for bit: all 65536 halves to float, a sweep of floats to
// half (every exponent with the rounding-critical low bits, boundaries of overflow and
// subnormals, ties, NaN payloads, infinities, zeros, random bit patterns), the values against
// an independent rounding written with ldexp/nearbyint, NaN quieting as half.hpp states it,
// and the tensor paths that use the loops (to(), copy_ strided and broadcast, copy_scaled_).
#include <catch2/catch.hpp>

#include <cfenv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dltrain/backend/cpu.hpp"
#include "dltrain/dltrain.hpp"
#include "src/backend/cpu/half_convert.hpp"

using namespace dltrain;
namespace bc = dltrain::backend::cpu;

namespace {

uint32_t bits_of(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}
float float_of(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// The value IEEE binary16 round-to-nearest-even gives for a finite float, computed in double
// without looking at bit patterns (an independent reference for the rounding).
double reference_half_value(float f) {
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return std::copysign(std::numeric_limits<double>::infinity(), f);
  if (a == 0.0) return f;
  const int e = std::max(std::ilogb(a), -14);  // the binade; subnormals share 2^-14's
  const double q = std::ldexp(a, 10 - e);      // 10 fraction bits become the integer part
  const double r = std::nearbyint(q);          // FE_TONEAREST: ties to even
  return std::copysign(std::ldexp(r, e - 10), f);
}

// Runs both loops over src and requires equal bits; returns the dispatched result.
std::vector<Half> to_half_both(const std::vector<float>& src, float scale = 1.0f) {
  const int64_t n = static_cast<int64_t>(src.size());
  std::vector<Half> fast(src.size()), slow(src.size());
  bc::f32_to_f16(src.data(), fast.data(), n, scale);
  bc::f32_to_f16_scalar(src.data(), slow.data(), n, scale);
  for (size_t i = 0; i < src.size(); ++i)
    if (fast[i].bits != slow[i].bits)
      FAIL("float bits 0x" << std::hex << bits_of(src[i]) << " scale " << scale << ": dispatched 0x"
                           << fast[i].bits << ", scalar 0x" << slow[i].bits);
  return fast;
}

}  // namespace

TEST_CASE("half -> float: all 65536 values, dispatched loop == scalar == Half", "[core][half]") {
  INFO("F16C " << (cpu::f16c_enabled() ? "on" : "off (scalar vs scalar)"));
  std::vector<Half> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h].bits = static_cast<uint16_t>(h);
  for (float scale : {1.0f, 0.5f}) {
    std::vector<float> fast(65536), slow(65536);
    // Offsets 0 and 3: the 8-wide loop and the scalar tail both see every value.
    for (int64_t off : {0, 3}) {
      bc::f16_to_f32(all.data() + off, fast.data() + off, 65536 - off, scale);
      bc::f16_to_f32_scalar(all.data() + off, slow.data() + off, 65536 - off, scale);
      for (uint32_t h = static_cast<uint32_t>(off); h < 65536; ++h)
        if (bits_of(fast[h]) != bits_of(slow[h]))
          FAIL("half 0x" << std::hex << h << " scale " << scale << ": dispatched 0x"
                         << bits_of(fast[h]) << ", scalar 0x" << bits_of(slow[h]));
    }
    if (scale != 1.0f) continue;
    for (uint32_t h = 0; h < 65536; ++h) {
      REQUIRE(bits_of(fast[h]) == bits_of(Half::to_float(static_cast<uint16_t>(h))));
      const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
      const bool neg = (h & 0x8000) != 0;
      if (e == 31 && m != 0) {  // NaN: quiet (bit 22), sign and the 10 payload bits kept
        REQUIRE(std::isnan(fast[h]));
        REQUIRE(bits_of(fast[h]) == ((neg ? 0x80000000u : 0u) | 0x7fc00000u | (m << 13)));
        continue;
      }
      // Every other half is exact in float: its value is (-1)^s m 2^(e-25) (subnormals e=1).
      const double v = e == 31 ? std::numeric_limits<double>::infinity()
                               : std::ldexp(e == 0 ? m : (m | 0x400), (e == 0 ? 1 : e) - 25);
      REQUIRE(static_cast<double>(fast[h]) == (neg ? -v : v));
      REQUIRE(std::signbit(fast[h]) == neg);
      // ... and converts back to the same half.
      REQUIRE(Half::from_float(fast[h]) == h);
    }
  }
}

TEST_CASE("float -> half: a sweep of floats, dispatched loop == scalar, values as IEEE rounds",
          "[core][half]") {
  REQUIRE(std::fegetround() == FE_TONEAREST);
  std::vector<float> f;
  // Every sign and exponent with the low 13 bits (the ones rounding drops) at the critical
  // values: zero, just below/at/above the halfway point, all ones; the kept bits vary too.
  for (uint32_t hi = 0; hi < (1u << 19); hi += 3)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu})
      f.push_back(float_of((hi << 13) | lo));
  // Boundaries: largest half, the overflow tie (65520 -> inf), subnormal range and its ties.
  for (float v : {65504.0f,
                  65519.996f,
                  65520.0f,
                  65536.0f,
                  1e10f,
                  0x1p-14f,
                  0x1.ff8p-15f,
                  0x1p-24f,
                  0x1p-25f,
                  0x1.000002p-25f,
                  0x1.8p-24f,
                  0x1.4p-23f,
                  0x1.ffcp-15f,
                  1e-30f,
                  std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::infinity(),
                  0.0f,
                  1.0f + 0x1p-11f,
                  1.0f + 0x1.8p-11f,
                  2049.0f,
                  2051.0f}) {
    f.push_back(v);
    f.push_back(-v);
  }
  // NaNs: quiet and signalling, payloads in the kept and the dropped bits, both signs.
  for (uint32_t nan :
       {0x7fc00000u, 0x7f800001u, 0x7f802000u, 0x7fbfffffu, 0x7fffffffu, 0x7fc01234u, 0x7f801fffu})
    for (uint32_t sign : {0u, 0x80000000u}) f.push_back(float_of(nan | sign));
  std::mt19937 rng(13);
  for (int i = 0; i < 1 << 20; ++i) f.push_back(float_of(static_cast<uint32_t>(rng())));

  const std::vector<Half> h = to_half_both(f);
  for (size_t i = 0; i < f.size(); ++i) {
    REQUIRE(h[i].bits == Half::from_float(f[i]));
    const uint32_t x = bits_of(f[i]);
    if (std::isnan(f[i])) {  // quiet (bit 9), sign and the payload's top 9 bits kept
      REQUIRE(h[i].bits == (((x >> 16) & 0x8000u) | 0x7e00u | ((x >> 13) & 0x3ffu)));
      continue;
    }
    const double want = reference_half_value(f[i]);
    const float got = Half::to_float(h[i].bits);
    if (static_cast<double>(got) != want || std::signbit(got) != std::signbit(f[i]))
      FAIL("float " << f[i] << " (0x" << std::hex << x << "): half value " << got
                    << ", IEEE rounding gives " << want);
  }
  // With a scale (copy_scaled_'s f32 -> f16): Half(v * scale), the product rounded in float.
  std::vector<float> some(f.begin(), f.begin() + 100003);
  for (float scale : {0.5f, 1.0f / 3.0f, 1024.0f}) {
    const std::vector<Half> hs = to_half_both(some, scale);
    for (size_t i = 0; i < some.size(); ++i)
      REQUIRE(hs[i].bits == Half::from_float(some[i] * scale));
  }
}

TEST_CASE("to(f16), copy_ and copy_scaled_ give the same bits with and without F16C",
          "[core][half]") {
  const bool was = cpu::f16c_enabled();
  Generator g(7);
  Tensor x = mul(randn({3, 5, 17, 19}, DType::f32, &g), 3e4);  // overflows to inf included
  Tensor xs = x.contiguous(MemoryFormat::ChannelsLast);
  struct Out {
    std::vector<uint16_t> half, strided, half_cl, scaled;
    std::vector<float> back, back_scaled, bcast;
  };
  auto run = [&] {
    Out o;
    auto raw = [](const Tensor& t) {
      const Tensor c = t.contiguous();
      std::vector<uint16_t> v(static_cast<size_t>(c.numel()));
      std::memcpy(v.data(), c.data_ptr(), v.size() * 2);
      return v;
    };
    const Tensor h = x.to(DType::f16);
    o.half = raw(h);
    o.strided = raw(x.transpose(1, 3).to(DType::f16));  // strided runs
    o.half_cl = raw(xs.to(DType::f16));                 // channels-last, one flat run
    Tensor d = empty(x.shape(), TensorOptions(DType::f16));
    copy_scaled_(d, x, 1.0 / 2);  // DDP's f16 gradient compression
    o.scaled = raw(d);
    o.back = h.to(DType::f32).to_vector<float>();
    Tensor e = empty(x.shape(), TensorOptions(DType::f32));
    copy_scaled_(e, h, 0.25);
    o.back_scaled = e.to_vector<float>();
    Tensor b = empty({4, 19}, TensorOptions(DType::f32));
    b.copy_(h.select(0, 0).select(0, 0).select(0, 0));  // broadcast source
    o.bcast = b.to_vector<float>();
    return o;
  };
  cpu::set_f16c_enabled(false);
  REQUIRE_FALSE(cpu::f16c_enabled());
  const Out slow = run();
  cpu::set_f16c_enabled(true);
  REQUIRE(cpu::f16c_enabled() == cpu::f16c_supported());
  const Out fast = run();
  cpu::set_f16c_enabled(was);
  REQUIRE(fast.half == slow.half);
  REQUIRE(fast.strided == slow.strided);
  REQUIRE(fast.half_cl == slow.half_cl);
  REQUIRE(fast.half_cl == fast.half);
  REQUIRE(fast.scaled == slow.scaled);
  REQUIRE(std::memcmp(fast.back.data(), slow.back.data(), fast.back.size() * 4) == 0);
  REQUIRE(std::memcmp(fast.back_scaled.data(), slow.back_scaled.data(),
                      fast.back_scaled.size() * 4) == 0);
  REQUIRE(fast.bcast == slow.bcast);
  // The values themselves: each element is Half's conversion of the source element.
  const std::vector<float> xv = x.to_vector<float>();
  for (size_t i = 0; i < xv.size(); ++i) {
    REQUIRE(fast.half[i] == Half::from_float(xv[i]));
    REQUIRE(fast.scaled[i] == Half::from_float(xv[i] * 0.5f));
    REQUIRE(bits_of(fast.back[i]) == bits_of(Half::to_float(fast.half[i])));
  }
}

TEST_CASE("F16C detection agrees with the kernel's CPU flags", "[core][half]") {
  // /proc/cpuinfo's "flags" line lists f16c (and avx) when the CPU and the OS support them.
  std::ifstream in("/proc/cpuinfo");
  if (!in) {
    // No flags to compare with: the switch can turn the F16C loops on exactly when detected.
    const bool was = dltrain::cpu::f16c_enabled();
    dltrain::cpu::set_f16c_enabled(true);
    CHECK(dltrain::cpu::f16c_enabled() == dltrain::cpu::f16c_supported());
    dltrain::cpu::set_f16c_enabled(was);
    return;
  }
  std::string line;
  bool listed = false, found = false;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    found = true;
    std::istringstream words(line);
    std::string w;
    bool f16c = false, avx = false;
    while (words >> w) {
      f16c = f16c || w == "f16c";
      avx = avx || w == "avx";
    }
    listed = f16c && avx;
    break;
  }
  REQUIRE(found);
#if defined(__x86_64__) || defined(__i386__)
  CHECK(dltrain::cpu::f16c_supported() == listed);
#else
  CHECK_FALSE(dltrain::cpu::f16c_supported());
#endif
}
