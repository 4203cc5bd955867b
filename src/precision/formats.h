// The number formats ptrain trains in, defined by NVIDIA's own host conversion functions
// (cuda_bf16.h, cuda_fp16.h, cuda_fp8.h, compiled by g++), so the CPU emulation rounds exactly
// as the GPU does. Values on the CPU stay in float but lie on the format's grid.
#pragma once

#include <cstdint>

namespace ptrain {

enum class Format { fp32, bf16, fp16, e4m3, e5m2 };

const char* format_name(Format f);  // "fp32", "bf16", "fp16", "e4m3", "e5m2"

// Largest finite magnitude: FLT_MAX, 0x7F7F bf16 (3.3895e38), 65504, 448, 57344.
float format_max(Format f);
// Smallest positive subnormal: 2^-149, 2^-133, 2^-24, 2^-9, 2^-16.
float format_min_subnormal(Format f);
bool is_fp8(Format f);

// Rounds x to the nearest value of format f, ties to even, and returns it as a float.
//  - fp32: x unchanged.
//  - bf16, fp16: overflow gives +-inf (as __float2bfloat16_rn / __float2half_rn do); NaN stays NaN.
//  - e4m3, e5m2 with saturate: magnitudes beyond the largest finite become +-max (satfinite);
//    +-inf becomes +-max; NaN stays NaN.
//  - e4m3, e5m2 without saturate: overflow gives NaN (e4m3 has no infinity) or +-inf (e5m2).
float round_to_format(float x, Format f, bool saturate);

// Bit patterns (for exact tests and, later, real storage).
uint16_t bf16_bits(float x);       // round to nearest even
float bf16_value(uint16_t bits);
uint16_t fp16_bits(float x);       // round to nearest even
float fp16_value(uint16_t bits);
uint8_t fp8_bits(float x, Format f, bool saturate);  // f is e4m3 or e5m2
float fp8_value(uint8_t bits, Format f);

}  // namespace ptrain
