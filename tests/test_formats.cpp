// Checks src/precision/formats.cpp (NVIDIA's host conversions where the CUDA toolkit's headers
// are on the include path, src/precision/portable_formats.h otherwise) against an independent
// reference written only from the format definitions: a decoder from bits, a brute-force
// nearest-code encoder for fp8 and an exact-arithmetic (frexp/ldexp/nearbyint, ties to even)
// encoder for all formats. No NVIDIA function is called by the reference.
//
// Where the headers exist, the portable implementation is also compared bit for bit with NVIDIA's
// functions: every code decoded, and encoding over a strided sweep of all floats, every rounding
// position and the edge cases. Without the headers those tests are compiled out (not skipped);
// the reference tests above them then check the portable path, which formats.cpp uses.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cfenv>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "precision/formats.h"
#include "precision/portable_formats.h"

#if __has_include(<cuda_fp8.h>) && __has_include(<cuda_fp16.h>) && __has_include(<cuda_bf16.h>)
#define PTRAIN_TEST_NVIDIA_FORMATS 1
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace {

using ptrain::Format;

// ---------------------------------------------------------------------------- reference

struct Spec {
  Format f;
  int E, M, bias;
  bool ieee;  // true: exponent all ones = inf (m == 0) / NaN. false (e4m3): only S.1111.111 is NaN.
};

const Spec kBF16{Format::bf16, 8, 7, 127, true};
const Spec kFP16{Format::fp16, 5, 10, 15, true};
const Spec kE4M3{Format::e4m3, 4, 3, 7, false};
const Spec kE5M2{Format::e5m2, 5, 2, 15, true};

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

uint32_t mmask(const Spec& s) { return (1u << s.M) - 1; }
uint32_t emask(const Spec& s) { return (1u << s.E) - 1; }
uint32_t sign_bit(const Spec& s) { return 1u << (s.E + s.M); }

double ref_decode(uint32_t code, const Spec& s) {
  const bool neg = (code & sign_bit(s)) != 0;
  const uint32_t e = (code >> s.M) & emask(s), m = code & mmask(s);
  if (s.ieee && e == emask(s)) return m ? kNaN : (neg ? -kInf : kInf);
  if (!s.ieee && e == emask(s) && m == mmask(s)) return kNaN;
  const double v = e == 0 ? std::ldexp(double(m), 1 - s.bias - s.M)
                          : std::ldexp(double((1u << s.M) + m), int(e) - s.bias - s.M);
  return neg ? -v : v;
}

uint32_t max_code(const Spec& s) {  // largest finite positive code
  return s.ieee ? ((emask(s) - 1) << s.M) | mmask(s) : (emask(s) << s.M) | (mmask(s) - 1);
}
double ref_max(const Spec& s) { return ref_decode(max_code(s), s); }
uint32_t nan_code(const Spec& s) { return (emask(s) << s.M) | mmask(s); }  // a NaN in every format
uint32_t inf_code(const Spec& s) { return emask(s) << s.M; }                // ieee formats only

// What an overflowing magnitude becomes: saturate -> max; else inf, or NaN where there is no inf.
uint32_t overflow_code(const Spec& s, bool neg, bool saturate) {
  if (!s.ieee && !saturate) return nan_code(s);
  return (saturate ? max_code(s) : inf_code(s)) | (neg ? sign_bit(s) : 0);
}

// Bits of a finite representable magnitude r >= 0.
uint32_t magnitude_bits(double r, const Spec& s) {
  if (r < std::ldexp(1.0, 1 - s.bias)) return uint32_t(std::ldexp(r, s.bias - 1 + s.M));  // subnormal
  int k;
  std::frexp(r, &k);  // r = f * 2^k, f in [0.5, 1)
  const uint32_t e = uint32_t(k - 1 + s.bias);
  const uint32_t m = uint32_t(std::ldexp(r, s.M - (k - 1))) - (1u << s.M);
  return (e << s.M) | m;
}

// Exact-arithmetic round to nearest even, any format. Floats are exact in double, scaling by
// powers of two is exact, and nearbyint rounds half to even in the default rounding mode.
// saturate only matters for fp8 (bf16/fp16 always overflow to inf).
uint32_t ref_encode_exact(float x, const Spec& s, bool saturate) {
  if (std::isnan(x)) return nan_code(s);
  const bool neg = std::signbit(x);
  const uint32_t sb = neg ? sign_bit(s) : 0;
  const double a = std::fabs(double(x));
  if (std::isinf(a)) return overflow_code(s, neg, saturate);
  if (a == 0) return sb;
  int k;
  std::frexp(a, &k);
  const int ex = std::max(k - 1, 1 - s.bias);  // exponent of a's binade, clamped to the subnormal one
  const int q = ex - s.M;                      // exponent of the quantum (ulp) there
  const double r = std::ldexp(std::nearbyint(std::ldexp(a, -q)), q);
  if (r > ref_max(s)) return overflow_code(s, neg, saturate);
  return sb | magnitude_bits(r, s);
}

// fp8 by brute force over the codes: nearest finite code by |x - value|, ties to the even code
// (adjacent codes differ in the last mantissa bit). Overflow: a magnitude above max + half an ulp
// rounds up out of range; exactly at it, ties-to-even goes up iff max's mantissa is odd.
struct Fp8Table {
  const Spec* s;
  std::vector<double> pos;  // value of positive codes 0..max_code, increasing
  double threshold;
  bool tie_overflows;
  explicit Fp8Table(const Spec& spec) : s(&spec) {
    for (uint32_t c = 0; c <= max_code(spec); ++c) pos.push_back(ref_decode(c, spec));
    const double mx = pos.back(), ulp = mx - pos[pos.size() - 2];
    threshold = mx + ulp / 2;
    tie_overflows = (max_code(spec) & 1) != 0;
  }
  uint32_t encode(float x, bool saturate) const {
    if (std::isnan(x)) return nan_code(*s);
    const bool neg = std::signbit(x);
    const double a = std::fabs(double(x));
    if (a > threshold || (a == threshold && tie_overflows)) return overflow_code(*s, neg, saturate);
    uint32_t best = 0;
    double best_d = a;
    for (uint32_t c = 1; c < pos.size(); ++c) {
      const double d = std::fabs(a - pos[c]);
      if (d < best_d || (d == best_d && (c & 1) == 0)) best = c, best_d = d;
      if (pos[c] > a) break;  // values only grow from here
    }
    return best | (neg ? sign_bit(*s) : 0);
  }
};

// ---------------------------------------------------------------------------- comparison

std::string hex(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a (%.9g)", v, v);
  return buf;
}

struct Mismatches {
  long count = 0;
  std::vector<std::string> first;
  void add(const std::string& what) {
    if (++count <= 10) first.push_back(what);
  }
  void require_none(const char* what) {
    for (const std::string& m : first) UNSCOPED_INFO(m);
    INFO(what << ": " << count << " mismatches");
    REQUIRE(count == 0);
  }
};

// NaN equals only NaN; otherwise equal values with the same sign (so -0 != +0).
bool same(double got, double want) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  return got == want && std::signbit(got) == std::signbit(want);
}

// Bits must be equal, except that any NaN code matches a NaN reference.
bool same_bits(uint32_t got, uint32_t want, const Spec& s) {
  if (std::isnan(ref_decode(want, s))) return std::isnan(ref_decode(got, s));
  return got == want;
}

struct Checker {
  Fp8Table e4m3{kE4M3}, e5m2{kE5M2};
  Mismatches bad;

  void report(const char* fn, float x, double got, double want) {
    bad.add(std::string(fn) + "(" + hex(x) + "): got " + hex(got) + ", want " + hex(want));
  }

  void check16(float x, const Spec& s) {
    const uint32_t want = ref_encode_exact(x, s, false);
    const uint32_t got = s.f == Format::bf16 ? ptrain::bf16_bits(x) : ptrain::fp16_bits(x);
    const char* name = ptrain::format_name(s.f);
    if (!same_bits(got, want, s)) report((std::string(name) + "_bits").c_str(), x, got, want);
    const float value = s.f == Format::bf16 ? ptrain::bf16_value(uint16_t(got)) : ptrain::fp16_value(uint16_t(got));
    if (!same(value, ref_decode(got, s))) report((std::string(name) + "_value").c_str(), x, value, ref_decode(got, s));
    for (bool sat : {false, true}) {
      const float r = ptrain::round_to_format(x, s.f, sat);
      if (!same(r, ref_decode(want, s))) report(sat ? "round_to_format sat" : "round_to_format", x, r, ref_decode(want, s));
    }
  }

  void check8(float x, const Fp8Table& t) {
    const Spec& s = *t.s;
    for (bool sat : {false, true}) {
      const uint32_t want = t.encode(x, sat);
      const uint32_t got = ptrain::fp8_bits(x, s.f, sat);
      const std::string name = std::string(ptrain::format_name(s.f)) + (sat ? " sat" : " nosat");
      if (!same_bits(got, want, s)) report(("fp8_bits " + name).c_str(), x, got, want);
      const float r = ptrain::round_to_format(x, s.f, sat);
      if (!same(r, ref_decode(want, s))) report(("round_to_format " + name).c_str(), x, r, ref_decode(want, s));
    }
  }

  void check(float x) {
    const float r32 = ptrain::round_to_format(x, Format::fp32, false);
    if (!(std::isnan(x) ? std::isnan(r32) : std::memcmp(&r32, &x, sizeof x) == 0)) report("round_to_format fp32", x, r32, x);
    check16(x, kBF16);
    check16(x, kFP16);
    check8(x, e4m3);
    check8(x, e5m2);
  }
};

// Edge cases of one format: every finite value, the midpoints between neighbours (exact ties),
// one float ulp either side of both, half the smallest subnormal, max + half ulp and beyond.
void add_edge_cases(const Spec& s, std::vector<float>& xs) {
  std::vector<double> pos;
  for (uint32_t c = 0; c <= max_code(s); ++c) pos.push_back(ref_decode(c, s));
  auto add = [&](double v) {
    const float f = float(v);
    REQUIRE(double(f) == v);  // all these points are exact floats
    for (float y : {f, std::nextafterf(f, -INFINITY), std::nextafterf(f, INFINITY)}) {
      xs.push_back(y);
      xs.push_back(-y);
    }
  };
  for (size_t i = 0; i < pos.size(); ++i) {
    add(pos[i]);
    if (i + 1 < pos.size()) add((pos[i] + pos[i + 1]) / 2);
  }
  const double mx = pos.back(), ulp = mx - pos[pos.size() - 2];
  for (double v : {pos[1] / 2, pos[1] / 4, pos[1] * 0.75, mx + ulp / 2, mx + ulp, mx + 1.5 * ulp, mx * 2})
    if (v <= FLT_MAX) add(v);
}

std::vector<float> special_values() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  uint32_t payload_bits = 0x7FA00001u;  // a signalling-looking NaN with a payload
  float payload;
  std::memcpy(&payload, &payload_bits, sizeof payload);
  return {0.0f,     -0.0f,     INFINITY,  -INFINITY, nan, -nan, payload, -payload, FLT_MAX, -FLT_MAX,
          FLT_MIN,  -FLT_MIN,  std::ldexp(1.0f, -149), -std::ldexp(1.0f, -149), 1.0f, -1.0f,
          1.0f + std::ldexp(1.0f, -8), 3.4e38f, -3.4e38f, 1000.0f, -1000.0f, 464.0f, -464.0f,
          61440.0f, -61440.0f, 65520.0f, -65520.0f, 1e9f, -1e9f};
}

}  // namespace

TEST_CASE("format names and constants", "[formats]") {
  CHECK(std::string(ptrain::format_name(Format::e4m3)) == "e4m3");
  CHECK(ptrain::is_fp8(Format::e4m3));
  CHECK(ptrain::is_fp8(Format::e5m2));
  CHECK_FALSE(ptrain::is_fp8(Format::fp16));
  CHECK(ptrain::format_max(Format::fp32) == FLT_MAX);
  CHECK(ptrain::format_min_subnormal(Format::fp32) == std::ldexp(1.0f, -149));
  for (const Spec* s : {&kBF16, &kFP16, &kE4M3, &kE5M2}) {
    CHECK(double(ptrain::format_max(s->f)) == ref_max(*s));
    CHECK(double(ptrain::format_min_subnormal(s->f)) == ref_decode(1, *s));
  }
  CHECK(ptrain::format_max(Format::e4m3) == 448.0f);
  CHECK(ptrain::format_max(Format::e5m2) == 57344.0f);
  CHECK(ptrain::format_max(Format::fp16) == 65504.0f);
  CHECK(ptrain::bf16_bits(ptrain::format_max(Format::bf16)) == 0x7F7F);
}

TEST_CASE("every fp8 code decodes per the format definition", "[formats]") {
  Mismatches bad;
  for (const Spec* s : {&kE4M3, &kE5M2})
    for (uint32_t c = 0; c < 256; ++c) {
      const float got = ptrain::fp8_value(uint8_t(c), s->f);
      if (!same(got, ref_decode(c, *s)))
        bad.add(std::string(ptrain::format_name(s->f)) + " code " + std::to_string(c) + ": got " + hex(got) +
                ", want " + hex(ref_decode(c, *s)));
    }
  bad.require_none("fp8 decode");
  // A few values written down by hand.
  CHECK(ref_decode(0x7E, kE4M3) == 448);
  CHECK(std::isnan(ref_decode(0xFF, kE4M3)));
  CHECK(ref_decode(0x01, kE4M3) == std::ldexp(1.0, -9));
  CHECK(ref_decode(0x7B, kE5M2) == 57344);
  CHECK(ref_decode(0xFC, kE5M2) == -kInf);
  CHECK(std::isnan(ref_decode(0x7D, kE5M2)));
  CHECK(ref_decode(0x3C00, kFP16) == 1);
  CHECK(ref_decode(0x7BFF, kFP16) == 65504);
  CHECK(ref_decode(0x3F80, kBF16) == 1);
}

TEST_CASE("every bf16 and fp16 code decodes per the format definition", "[formats]") {
  Mismatches bad;
  for (uint32_t c = 0; c < 65536; ++c) {
    const float b = ptrain::bf16_value(uint16_t(c)), h = ptrain::fp16_value(uint16_t(c));
    if (!same(b, ref_decode(c, kBF16))) bad.add("bf16 code " + std::to_string(c) + ": got " + hex(b));
    if (!same(h, ref_decode(c, kFP16))) bad.add("fp16 code " + std::to_string(c) + ": got " + hex(h));
  }
  bad.require_none("16-bit decode");
}

TEST_CASE("the two reference fp8 encoders agree", "[formats]") {
  REQUIRE(std::fegetround() == FE_TONEAREST);
  std::vector<float> xs = special_values();
  add_edge_cases(kE4M3, xs);
  add_edge_cases(kE5M2, xs);
  Mismatches bad;
  const Fp8Table e4m3(kE4M3), e5m2(kE5M2);
  for (const Fp8Table* t : {&e4m3, &e5m2})
    for (float x : xs)
      for (bool sat : {false, true})
        if (!same_bits(t->encode(x, sat), ref_encode_exact(x, *t->s, sat), *t->s))
          bad.add(std::string(ptrain::format_name(t->s->f)) + " " + hex(x));
  bad.require_none("brute force vs exact reference");
}

TEST_CASE("encoding matches the reference on edge cases", "[formats]") {
  std::vector<float> xs = special_values();
  for (const Spec* s : {&kBF16, &kFP16, &kE4M3, &kE5M2}) add_edge_cases(*s, xs);
  Checker c;
  for (float x : xs) c.check(x);
  c.bad.require_none("edge cases");
}

TEST_CASE("encoding matches the reference on 2 million random floats", "[formats]") {
  std::mt19937_64 rng(20240601);
  const Spec* specs[] = {&kBF16, &kFP16, &kE4M3, &kE5M2};
  Checker c;
  const int n = 700000;
  for (int i = 0; i < n; ++i) {
    // 1) uniform bit patterns (every float class, mostly huge or tiny magnitudes)
    uint32_t bits = uint32_t(rng());
    float x;
    std::memcpy(&x, &bits, sizeof x);
    c.check(x);
    // 2) log-uniform magnitudes over 2^-30 .. 2^19, covering the 16-bit and fp8 ranges
    const uint64_t r = rng();
    const double mant = 1.0 + std::ldexp(double(r & 0x7FFFFF), -23);
    x = float(std::ldexp(mant, int((r >> 23) % 50) - 30));
    c.check((r >> 40) & 1 ? -x : x);
    // 3) near the grid of a random format: a value, a midpoint, or a float ulp off a midpoint
    const Spec& s = *specs[rng() % 4];
    const uint32_t code = uint32_t(rng() % (max_code(s)));  // code and code + 1 are finite
    const double lo = ref_decode(code, s), hi = ref_decode(code + 1, s), mid = (lo + hi) / 2;
    const float fm = float(mid);
    const float pick[] = {float(lo), fm, std::nextafterf(fm, -INFINITY), std::nextafterf(fm, INFINITY),
                          float(lo + (hi - lo) * double(rng() % 1000) / 1000)};
    x = pick[rng() % 5];
    c.check(rng() & 1 ? -x : x);
  }
  INFO("checked " << 3 * n << " random floats");
  c.bad.require_none("random floats");
}

TEST_CASE("spot checks of E4M3 and E5M2 saturation and rounding, from the OCP FP8 specification", "[formats]") {
  using ptrain::fp8_bits;
  using ptrain::round_to_format;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // e4m3: 464 is the tie between 448 and (non-existent) 480 -> 448 in both modes.
  CHECK(fp8_bits(464.0f, Format::e4m3, true) == 0x7E);
  CHECK(fp8_bits(464.0f, Format::e4m3, false) == 0x7E);
  CHECK(round_to_format(464.0f, Format::e4m3, true) == 448.0f);
  CHECK(round_to_format(-464.0f, Format::e4m3, false) == -448.0f);
  CHECK(round_to_format(1000.0f, Format::e4m3, true) == 448.0f);
  CHECK(round_to_format(-1000.0f, Format::e4m3, true) == -448.0f);
  CHECK(std::isnan(round_to_format(1000.0f, Format::e4m3, false)));
  CHECK((fp8_bits(1000.0f, Format::e4m3, false) & 0x7F) == 0x7F);
  CHECK(round_to_format(INFINITY, Format::e4m3, true) == 448.0f);
  CHECK(round_to_format(-INFINITY, Format::e4m3, true) == -448.0f);
  CHECK(std::isnan(round_to_format(INFINITY, Format::e4m3, false)));
  // e5m2: 61440 is the tie between 57344 and 65536 (= inf) -> inf, or 57344 saturated.
  CHECK(fp8_bits(61440.0f, Format::e5m2, false) == 0x7C);
  CHECK(round_to_format(61440.0f, Format::e5m2, false) == INFINITY);
  CHECK(round_to_format(-61440.0f, Format::e5m2, false) == -INFINITY);
  CHECK(fp8_bits(61440.0f, Format::e5m2, true) == 0x7B);
  CHECK(round_to_format(61440.0f, Format::e5m2, true) == 57344.0f);
  CHECK(round_to_format(-INFINITY, Format::e5m2, true) == -57344.0f);
  CHECK(round_to_format(INFINITY, Format::e5m2, false) == INFINITY);
  // bf16 overflows to inf, not to max; ties to even.
  CHECK(ptrain::bf16_bits(3.4e38f) == 0x7F80);
  CHECK(round_to_format(3.4e38f, Format::bf16, false) == INFINITY);
  CHECK(round_to_format(3.4e38f, Format::bf16, true) == INFINITY);
  CHECK(ptrain::bf16_bits(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);
  CHECK(ptrain::bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);
  CHECK(round_to_format(65520.0f, Format::fp16, false) == INFINITY);
  CHECK(round_to_format(65519.0f, Format::fp16, false) == 65504.0f);
  // Any NaN -> 0x7F (sign dropped), bf16 NaN -> 0x7FFF, and NaN stays NaN everywhere.
  for (float x : {nan, -nan}) {
    for (bool sat : {false, true}) {
      CHECK(fp8_bits(x, Format::e4m3, sat) == 0x7F);
      CHECK(fp8_bits(x, Format::e5m2, sat) == 0x7F);
      for (Format f : {Format::fp32, Format::bf16, Format::fp16, Format::e4m3, Format::e5m2})
        CHECK(std::isnan(round_to_format(x, f, sat)));
    }
    CHECK(ptrain::bf16_bits(x) == 0x7FFF);
    CHECK(ptrain::fp16_bits(x) == 0x7FFF);
  }
  // Decoded NaNs: bf16 keeps sign and payload; fp16 and fp8 give the float 0x7FFFFFFF.
  const auto bits = [](float v) { return ptrain::portable::float_as_bits(v); };
  CHECK(bits(ptrain::bf16_value(0xFFC1)) == 0xFFC10000u);
  CHECK(bits(ptrain::bf16_value(0x7F81)) == 0x7F810000u);
  CHECK(bits(ptrain::fp16_value(0xFE01)) == 0x7FFFFFFFu);
  CHECK(bits(ptrain::fp16_value(0x7C01)) == 0x7FFFFFFFu);
  CHECK(bits(ptrain::fp8_value(0xFF, Format::e4m3)) == 0x7FFFFFFFu);
  CHECK(bits(ptrain::fp8_value(0xFD, Format::e5m2)) == 0x7FFFFFFFu);
  CHECK(bits(ptrain::fp8_value(0x7E, Format::e5m2)) == 0x7FFFFFFFu);
  // Subnormals: smallest, half of it (tie with 0 -> 0), a bit more than half -> smallest.
  CHECK(round_to_format(std::ldexp(1.0f, -9), Format::e4m3, true) == std::ldexp(1.0f, -9));
  CHECK(round_to_format(std::ldexp(1.0f, -10), Format::e4m3, true) == 0.0f);
  CHECK(round_to_format(std::ldexp(1.5f, -10), Format::e4m3, true) == std::ldexp(1.0f, -9));
  CHECK(round_to_format(std::ldexp(1.0f, -17), Format::e5m2, false) == 0.0f);
  CHECK(std::signbit(round_to_format(-std::ldexp(1.0f, -17), Format::e5m2, false)));
}

// ---------------------------------------------------------------------------- portable vs NVIDIA

#ifdef PTRAIN_TEST_NVIDIA_FORMATS

namespace {

namespace pp = ptrain::portable;

std::string hex_bits(uint32_t b) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%X", unsigned(b));
  return buf;
}

// Runs one float through NVIDIA's encoders and the portable ones; the bits must be equal.
struct NvidiaComparison {
  Mismatches bad;
  long checked = 0;

  void mismatch(const std::string& what, float x, uint32_t got, uint32_t want) {
    bad.add(what + "(" + hex(x) + ", bits " + hex_bits(pp::float_as_bits(x)) + "): portable " + hex_bits(got) +
            ", NVIDIA " + hex_bits(want));
  }

  void encode(float x) {
    ++checked;
    const uint32_t b_nv = __bfloat16_as_ushort(__float2bfloat16_rn(x)), b_pp = pp::float_to_bf16(x);
    if (b_pp != b_nv) mismatch("bf16", x, b_pp, b_nv);
    const uint32_t h_nv = __half_as_ushort(__float2half_rn(x)), h_pp = pp::float_to_fp16(x);
    if (h_pp != h_nv) mismatch("fp16", x, h_pp, h_nv);
    for (bool sat : {false, true}) {
      const __nv_saturation_t mode = sat ? __NV_SATFINITE : __NV_NOSAT;
      const uint32_t e4_nv = __nv_cvt_float_to_fp8(x, mode, __NV_E4M3), e4_pp = pp::float_to_e4m3(x, sat);
      if (e4_pp != e4_nv) mismatch(sat ? "e4m3 sat" : "e4m3 nosat", x, e4_pp, e4_nv);
      const uint32_t e5_nv = __nv_cvt_float_to_fp8(x, mode, __NV_E5M2), e5_pp = pp::float_to_e5m2(x, sat);
      if (e5_pp != e5_nv) mismatch(sat ? "e5m2 sat" : "e5m2 nosat", x, e5_pp, e5_nv);
    }
  }
};

float nv_fp8_value(uint8_t code, __nv_fp8_interpretation_t kind) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, kind)));
}

}  // namespace

TEST_CASE("portable decoding matches NVIDIA bit for bit on all 65536 bf16 and fp16 codes", "[formats][nvidia]") {
  Mismatches bad;
  for (uint32_t c = 0; c < 65536; ++c) {
    const uint16_t code = uint16_t(c);
    const uint32_t b_nv = pp::float_as_bits(__bfloat162float(__ushort_as_bfloat16(code)));
    const uint32_t b_pp = pp::float_as_bits(pp::bf16_to_float(code));
    if (b_pp != b_nv) bad.add("bf16 code " + hex_bits(c) + ": portable " + hex_bits(b_pp) + ", NVIDIA " + hex_bits(b_nv));
    const uint32_t h_nv = pp::float_as_bits(__half2float(__ushort_as_half(code)));
    const uint32_t h_pp = pp::float_as_bits(pp::fp16_to_float(code));
    if (h_pp != h_nv) bad.add("fp16 code " + hex_bits(c) + ": portable " + hex_bits(h_pp) + ", NVIDIA " + hex_bits(h_nv));
  }
  bad.require_none("16-bit decode against NVIDIA");
}

TEST_CASE("portable decoding matches NVIDIA bit for bit on all 256 codes of each fp8 format", "[formats][nvidia]") {
  Mismatches bad;
  for (uint32_t c = 0; c < 256; ++c) {
    const uint8_t code = uint8_t(c);
    const uint32_t e4_nv = pp::float_as_bits(nv_fp8_value(code, __NV_E4M3));
    const uint32_t e4_pp = pp::float_as_bits(pp::e4m3_to_float(code));
    if (e4_pp != e4_nv) bad.add("e4m3 code " + hex_bits(c) + ": portable " + hex_bits(e4_pp) + ", NVIDIA " + hex_bits(e4_nv));
    const uint32_t e5_nv = pp::float_as_bits(nv_fp8_value(code, __NV_E5M2));
    const uint32_t e5_pp = pp::float_as_bits(pp::e5m2_to_float(code));
    if (e5_pp != e5_nv) bad.add("e5m2 code " + hex_bits(c) + ": portable " + hex_bits(e5_pp) + ", NVIDIA " + hex_bits(e5_nv));
  }
  bad.require_none("fp8 decode against NVIDIA");
}

TEST_CASE("portable encoding matches NVIDIA bit for bit on edge cases", "[formats][nvidia]") {
  std::vector<float> xs = special_values();
  for (const Spec* s : {&kBF16, &kFP16, &kE4M3, &kE5M2}) add_edge_cases(*s, xs);
  // NaNs with several payloads (quiet and signalling) and both signs; float subnormals; float
  // extremes; every value that is a power of two.
  for (uint32_t b : {0x7F800001u, 0x7F800100u, 0x7F802000u, 0x7FA00001u, 0x7FBFFFFFu, 0x7FC00000u, 0x7FC00001u,
                     0x7FE00000u, 0x7FFFE000u, 0x7FFFFFFFu, 0x00000001u, 0x00000002u, 0x00000003u, 0x00400000u,
                     0x00400001u, 0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu, 0x7F800000u})
    for (uint32_t sign : {0u, 0x80000000u}) xs.push_back(pp::bits_as_float(b | sign));
  for (uint32_t e = 0; e < 256; ++e)
    for (uint32_t sign : {0u, 0x80000000u}) xs.push_back(pp::bits_as_float(sign | (e << 23)));
  NvidiaComparison c;
  for (float x : xs) c.encode(x);
  INFO(c.checked << " floats checked");
  c.bad.require_none("edge cases against NVIDIA");
}

TEST_CASE("portable encoding matches NVIDIA bit for bit on every 4099th float", "[formats][nvidia]") {
  // A prime stride: about 2046 mantissas of every exponent and sign, NaNs and subnormals included.
  NvidiaComparison c;
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 4099) c.encode(pp::bits_as_float(uint32_t(b)));
  c.encode(pp::bits_as_float(0xFFFFFFFFu));
  INFO(c.checked << " floats checked");
  c.bad.require_none("strided sweep against NVIDIA");
}

TEST_CASE("portable encoding matches NVIDIA bit for bit around every rounding position", "[formats][nvidia]") {
  // Every combination of the top 16 bits (sign, exponent, 7 mantissa bits: every bf16 code, and
  // every kept/rounded-off bit of fp8 and of fp16 in its subnormal range), times low halves that
  // sit at, just below and just above a tie at each lower bit position, with the kept bit above
  // it both even (1 << k) and odd (3 << k).
  std::vector<uint32_t> low = {0u, 0xFFFFu};
  for (uint32_t k = 0; k < 16; ++k)
    for (uint32_t base : {1u << k, 3u << k})
      if (base < 0x10000u)
        for (uint32_t v : {base - 1, base, base + 1})
          if (v < 0x10000u) low.push_back(v);
  NvidiaComparison c;
  for (uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (uint32_t lo : low) c.encode(pp::bits_as_float((hi << 16) | lo));
  INFO(c.checked << " floats checked");
  c.bad.require_none("rounding positions against NVIDIA");
}

#endif  // PTRAIN_TEST_NVIDIA_FORMATS
