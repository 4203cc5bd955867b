#include "metrics/cpu_peak.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/rng.h"

namespace ptrain {

GemmRate measure_sgemm_rate(int size, int repeats) {
  const size_t n = static_cast<size_t>(size) * size;
  std::vector<float> a(n), b(n), c(n);
  Rng rng(1);
  for (size_t i = 0; i < n; ++i) {
    a[i] = rng.uniform() - 0.5f;
    b[i] = rng.uniform() - 0.5f;
  }
  GemmRate result{size, omp_get_max_threads(), {}};
  std::vector<double>& rates = result.rates;
  for (int r = 0; r <= repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, size, size, size, 1.0f, a.data(), size, b.data(), size,
                0.0f, c.data(), size);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) rates.push_back(2.0 * size * static_cast<double>(size) * size / s);  // r = 0 warms up
  }
  std::sort(rates.begin(), rates.end());
  return result;
}

double GemmRate::median_flops() const {
  if (rates.empty()) return 0;
  const size_t n = rates.size();
  return n % 2 ? rates[n / 2] : 0.5 * (rates[n / 2 - 1] + rates[n / 2]);
}

GemmRate GemmRate::merged(const GemmRate& other) const {
  GemmRate m = *this;
  m.rates.insert(m.rates.end(), other.rates.begin(), other.rates.end());
  std::sort(m.rates.begin(), m.rates.end());
  return m;
}

}  // namespace ptrain
