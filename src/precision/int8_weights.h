// Weight-only INT8, the inference format the guide ptrain follows names: each output channel (a
// row of a linear's (out, in) weight) gets its own scale, the row's largest |w| over 127, and
// every weight the code round(w / scale), ties to even, in [-127, 127] (symmetric: -128 unused).
// A row of zeros has scale 0 and codes 0. The dequantized weight is code x scale. Activations
// are not quantized: `ptrain eval/sample --weights int8` runs the dequantized weights through
// the ordinary forward pass, so every backend runs it and the difference in loss is the
// weights' alone.
#pragma once

#include <cstdint>
#include <vector>

namespace ptrain {

struct Int8Rows {
  int64_t rows = 0, cols = 0;
  std::vector<int8_t> codes;  // rows x cols, row-major
  std::vector<float> scales;  // one per row
};

Int8Rows quantize_int8_rows(const float* weights, int64_t rows, int64_t cols);
void dequantize_int8_rows(const Int8Rows& q, float* out);

}  // namespace ptrain
