// ptrain's Format in the kernels' terms (their RoundFormat, and CUDA's FP8 interpretation):
// kernels/ is single-source device code and does not include src/, so the mapping lives here,
// for the CUDA backend and the kernel tests alike.
#pragma once

#include <stdexcept>

#include "convert.cuh"
#include "precision/formats.h"

namespace ptrain {

inline kernels::RoundFormat round_format(Format f) {
  switch (f) {
    case Format::fp32: return kernels::RoundFormat::fp32;
    case Format::bf16: return kernels::RoundFormat::bf16;
    case Format::fp16: return kernels::RoundFormat::fp16;
    case Format::e4m3: return kernels::RoundFormat::e4m3;
    case Format::e5m2: return kernels::RoundFormat::e5m2;
  }
  throw std::logic_error("round_format: unknown format");
}

// E4M3 or E5M2 (the caller has checked that f is an FP8 format).
inline __nv_fp8_interpretation_t fp8_interpretation(Format f) { return f == Format::e4m3 ? __NV_E4M3 : __NV_E5M2; }

}  // namespace ptrain
