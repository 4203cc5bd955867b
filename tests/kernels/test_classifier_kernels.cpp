// The fused classifier kernel under the SIMT emulator against the CPU backend's classifier.
#include "classifier.cuh"
#include "kernel_test.h"

namespace ptrain::test {
namespace {

struct ClassifierShape {
  int N, V, Vp;
};
// Odd vocabularies with and without padding, ragged and unaligned rows, and GPT-2's 50257
// tokens padded to 50304 (a row spans many chunks per thread).
const std::vector<ClassifierShape> kShapes{{1, 1, 1},     {7, 7, 8},     {19, 19, 19},
                                           {5, 111, 128}, {3, 769, 776}, {4, 50257, 50304}};

// Targets spread over the vocabulary, its last column included.
std::vector<int32_t> targets_for(const ClassifierShape& s) {
  std::vector<int32_t> targets(s.N);
  for (int n = 0; n < s.N; ++n) targets[n] = n == 0 ? s.V - 1 : static_cast<int32_t>((n * 7919LL + 13) % s.V);
  return targets;
}

// Runs the kernel under every thread order, with dloss = 1/N (a mean loss's gradient) or 0 (loss
// only), and compares the losses and what is left in the logits with the CPU backend's.
template <typename T>
void check_fused_classifier(bool with_gradient) {
  constexpr Format f = format_of<T>();
  for (const ClassifierShape s : kShapes) {
    const float dloss = with_gradient ? 1.0f / s.N : 0.0f;
    const size_t n = static_cast<size_t>(s.N) * s.Vp;
    // Padded columns hold values too: the kernel must neither read nor keep them.
    const std::vector<float> logits = random_on_grid(n, 41, 3.0f, f);
    std::vector<int32_t> targets = targets_for(s);
    std::vector<float> ref_grad = logits, ref_losses(s.N);
    CpuReference cpu;
    cpu->classifier(cpu.view(ref_grad, {s.N, s.Vp}, f), cpu.view(ref_losses, {s.N}), cpu.tokens(targets, {s.N}), s.V,
                    dloss);
    const auto d_logits = to_storage<T>(logits);
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO("N=" << s.N << " V=" << s.V << " Vp=" << s.Vp << " dloss=" << dloss << " order " << order.name());
      auto grad = d_logits;  // overwritten in place
      auto losses = poisoned<float>(s.N);
      kernels::fused_classifier(grad.data(), losses.data(), targets.data(), s.N, s.V, s.Vp, dloss, nullptr);
      // Both sides compute in FP32 from the same values; only summation order differs.
      expect_close("fused_classifier losses", losses, ref_losses, Format::fp32, 1e-5);
      if (with_gradient) {
        expect_close("fused_classifier dlogits", to_floats(grad), ref_grad, f);
      } else {
        expect_identical("fused_classifier zeroed logits", to_floats(grad), ref_grad);  // all +0
      }
    }
  }
}

TEMPLATE_TEST_CASE("fused_classifier kernel matches the CPU backend", "[kernels][classifier]", float, bf16, fp16) {
  check_fused_classifier<TestType>(true);
}

TEMPLATE_TEST_CASE("fused_classifier kernel with dloss 0 gives losses and a zeroed row", "[kernels][classifier]", float,
                   bf16, fp16) {
  check_fused_classifier<TestType>(false);
}

}  // namespace
}  // namespace ptrain::test
