#include "precision/int8_weights.h"

#include <algorithm>
#include <cmath>

namespace ptrain {

Int8Rows quantize_int8_rows(const float* weights, int64_t rows, int64_t cols) {
  Int8Rows q{rows, cols, std::vector<int8_t>(static_cast<size_t>(rows * cols)), std::vector<float>(static_cast<size_t>(rows))};
  for (int64_t r = 0; r < rows; ++r) {
    const float* w = weights + r * cols;
    float amax = 0;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(w[c]));
    const float scale = amax / 127.0f;
    q.scales[static_cast<size_t>(r)] = scale;
    if (scale == 0) continue;  // codes stay 0
    for (int64_t c = 0; c < cols; ++c) {
      // nearbyint rounds ties to even in the default rounding mode; the clamp only guards a
      // quotient that float division put a hair past 127.
      const float code = std::clamp(std::nearbyint(w[c] / scale), -127.0f, 127.0f);
      q.codes[static_cast<size_t>(r * cols + c)] = static_cast<int8_t>(code);
    }
  }
  return q;
}

void dequantize_int8_rows(const Int8Rows& q, float* out) {
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t c = 0; c < q.cols; ++c)
      out[r * q.cols + c] = static_cast<float>(q.codes[static_cast<size_t>(r * q.cols + c)]) * q.scales[static_cast<size_t>(r)];
}

}  // namespace ptrain
