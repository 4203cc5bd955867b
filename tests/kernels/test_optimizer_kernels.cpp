// The optimizer kernel under the SIMT emulator against the CPU backend: AdamW with the
// low-precision weight copy.
#include <cmath>

#include "kernel_test.h"
#include "optimizer.cuh"

namespace ptrain::test {
namespace {

// Odd sizes (vector tails) and a GPT-2 124M-sized slice (64 x 768).
const std::vector<size_t> kSizes{1, 7, 19, 111, 769, 64 * 768};

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
    for (const auto& order : simt::test_orders()) {
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

}  // namespace
}  // namespace ptrain::test
