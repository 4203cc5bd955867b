// Elementwise kernels (GELU, add, bias add, bias gradient) under the SIMT emulator against the
// CPU backend's ops.
#include "kernel_test.h"
#include "elementwise.cuh"

namespace ptrain::test {
namespace {

// A GPT-2 124M fc activation: 64 rows of 4 * 768.
constexpr size_t kGpt2Fc = 64 * 3072;

struct RowShape {
  int N, OC;
};
// Odd sizes, several partial-sum slices with a ragged last one (100 rows), and the GPT-2 fc shape.
const std::vector<RowShape> kRowShapes{{1, 1}, {7, 7}, {19, 19}, {100, 19}, {33, 111}, {5, 769}, {64, 3072}};

// `values` in storage type T, starting `offset` elements into the buffer.
template <typename T>
std::vector<T> at_offset(const std::vector<float>& values, int offset) {
  std::vector<T> buffer(values.size() + offset, kernels::from_float<T>(0.0f));
  for (size_t i = 0; i < values.size(); ++i) buffer[offset + i] = kernels::from_float<T>(values[i]);
  return buffer;
}

// The buffer's elements from `offset` on, as floats.
template <typename T>
std::vector<float> floats_from(const std::vector<T>& buffer, int offset) {
  std::vector<float> out(buffer.size() - offset);
  for (size_t i = 0; i < out.size(); ++i) out[i] = kernels::to_float(buffer[offset + i]);
  return out;
}

// Whether the `count` elements before an output (poisoned) were left alone.
template <typename T>
bool prefix_untouched(const std::vector<T>& buffer, int count) {
  const auto poison = poisoned<T>(1);
  for (int i = 0; i < count; ++i)
    if (std::memcmp(&buffer[i], &poison[0], sizeof(T)) != 0) return false;
  return true;
}

std::string describe(const FlatCase& s, const simt::Options& order) {
  return "n=" + std::to_string(s.n) + " input offset " + std::to_string(s.in_offset) + " output offset " +
         std::to_string(s.out_offset) + " order " + order.name();
}

TEMPLATE_TEST_CASE("gelu_forward kernel matches the CPU backend", "[kernels][elementwise]", float, bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  CpuReference cpu;
  for (const FlatCase& s : flat_cases(kGpt2Fc)) {
    const int64_t n = static_cast<int64_t>(s.n);
    std::vector<float> inp = random_on_grid(s.n, 1, 2.0f, f), ref(s.n);
    cpu->gelu_forward(cpu.view(ref, {n}, f), cpu.view(inp, {n}));
    const auto d_inp = at_offset<TestType>(inp, s.in_offset);
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO(describe(s, order));
      auto out = poisoned<TestType>(s.n + s.out_offset);
      kernels::gelu_forward(out.data() + s.out_offset, d_inp.data() + s.in_offset, s.n, nullptr);
      expect_close("gelu_forward", floats_from(out, s.out_offset), ref, f);
      CHECK(prefix_untouched(out, s.out_offset));
    }
  }
}

TEMPLATE_TEST_CASE("gelu_backward kernel matches the CPU backend", "[kernels][elementwise]", float, bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  CpuReference cpu;
  for (const FlatCase& s : flat_cases(kGpt2Fc)) {
    const int64_t n = static_cast<int64_t>(s.n);
    std::vector<float> inp = random_on_grid(s.n, 2, 2.0f, f), dout = random_on_grid(s.n, 3, 1.0f, f);
    // The gradient accumulates (+=): start from non-zero values.
    const std::vector<float> dinp0 = random_on_grid(s.n, 4, 0.5f, f);
    std::vector<float> ref = dinp0;
    cpu->gelu_backward(cpu.view(ref, {n}, f), cpu.view(inp, {n}), cpu.view(dout, {n}));
    const auto d_inp = at_offset<TestType>(inp, s.in_offset), d_dout = at_offset<TestType>(dout, s.in_offset);
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO(describe(s, order));
      auto dinp = at_offset<TestType>(dinp0, s.out_offset);
      kernels::gelu_backward(dinp.data() + s.out_offset, d_inp.data() + s.in_offset, d_dout.data() + s.in_offset, s.n,
                             nullptr);
      expect_close("gelu_backward", floats_from(dinp, s.out_offset), ref, f);
    }
  }
}

TEMPLATE_TEST_CASE("add kernel matches the CPU backend", "[kernels][elementwise]", float, bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  CpuReference cpu;
  for (const FlatCase& s : flat_cases(kGpt2Fc)) {
    const int64_t n = static_cast<int64_t>(s.n);
    std::vector<float> a = random_on_grid(s.n, 5, 1.0f, f), b = random_on_grid(s.n, 6, 1.0f, f), ref(s.n);
    cpu->add(cpu.view(ref, {n}, f), cpu.view(a, {n}), cpu.view(b, {n}));
    const auto d_a = at_offset<TestType>(a, s.in_offset), d_b = at_offset<TestType>(b, s.in_offset);
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO(describe(s, order));
      auto out = poisoned<TestType>(s.n + s.out_offset);
      kernels::add(out.data() + s.out_offset, d_a.data() + s.in_offset, d_b.data() + s.in_offset, s.n, nullptr);
      // One rounded addition: exactly the CPU's.
      expect_identical("add", floats_from(out, s.out_offset), ref);
      CHECK(prefix_untouched(out, s.out_offset));
    }
  }
}

TEMPLATE_TEST_CASE("bias_add kernel adds the bias to every row", "[kernels][elementwise]", float, bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  CpuReference cpu;
  for (const RowShape s : kRowShapes) {
    const size_t n = static_cast<size_t>(s.N) * s.OC;
    std::vector<float> out0 = random_on_grid(n, 7, 1.0f, f), bias = random_on_grid(s.OC, 8, 1.0f, f), ref(n);
    // The reference: out0 + the bias broadcast to every row.
    std::vector<float> broadcast(n);
    for (size_t i = 0; i < n; ++i) broadcast[i] = bias[i % s.OC];
    cpu->add(cpu.view(ref, {s.N, s.OC}, f), cpu.view(out0, {s.N, s.OC}), cpu.view(broadcast, {s.N, s.OC}));
    const auto d_bias = to_storage<TestType>(bias);
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO("N=" << s.N << " OC=" << s.OC << " order " << order.name());
      auto out = to_storage<TestType>(out0);
      kernels::bias_add(out.data(), d_bias.data(), s.N, s.OC, nullptr);
      expect_identical("bias_add", to_floats(out), ref);
    }
  }
}

TEMPLATE_TEST_CASE("bias_backward kernels match the CPU backend", "[kernels][elementwise]", float, bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  CpuReference cpu;
  for (const RowShape s : kRowShapes) {
    const size_t n = static_cast<size_t>(s.N) * s.OC;
    std::vector<float> dout = random_on_grid(n, 9, 1.0f, f);
    // The gradient accumulates (+=): start from non-zero values.
    const std::vector<float> dbias0 = random_on_grid(s.OC, 10, 0.5f, f);
    std::vector<float> ref = dbias0;
    cpu->bias_backward(cpu.view(ref, {s.OC}, f), cpu.view(dout, {s.N, s.OC}));
    const auto d_dout = to_storage<TestType>(dout);
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO("N=" << s.N << " OC=" << s.OC << " order " << order.name());
      auto dbias = to_storage<TestType>(dbias0);
      auto scratch = poisoned<float>(kernels::bias_backward_scratch_floats(s.N, s.OC));
      kernels::bias_backward(dbias.data(), scratch.data(), d_dout.data(), s.N, s.OC, nullptr);
      expect_close("bias_backward", to_floats(dbias), ref, f);
    }
  }
}

}  // namespace
}  // namespace ptrain::test
