// Rounding whole arrays of floats to a format's grid, for the CPU backend's emulation of bf16,
// fp16 and fp8: the same results as round_to_format (formats.h), bit for bit, NaN, infinities,
// subnormals, ties and overflow included (tests/test_grid_rounding.cpp compares them over every
// exponent and every rounding position), but inline and branch-free so that loops over them
// vectorise. round_to_format stays the definition (NVIDIA's own conversions); this is its
// fast path.
//
// Integer operations on the bit patterns, and float multiplications that are exact (a small
// integer times a power of two in the normal range), so neither the rounding mode nor
// flush-to-zero can change a result.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/bits.h"
#include "precision/formats.h"

namespace ptrain {
namespace grid {

constexpr uint32_t kSign = 0x80000000u, kInf = 0x7F800000u;

// bf16 keeps float's exponent: add just under half of the dropped 16 bits, plus the kept last
// bit (ties to even), and truncate. Overflow carries into +-inf as the hardware rounds.
inline float round_bf16(float x) {
  const uint32_t u = float_as_bits(x);
  const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  return bits_as_float((u & 0x7FFFFFFFu) > kInf ? 0x7FFF0000u : r);  // NaN: NVIDIA's canonical 0x7FFF
}

// The non-NaN magnitude a (bits, sign clear; +inf counts as 2^128) rounded to nearest, ties to
// even, on the grid of a format with M mantissa bits and exponent bias `Bias` whose exponents are
// unbounded above: a float, which the caller compares with the format's largest finite value.
template <int M, int Bias>
inline float round_magnitude(uint32_t a) {
  constexpr int kMinExp = 1 - Bias;  // the format's smallest normal exponent
  const int32_t fe = static_cast<int32_t>(a >> 23);
  const uint32_t sig = (a & 0x7FFFFFu) | (fe != 0 ? 0x800000u : 0u);  // a = sig * 2^(e - 23)
  const int32_t e = fe != 0 ? fe - 127 : -126;
  const int32_t ec = std::max(e, static_cast<int32_t>(kMinExp));  // below kMinExp the ulp is fixed
  // sig's bits below the quantum 2^(ec - M); at 25 or more (sig < 2^24) the value is under half a
  // quantum and, with the shift clamped to 25, rounds to 0 unaided.
  const uint32_t shift = static_cast<uint32_t>(std::min(ec - M - (e - 23), 25));
  uint32_t n = sig >> shift;
  const uint32_t rem = sig & ((1u << shift) - 1u), half = 1u << (shift - 1);
  n += (rem > half) | ((rem == half) & n);
  // n * 2^(ec - M): n < 2^(M + 2) and 2^(ec - M) >= 2^-24, so the product is exact.
  return static_cast<float>(static_cast<int32_t>(n)) * bits_as_float(static_cast<uint32_t>(ec - M + 127) << 23);
}

// fp16: overflow gives +-inf, NaN the float 0x7FFFFFFF (what __half2float returns for any NaN).
inline float round_fp16(float x) {
  const uint32_t u = float_as_bits(x), a = u & 0x7FFFFFFFu;
  const float m = round_magnitude<10, 15>(a);
  const uint32_t mag = m > 65504.0f ? kInf : float_as_bits(m);
  return bits_as_float(a > kInf ? 0x7FFFFFFFu : (u & kSign) | mag);
}

// fp8 rounding: with `saturate` overflow gives +-max, without it NaN (e4m3, which has no
// infinity) or +-inf (e5m2); NaN gives the float 0x7FFFFFFF. overflows(x): x (+-inf included)
// rounds past the largest finite value.
template <int M, int Bias>
struct Fp8Grid {
  static constexpr float kMax = M == 3 ? 448.0f : 57344.0f;
  static float round(float x, bool saturate) {
    const uint32_t u = float_as_bits(x), a = u & 0x7FFFFFFFu;
    const float m = round_magnitude<M, Bias>(a);
    const uint32_t nosat = M == 3 ? 0x7FFFFFFFu : (u & kSign) | kInf;
    const uint32_t over = saturate ? (u & kSign) | float_as_bits(kMax) : nosat;
    return bits_as_float(a > kInf ? 0x7FFFFFFFu : m > kMax ? over : (u & kSign) | float_as_bits(m));
  }
  static bool overflows(float x) {
    // On the bits (a non-negative float's order), which keeps the callers' count loops vectorisable.
    const uint32_t a = float_as_bits(x) & 0x7FFFFFFFu;
    return (a <= kInf) & (float_as_bits(round_magnitude<M, Bias>(a)) > float_as_bits(kMax));
  }
};
using E4m3Grid = Fp8Grid<3, 7>;
using E5m2Grid = Fp8Grid<2, 15>;

// Calls fn with a rounding functor float(float) for format f, so that a loop over it is compiled
// once per format with the rounding inlined.
template <typename Fn>
void with_rounding(Format f, bool saturate, Fn&& fn) {
  switch (f) {
    case Format::bf16: fn([](float x) { return round_bf16(x); }); return;
    case Format::fp16: fn([](float x) { return round_fp16(x); }); return;
    case Format::e4m3: fn([saturate](float x) { return E4m3Grid::round(x, saturate); }); return;
    case Format::e5m2: fn([saturate](float x) { return E5m2Grid::round(x, saturate); }); return;
    case Format::fp32: break;
  }
  fn([](float x) { return x; });
}

}  // namespace grid
}  // namespace ptrain
