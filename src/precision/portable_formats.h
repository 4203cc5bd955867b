// Pure C++ conversions between float and ptrain's reduced-precision formats (bf16, fp16, fp8
// e4m3 and e5m2), for builds without the CUDA toolkit's headers. They give the same bits as
// NVIDIA's host functions (__float2bfloat16_rn, __bfloat162float, __float2half_rn,
// __half2float, __nv_cvt_float_to_fp8, __nv_cvt_fp8_to_halfraw + __half2float) for every input,
// NaN payloads, infinities, subnormals and ties included; tests/test_formats.cpp compares them
// exhaustively (decoding) and by sweeps (encoding) against NVIDIA's wherever the headers exist.
//
// Integer arithmetic on the bit patterns only: no floating-point operation, so neither the
// rounding mode nor flush-to-zero (FTZ/DAZ) can change a result.
//
// What NVIDIA's host functions do beyond plain round-to-nearest-even (read from cuda_bf16.hpp,
// cuda_fp16.hpp and cuda_fp8.hpp), and so what these do:
//  - float -> bf16 / fp16: any NaN (either sign, any payload) -> 0x7FFF; overflow -> +-inf.
//  - float -> fp8: any NaN -> 0x7F (sign dropped). Too large (beyond max + half an ulp, or the
//    tie there when it rounds up), +-inf included: SATFINITE -> +-max (0x7E e4m3, 0x7B e5m2);
//    NOSAT -> NaN 0x7F / 0xFF for e4m3 (which has no infinity), +-inf 0x7C / 0xFC for e5m2.
//  - bf16 -> float: the bits shifted up, so a NaN keeps its sign and payload.
//  - fp16 -> float and fp8 -> float: any NaN -> the float 0x7FFFFFFF (sign and payload dropped).
#pragma once

#include <cstdint>

#include "core/bits.h"

namespace ptrain {
namespace portable {

using ptrain::bits_as_float;
using ptrain::float_as_bits;

namespace detail {

inline constexpr uint32_t kFloatNaN = 0x7FFFFFFFu;  // the NaN __half2float returns for every fp16 NaN
inline constexpr uint32_t kFloatInf = 0x7F800000u;

inline bool is_nan_bits(uint32_t u) { return (u & 0x7FFFFFFFu) > kFloatInf; }

// Rounds a non-NaN float magnitude (bits a, sign bit clear; +inf is treated as 2^128, which
// overflows every target) to nearest, ties to even, in a format with M stored mantissa bits and
// exponent bias `bias`, whose exponent range is taken as unbounded above. Returns the magnitude
// code (exponent field << M | mantissa field) of the result; a code beyond the format's largest
// finite one means overflow, which the caller resolves.
inline uint32_t round_magnitude(uint32_t a, int M, int bias) {
  if (a == 0) return 0;
  const int fe = int(a >> 23);  // float's exponent field
  uint32_t sig = a & 0x7FFFFFu;
  int e;  // a = sig * 2^(e - 23), sig < 2^24
  if (fe == 0) {
    e = -126;  // float subnormal: no implicit bit
  } else {
    sig |= 0x800000u;
    e = fe - 127;
  }
  // The target's quantum (ulp) in a's binade is 2^(ec - M), where ec clamps a's exponent to
  // the target's smallest normal exponent: below it the target is subnormal, with a fixed ulp.
  const int emin = 1 - bias;
  const int ec = e > emin ? e : emin;
  // How many of sig's low bits lie below that quantum. The targets are narrower than float and
  // their emin is >= float's, so shift >= 23 - M > 0.
  const int shift = ec - M - (e - 23);
  // sig < 2^24 <= 2^(shift - 2): less than half a quantum, rounds to zero. Also keeps the
  // shifts below 32 bits.
  if (shift > 25) return 0;
  uint32_t n = sig >> shift;  // whole quanta, truncated
  const uint32_t rem = sig & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (n & 1u))) ++n;  // ties to even
  // Value n * 2^(ec - M). In the subnormal binade (ec == emin) the code is n itself; in a normal
  // binade n = 2^M + mantissa and the exponent field is ec + bias, so code = ((ec + bias - 1)
  // << M) + n for both. A carry out of the mantissa (n == 2^(M+1)) correctly bumps the exponent,
  // and rounding the largest subnormal up gives the smallest normal.
  return (uint32_t(ec + bias - 1) << M) + n;
}

// Exact float for the finite code (exp field, mantissa field m) of a format with M mantissa bits
// and bias `bias`; sign is 0 or 0x80000000. Every value of these formats is a float.
inline float decode_finite(uint32_t sign, uint32_t exp, uint32_t m, int M, int bias) {
  if (exp == 0) {
    if (m == 0) return bits_as_float(sign);  // +-0
    // Subnormal m * 2^(1 - bias - M) is a normal float: normalise on m's leading bit p.
    int p = 0;
    while ((m >> (p + 1)) != 0) ++p;
    const uint32_t fexp = uint32_t(p + 1 - bias - M + 127);
    return bits_as_float(sign | (fexp << 23) | ((m << (23 - p)) & 0x7FFFFFu));
  }
  return bits_as_float(sign | (uint32_t(int(exp) - bias + 127) << 23) | (m << (23 - M)));
}

}  // namespace detail

// ---------------------------------------------------------------------------- bf16

inline uint16_t float_to_bf16(float x) {
  const uint32_t u = float_as_bits(x);
  if (detail::is_nan_bits(u)) return 0x7FFF;  // canonical NaN, sign dropped
  // bf16 has float's exponent range, so the only overflow is rounding up into 0x7F80 = inf.
  return uint16_t(((u >> 16) & 0x8000u) | detail::round_magnitude(u & 0x7FFFFFFFu, 7, 127));
}

// bf16 is the top half of a float.
inline float bf16_to_float(uint16_t bits) { return bits_as_float(uint32_t(bits) << 16); }

// ---------------------------------------------------------------------------- fp16

inline uint16_t float_to_fp16(float x) {
  const uint32_t u = float_as_bits(x);
  if (detail::is_nan_bits(u)) return 0x7FFF;  // canonical NaN, sign dropped
  uint32_t code = detail::round_magnitude(u & 0x7FFFFFFFu, 10, 15);
  if (code > 0x7C00u) code = 0x7C00u;  // overflow -> inf (0x7C00 itself is a rounded-up max)
  return uint16_t(((u >> 16) & 0x8000u) | code);
}

inline float fp16_to_float(uint16_t bits) {
  const uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1Fu, m = bits & 0x3FFu;
  if (exp == 0x1Fu) return bits_as_float(m ? detail::kFloatNaN : (sign | detail::kFloatInf));
  return detail::decode_finite(sign, exp, m, 10, 15);
}

// ---------------------------------------------------------------------------- fp8

// e4m3 (OCP FP8): bias 7, max 448 = 0x7E, S.1111.111 is NaN, no infinity.
inline uint8_t float_to_e4m3(float x, bool saturate) {
  const uint32_t u = float_as_bits(x);
  if (detail::is_nan_bits(u)) return 0x7F;  // sign dropped
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t code = detail::round_magnitude(u & 0x7FFFFFFFu, 3, 7);
  // Codes above 0x7E: 0x7F is NaN, not a number to round to, so anything that rounds past 448
  // (i.e. above 464; 464 itself ties down to the even 0x7E) overflows.
  if (code > 0x7Eu) return uint8_t(sign | (saturate ? 0x7Eu : 0x7Fu));
  return uint8_t(sign | code);
}

// e5m2 (OCP FP8): bias 15, max 57344 = 0x7B, infinity 0x7C, NaN above; the top byte of an fp16.
inline uint8_t float_to_e5m2(float x, bool saturate) {
  const uint32_t u = float_as_bits(x);
  if (detail::is_nan_bits(u)) return 0x7F;  // sign dropped
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t code = detail::round_magnitude(u & 0x7FFFFFFFu, 2, 15);
  // 61440 ties between 0x7B (odd) and 0x7C: to even means up, so it overflows too.
  if (code > 0x7Bu) return uint8_t(sign | (saturate ? 0x7Bu : 0x7Cu));
  return uint8_t(sign | code);
}

inline float e4m3_to_float(uint8_t bits) {
  if ((bits & 0x7Fu) == 0x7Fu) return bits_as_float(detail::kFloatNaN);
  const uint32_t sign = uint32_t(bits & 0x80u) << 24;
  return detail::decode_finite(sign, (bits >> 3) & 0xFu, bits & 0x7u, 3, 7);
}

// An e5m2 code is an fp16 code's top byte, and NVIDIA decodes it exactly that way.
inline float e5m2_to_float(uint8_t bits) { return fp16_to_float(uint16_t(uint16_t(bits) << 8)); }

}  // namespace portable
}  // namespace ptrain
