// Optimizer kernels under the SIMT emulator against the CPU backend: AdamW with the
// low-precision weight copy, the global gradient norm, and loss-scale removal.
#include <cmath>
#include <cstring>
#include <limits>

#include "kernel_test.h"
#include "optimizer.cuh"

namespace ptrain::test {
namespace {

// Odd sizes (vector tails) and a GPT-2 124M-sized slice (64 x 768).
const std::vector<size_t> kSizes{1, 7, 19, 111, 769, 64 * 768};

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

TEMPLATE_TEST_CASE("adamw_update kernel matches the CPU backend's adamw", "[kernels][optimizer]", float, bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  AdamWParams p;
  p.lr = 6e-4f;
  p.beta1 = 0.9f;
  p.beta2 = 0.95f;
  p.eps = 1e-8f;
  p.weight_decay = 0.1f;
  p.grad_scale = 0.5f;  // as after clipping
  p.step = 3;
  const float inv_bc1 = kernels::adamw_inv_bias_correction(p.beta1, p.step);
  const float inv_bc2 = kernels::adamw_inv_bias_correction(p.beta2, p.step);
  for (const size_t n : kSizes) {
    const auto N = static_cast<int64_t>(n);
    // FP32 master weights and moments; the gradient on the storage format's grid.
    const std::vector<float> master0 = random_on_grid(n, 51, 0.02f, Format::fp32),
                             m0 = random_on_grid(n, 53, 0.05f, Format::fp32);
    std::vector<float> grad = random_on_grid(n, 52, 1.0f, f), v0 = random_on_grid(n, 54, 0.1f, Format::fp32);
    for (auto& x : v0) x = x * x;  // second moments are non-negative
    std::vector<float> ref_master = master0, ref_m = m0, ref_v = v0, ref_copy(n);
    CpuReference cpu;
    cpu->adamw(cpu.view(ref_master, {N}), cpu.view(grad, {N}, f), cpu.view(ref_m, {N}), cpu.view(ref_v, {N}), p,
               cpu.view(ref_copy, {N}, f));
    const auto d_grad = to_storage<TestType>(grad);
    for (const auto& order : thread_orders()) {
      simt::ScopedOptions use(order);
      for (const bool with_copy : {true, false}) {
        INFO("n=" << n << " order " << order.name() << (with_copy ? " with" : " without") << " the copy");
        std::vector<float> master = master0, m = m0, v = v0;
        auto copy = poisoned<TestType>(n);
        kernels::adamw_update(master.data(), with_copy ? copy.data() : nullptr, d_grad.data(), m.data(), v.data(), n,
                              p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.grad_scale, inv_bc1, inv_bc2, nullptr);
        expect_close("adamw master", master, ref_master, Format::fp32, 1e-6);
        expect_close("adamw m", m, ref_m, Format::fp32, 1e-6);
        expect_close("adamw v", v, ref_v, Format::fp32, 1e-6);
        if (!with_copy) continue;
        if (master == ref_master) {
          // The same master weights rounded the same way: the same copy.
          expect_identical("adamw copy", to_floats(copy), ref_copy);
        } else {
          expect_close("adamw copy", to_floats(copy), ref_copy, f);
        }
      }
    }
  }
}

TEMPLATE_TEST_CASE("grad_norm_squared kernel matches the CPU backend's sum of squares", "[kernels][optimizer]", float,
                   bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  const std::vector<size_t> sizes{1, 7, 19, 111, 769, (size_t{1} << 20) + 3};  // the last strides over the grid
  for (const size_t n : sizes) {
    std::vector<float> grad = random_on_grid(n, 61, 1.0f, f);
    CpuReference cpu;
    const double ref = cpu->sum_squares(cpu.view(grad, {static_cast<int64_t>(n)}));
    const auto d_grad = to_storage<TestType>(grad);
    bool have_first = false;
    uint32_t first_bits = 0;
    for (const auto& order : thread_orders()) {
      simt::ScopedOptions use(order);
      INFO("n=" << n << " order " << order.name());
      float out = std::numeric_limits<float>::quiet_NaN();
      auto partials = poisoned<float>(kernels::kGradNormPartials);
      kernels::grad_norm_squared(&out, partials.data(), d_grad.data(), n, nullptr);
      INFO("kernel " << out << " reference " << ref);
      CHECK(std::fabs(static_cast<double>(out) - ref) <= 1e-5 * ref);  // FP32 accumulation; NaN fails
      // The summation order is fixed by n alone: the same bits whatever the thread order.
      if (!have_first) {
        first_bits = bits_of(out);
        have_first = true;
      }
      CHECK(bits_of(out) == first_bits);
    }
  }
}

TEMPLATE_TEST_CASE("grad_norm_squared kernel is not finite when a gradient is inf or NaN", "[kernels][optimizer]", float,
                   bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  constexpr size_t n = 769;
  for (const float special : {INFINITY, -INFINITY, NAN})
    for (const size_t at : {size_t{0}, size_t{400}, n - 1}) {
      std::vector<float> grad = random_on_grid(n, 62, 1.0f, f);
      grad[at] = round_to_format(special, f, false);
      const auto d_grad = to_storage<TestType>(grad);
      for (const auto& order : thread_orders()) {
        simt::ScopedOptions use(order);
        INFO(special << " at " << at << " order " << order.name());
        float out = 0.0f;
        auto partials = poisoned<float>(kernels::kGradNormPartials);
        kernels::grad_norm_squared(&out, partials.data(), d_grad.data(), n, nullptr);
        CHECK(!std::isfinite(out));
        if (std::isnan(special)) CHECK(std::isnan(out));
      }
    }
}

TEMPLATE_TEST_CASE("grad_unscale kernel rounds x * inv_scale to the format bit for bit", "[kernels][optimizer]", float,
                   bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  const float inv_scale = 1.0f / 3000.0f;  // not a power of two: the rounding matters
  for (const size_t n : kSizes) {
    const std::vector<float> grad = random_on_grid(n, 71, 300.0f, f);
    std::vector<float> ref(n);
    for (size_t i = 0; i < n; ++i) ref[i] = round_to_format(grad[i] * inv_scale, f, false);
    for (const auto& order : thread_orders()) {
      simt::ScopedOptions use(order);
      INFO("n=" << n << " order " << order.name());
      auto g = to_storage<TestType>(grad);
      int found = 0;
      kernels::grad_unscale(g.data(), n, inv_scale, &found, nullptr);
      expect_identical("grad_unscale", to_floats(g), ref);
      CHECK(found == 0);
      // A flag set by an earlier buffer of the step survives a clean one: the kernel never writes 0.
      g = to_storage<TestType>(grad);
      found = 1;
      kernels::grad_unscale(g.data(), n, inv_scale, &found, nullptr);
      CHECK(found == 1);
    }
  }
}

TEMPLATE_TEST_CASE("grad_unscale kernel flags inf and NaN gradients", "[kernels][optimizer]", float, bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  const float inv_scale = 1.0f / 65536.0f;
  constexpr size_t n = 111;
  for (const float special : {INFINITY, -INFINITY, NAN})
    for (const size_t at : {size_t{0}, size_t{55}, n - 1}) {
      std::vector<float> grad = random_on_grid(n, 72, 100.0f, f);
      grad[at] = round_to_format(special, f, false);
      std::vector<float> ref(n);
      for (size_t i = 0; i < n; ++i) ref[i] = round_to_format(grad[i] * inv_scale, f, false);
      for (const auto& order : thread_orders()) {
        simt::ScopedOptions use(order);
        INFO(special << " at " << at << " order " << order.name());
        auto g = to_storage<TestType>(grad);
        int found = 0;
        kernels::grad_unscale(g.data(), n, inv_scale, &found, nullptr);
        CHECK(found == 1);
        expect_identical("grad_unscale with a non-finite element", to_floats(g), ref);
      }
    }
}

}  // namespace
}  // namespace ptrain::test
