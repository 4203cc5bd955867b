// A float's bit pattern and back (what std::bit_cast does in C++20).
#pragma once

#include <cstdint>

namespace ptrain {

inline uint32_t float_as_bits(float x) { return __builtin_bit_cast(uint32_t, x); }
inline float bits_as_float(uint32_t u) { return __builtin_bit_cast(float, u); }

}  // namespace ptrain
