#include "model/rope_table.h"

#include <cmath>

#include "core/error.h"

namespace ptrain {

std::vector<float> rope_table(int T, int head_size, double theta) {
  PTRAIN_CHECK(T > 0 && head_size > 0 && head_size % 2 == 0 && theta > 0, "RoPE needs an even head size");
  const int half = head_size / 2;
  std::vector<float> inverse_frequency(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i)
    inverse_frequency[i] = 1.0f / std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(head_size));
  std::vector<float> table(static_cast<size_t>(T) * half * 2);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(t) * inverse_frequency[i];
      table[(static_cast<size_t>(t) * half + i) * 2] = std::cos(angle);
      table[(static_cast<size_t>(t) * half + i) * 2 + 1] = std::sin(angle);
    }
  return table;
}

}  // namespace ptrain
