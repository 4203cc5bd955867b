// Each CPU backend op: the float forward against a float64 reference loop written here, the
// backward (run in float64 by the same templated code) against central finite differences of
// sum(out * R) for a random R, and the float backward against the float64 one. Odd sizes.
#include <catch2/catch.hpp>

#include <array>
#include <cstring>
#include <functional>

#include "backend/backend.h"
#include "model/transformer.h"
#include "model/rope_table.h"
#include "optim/adamw.h"
#include "test_backends.h"
#include "test_util.h"
#include "tolerances.h"

using namespace ptrain;
using namespace ptrain::test;

namespace {

constexpr double kFp32Tol = 1e-5;  // fp32 ops within 1e-5 relative
constexpr double kFdTol = 1e-6;    // float64 analytic vs finite-difference gradients

std::vector<double> finite_difference(std::vector<double>& x, const std::function<double()>& loss,
                                      double eps = 1e-5) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + eps;
    const double up = loss();
    x[i] = saved - eps;
    const double down = loss();
    x[i] = saved;
    g[i] = (up - down) / (2 * eps);
  }
  return g;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

template <typename T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

void check_gradient(const std::vector<double>& analytic, const std::vector<double>& numeric) {
  REQUIRE(norm(numeric) > 0);  // an all-zero gradient could never catch a missing term
  CHECK(relative_error(analytic, numeric) < kFdTol);
}

const int kSizes[] = {1, 7, 19, 111};

}  // namespace

TEST_CASE("op tolerances: one bf16 element off by a whole unit passes the aggregate bound, not the per-element one",
          "[ops]") {
  // A layernorm-like output, 64 x 768 values of unit scale, on bf16's grid.
  std::vector<float> ref(64 * 768);
  fill_normal(ref, 11);
  for (float& x : ref) x = round_to_format(x, Format::bf16, false);
  std::vector<float> got = ref;
  got[1234] += 1.0f;
  const Tolerance bf16 = op_tolerance(Format::bf16);
  CHECK(relative_error(got, ref) < bf16.rel_l2);  // about 0.0045: the aggregate lets it through
  const ElementMismatches bad = element_mismatches(got, ref, bf16);
  CHECK(bad.count == 1);
  CHECK_THAT(bad.worst, Catch::StartsWith("at 1234: "));
  // Every element one bf16 unit in the last place larger in magnitude: within both bounds.
  got = ref;
  for (float& x : got) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    bits += 1u << 16;  // bf16 is a float's top 16 bits
    std::memcpy(&x, &bits, sizeof bits);
  }
  CHECK(relative_error(got, ref) < bf16.rel_l2);
  CHECK(element_mismatches(got, ref, bf16).count == 0);
}

TEST_CASE("matmul forward and backward", "[ops]") {
  for (int N : kSizes)
    for (int C : {1, 7, 19})
      for (int OC : {7, 111}) {
        CAPTURE(N, C, OC);
        HostBuffer<double> inp({N, C}), w({OC, C}), bias({OC}), out({N, OC}), R({N, OC});
        fill_normal(inp.data, 1);
        fill_normal(w.data, 2);
        fill_normal(bias.data, 3);
        fill_normal(R.data, 4);

        // Float forward against a float64 loop.
        std::vector<double> ref(out.size());
        for (int n = 0; n < N; ++n)
          for (int o = 0; o < OC; ++o) {
            double s = bias.data[o];
            for (int c = 0; c < C; ++c) s += inp.data[n * C + c] * w.data[o * C + c];
            ref[n * OC + o] = s;
          }
        HostBuffer<float> fi({N, C}), fw({OC, C}), fb({OC}), fo({N, OC});
        fi.data = cast<float>(inp.data);
        fw.data = cast<float>(w.data);
        fb.data = cast<float>(bias.data);
        cpu_backend().matmul_forward(fo.view(), fi.view(), fw.view(), fb.view());
        CHECK(relative_error(fo.data, ref) < kFp32Tol);

        // Backward in float64 against finite differences.
        auto loss = [&] {
          cpu_backend().matmul_forward(out.view(), inp.view(), w.view(), bias.view());
          return dot(out.data, R.data);
        };
        HostBuffer<double> dinp({N, C}), dw({OC, C}), db({OC});
        cpu_backend().matmul_backward(dinp.view(), dw.view(), db.view(), R.view(), inp.view(), w.view());
        check_gradient(dinp.data, finite_difference(inp.data, loss));
        check_gradient(dw.data, finite_difference(w.data, loss));
        check_gradient(db.data, finite_difference(bias.data, loss));

        // Float backward matches float64 backward.
        HostBuffer<float> fdi({N, C}), fdw({OC, C}), fdb({OC}), fR({N, OC});
        fR.data = cast<float>(R.data);
        cpu_backend().matmul_backward(fdi.view(), fdw.view(), fdb.view(), fR.view(), fi.view(), fw.view());
        CHECK(relative_error(fdi.data, dinp.data) < kFp32Tol);
        CHECK(relative_error(fdw.data, dw.data) < kFp32Tol);
        CHECK(relative_error(fdb.data, db.data) < kFp32Tol);
      }
}

TEST_CASE("backward ops accumulate into their gradient outputs", "[ops]") {
  HostBuffer<double> inp({3, 5}), w({4, 5}), R({3, 4});
  fill_normal(inp.data, 1);
  fill_normal(w.data, 2);
  fill_normal(R.data, 3);
  HostBuffer<double> dinp1({3, 5}), dw1({4, 5}), db1({4});
  cpu_backend().matmul_backward(dinp1.view(), dw1.view(), db1.view(), R.view(), inp.view(), w.view());
  HostBuffer<double> dinp2({3, 5}), dw2({4, 5}), db2({4});
  cpu_backend().matmul_backward(dinp2.view(), dw2.view(), db2.view(), R.view(), inp.view(), w.view());
  cpu_backend().matmul_backward(dinp2.view(), dw2.view(), db2.view(), R.view(), inp.view(), w.view());
  for (auto& x : dw1.data) x *= 2;
  for (auto& x : db1.data) x *= 2;
  for (auto& x : dinp1.data) x *= 2;
  CHECK(relative_error(dw2.data, dw1.data) < 1e-12);
  CHECK(relative_error(db2.data, db1.data) < 1e-12);
  CHECK(relative_error(dinp2.data, dinp1.data) < 1e-12);
}

TEST_CASE("layernorm forward and backward", "[ops]") {
  for (int N : kSizes)
    for (int C : {7, 19, 111}) {
      CAPTURE(N, C);
      HostBuffer<double> inp({N, C}), w({C}), b({C}), out({N, C}), mean({N}), rstd({N}), R({N, C});
      fill_normal(inp.data, 5, 2.0);
      for (auto& x : inp.data) x += 0.5;  // a non-zero mean to remove
      fill_normal(w.data, 6);
      fill_normal(b.data, 7);
      fill_normal(R.data, 8);

      std::vector<double> ref(out.size());
      for (int n = 0; n < N; ++n) {
        double m = 0, v = 0;
        for (int c = 0; c < C; ++c) m += inp.data[n * C + c];
        m /= C;
        for (int c = 0; c < C; ++c) v += (inp.data[n * C + c] - m) * (inp.data[n * C + c] - m);
        v /= C;
        for (int c = 0; c < C; ++c)
          ref[n * C + c] = (inp.data[n * C + c] - m) / std::sqrt(v + 1e-5) * w.data[c] + b.data[c];
      }
      HostBuffer<float> fi({N, C}), fw({C}), fb({C}), fo({N, C}), fm({N}), fr({N});
      fi.data = cast<float>(inp.data);
      fw.data = cast<float>(w.data);
      fb.data = cast<float>(b.data);
      cpu_backend().layernorm_forward(fo.view(), fm.view(), fr.view(), fi.view(), fw.view(), fb.view());
      CHECK(relative_error(fo.data, ref) < kFp32Tol);

      auto loss = [&] {
        cpu_backend().layernorm_forward(out.view(), mean.view(), rstd.view(), inp.view(), w.view(), b.view());
        return dot(out.data, R.data);
      };
      loss();  // fills mean/rstd at the unperturbed point
      HostBuffer<double> dinp({N, C}), dw({C}), db({C});
      cpu_backend().layernorm_backward(dinp.view(), dw.view(), db.view(), R.view(), inp.view(), w.view(), mean.view(), rstd.view());
      const std::vector<double> fd_inp = finite_difference(inp.data, loss);
      if (C > 1) check_gradient(dinp.data, fd_inp);
      check_gradient(dw.data, finite_difference(w.data, loss));
      check_gradient(db.data, finite_difference(b.data, loss));
    }
}

TEST_CASE("gelu forward and backward", "[ops]") {
  for (int n : kSizes) {
    CAPTURE(n);
    HostBuffer<double> inp({n}), out({n}), R({n});
    fill_normal(inp.data, 9, 2.0);
    fill_normal(R.data, 10);
    std::vector<double> ref(n);
    for (int i = 0; i < n; ++i) {
      const double x = inp.data[i];
      ref[i] = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    }
    HostBuffer<float> fi({n}), fo({n});
    fi.data = cast<float>(inp.data);
    cpu_backend().gelu_forward(fo.view(), fi.view());
    CHECK(relative_error(fo.data, ref) < kFp32Tol);

    auto loss = [&] {
      cpu_backend().gelu_forward(out.view(), inp.view());
      return dot(out.data, R.data);
    };
    HostBuffer<double> dinp({n});
    cpu_backend().gelu_backward(dinp.view(), inp.view(), R.view());
    check_gradient(dinp.data, finite_difference(inp.data, loss));
  }
}

TEST_CASE("rmsnorm forward and backward", "[ops][llama]") {
  for (int N : kSizes)
    for (int C : {1, 7, 19, 111}) {
      CAPTURE(N, C);
      const double eps = 1e-5;
      HostBuffer<double> inp({N, C}), w({C}), out({N, C}), rstd({N}), R({N, C});
      fill_normal(inp.data, 41, 2.0);
      fill_normal(w.data, 42);
      fill_normal(R.data, 43);
      std::vector<double> ref(out.size());
      for (int n = 0; n < N; ++n) {
        double squares = 0;
        for (int c = 0; c < C; ++c) squares += inp.data[n * C + c] * inp.data[n * C + c];
        for (int c = 0; c < C; ++c) ref[n * C + c] = inp.data[n * C + c] / std::sqrt(squares / C + eps) * w.data[c];
      }
      HostBuffer<float> fi({N, C}), fw({C}), fo({N, C}), fr({N});
      fi.data = cast<float>(inp.data);
      fw.data = cast<float>(w.data);
      cpu_backend().rmsnorm_forward(fo.view(), fr.view(), fi.view(), fw.view(), static_cast<float>(eps));
      CHECK(relative_error(fo.data, ref) < kFp32Tol);

      auto loss = [&] {
        cpu_backend().rmsnorm_forward(out.view(), rstd.view(), inp.view(), w.view(), static_cast<float>(eps));
        return dot(out.data, R.data);
      };
      loss();  // rstd at the unperturbed point
      // Accumulates: start from non-zero gradients.
      HostBuffer<double> dinp({N, C}, 0.25), dw({C}, -0.5);
      cpu_backend().rmsnorm_backward(dinp.view(), dw.view(), R.view(), inp.view(), w.view(), rstd.view());
      for (auto& g : dinp.data) g -= 0.25;
      for (auto& g : dw.data) g += 0.5;
      // With one channel out = w x / sqrt(x^2 + eps) is flat but for eps: no signal to check.
      if (C > 1) check_gradient(dinp.data, finite_difference(inp.data, loss));
      check_gradient(dw.data, finite_difference(w.data, loss));
    }
}

// QK-norm: each q head by the q weight, each k head by the k weight, v passed through; head
// sizes 2, 6, 38, multi-head, grouped and multi-query.
TEST_CASE("qk_norm forward and backward", "[ops][llama]") {
  struct Heads {
    int NH, KV, hs;
  };
  for (int N : {1, 7})
    for (const Heads h : {Heads{1, 1, 2}, Heads{4, 2, 6}, Heads{3, 1, 38}, Heads{2, 2, 6}}) {
      CAPTURE(N, h.NH, h.KV, h.hs);
      const double eps = 1e-5;
      const int W = (h.NH + 2 * h.KV) * h.hs, stats = N * (h.NH + h.KV);
      HostBuffer<double> inp({N, W}), qw({h.hs}), kw({h.hs}), out({N, W}), rstd({stats}), R({N, W});
      fill_normal(inp.data, 46, 2.0);
      fill_normal(qw.data, 47);
      fill_normal(kw.data, 48);
      fill_normal(R.data, 49);
      std::vector<double> ref = inp.data;  // v's heads unchanged
      for (int n = 0; n < N; ++n)
        for (int head = 0; head < h.NH + h.KV; ++head) {
          double* x = &ref[static_cast<size_t>(n * W + head * h.hs)];
          const std::vector<double>& w = head < h.NH ? qw.data : kw.data;
          double squares = 0;
          for (int c = 0; c < h.hs; ++c) squares += x[c] * x[c];
          const double s = 1 / std::sqrt(squares / h.hs + eps);
          for (int c = 0; c < h.hs; ++c) x[c] = x[c] * s * w[c];
        }
      HostBuffer<float> fi({N, W}), fq({h.hs}), fk({h.hs}), fo({N, W}), fr({stats});
      fi.data = cast<float>(inp.data);
      fq.data = cast<float>(qw.data);
      fk.data = cast<float>(kw.data);
      cpu_backend().qk_norm_forward(fo.view(), fr.view(), fi.view(), fq.view(), fk.view(), h.NH, static_cast<float>(eps));
      CHECK(relative_error(fo.data, ref) < kFp32Tol);
      cpu_backend().qk_norm_forward(fi.view(), fr.view(), fi.view(), fq.view(), fk.view(), h.NH, static_cast<float>(eps));
      CHECK(fi.data == fo.data);  // in place: the same numbers

      auto loss = [&] {
        cpu_backend().qk_norm_forward(out.view(), rstd.view(), inp.view(), qw.view(), kw.view(), h.NH,
                                      static_cast<float>(eps));
        return dot(out.data, R.data);
      };
      loss();  // rstd at the unperturbed point
      HostBuffer<double> dinp({N, W}, 0.25), dq({h.hs}, -0.5), dk({h.hs}, 0.75);
      cpu_backend().qk_norm_backward(dinp.view(), dq.view(), dk.view(), R.view(), inp.view(), qw.view(), kw.view(),
                                     rstd.view(), h.NH);
      for (auto& g : dinp.data) g -= 0.25;
      for (auto& g : dq.data) g += 0.5;
      for (auto& g : dk.data) g -= 0.75;
      check_gradient(dinp.data, finite_difference(inp.data, loss));
      check_gradient(dq.data, finite_difference(qw.data, loss));
      check_gradient(dk.data, finite_difference(kw.data, loss));
    }
  // A weight of the wrong size is refused, naming the op.
  HostBuffer<float> qkv({1, 24}), w({6}), w5({5}), r({3}), o({1, 24});
  CHECK_THROWS_WITH(cpu_backend().qk_norm_forward(o.view(), r.view(), qkv.view(), w.view(), w5.view(), 2, 1e-5f),
                    Catch::Contains("qk_norm_forward"));
}

TEST_CASE("swiglu forward and backward", "[ops][llama]") {
  for (int N : {1, 7, 19})
    for (int H : {1, 7, 111}) {
      CAPTURE(N, H);
      HostBuffer<double> gate_up({N, 2 * H}), out({N, H}), R({N, H});
      fill_normal(gate_up.data, 44, 2.0);
      fill_normal(R.data, 45);
      std::vector<double> ref(out.size());
      for (int n = 0; n < N; ++n)
        for (int h = 0; h < H; ++h) {
          const double g = gate_up.data[n * 2 * H + h], u = gate_up.data[n * 2 * H + H + h];
          ref[n * H + h] = g / (1 + std::exp(-g)) * u;
        }
      HostBuffer<float> fg({N, 2 * H}), fo({N, H});
      fg.data = cast<float>(gate_up.data);
      cpu_backend().swiglu_forward(fo.view(), fg.view());
      CHECK(relative_error(fo.data, ref) < kFp32Tol);

      auto loss = [&] {
        cpu_backend().swiglu_forward(out.view(), gate_up.view());
        return dot(out.data, R.data);
      };
      HostBuffer<double> dgate_up({N, 2 * H}, 0.5);
      cpu_backend().swiglu_backward(dgate_up.view(), R.view(), gate_up.view());
      for (auto& g : dgate_up.data) g -= 0.5;
      check_gradient(dgate_up.data, finite_difference(gate_up.data, loss));
    }
}

// RoPE by its definition: in head h, elements i and i + hs/2 at position t turn by
// t * theta^(-2i/hs); v's heads (after the rotated ones) stay as they were.
TEST_CASE("rope rotates q and k heads by position times theta^(-2i/hs)", "[ops][llama]") {
  for (int hs : {2, 6, 38})
    for (int Tn : {1, 7, 19}) {
      CAPTURE(hs, Tn);
      const int B = 2, heads = 3, width = 5 * hs;  // 3 rotated heads (q and k), 2 that stay (v)
      const double theta = 10000;
      const std::vector<float> table = rope_table(Tn, hs, theta);
      HostBuffer<float> ftable({Tn, hs / 2, 2});
      ftable.data = table;
      HostBuffer<double> x({B, Tn, width}), R({B, Tn, width});
      fill_normal(x.data, 46);
      fill_normal(R.data, 47);
      std::vector<double> ref = x.data;
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < Tn; ++t)
          for (int h = 0; h < heads; ++h)
            for (int i = 0; i < hs / 2; ++i) {
              const double angle = t * std::pow(theta, -2.0 * i / hs);
              const size_t at = (static_cast<size_t>(b) * Tn + t) * width + h * hs + i, pair = at + hs / 2;
              ref[at] = x.data[at] * std::cos(angle) - x.data[pair] * std::sin(angle);
              ref[pair] = x.data[pair] * std::cos(angle) + x.data[at] * std::sin(angle);
            }
      HostBuffer<float> fx({B, Tn, width});
      fx.data = cast<float>(x.data);
      cpu_backend().rope_forward(fx.view(), ftable.view(), heads);
      CHECK(relative_error(fx.data, ref) < kFp32Tol);

      // The backward turns a gradient back: the gradient of sum(rope(x) * R) is rope^-1(R).
      auto loss = [&] {
        HostBuffer<double> y = x;
        cpu_backend().rope_forward(y.view(), ftable.view(), heads);
        return dot(y.data, R.data);
      };
      HostBuffer<double> dx = R;
      cpu_backend().rope_backward(dx.view(), ftable.view(), heads);
      check_gradient(dx.data, finite_difference(x.data, loss));
    }
}

// What RoPE is for: the score q_s . k_t of rotated vectors depends on s - t alone.
TEST_CASE("rope makes attention scores depend only on relative position", "[ops][llama]") {
  const int hs = 38, Tn = 64;
  const std::vector<float> table = rope_table(Tn, hs, 10000);
  HostBuffer<float> ftable({Tn, hs / 2, 2});
  ftable.data = table;
  HostBuffer<double> q({1, Tn, hs}), k({1, Tn, hs});
  std::vector<double> q0(hs), k0(hs);
  fill_normal(q0, 48);
  fill_normal(k0, 49);
  for (int t = 0; t < Tn; ++t)
    for (int i = 0; i < hs; ++i) {
      q.data[t * hs + i] = q0[i];  // the same vectors at every position
      k.data[t * hs + i] = k0[i];
    }
  cpu_backend().rope_forward(q.view(), ftable.view(), 1);
  cpu_backend().rope_forward(k.view(), ftable.view(), 1);
  const auto score = [&](int s, int t) {
    double d = 0;
    for (int i = 0; i < hs; ++i) d += q.data[s * hs + i] * k.data[t * hs + i];
    return d;
  };
  for (const auto& [s, t, s2, t2] : {std::array{5, 2, 40, 37}, std::array{63, 0, 63, 0}, std::array{9, 9, 50, 50},
                                     std::array{20, 30, 33, 43}})
    CHECK(score(s, t) == Approx(score(s2, t2)).epsilon(1e-5));
  CHECK(std::fabs(score(5, 2) - score(5, 3)) > 1e-3);  // and it does depend on the distance
}

TEST_CASE("rope_table computes HF's FP32 angles", "[ops][llama]") {
  const int hs = 64, Tn = 2049;
  const std::vector<float> table = rope_table(Tn, hs, 500000);
  // Position 2048, pair 1: inverse frequency 1 / 500000^(2/64) in FP32, times 2048 in FP32.
  const float inv = 1.0f / std::pow(500000.0f, 2.0f / 64.0f);
  const float angle = 2048.0f * inv;
  CHECK(table[(2048 * 32 + 1) * 2] == std::cos(angle));
  CHECK(table[(2048 * 32 + 1) * 2 + 1] == std::sin(angle));
  CHECK(table[0] == 1.0f);  // position 0 does not turn
  CHECK(table[1] == 0.0f);
}

// Query heads and K/V heads (attention_heads.h): multi-head, grouped-query and multi-query.
const std::pair<int, int> kHeadLayouts[] = {{1, 1}, {3, 3}, {4, 2}, {4, 1}};

TEST_CASE("causal attention forward and backward", "[ops]") {
  for (int Tn : {1, 7, 19})
    for (const auto& [NH, KV] : kHeadLayouts)
      for (int hs : {1, 2, 7}) {
        const int B = 2, C = NH * hs, W = (NH + 2 * KV) * hs, group = NH / KV;
        CAPTURE(Tn, NH, KV, hs);
        HostBuffer<double> qkv({B, Tn, W}), out({B, Tn, C}), att({B, NH, Tn, Tn}), R({B, Tn, C});
        fill_normal(qkv.data, 11);
        fill_normal(R.data, 12);

        // Query head h reads K/V head h / group: K after the NH query heads, V after the KV K heads.
        const auto q = [&](int b, int t, int h, int i) { return qkv.data[(b * Tn + t) * W + h * hs + i]; };
        const auto k = [&](int b, int t, int h, int i) { return qkv.data[(b * Tn + t) * W + (NH + h / group) * hs + i]; };
        const auto v = [&](int b, int t, int h, int i) {
          return qkv.data[(b * Tn + t) * W + (NH + KV + h / group) * hs + i];
        };
        std::vector<double> ref(out.size(), 0.0);
        for (int b = 0; b < B; ++b)
          for (int h = 0; h < NH; ++h)
            for (int t = 0; t < Tn; ++t) {
              std::vector<double> s(t + 1);
              double mx = -INFINITY, sum = 0;
              for (int u = 0; u <= t; ++u) {
                double d = 0;
                for (int i = 0; i < hs; ++i) d += q(b, t, h, i) * k(b, u, h, i);
                s[u] = d / std::sqrt(static_cast<double>(hs));
                mx = std::max(mx, s[u]);
              }
              for (int u = 0; u <= t; ++u) sum += (s[u] = std::exp(s[u] - mx));
              for (int u = 0; u <= t; ++u)
                for (int i = 0; i < hs; ++i) ref[(b * Tn + t) * C + h * hs + i] += s[u] / sum * v(b, u, h, i);
            }
        HostBuffer<float> fq({B, Tn, W}), fo({B, Tn, C}), fa({B, NH, Tn, Tn});
        fq.data = cast<float>(qkv.data);
        cpu_backend().attention_forward(fo.view(), fa.view(), fq.view(), NH);
        CHECK(relative_error(fo.data, ref) < kFp32Tol);

        auto loss = [&] {
          cpu_backend().attention_forward(out.view(), att.view(), qkv.view(), NH);
          return dot(out.data, R.data);
        };
        loss();
        HostBuffer<double> dqkv({B, Tn, W});
        cpu_backend().attention_backward(dqkv.view(), R.view(), qkv.view(), out.view(), att.view(), NH);
        check_gradient(dqkv.data, finite_difference(qkv.data, loss));
      }
}

// Decoding's op must give what the whole forward pass gives at the last row, for every length
// of the cache: in double, to rounding; in float, as close as two summation orders allow.
TEST_CASE("attention_decode gives attention_forward's last row", "[ops]") {
  for (int Tn : {1, 2, 7, 19, 70})
    for (const auto& [NH, KV] : kHeadLayouts)
      for (int hs : {1, 7}) {
        const int C = NH * hs, W = (NH + 2 * KV) * hs;
        CAPTURE(Tn, NH, KV, hs);
        HostBuffer<double> qkv({1, Tn, W}), out({1, Tn, C}), att({1, NH, Tn, Tn}), row({C});
        fill_normal(qkv.data, 13);
        cpu_backend().attention_forward(out.view(), att.view(), qkv.view(), NH);
        const std::vector<double> last(out.data.end() - C, out.data.end());
        std::fill(row.data.begin(), row.data.end(), NAN);  // every element must be written
        cpu_backend().attention_decode(row.view(), qkv.view().reshaped({Tn, W}), NH);
        CHECK(relative_error(row.data, last) < 1e-12);

        HostBuffer<float> fq({Tn, W}), frow({C});
        fq.data = cast<float>(qkv.data);
        cpu_backend().attention_decode(frow.view(), fq.view(), NH);
        CHECK(relative_error(frow.data, last) < kFp32Tol);
      }
}

TEST_CASE("attention refuses qkv rows that are no layout of query and K/V heads", "[ops]") {
  HostBuffer<float> qkv({1, 4, 12}), out({4}), wrong_out({5});
  CHECK_THROWS_WITH(cpu_backend().attention_decode(out.view(), qkv.view(), 2), Catch::Contains("attention_decode"));
  // 5 outputs over 2 heads, and 12 = (3 + 2 KV) * 4/3 wide rows for 3 heads: neither is a layout.
  CHECK_THROWS_WITH(cpu_backend().attention_decode(wrong_out.view(), qkv.view().reshaped({4, 12}), 2),
                    Catch::Contains("query heads over K/V heads"));
  CHECK_THROWS_WITH(cpu_backend().attention_decode(out.view(), qkv.view().reshaped({4, 12}), 3),
                    Catch::Contains("query heads over K/V heads"));
  // 4 query heads of size 1 with (12 - 4) / 2 = 4 K/V heads is a layout; 3 K/V heads would not divide 4.
  HostBuffer<float> odd({4, 10});
  CHECK_THROWS_WITH(cpu_backend().attention_decode(out.view(), odd.view(), 4), Catch::Contains("query heads"));
}

TEST_CASE("embedding forward and backward", "[ops]") {
  for (int Tn : {1, 7, 19})
    for (int C : {1, 7, 111}) {
      const int B = 3, V = 19, maxT = 23;
      CAPTURE(Tn, C);
      HostBuffer<double> wte({V, C}), wpe({maxT, C}), out({B, Tn, C}), R({B, Tn, C});
      HostBuffer<int32_t> tokens({B, Tn});
      fill_normal(wte.data, 13);
      fill_normal(wpe.data, 14);
      fill_normal(R.data, 15);
      Rng rng(16);
      for (auto& t : tokens.data) t = static_cast<int32_t>(rng.below(5));  // repeats on purpose

      std::vector<double> ref(out.size());
      for (int bt = 0; bt < B * Tn; ++bt)
        for (int c = 0; c < C; ++c) ref[bt * C + c] = wte.data[tokens.data[bt] * C + c] + wpe.data[(bt % Tn) * C + c];
      HostBuffer<float> fte({V, C}), fpe({maxT, C}), fo({B, Tn, C});
      fte.data = cast<float>(wte.data);
      fpe.data = cast<float>(wpe.data);
      cpu_backend().embedding_forward(fo.view(), tokens.view(), fte.view(), fpe.view());
      CHECK(relative_error(fo.data, ref) < kFp32Tol);

      auto loss = [&] {
        cpu_backend().embedding_forward(out.view(), tokens.view(), wte.view(), wpe.view());
        return dot(out.data, R.data);
      };
      HostBuffer<double> dwte({V, C}), dwpe({maxT, C});
      cpu_backend().embedding_backward(dwte.view(), dwpe.view(), R.view(), tokens.view());
      check_gradient(dwte.data, finite_difference(wte.data, loss));
      check_gradient(dwpe.data, finite_difference(wpe.data, loss));

      // Without position embeddings (llama): the token rows alone, and dwte the same sums.
      HostBuffer<float> token_rows({B, Tn, C});
      cpu_backend().embedding_forward(token_rows.view(), tokens.view(), fte.view(), Tensor());
      for (int bt = 0; bt < B * Tn; ++bt)
        for (int c = 0; c < C; ++c) REQUIRE(token_rows.data[bt * C + c] == fte.data[tokens.data[bt] * C + c]);
      HostBuffer<double> dwte_alone({V, C});
      cpu_backend().embedding_backward(dwte_alone.view(), Tensor(), R.view(), tokens.view());
      CHECK(dwte_alone.data == dwte.data);
    }
}

TEST_CASE("fused classifier: loss, in-place gradient, padded vocabulary", "[ops]") {
  for (int N : kSizes)
    for (int V : {7, 111}) {
      const int Vp = 128;
      CAPTURE(N, V);
      HostBuffer<double> logits({N, Vp}), losses({N});
      HostBuffer<int32_t> targets({N});
      fill_normal(logits.data, 17, 3.0);
      for (int n = 0; n < N; ++n)
        for (int i = V; i < Vp; ++i) logits.data[n * Vp + i] = 100.0;  // padding must never win
      Rng rng(18);
      for (auto& t : targets.data) t = static_cast<int32_t>(rng.below(V));

      std::vector<double> ref(N);
      for (int n = 0; n < N; ++n) {
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < V; ++i) mx = std::max(mx, logits.data[n * Vp + i]);
        for (int i = 0; i < V; ++i) sum += std::exp(logits.data[n * Vp + i] - mx);
        ref[n] = -(logits.data[n * Vp + targets.data[n]] - mx - std::log(sum));
      }
      HostBuffer<float> fl({N, Vp}), flo({N});
      fl.data = cast<float>(logits.data);
      cpu_backend().classifier(fl.view(), flo.view(), targets.view(), V, 0.0f);
      CHECK(relative_error(flo.data, ref) < kFp32Tol);

      const double dloss = 1.0 / N;
      const std::vector<double> original = logits.data;
      auto loss = [&] {
        HostBuffer<double> copy({N, Vp});
        copy.data = logits.data;
        cpu_backend().classifier(copy.view(), losses.view(), targets.view(), V, 0.0f);
        double s = 0;
        for (double x : losses.data) s += x * dloss;
        return s;
      };
      const std::vector<double> fd = finite_difference(logits.data, loss);
      HostBuffer<double> grad({N, Vp});
      grad.data = original;
      cpu_backend().classifier(grad.view(), losses.view(), targets.view(), V, static_cast<float>(dloss));
      check_gradient(grad.data, fd);
      for (int n = 0; n < N; ++n)
        for (int i = V; i < Vp; ++i) REQUIRE(grad.data[n * Vp + i] == 0.0);
    }
}

TEST_CASE("reductions and AdamW", "[ops]") {
  for (int n : {1, 7, 111, 40000}) {
    CAPTURE(n);
    HostBuffer<float> x({n});
    fill_normal(x.data, 19);
    double ref = 0;
    for (float v : x.data) ref += static_cast<double>(v) * v;
    CHECK(cpu_backend().sum_squares(x.view()) == Approx(ref).epsilon(1e-12));
    double plain = 0;
    for (float v : x.data) plain += v;
    CHECK(cpu_backend().sum(x.view()) == Approx(plain).epsilon(1e-9).margin(1e-9));
    // Loss scaling detects overflow through the sum of squares: one inf or NaN must show.
    x.data[n / 2] = NAN;
    CHECK_FALSE(std::isfinite(cpu_backend().sum_squares(x.view())));
    x.data[n / 2] = INFINITY;
    CHECK_FALSE(std::isfinite(cpu_backend().sum_squares(x.view())));
    x.data[n / 2] = 3e38f;  // the largest floats square to finite doubles
    CHECK(std::isfinite(cpu_backend().sum_squares(x.view())));
  }

  // AdamW: gradients and grad_scale change every step. Adam's m/sqrt(v) cancels a scale that
  // stays constant, so the moments themselves are compared too.
  const int n = 19;
  HostBuffer<float> p({n}), g({n}), m({n}), v({n});
  fill_normal(p.data, 20);
  std::vector<double> rp(p.data.begin(), p.data.end()), rm(n, 0), rv(n, 0);
  AdamWParams a;
  a.lr = 0.01f;
  a.weight_decay = 0.1f;
  const float scales[] = {0.5f, 2.0f, 0.125f};
  for (int step = 1; step <= 3; ++step) {
    fill_normal(g.data, 20 + step);
    a.step = step;
    a.grad_scale = scales[step - 1];
    cpu_backend().adamw(p.view(), g.view(), m.view(), v.view(), a, Tensor());
    for (int i = 0; i < n; ++i) {
      const double gi = static_cast<double>(g.data[i]) * scales[step - 1];
      rm[i] = 0.9 * rm[i] + 0.1 * gi;
      rv[i] = 0.95 * rv[i] + 0.05 * gi * gi;
      const double mh = rm[i] / (1 - std::pow(0.9, step)), vh = rv[i] / (1 - std::pow(0.95, step));
      rp[i] -= 0.01 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * rp[i]);
    }
    CAPTURE(step);
    CHECK(relative_error(m.data, rm) < kFp32Tol);
    CHECK(relative_error(v.data, rv) < kFp32Tol);
    CHECK(relative_error(p.data, rp) < kFp32Tol);
  }
}

// AdamW::step on a whole model: the global norm, clipping by it, and decay on 2-D weights only.
TEST_CASE("AdamW clips by the global gradient norm and decays 2-D weights only", "[ops]") {
  const ModelShape shape{1, 2, 8, 4, 16, 128};
  Transformer model(shape, cpu_backend(), DType::f32, 1, 4);
  model.init(3);
  const Tensor grads = model.grads_flat();
  float* gd = grads.as<float>();
  double sum_squares = 0;
  for (int64_t i = 0; i < grads.numel(); ++i) {
    gd[i] = static_cast<float>(((i * 37) % 11) - 5) * 0.25f;
    sum_squares += static_cast<double>(gd[i]) * gd[i];
  }
  const std::vector<float> g(gd, gd + grads.numel());
  const double true_norm = std::sqrt(sum_squares);
  REQUIRE(true_norm > 2);

  SECTION("the norm is the L2 norm of all gradients, and clipping scales them to grad_clip") {
    for (const double clip : {0.0, 1.0, 1e9}) {
      CAPTURE(clip);
      model.zero_grad();
      std::copy(g.begin(), g.end(), gd);
      AdamW adamw(model, cpu_backend(), AdamWConfig{0.9, 0.95, 1e-8, 0.0, clip});
      const double norm = adamw.reduce_gradients();
      CHECK(norm == Approx(true_norm).epsilon(1e-12));
      adamw.step(1e-3, norm);
      // After one step m = (1 - beta1) * c * g, with c the clip factor.
      const double c = clip > 0 && true_norm > clip ? clip / true_norm : 1.0;
      const float* m = adamw.first_moment().as<float>();
      for (int64_t i = 0; i < grads.numel(); i += 97) REQUIRE(m[i] == Approx(0.1 * c * g[i]).margin(1e-12));
    }
  }
  SECTION("with no gradient, weight decay alone moves exactly the 2-D weights") {
    model.zero_grad();
    const std::vector<float> before(model.master_flat().as<float>(), model.master_flat().as<float>() + model.num_params());
    AdamW adamw(model, cpu_backend(), AdamWConfig{0.9, 0.95, 1e-8, 0.5, 1.0});
    adamw.step(0.1, 0.0);
    int64_t offset = 0, decayed = 0, kept = 0;
    for (const ParamSpec& spec : model.specs()) {
      const int64_t count = model.param(spec.id).numel();
      CAPTURE(spec.name);
      // The matrices (wte, wpe and each block's four linear weights), not biases or layernorms.
      const bool matrix = spec.name == "wte" || spec.name == "wpe" ||
                          (spec.name.size() > 1 && spec.name.back() == 'w' && spec.name.rfind("ln", 0) != 0);
      CHECK(spec.weight_decay == matrix);
      for (int64_t i = offset; i < offset + count; ++i) {
        const float now = model.master_flat().as<float>()[i];
        if (spec.weight_decay) {
          REQUIRE(now == Approx(before[i] * (1 - 0.1f * 0.5f)).epsilon(1e-6));
          decayed += before[i] != 0;
        } else {
          REQUIRE(now == before[i]);
          ++kept;
        }
      }
      offset += count;
    }
    CHECK(decayed > 0);
    CHECK(kept > 0);
  }
}

TEST_CASE("residual add", "[ops]") {
  for (int n : kSizes) {
    HostBuffer<float> a({n}), b({n}), out({n}, NAN);
    fill_normal(a.data, 22);
    fill_normal(b.data, 23);
    cpu_backend().add(out.view(), a.view(), b.view());
    std::vector<double> ref(n);
    for (int i = 0; i < n; ++i) ref[i] = static_cast<double>(a.data[i]) + b.data[i];
    CHECK(relative_error(out.data, ref) < kFp32Tol);
  }
}
