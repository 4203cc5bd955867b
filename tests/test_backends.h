// Backends for tests that need the CPU backend's numbers with one part changed: a backend
// that hands every op to another, and Fp8Gemms that keep their statistics as a GPU does; and
// the check that two models' FP8 states agree bit for bit.
#pragma once

#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/fp8_linear.h"
#include "precision/formats.h"
#include "precision/fp8_scaling.h"

namespace ptrain::test {

// The CPU backend (every core), made once for all the tests that share it.
inline Backend& cpu_backend() {
  static std::unique_ptr<Backend> be = make_cpu_backend(0);
  return *be;
}

// Every op handed to `inner`; derive and override what the test changes.
class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}

  std::string name() const override { return inner_.name(); }
  Device device() const override { return inner_.device(); }
  std::string description() const override { return inner_.description(); }
  std::vector<std::string> performance_warnings() const override { return inner_.performance_warnings(); }
  DType storage_for(Format f, DType compute) const override { return inner_.storage_for(f, compute); }
  void* allocate(size_t bytes) override { return inner_.allocate(bytes); }
  void release(void* p) override { inner_.release(p); }
  void zero(Tensor t) override { inner_.zero(t); }
  void upload(Tensor dst, const float* src) override { inner_.upload(dst, src); }
  void download(float* dst, Tensor src) override { inner_.download(dst, src); }
  void upload_tokens(Tensor dst, const int32_t* src) override { inner_.upload_tokens(dst, src); }
  void copy(Tensor dst, Tensor src) override { inner_.copy(dst, src); }
  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) override {
    inner_.embedding_forward(out, tokens, wte, wpe);
  }
  void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) override {
    inner_.embedding_backward(dwte, dwpe, dout, tokens);
  }
  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b) override {
    inner_.layernorm_forward(out, mean, rstd, inp, w, b);
  }
  void layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
                          Tensor rstd) override {
    inner_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd);
  }
  void matmul_forward(Tensor out, Tensor inp, Tensor w, Tensor bias) override {
    inner_.matmul_forward(out, inp, w, bias);
  }
  void matmul_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w) override {
    inner_.matmul_backward(dinp, dw, db, dout, inp, w);
  }
  void bias_backward(Tensor db, Tensor dout) override { inner_.bias_backward(db, dout); }
  void attention_forward(Tensor out, Tensor saved, Tensor qkv, int nh) override {
    inner_.attention_forward(out, saved, qkv, nh);
  }
  void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor saved, int nh) override {
    inner_.attention_backward(dqkv, dout, qkv, out, saved, nh);
  }
  void attention_decode(Tensor out, Tensor qkv, int nh) override { inner_.attention_decode(out, qkv, nh); }
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor w, float eps) override {
    inner_.rmsnorm_forward(out, rstd, inp, w, eps);
  }
  void rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd) override {
    inner_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd);
  }
  void qk_norm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor qw, Tensor kw, int nh, float eps) override {
    inner_.qk_norm_forward(out, rstd, inp, qw, kw, nh, eps);
  }
  void qk_norm_backward(Tensor dinp, Tensor dqw, Tensor dkw, Tensor dout, Tensor inp, Tensor qw, Tensor kw,
                        Tensor rstd, int nh) override {
    inner_.qk_norm_backward(dinp, dqw, dkw, dout, inp, qw, kw, rstd, nh);
  }
  void rope_forward(Tensor x, Tensor table, int heads) override { inner_.rope_forward(x, table, heads); }
  void rope_backward(Tensor dx, Tensor table, int heads) override { inner_.rope_backward(dx, table, heads); }
  void swiglu_forward(Tensor out, Tensor gate_up) override { inner_.swiglu_forward(out, gate_up); }
  void swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up) override {
    inner_.swiglu_backward(dgate_up, dout, gate_up);
  }
  AttentionChoice choose_attention(AttentionRequest want, DType dt, int64_t B, int64_t T, int nh, int kv,
                                   int64_t hs) override {
    return inner_.choose_attention(want, dt, B, T, nh, kv, hs);
  }
  void gelu_forward(Tensor out, Tensor inp) override { inner_.gelu_forward(out, inp); }
  void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) override { inner_.gelu_backward(dinp, inp, dout); }
  void add(Tensor out, Tensor a, Tensor b) override { inner_.add(out, a, b); }
  void classifier(Tensor logits, Tensor losses, Tensor targets, int vocab, float dloss) override {
    inner_.classifier(logits, losses, targets, vocab, dloss);
  }
  double sum(Tensor t) override { return inner_.sum(t); }
  double sum_squares(Tensor t) override { return inner_.sum_squares(t); }
  void sum_into(Tensor out, Tensor t) override { inner_.sum_into(out, t); }
  void download_doubles(double* dst, Tensor src) override { inner_.download_doubles(dst, src); }
  float amax(Tensor t) override { return inner_.amax(t); }
  Fp8CastStats fp8_cast(Tensor out, Tensor in, Format f, float scale) override {
    return inner_.fp8_cast(out, in, f, scale);
  }
  Fp8CastStats fp8_cast_blocks(Tensor out, Tensor in, Format f, int br, int bc) override {
    return inner_.fp8_cast_blocks(out, in, f, br, bc);
  }
  void fp8_block_amaxes(float* amaxes, Tensor part, int64_t first, int64_t cols, int br, int bc) override {
    inner_.fp8_block_amaxes(amaxes, part, first, cols, br, bc);
  }
  Fp8CastStats fp8_encode(Tensor out, Tensor part, Format f, const std::vector<float>& scales, int64_t first,
                          int64_t cols, int br, int bc) override {
    return inner_.fp8_encode(out, part, f, scales, first, cols, br, bc);
  }
  void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& p, Tensor copy) override {
    inner_.adamw(param, grad, m, v, p, copy);
  }
  GradNumerics take_grad_numerics() override { return inner_.take_grad_numerics(); }

 protected:
  Backend& inner_;
};

// The native FP8 path's bookkeeping, checked without a GPU. These Fp8Gemms cast and multiply as
// the CPU emulates, but gather each operand's statistics until take_stats() (unrecorded casts
// into a slot never read), as the CUDA backend's do on the device; the model must then train
// and report exactly as with the emulation, whose statistics arrive with each cast.
class DeferredFp8Gemms final : public Fp8Gemms {
 public:
  DeferredFp8Gemms(Backend& cpu, int64_t rows, int64_t C, int64_t OC, Scaling scaling)
      : be_(cpu), blocks_(scaling == Scaling::blocks) {
    shapes_ = {std::vector<int64_t>{rows, C}, {OC, C}, {rows, OC}};
    for (int i = 0; i < 3; ++i) {
      q_[i].assign(static_cast<size_t>(shapes_[i][0] * shapes_[i][1]), 0.0f);
      qt_[i] = q_[i];
    }
  }
  void cast(Operand which, Tensor in, Format format, float scale, bool record) override {
    gather(which, record, be_.fp8_cast(view(q_, which), in, format, scale), scale);
  }
  void cast_current(Operand which, Tensor in, Format format, bool record) override {
    cast(which, in, format, current_scale(be_.amax(in), format_max(format)), record);
  }
  void cast_blocks(Operand which, Tensor in, Format format, int block_rows, int block_cols, bool record) override {
    const Tensor out = block_cols == 1 ? view(qt_, which) : view(q_, which);  // 128x1 tiles feed wgrad
    gather(which, record, be_.fp8_cast_blocks(out, in, format, block_rows, block_cols), NAN);
  }
  std::array<OperandStats, 3> take_stats() override {
    const std::array<OperandStats, 3> taken = {slots_[0], slots_[1], slots_[2]};
    slots_ = {};
    return taken;
  }
  Tensor weight_codes() override { return view(q_, kWeight); }  // dequantised, as the CPU encodes
  void set_weight_scales(Format, const std::vector<float>&) override {}
  void forward(Tensor out, Tensor bias) override {
    be_.matmul_forward(out, view(q_, kInput), view(q_, kWeight), bias);
  }
  void backward(Tensor dinp, Tensor dweight) override {
    be_.matmul_backward(dinp, Tensor(), Tensor(), view(q_, kGrad), view(q_, kInput), view(q_, kWeight));
    auto& wgrad = blocks_ ? qt_ : q_;
    be_.matmul_backward(Tensor(), dweight, Tensor(), view(wgrad, kGrad), view(wgrad, kInput), view(q_, kWeight));
  }

 private:
  Tensor view(std::array<std::vector<float>, 3>& q, Operand which) {
    return Tensor(q[which].data(), DType::f32, shapes_[which]);
  }
  void gather(Operand which, bool record, const Fp8CastStats& s, float scale) {
    OperandStats& slot = slots_[record ? which : 3];
    slot.stats.merge(s);
    slot.scale = scale;
  }

  Backend& be_;
  bool blocks_;
  std::array<std::vector<int64_t>, 3> shapes_;
  std::array<std::vector<float>, 3> q_, qt_;  // dequantised casts; qt_: block scaling's wgrad tiles
  std::array<OperandStats, 4> slots_{};       // per operand, then the unrecorded casts'
};

// Two FP8 tensors' telemetry, latest scale and delayed-scaling state, bit for bit.
inline void check_same_fp8_state(const Fp8TensorState& a, const Fp8TensorState& b) {
  INFO(a.name);
  CHECK(std::memcmp(&a.stats.amax, &b.stats.amax, sizeof(float)) == 0);
  CHECK(a.stats.nonzero == b.stats.nonzero);
  CHECK(a.stats.underflow == b.stats.underflow);
  CHECK(a.stats.saturated == b.stats.saturated);
  CHECK(std::memcmp(&a.scale, &b.scale, sizeof(float)) == 0);
  CHECK(a.delayed.history() == b.delayed.history());
  CHECK(a.delayed.scale() == b.delayed.scale());
}

// The CPU backend with the Fp8Gemms above: every other op is the CPU's own.
class DeferredFp8Backend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::unique_ptr<Fp8Gemms> make_fp8_gemms(int64_t rows, int64_t C, int64_t OC, Fp8Gemms::Scaling scaling, Format,
                                           Format, int, Fp8Gemms::WeightCodes codes, std::string* why) override {
    if (codes == Fp8Gemms::WeightCodes::handed) {  // the layer emulates, reading the codes it is handed
      *why = "these test GEMMs keep their weight's codes";
      return nullptr;
    }
    return std::make_unique<DeferredFp8Gemms>(inner_, rows, C, OC, scaling);
  }
};

}  // namespace ptrain::test
