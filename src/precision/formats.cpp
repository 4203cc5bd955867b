// Which implementation defines the formats: NVIDIA's host conversions (cuda_bf16.h, cuda_fp16.h,
// cuda_fp8.h, which g++ compiles with only -I/usr/local/cuda/include) when those headers are on
// the include path, so the CPU emulation rounds with the very code the CUDA build uses; otherwise
// precision/portable_formats.h, a pure C++ implementation, so the CPU build also works without the
// CUDA toolkit. The two give identical bits: tests/test_formats.cpp compares them wherever the
// headers exist, and checks whichever one this file uses against an independent reference written
// from the format definitions. Defining PTRAIN_PORTABLE_FORMATS forces the portable one (to test
// it on a machine that has the headers).
//
// Overflow without saturation (__NV_NOSAT), as measured: e4m3 has no infinity and gives NaN
// (0x7F / 0xFF); e5m2 gives +-inf (0x7C / 0xFC). Any NaN input encodes to 0x7F (sign dropped).
#include "precision/formats.h"

#include <cfloat>
#include <cmath>

#if !defined(PTRAIN_PORTABLE_FORMATS) && __has_include(<cuda_fp8.h>) && __has_include(<cuda_fp16.h>) && \
    __has_include(<cuda_bf16.h>)
#define PTRAIN_NVIDIA_FORMATS 1
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#else
#include "precision/portable_formats.h"
#endif

namespace ptrain {

const char* format_name(Format f) {
  switch (f) {
    case Format::fp32: return "fp32";
    case Format::bf16: return "bf16";
    case Format::fp16: return "fp16";
    case Format::e4m3: return "e4m3";
    case Format::e5m2: return "e5m2";
  }
  return "?";
}

float format_max(Format f) {
  switch (f) {
    case Format::fp32: return FLT_MAX;
    case Format::bf16: return bf16_value(0x7F7F);
    case Format::fp16: return 65504.0f;
    case Format::e4m3: return 448.0f;
    case Format::e5m2: return 57344.0f;
  }
  return 0.0f;
}

float format_min_subnormal(Format f) {
  switch (f) {
    case Format::fp32: return std::ldexp(1.0f, -149);
    case Format::bf16: return std::ldexp(1.0f, -133);
    case Format::fp16: return std::ldexp(1.0f, -24);
    case Format::e4m3: return std::ldexp(1.0f, -9);
    case Format::e5m2: return std::ldexp(1.0f, -16);
  }
  return 0.0f;
}

bool is_fp8(Format f) { return f == Format::e4m3 || f == Format::e5m2; }

#ifdef PTRAIN_NVIDIA_FORMATS

static __nv_fp8_interpretation_t fp8_kind(Format f) { return f == Format::e4m3 ? __NV_E4M3 : __NV_E5M2; }

uint16_t bf16_bits(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
float bf16_value(uint16_t bits) { return __bfloat162float(__ushort_as_bfloat16(bits)); }
uint16_t fp16_bits(float x) { return __half_as_ushort(__float2half_rn(x)); }
float fp16_value(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }

uint8_t fp8_bits(float x, Format f, bool saturate) {
  return __nv_cvt_float_to_fp8(x, saturate ? __NV_SATFINITE : __NV_NOSAT, fp8_kind(f));
}

// Every fp8 value is exact in fp16, and every fp16 value is exact in float.
float fp8_value(uint8_t bits, Format f) { return __half2float(__half(__nv_cvt_fp8_to_halfraw(bits, fp8_kind(f)))); }

#else

uint16_t bf16_bits(float x) { return portable::float_to_bf16(x); }
float bf16_value(uint16_t bits) { return portable::bf16_to_float(bits); }
uint16_t fp16_bits(float x) { return portable::float_to_fp16(x); }
float fp16_value(uint16_t bits) { return portable::fp16_to_float(bits); }

uint8_t fp8_bits(float x, Format f, bool saturate) {
  return f == Format::e4m3 ? portable::float_to_e4m3(x, saturate) : portable::float_to_e5m2(x, saturate);
}

float fp8_value(uint8_t bits, Format f) {
  return f == Format::e4m3 ? portable::e4m3_to_float(bits) : portable::e5m2_to_float(bits);
}

#endif

float round_to_format(float x, Format f, bool saturate) {
  switch (f) {
    case Format::fp32: return x;
    case Format::bf16: return bf16_value(bf16_bits(x));
    case Format::fp16: return fp16_value(fp16_bits(x));
    case Format::e4m3:
    case Format::e5m2: return fp8_value(fp8_bits(x, f, saturate), f);
  }
  return x;
}

}  // namespace ptrain
