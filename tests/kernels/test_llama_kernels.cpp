// The Llama block's kernels (RMSNorm, QK-norm, RoPE, SwiGLU) under the SIMT emulator against
// the CPU backend's ops.
#include "kernel_test.h"
#include "llama.cuh"
#include "model/rope_table.h"

namespace ptrain::test {
namespace {

struct RowShape {
  int N, C;
};
// Odd sizes, ragged vector tails, more rows than one weight-gradient slice (32), a 1B model's C.
const std::vector<RowShape> kShapes{{1, 1}, {7, 7}, {19, 19}, {5, 111}, {70, 64}, {3, 2048}};

TEMPLATE_TEST_CASE("rmsnorm_forward kernel matches the CPU backend", "[kernels][llama]", float, bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  for (const RowShape s : kShapes) {
    const size_t n = static_cast<size_t>(s.N) * s.C;
    std::vector<float> inp = random_on_grid(n, 81, 2.0f, f), w = random_on_grid(s.C, 82, 1.0f, f);
    std::vector<float> ref_out(n), ref_rstd(s.N);
    CpuReference cpu;
    cpu->rmsnorm_forward(cpu.view(ref_out, {s.N, s.C}, f), cpu.view(ref_rstd, {s.N}), cpu.view(inp, {s.N, s.C}),
                         cpu.view(w, {s.C}), 1e-5f);
    const auto d_inp = to_storage<TestType>(inp), d_w = to_storage<TestType>(w);
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO("N=" << s.N << " C=" << s.C << " order " << order.name());
      auto out = poisoned<TestType>(n);
      auto rstd = poisoned<float>(s.N);
      kernels::rmsnorm_forward(out.data(), rstd.data(), d_inp.data(), d_w.data(), s.N, s.C, 1e-5f, nullptr);
      expect_close("rmsnorm_forward out", to_floats(out), ref_out, f);
      expect_close("rmsnorm_forward rstd", rstd, ref_rstd, Format::fp32, 1e-5);
    }
  }
}

TEMPLATE_TEST_CASE("rmsnorm_backward kernels match the CPU backend", "[kernels][llama]", float, bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  for (const RowShape s : kShapes) {
    const size_t n = static_cast<size_t>(s.N) * s.C;
    std::vector<float> inp = random_on_grid(n, 83, 1.5f, f), w = random_on_grid(s.C, 84, 1.0f, f),
                       dout = random_on_grid(n, 85, 1.0f, f);
    // Gradients accumulate (+=): start from non-zero values.
    std::vector<float> dinp0 = random_on_grid(n, 86, 0.5f, f), dw0 = random_on_grid(s.C, 87, 0.5f, f);
    std::vector<float> out(n), rstd(s.N);
    CpuReference cpu;
    cpu->rmsnorm_forward(cpu.view(out, {s.N, s.C}, f), cpu.view(rstd, {s.N}), cpu.view(inp, {s.N, s.C}),
                         cpu.view(w, {s.C}), 1e-5f);
    std::vector<float> ref_dinp = dinp0, ref_dw = dw0;
    cpu->rmsnorm_backward(cpu.view(ref_dinp, {s.N, s.C}, f), cpu.view(ref_dw, {s.C}, f), cpu.view(dout, {s.N, s.C}),
                          cpu.view(inp, {s.N, s.C}), cpu.view(w, {s.C}), cpu.view(rstd, {s.N}));
    const auto d_inp = to_storage<TestType>(inp), d_w = to_storage<TestType>(w), d_dout = to_storage<TestType>(dout);
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO("N=" << s.N << " C=" << s.C << " order " << order.name());
      auto dinp = to_storage<TestType>(dinp0), dw = to_storage<TestType>(dw0);
      auto scratch = poisoned<float>(kernels::rmsnorm_backward_scratch_floats(s.N, s.C));
      kernels::rmsnorm_backward(dinp.data(), dw.data(), scratch.data(), d_dout.data(), d_inp.data(), d_w.data(),
                                rstd.data(), s.N, s.C, nullptr);
      expect_close("rmsnorm_backward dinp", to_floats(dinp), ref_dinp, f);
      expect_close("rmsnorm_backward dweight", to_floats(dw), ref_dw, f);
    }
  }
}

struct QkShape {
  int rows, NH, KV, hs;
};
// Multi-head, grouped and multi-query heads; head sizes 2, 6, 38 (ragged vector tails, rows not
// 16-byte aligned) and 64; more q rows than one weight-gradient slice.
const std::vector<QkShape> kQkShapes{{1, 1, 1, 2}, {3, 4, 2, 6}, {5, 3, 1, 38}, {9, 4, 4, 64}};

// The forward pass out of place (v's heads copied) and in place, then the backward pass adding
// into non-zero gradients.
TEMPLATE_TEST_CASE("qk_norm kernels match the CPU backend", "[kernels][llama]", float, bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  for (const QkShape s : kQkShapes) {
    const int W = (s.NH + 2 * s.KV) * s.hs, stats = s.rows * (s.NH + s.KV);
    const size_t n = static_cast<size_t>(s.rows) * W;
    std::vector<float> inp = random_on_grid(n, 91, 2.0f, f), qw = random_on_grid(s.hs, 92, 1.0f, f),
                       kw = random_on_grid(s.hs, 93, 1.0f, f), dout = random_on_grid(n, 94, 1.0f, f);
    std::vector<float> dinp0 = random_on_grid(n, 95, 0.5f, f), dqw0 = random_on_grid(s.hs, 96, 0.5f, f),
                       dkw0 = random_on_grid(s.hs, 97, 0.5f, f);
    std::vector<float> ref_out(n), ref_rstd(stats), ref_dinp = dinp0, ref_dqw = dqw0, ref_dkw = dkw0;
    CpuReference cpu;
    cpu->qk_norm_forward(cpu.view(ref_out, {s.rows, W}, f), cpu.view(ref_rstd, {stats}), cpu.view(inp, {s.rows, W}),
                         cpu.view(qw, {s.hs}), cpu.view(kw, {s.hs}), s.NH, 1e-5f);
    cpu->qk_norm_backward(cpu.view(ref_dinp, {s.rows, W}, f), cpu.view(ref_dqw, {s.hs}, f),
                          cpu.view(ref_dkw, {s.hs}, f), cpu.view(dout, {s.rows, W}), cpu.view(inp, {s.rows, W}),
                          cpu.view(qw, {s.hs}), cpu.view(kw, {s.hs}), cpu.view(ref_rstd, {stats}), s.NH);
    const auto d_inp = to_storage<TestType>(inp), d_qw = to_storage<TestType>(qw), d_kw = to_storage<TestType>(kw),
               d_dout = to_storage<TestType>(dout);
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO("rows=" << s.rows << " NH=" << s.NH << " KV=" << s.KV << " hs=" << s.hs << " order " << order.name());
      auto out = poisoned<TestType>(n);
      auto rstd = poisoned<float>(static_cast<size_t>(stats));
      kernels::qk_norm_forward(out.data(), rstd.data(), d_inp.data(), d_qw.data(), d_kw.data(), s.rows, s.NH, s.KV,
                               s.hs, 1e-5f, nullptr);
      expect_close("qk_norm_forward out", to_floats(out), ref_out, f);
      expect_close("qk_norm_forward rstd", rstd, ref_rstd, Format::fp32, 1e-5);
      auto in_place = to_storage<TestType>(inp);
      kernels::qk_norm_forward(in_place.data(), rstd.data(), in_place.data(), d_qw.data(), d_kw.data(), s.rows, s.NH,
                               s.KV, s.hs, 1e-5f, nullptr);
      expect_close("qk_norm_forward in place", to_floats(in_place), ref_out, f);

      auto dinp = to_storage<TestType>(dinp0), dqw = to_storage<TestType>(dqw0), dkw = to_storage<TestType>(dkw0);
      auto scratch = poisoned<float>(kernels::qk_norm_backward_scratch_floats(s.rows, s.NH, s.hs));
      kernels::qk_norm_backward(dinp.data(), dqw.data(), dkw.data(), scratch.data(), d_dout.data(), d_inp.data(),
                                d_qw.data(), d_kw.data(), rstd.data(), s.rows, s.NH, s.KV, s.hs, nullptr);
      expect_close("qk_norm_backward dinp", to_floats(dinp), ref_dinp, f);
      expect_close("qk_norm_backward dq_weight", to_floats(dqw), ref_dqw, f);
      expect_close("qk_norm_backward dk_weight", to_floats(dkw), ref_dkw, f);
    }
  }
}

struct RopeShape {
  int B, T, heads, width_heads, hs;  // `heads` of `width_heads` heads rotate
};
// Head sizes 2, 6, 38 and a Llama head (128); v heads left alone; B*T rows over several blocks.
const std::vector<RopeShape> kRopeShapes{{1, 1, 1, 1, 2}, {2, 7, 3, 5, 6}, {1, 19, 2, 3, 38}, {2, 64, 6, 8, 128}};

TEMPLATE_TEST_CASE("rope kernel turns q and k as the CPU backend does, and back", "[kernels][llama]", float, bf16,
                   fp16) {
  constexpr Format f = format_of<TestType>();
  for (const RopeShape s : kRopeShapes) {
    const int width = s.width_heads * s.hs;
    const size_t n = static_cast<size_t>(s.B) * s.T * width;
    std::vector<float> table = rope_table(s.T, s.hs, 10000);
    const std::vector<float> x = random_on_grid(n, 88, 1.0f, f);
    for (const bool inverse : {false, true}) {
      std::vector<float> ref = x;
      CpuReference cpu;
      const Tensor view = cpu.view(ref, {s.B, s.T, width}, f), t = cpu.view(table, {s.T, s.hs / 2, 2});
      inverse ? cpu->rope_backward(view, t, s.heads) : cpu->rope_forward(view, t, s.heads);
      for (const auto& order : simt::test_orders()) {
        simt::ScopedOptions use(order);
        INFO("B=" << s.B << " T=" << s.T << " heads " << s.heads << "/" << s.width_heads << " hs=" << s.hs
                  << (inverse ? " backward" : " forward") << " order " << order.name());
        auto got = to_storage<TestType>(x);
        kernels::rope(got.data(), table.data(), s.B * s.T, s.T, width, s.heads, s.hs / 2, inverse, nullptr);
        expect_close("rope", to_floats(got), ref, f);
        // The heads past `heads` (v's) are untouched, bit for bit.
        const auto stored = to_storage<TestType>(x);
        size_t changed = 0;
        for (size_t row = 0; row < static_cast<size_t>(s.B) * s.T; ++row)
          for (int i = s.heads * s.hs; i < width; ++i)
            changed += std::memcmp(&got[row * width + i], &stored[row * width + i], sizeof(TestType)) != 0;
        CHECK(changed == 0);
      }
    }
  }
}

TEMPLATE_TEST_CASE("swiglu kernels match the CPU backend", "[kernels][llama]", float, bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  for (const RowShape s : kShapes) {
    const int N = s.N, H = s.C;
    const size_t n = static_cast<size_t>(N) * H;
    std::vector<float> gate_up = random_on_grid(2 * n, 89, 2.0f, f), dout = random_on_grid(n, 90, 1.0f, f);
    std::vector<float> dgate_up0 = random_on_grid(2 * n, 91, 0.5f, f);
    std::vector<float> ref_out(n), ref_dgate_up = dgate_up0;
    CpuReference cpu;
    cpu->swiglu_forward(cpu.view(ref_out, {N, H}, f), cpu.view(gate_up, {N, 2 * H}));
    cpu->swiglu_backward(cpu.view(ref_dgate_up, {N, 2 * H}, f), cpu.view(dout, {N, H}), cpu.view(gate_up, {N, 2 * H}));
    const auto d_gate_up = to_storage<TestType>(gate_up), d_dout = to_storage<TestType>(dout);
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO("N=" << N << " H=" << H << " order " << order.name());
      auto out = poisoned<TestType>(n);
      kernels::swiglu_forward(out.data(), d_gate_up.data(), N, H, nullptr);
      expect_close("swiglu_forward out", to_floats(out), ref_out, f);
      auto dgate_up = to_storage<TestType>(dgate_up0);
      kernels::swiglu_backward(dgate_up.data(), d_dout.data(), d_gate_up.data(), N, H, nullptr);
      expect_close("swiglu_backward dgate_up", to_floats(dgate_up), ref_dgate_up, f);
    }
  }
}

}  // namespace
}  // namespace ptrain::test
