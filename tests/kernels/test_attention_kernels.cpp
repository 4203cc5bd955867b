// Attention fallback kernels under the SIMT emulator: the permutes bit for bit, the causal
// softmax against a double-precision loop, and the whole fallback (the kernels composed with a
// scalar batched GEMM standing in for cuBLASLt) against the CPU backend's attention ops.
#include <algorithm>
#include <cmath>

#include "attention.cuh"
#include "kernel_test.h"

namespace ptrain::test {
namespace {

struct AttentionShape {
  int B, T, NH, HS;
  int KV = 0;  // K/V heads (grouped-query attention); 0 = NH
  int kv() const { return KV > 0 ? KV : NH; }
  int width() const { return (NH + 2 * kv()) * HS; }  // of a qkv row
};
// Odd sizes (ragged and unaligned chunks of HS), several chunks per thread, a GPT-2 layer, and
// grouped-query layouts (4 query heads over 2 K/V heads, over 1).
const std::vector<AttentionShape> kShapes{{1, 1, 1, 1},     {2, 7, 3, 5},       {1, 19, 2, 7},
                                          {1, 111, 1, 8},   {1, 64, 12, 64},    {2, 7, 4, 5, 2},
                                          {1, 19, 4, 8, 1}, {1, 33, 8, 16, 2}};

struct SoftmaxShape {
  int BNH, T;
};
// T = 300 gives a lane several chunks of a row, so its running max must rescale its sum.
const std::vector<SoftmaxShape> kSoftmaxShapes{{1, 1}, {6, 7}, {2, 19}, {1, 111}, {12, 64}, {1, 300}};

// c[z] (M, N) = op(a[z]) op(b[z]) for z < batch, with a (M, K), or (K, M) when trans_a, and
// b (K, N), or (N, K) when trans_b. FP32 accumulation and each result rounded once to T, as
// cuBLASLt writing T does.
template <typename T>
std::vector<T> batched_gemm(const std::vector<T>& a, bool trans_a, const std::vector<T>& b, bool trans_b, int batch,
                            int M, int N, int K) {
  std::vector<T> c(static_cast<size_t>(batch) * M * N);
  for (int z = 0; z < batch; ++z) {
    const T* A = a.data() + static_cast<size_t>(z) * M * K;
    const T* Bm = b.data() + static_cast<size_t>(z) * K * N;
    T* Cm = c.data() + static_cast<size_t>(z) * M * N;
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k)
          acc += kernels::to_float(trans_a ? A[k * M + m] : A[m * K + k]) *
                 kernels::to_float(trans_b ? Bm[n * K + k] : Bm[k * N + n]);
        Cm[m * N + n] = kernels::from_float<T>(acc);
      }
  }
  return c;
}

// att[t, j] = softmax over j <= t of scale * preatt[t, j], 0 for j > t; computed in double.
std::vector<float> causal_softmax_reference(const std::vector<float>& preatt, float scale, int rows, int Tn) {
  std::vector<float> att(preatt.size(), 0.0f);
  for (int r = 0; r < rows; ++r) {
    const int t = r % Tn;
    const size_t o = static_cast<size_t>(r) * Tn;
    const auto x = [&](int j) { return static_cast<double>(scale) * preatt[o + j]; };
    double m = -INFINITY, sum = 0;
    for (int j = 0; j <= t; ++j) m = std::max(m, x(j));
    for (int j = 0; j <= t; ++j) sum += std::exp(x(j) - m);
    for (int j = 0; j <= t; ++j) att[o + j] = static_cast<float>(std::exp(x(j) - m) / sum);
  }
  return att;
}

// Elements above the diagonal of rows (.., T, T) that are not exactly zero: the mask must be exact.
size_t nonzero_above_diagonal(const std::vector<float>& m, int rows, int Tn) {
  size_t count = 0;
  for (int r = 0; r < rows; ++r)
    for (int j = r % Tn + 1; j < Tn; ++j) count += m[static_cast<size_t>(r) * Tn + j] != 0.0f;
  return count;
}

TEMPLATE_TEST_CASE("attention permutes move every element bit for bit", "[kernels][attention]", float, bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  for (const AttentionShape s : kShapes) {
    const int C = s.NH * s.HS, W = s.width(), group = s.NH / s.kv();
    const size_t n = static_cast<size_t>(s.B) * s.T * C;  // one of q, k, v (expanded to NH heads), out
    const size_t n_qkv = static_cast<size_t>(s.B) * s.T * W;
    const auto qkv = to_storage<TestType>(random_on_grid(n_qkv, 51, 1.0f, f));
    const auto tokens = to_storage<TestType>(random_on_grid(n, 52, 1.0f, f));  // (B, T, C): dout
    const auto heads = to_storage<TestType>(random_on_grid(n, 53, 1.0f, f));   // (B, NH, T, HS): y
    const std::vector<TestType> dparts[3] = {to_storage<TestType>(random_on_grid(n, 54, 1.0f, f)),
                                             to_storage<TestType>(random_on_grid(n, 55, 1.0f, f)),
                                             to_storage<TestType>(random_on_grid(n, 56, 1.0f, f))};
    const auto dqkv0 = to_storage<TestType>(random_on_grid(n_qkv, 57, 1.0f, f));
    // The expected results, by index arithmetic on the two layouts: query head h reads K/V head
    // h / group, whose gradient sums the group's in FP32, in head order, rounded once.
    std::vector<TestType> ref_q(n), ref_k(n), ref_v(n), ref_out(n), ref_dy(n), ref_dqkv(n_qkv);
    std::vector<TestType>* ref_qkv_parts[3] = {&ref_q, &ref_k, &ref_v};
    std::vector<float> kv_sums(n_qkv);
    for (size_t e = 0; e < n_qkv; ++e) kv_sums[e] = kernels::to_float(dqkv0[e]);
    for (int b = 0; b < s.B; ++b)
      for (int h = 0; h < s.NH; ++h)
        for (int t = 0; t < s.T; ++t)
          for (int i = 0; i < s.HS; ++i) {
            const size_t head = ((static_cast<size_t>(b) * s.NH + h) * s.T + t) * s.HS + i;
            const size_t token = (static_cast<size_t>(b) * s.T + t) * C + h * s.HS + i;
            const size_t row = (static_cast<size_t>(b) * s.T + t) * W;
            const size_t packed[3] = {row + h * s.HS + i, row + (s.NH + h / group) * s.HS + i,
                                      row + (s.NH + s.kv() + h / group) * s.HS + i};
            ref_out[token] = heads[head];
            ref_dy[head] = tokens[token];
            for (int w = 0; w < 3; ++w) {
              (*ref_qkv_parts[w])[head] = qkv[packed[w]];
              kv_sums[packed[w]] += kernels::to_float(dparts[w][head]);
            }
          }
    for (size_t e = 0; e < n_qkv; ++e) ref_dqkv[e] = kernels::from_float<TestType>(kv_sums[e]);
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " KV=" << s.kv() << " HS=" << s.HS << " order "
                << order.name());
      auto q = poisoned<TestType>(n), k = poisoned<TestType>(n), v = poisoned<TestType>(n);
      kernels::attention_permute(q.data(), k.data(), v.data(), qkv.data(), s.B, s.T, s.NH, s.kv(), s.HS, nullptr);
      expect_identical("attention_permute q", q, ref_q);
      expect_identical("attention_permute k", k, ref_k);
      expect_identical("attention_permute v", v, ref_v);
      auto out = poisoned<TestType>(n);
      kernels::attention_unpermute(out.data(), heads.data(), s.B, s.T, s.NH, s.HS, nullptr);
      expect_identical("attention_unpermute", out, ref_out);
      auto dy = poisoned<TestType>(n);
      kernels::attention_unpermute_backward(dy.data(), tokens.data(), s.B, s.T, s.NH, s.HS, nullptr);
      expect_identical("attention_unpermute_backward", dy, ref_dy);
      // Adds: FP32 additions in a fixed order per element rounded once, so exact too.
      auto dqkv = dqkv0;
      kernels::attention_permute_backward(dqkv.data(), dparts[0].data(), dparts[1].data(), dparts[2].data(), s.B, s.T,
                                          s.NH, s.kv(), s.HS, nullptr);
      expect_identical("attention_permute_backward", dqkv, ref_dqkv);
    }
  }
}

TEMPLATE_TEST_CASE("softmax_causal_forward kernel matches a double-precision softmax", "[kernels][attention]", float,
                   bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  const float scale = 0.35f;
  for (const SoftmaxShape s : kSoftmaxShapes) {
    const int rows = s.BNH * s.T;
    const size_t n = static_cast<size_t>(rows) * s.T;
    // The masked part holds values too: the kernel must ignore them.
    const std::vector<float> preatt = random_on_grid(n, 61, 3.0f, f);
    const std::vector<float> ref = causal_softmax_reference(preatt, scale, rows, s.T);
    const auto d_preatt = to_storage<TestType>(preatt);
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO("BNH=" << s.BNH << " T=" << s.T << " order " << order.name());
      auto att = poisoned<TestType>(n);
      kernels::softmax_causal_forward(att.data(), d_preatt.data(), scale, s.BNH, s.T, nullptr);
      const std::vector<float> got = to_floats(att);
      expect_close("softmax_causal_forward att", got, ref, f);
      CHECK(nonzero_above_diagonal(got, rows, s.T) == 0);
    }
  }
}

TEMPLATE_TEST_CASE("softmax_causal_backward kernel matches a double-precision loop", "[kernels][attention]", float,
                   bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  const float scale = 0.35f;
  for (const SoftmaxShape s : kSoftmaxShapes) {
    const int rows = s.BNH * s.T;
    const size_t n = static_cast<size_t>(rows) * s.T;
    // Real probabilities on the format's grid; datt is non-zero above the diagonal too.
    std::vector<float> att = causal_softmax_reference(random_on_grid(n, 62, 3.0f, f), scale, rows, s.T);
    for (auto& x : att) x = round_to_format(x, f, false);
    const std::vector<float> datt = random_on_grid(n, 63, 1.0f, f);
    std::vector<float> ref(n, 0.0f);
    for (int r = 0; r < rows; ++r) {
      const int t = r % s.T;
      const size_t o = static_cast<size_t>(r) * s.T;
      double dot = 0;
      for (int j = 0; j <= t; ++j) dot += static_cast<double>(att[o + j]) * datt[o + j];
      for (int j = 0; j <= t; ++j)
        ref[o + j] = static_cast<float>(static_cast<double>(scale) * att[o + j] * (datt[o + j] - dot));
    }
    const auto d_att = to_storage<TestType>(att), d_datt = to_storage<TestType>(datt);
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO("BNH=" << s.BNH << " T=" << s.T << " order " << order.name());
      auto dpreatt = poisoned<TestType>(n);
      kernels::softmax_causal_backward(dpreatt.data(), d_datt.data(), d_att.data(), scale, s.BNH, s.T, nullptr);
      const std::vector<float> got = to_floats(dpreatt);
      expect_close("softmax_causal_backward dpreatt", got, ref, f);
      CHECK(nonzero_above_diagonal(got, rows, s.T) == 0);
    }
  }
}

TEMPLATE_TEST_CASE("attention fallback forward matches the CPU backend", "[kernels][attention]", float, bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  for (const AttentionShape s : kShapes) {
    const int C = s.NH * s.HS, BNH = s.B * s.NH, W = s.width();
    const size_t n = static_cast<size_t>(s.B) * s.T * C, n_att = static_cast<size_t>(BNH) * s.T * s.T;
    const size_t n_qkv = static_cast<size_t>(s.B) * s.T * W;
    std::vector<float> qkv = random_on_grid(n_qkv, 21, 1.0f, f);
    std::vector<float> ref_out(n), ref_att(n_att);
    CpuReference cpu;
    cpu->attention_forward(cpu.view(ref_out, {s.B, s.T, C}, f), cpu.view(ref_att, {s.B, s.NH, s.T, s.T}, f),
                           cpu.view(qkv, {s.B, s.T, W}), s.NH);
    const auto d_qkv = to_storage<TestType>(qkv);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.HS));
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " KV=" << s.kv() << " HS=" << s.HS << " order "
                << order.name());
      auto q = poisoned<TestType>(n), k = poisoned<TestType>(n), v = poisoned<TestType>(n);
      kernels::attention_permute(q.data(), k.data(), v.data(), d_qkv.data(), s.B, s.T, s.NH, s.kv(), s.HS, nullptr);
      const auto preatt = batched_gemm(q, false, k, true, BNH, s.T, s.T, s.HS);  // q k^T
      auto att = poisoned<TestType>(n_att);
      kernels::softmax_causal_forward(att.data(), preatt.data(), scale, BNH, s.T, nullptr);
      const auto y = batched_gemm(att, false, v, false, BNH, s.T, s.HS, s.T);  // att v
      auto out = poisoned<TestType>(n);
      kernels::attention_unpermute(out.data(), y.data(), s.B, s.T, s.NH, s.HS, nullptr);
      expect_close("attention fallback out", to_floats(out), ref_out, f);
      expect_close("attention fallback att", to_floats(att), ref_att, f);
    }
  }
}

TEMPLATE_TEST_CASE("attention fallback backward matches the CPU backend", "[kernels][attention]", float, bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  for (const AttentionShape s : kShapes) {
    const int C = s.NH * s.HS, BNH = s.B * s.NH, W = s.width();
    const size_t n = static_cast<size_t>(s.B) * s.T * C, n_att = static_cast<size_t>(BNH) * s.T * s.T;
    const size_t n_qkv = static_cast<size_t>(s.B) * s.T * W;
    std::vector<float> qkv = random_on_grid(n_qkv, 31, 1.0f, f), dout = random_on_grid(n, 32, 1.0f, f);
    // dqkv accumulates (+=): start from non-zero values.
    const std::vector<float> dqkv0 = random_on_grid(n_qkv, 33, 0.5f, f);
    std::vector<float> out(n), att(n_att);
    CpuReference cpu;
    cpu->attention_forward(cpu.view(out, {s.B, s.T, C}, f), cpu.view(att, {s.B, s.NH, s.T, s.T}, f),
                           cpu.view(qkv, {s.B, s.T, W}), s.NH);
    std::vector<float> ref_dqkv = dqkv0;
    cpu->attention_backward(cpu.view(ref_dqkv, {s.B, s.T, W}, f), cpu.view(dout, {s.B, s.T, C}),
                            cpu.view(qkv, {s.B, s.T, W}), cpu.view(out, {s.B, s.T, C}),
                            cpu.view(att, {s.B, s.NH, s.T, s.T}), s.NH);
    // Both sides start from the same saved probabilities.
    const auto d_qkv = to_storage<TestType>(qkv), d_dout = to_storage<TestType>(dout),
               d_att = to_storage<TestType>(att);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.HS));
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " KV=" << s.kv() << " HS=" << s.HS << " order "
                << order.name());
      auto q = poisoned<TestType>(n), k = poisoned<TestType>(n), v = poisoned<TestType>(n);
      kernels::attention_permute(q.data(), k.data(), v.data(), d_qkv.data(), s.B, s.T, s.NH, s.kv(), s.HS, nullptr);
      auto dy = poisoned<TestType>(n);
      kernels::attention_unpermute_backward(dy.data(), d_dout.data(), s.B, s.T, s.NH, s.HS, nullptr);
      const auto datt = batched_gemm(dy, false, v, true, BNH, s.T, s.T, s.HS);    // dy v^T
      const auto dv = batched_gemm(d_att, true, dy, false, BNH, s.T, s.HS, s.T);  // att^T dy
      auto dpreatt = poisoned<TestType>(n_att);
      kernels::softmax_causal_backward(dpreatt.data(), datt.data(), d_att.data(), scale, BNH, s.T, nullptr);
      const auto dq = batched_gemm(dpreatt, false, k, false, BNH, s.T, s.HS, s.T);  // dpreatt k
      const auto dk = batched_gemm(dpreatt, true, q, false, BNH, s.T, s.HS, s.T);   // dpreatt^T q
      auto dqkv = to_storage<TestType>(dqkv0);
      kernels::attention_permute_backward(dqkv.data(), dq.data(), dk.data(), dv.data(), s.B, s.T, s.NH, s.kv(), s.HS,
                                          nullptr);
      expect_close("attention fallback dqkv", to_floats(dqkv), ref_dqkv, f);
    }
  }
}

struct DecodeShape {
  int T, NH, HS;
  int KV = 0;  // 0 = NH
  int kv() const { return KV > 0 ? KV : NH; }
};
// One key, ragged head sizes, more keys than a tile (several tiles: the online softmax must
// rescale), a GPT-2 layer, a head wider than the block's usual 256 threads, and grouped K/V heads.
const std::vector<DecodeShape> kDecodeShapes{{1, 1, 1},    {7, 3, 5},    {19, 2, 7},      {300, 2, 8},
                                             {600, 1, 3},  {64, 12, 64}, {5, 1, 300},     {19, 4, 6, 2},
                                             {300, 4, 8, 1}};

TEMPLATE_TEST_CASE("attention_decode kernel matches the CPU backend's decoding op", "[kernels][attention]", float,
                   bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  for (const DecodeShape s : kDecodeShapes) {
    const int C = s.NH * s.HS, W = (s.NH + 2 * s.kv()) * s.HS;
    std::vector<float> qkv = random_on_grid(static_cast<size_t>(s.T) * W, 71, 1.0f, f);
    std::vector<float> ref(static_cast<size_t>(C));
    CpuReference cpu;
    cpu->attention_decode(cpu.view(ref, {C}, f), cpu.view(qkv, {s.T, W}), s.NH);
    const auto d_qkv = to_storage<TestType>(qkv);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.HS));
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO("T=" << s.T << " NH=" << s.NH << " KV=" << s.kv() << " HS=" << s.HS << " order " << order.name());
      auto out = poisoned<TestType>(static_cast<size_t>(C));
      kernels::attention_decode(out.data(), d_qkv.data(), s.T, s.NH, s.kv(), s.HS, scale, nullptr);
      expect_close("attention_decode out", to_floats(out), ref, f);
    }
  }
}

}  // namespace
}  // namespace ptrain::test
