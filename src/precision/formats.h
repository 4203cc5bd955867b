// The number formats ptrain trains in. Conversions give exactly the bits of NVIDIA's host
// conversion functions (cuda_bf16.h, cuda_fp16.h, cuda_fp8.h), the rounding the CUDA kernels use:
// formats.cpp calls those functions (compiled by g++) when the CUDA toolkit's headers are on the
// include path, and otherwise precision/portable_formats.h, a pure C++ implementation that
// tests/test_formats.cpp compares bit for bit with NVIDIA's. Values on the CPU stay in float but
// lie on the format's grid.
#pragma once

#include <cstdint>

#include "core/tensor.h"  // Format

namespace ptrain {

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

// Bit patterns (the GPU's storage, and exact tests). Encoding any NaN (either sign, any
// payload) gives 0x7FFF for bf16 and fp16 and 0x7F for fp8. Decoding a bf16 NaN keeps its sign
// and payload (the float is the code shifted up); decoding an fp16 or fp8 NaN gives the float
// with bits 0x7FFFFFFF.
uint16_t bf16_bits(float x);       // round to nearest even
float bf16_value(uint16_t bits);
uint16_t fp16_bits(float x);       // round to nearest even
float fp16_value(uint16_t bits);
uint8_t fp8_bits(float x, Format f, bool saturate);  // f is e4m3 or e5m2
float fp8_value(uint8_t bits, Format f);

}  // namespace ptrain
