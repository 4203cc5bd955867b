// Layernorm kernels under the SIMT emulator against the CPU backend's layernorm ops.
#include "kernel_test.h"
#include "layernorm.cuh"

namespace ptrain::test {
namespace {

struct RowShape {
  int N, C;
};
// Odd sizes, ragged vector tails, and a GPT-2 124M shape (C = 768).
const std::vector<RowShape> kShapes{{1, 1}, {7, 7}, {19, 19}, {5, 111}, {3, 769}, {64, 768}};

TEMPLATE_TEST_CASE("layernorm_forward kernel matches the CPU backend", "[kernels][layernorm]", float, bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  for (const RowShape s : kShapes) {
    const size_t n = static_cast<size_t>(s.N) * s.C;
    std::vector<float> inp = random_on_grid(n, 1, 2.0f, f), w = random_on_grid(s.C, 2, 1.0f, f),
                       b = random_on_grid(s.C, 3, 0.5f, f);
    for (auto& x : inp) x = round_to_format(x + 0.3f, f, false);  // a non-zero mean
    std::vector<float> ref_out(n), ref_mean(s.N), ref_rstd(s.N);
    CpuReference cpu;
    cpu->layernorm_forward(cpu.view(ref_out, {s.N, s.C}, f), cpu.view(ref_mean, {s.N}), cpu.view(ref_rstd, {s.N}),
                           cpu.view(inp, {s.N, s.C}), cpu.view(w, {s.C}), cpu.view(b, {s.C}));
    const auto d_inp = to_storage<TestType>(inp), d_w = to_storage<TestType>(w), d_b = to_storage<TestType>(b);
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO("N=" << s.N << " C=" << s.C << " order " << order.name());
      auto out = poisoned<TestType>(n);
      auto mean = poisoned<float>(s.N), rstd = poisoned<float>(s.N);
      kernels::layernorm_forward(out.data(), mean.data(), rstd.data(), d_inp.data(), d_w.data(), d_b.data(), s.N, s.C,
                                 nullptr);
      expect_close("layernorm_forward out", to_floats(out), ref_out, f);
      expect_close("layernorm_forward mean", mean, ref_mean, Format::fp32, 1e-5);
      expect_close("layernorm_forward rstd", rstd, ref_rstd, Format::fp32, 1e-5);
    }
  }
}

TEMPLATE_TEST_CASE("layernorm_backward kernels match the CPU backend", "[kernels][layernorm]", float, bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  for (const RowShape s : kShapes) {
    const size_t n = static_cast<size_t>(s.N) * s.C;
    std::vector<float> inp = random_on_grid(n, 8, 1.5f, f), w = random_on_grid(s.C, 9, 1.0f, f),
                       b = random_on_grid(s.C, 10, 0.5f, f), dout = random_on_grid(n, 11, 1.0f, f);
    // Gradients accumulate (+=): start from non-zero values.
    std::vector<float> dinp0 = random_on_grid(n, 12, 0.5f, f), dw0 = random_on_grid(s.C, 13, 0.5f, f),
                       db0 = random_on_grid(s.C, 14, 0.5f, f);
    std::vector<float> out(n), mean(s.N), rstd(s.N);
    CpuReference cpu;
    cpu->layernorm_forward(cpu.view(out, {s.N, s.C}, f), cpu.view(mean, {s.N}), cpu.view(rstd, {s.N}),
                           cpu.view(inp, {s.N, s.C}), cpu.view(w, {s.C}), cpu.view(b, {s.C}));
    std::vector<float> ref_dinp = dinp0, ref_dw = dw0, ref_db = db0;
    cpu->layernorm_backward(cpu.view(ref_dinp, {s.N, s.C}, f), cpu.view(ref_dw, {s.C}, f), cpu.view(ref_db, {s.C}, f),
                            cpu.view(dout, {s.N, s.C}), cpu.view(inp, {s.N, s.C}), cpu.view(w, {s.C}),
                            cpu.view(mean, {s.N}), cpu.view(rstd, {s.N}));
    const auto d_inp = to_storage<TestType>(inp), d_w = to_storage<TestType>(w), d_dout = to_storage<TestType>(dout);
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO("N=" << s.N << " C=" << s.C << " order " << order.name());
      auto dinp = to_storage<TestType>(dinp0), dw = to_storage<TestType>(dw0), db = to_storage<TestType>(db0);
      auto scratch = poisoned<float>(kernels::layernorm_backward_scratch_floats(s.N, s.C));
      kernels::layernorm_backward(dinp.data(), dw.data(), db.data(), scratch.data(), d_dout.data(), d_inp.data(),
                                  d_w.data(), mean.data(), rstd.data(), s.N, s.C, nullptr);
      expect_close("layernorm_backward dinp", to_floats(dinp), ref_dinp, f);
      expect_close("layernorm_backward dweight", to_floats(dw), ref_dw, f);
      expect_close("layernorm_backward dbias", to_floats(db), ref_db, f);
    }
  }
}

}  // namespace
}  // namespace ptrain::test
