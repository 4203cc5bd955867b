// Recorded micro-batches (training.cuda_graph), checked without a GPU. RecordingBackend records
// as CUDA stream capture does: while recording, each op is kept with its arguments (pointers and
// shapes, not the data behind them) instead of running, and a replay runs the kept calls in
// order on whatever the memory holds then. Ops that hand a result to the host, which on a GPU
// wait for the device, cannot be recorded and fail the recording. A model that records and
// replays must train exactly as one that runs every op as called.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <utility>

#include "model/transformer.h"
#include "test_backends.h"
#include "test_util.h"

using namespace ptrain;
using namespace ptrain::test;

namespace {

struct RecordingRefused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class RecordingBackend final : public ForwardingBackend {
 public:
  // native_fp8: FP8 layers get recordable Fp8Gemms (as on a GPU) instead of the emulation.
  // refused_op: an op that fails a recording, as one a GPU library cannot capture would.
  RecordingBackend(Backend& inner, bool native_fp8, std::string refused_op = "")
      : ForwardingBackend(inner), native_fp8_(native_fp8), refused_op_(std::move(refused_op)) {}
  int recordings = 0, replays = 0;

  std::string cannot_record() const override { return ""; }
  std::unique_ptr<RecordedWork> record(const std::function<void()>& body, std::string* why) override {
    calls_ = std::make_shared<Calls>();
    recording_ = true;
    try {
      body();
    } catch (const RecordingRefused& e) {
      recording_ = false;
      *why = e.what();
      return nullptr;
    }
    recording_ = false;
    ++recordings;
    return std::make_unique<Replay>(std::move(calls_), &replays);
  }
  uint64_t memory_epoch() const override { return epoch_; }

  // Runs `call` now, or keeps it while recording.
  void queue(const char* op, std::function<void()> call) {
    if (recording_ && refused_op_ == op) refuse(op);
    if (recording_)
      calls_->push_back(std::move(call));
    else
      call();
  }
  void refuse(const char* op) {
    if (recording_) throw RecordingRefused(std::string(op) + " cannot be recorded");
  }

  // Memory is handed out at once, recording or not, as from the CUDA backend's arena.
  void* allocate(size_t bytes) override {
    ++epoch_;
    return inner_.allocate(bytes);
  }
  void release(void* p) override {
    ++epoch_;
    inner_.release(p);
  }
  void zero(Tensor t) override {
    queue("zero", [this, t] { inner_.zero(t); });
  }
  void copy(Tensor dst, Tensor src) override {
    queue("copy", [this, dst, src] { inner_.copy(dst, src); });
  }
  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) override {
    queue("embedding_forward", [=] { inner_.embedding_forward(out, tokens, wte, wpe); });
  }
  void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) override {
    queue("embedding_backward", [=] { inner_.embedding_backward(dwte, dwpe, dout, tokens); });
  }
  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b) override {
    queue("layernorm_forward", [=] { inner_.layernorm_forward(out, mean, rstd, inp, w, b); });
  }
  void layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
                          Tensor rstd) override {
    queue("layernorm_backward", [=] { inner_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd); });
  }
  void matmul_forward(Tensor out, Tensor inp, Tensor w, Tensor bias) override {
    queue("matmul_forward", [=] { inner_.matmul_forward(out, inp, w, bias); });
  }
  void matmul_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w) override {
    queue("matmul_backward", [=] { inner_.matmul_backward(dinp, dw, db, dout, inp, w); });
  }
  void bias_backward(Tensor db, Tensor dout) override {
    queue("bias_backward", [=] { inner_.bias_backward(db, dout); });
  }
  void attention_forward(Tensor out, Tensor saved, Tensor qkv, int nh) override {
    queue("attention_forward", [=] { inner_.attention_forward(out, saved, qkv, nh); });
  }
  void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor saved, int nh) override {
    queue("attention_backward", [=] { inner_.attention_backward(dqkv, dout, qkv, out, saved, nh); });
  }
  void attention_decode(Tensor out, Tensor qkv, int nh) override {
    queue("attention_decode", [=] { inner_.attention_decode(out, qkv, nh); });
  }
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor w, float eps) override {
    queue("rmsnorm_forward", [=] { inner_.rmsnorm_forward(out, rstd, inp, w, eps); });
  }
  void rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd) override {
    queue("rmsnorm_backward", [=] { inner_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd); });
  }
  void qk_norm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor qw, Tensor kw, int nh, float eps) override {
    queue("qk_norm_forward", [=] { inner_.qk_norm_forward(out, rstd, inp, qw, kw, nh, eps); });
  }
  void qk_norm_backward(Tensor dinp, Tensor dqw, Tensor dkw, Tensor dout, Tensor inp, Tensor qw, Tensor kw,
                        Tensor rstd, int nh) override {
    queue("qk_norm_backward", [=] { inner_.qk_norm_backward(dinp, dqw, dkw, dout, inp, qw, kw, rstd, nh); });
  }
  void rope_forward(Tensor x, Tensor table, int heads) override {
    queue("rope_forward", [=] { inner_.rope_forward(x, table, heads); });
  }
  void rope_backward(Tensor dx, Tensor table, int heads) override {
    queue("rope_backward", [=] { inner_.rope_backward(dx, table, heads); });
  }
  void swiglu_forward(Tensor out, Tensor gate_up) override {
    queue("swiglu_forward", [=] { inner_.swiglu_forward(out, gate_up); });
  }
  void swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up) override {
    queue("swiglu_backward", [=] { inner_.swiglu_backward(dgate_up, dout, gate_up); });
  }
  void gelu_forward(Tensor out, Tensor inp) override {
    queue("gelu_forward", [=] { inner_.gelu_forward(out, inp); });
  }
  void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) override {
    queue("gelu_backward", [=] { inner_.gelu_backward(dinp, inp, dout); });
  }
  void add(Tensor out, Tensor a, Tensor b) override {
    queue("add", [=] { inner_.add(out, a, b); });
  }
  void classifier(Tensor logits, Tensor losses, Tensor targets, int vocab, float dloss) override {
    queue("classifier", [=] { inner_.classifier(logits, losses, targets, vocab, dloss); });
  }
  void sum_into(Tensor out, Tensor t) override {
    queue("sum_into", [=] { inner_.sum_into(out, t); });
  }

  // What hands a result to the host (or reads pageable host memory) waits for the device.
  void upload(Tensor dst, const float* src) override {
    refuse("upload");
    inner_.upload(dst, src);
  }
  void download(float* dst, Tensor src) override {
    refuse("download");
    inner_.download(dst, src);
  }
  void upload_tokens(Tensor dst, const int32_t* src) override {
    refuse("upload_tokens");
    inner_.upload_tokens(dst, src);
  }
  void download_doubles(double* dst, Tensor src) override {
    refuse("download_doubles");
    inner_.download_doubles(dst, src);
  }
  double sum(Tensor t) override {
    refuse("sum");
    return inner_.sum(t);
  }
  double sum_squares(Tensor t) override {
    refuse("sum_squares");
    return inner_.sum_squares(t);
  }
  float amax(Tensor t) override {
    refuse("amax");
    return inner_.amax(t);
  }
  Fp8CastStats fp8_cast(Tensor out, Tensor in, Format f, float scale) override {
    refuse("fp8_cast");
    return inner_.fp8_cast(out, in, f, scale);
  }
  Fp8CastStats fp8_cast_blocks(Tensor out, Tensor in, Format f, int br, int bc) override {
    refuse("fp8_cast_blocks");
    return inner_.fp8_cast_blocks(out, in, f, br, bc);
  }
  void fp8_block_amaxes(float* amaxes, Tensor part, int64_t first, int64_t cols, int br, int bc) override {
    refuse("fp8_block_amaxes");
    inner_.fp8_block_amaxes(amaxes, part, first, cols, br, bc);
  }
  Fp8CastStats fp8_encode(Tensor out, Tensor part, Format f, const std::vector<float>& scales, int64_t first,
                          int64_t cols, int br, int bc) override {
    refuse("fp8_encode");
    return inner_.fp8_encode(out, part, f, scales, first, cols, br, bc);
  }
  GradNumerics take_grad_numerics() override {
    refuse("take_grad_numerics");
    return inner_.take_grad_numerics();
  }

  std::unique_ptr<Fp8Gemms> make_fp8_gemms(int64_t rows, int64_t C, int64_t OC, Fp8Gemms::Scaling scaling,
                                           Format forward, Format backward, int input_slot,
                                           Fp8Gemms::WeightCodes weight_codes, std::string* why) override;

 private:
  using Calls = std::vector<std::function<void()>>;
  class Replay final : public RecordedWork {
   public:
    Replay(std::shared_ptr<Calls> calls, int* count) : calls_(std::move(calls)), count_(count) {}
    void replay() override {
      ++*count_;
      for (const auto& call : *calls_) call();
    }

   private:
    std::shared_ptr<Calls> calls_;
    int* count_;
  };

  bool native_fp8_;
  std::string refused_op_;
  bool recording_ = false;
  std::shared_ptr<Calls> calls_;
  uint64_t epoch_ = 0;
};

// DeferredFp8Gemms (statistics kept until take_stats, as on a GPU) whose casts and GEMMs are
// recorded like any op; reading the statistics back cannot be.
class RecordedFp8Gemms final : public Fp8Gemms {
 public:
  RecordedFp8Gemms(RecordingBackend& be, std::unique_ptr<Fp8Gemms> inner) : be_(be), inner_(std::move(inner)) {}
  void cast(Operand which, Tensor in, Format format, float scale, bool record) override {
    be_.queue("fp8 cast", [=] { inner_->cast(which, in, format, scale, record); });
  }
  void cast_current(Operand which, Tensor in, Format format, bool record) override {
    be_.queue("fp8 cast", [=] { inner_->cast_current(which, in, format, record); });
  }
  void cast_blocks(Operand which, Tensor in, Format format, int block_rows, int block_cols, bool record) override {
    be_.queue("fp8 cast", [=] { inner_->cast_blocks(which, in, format, block_rows, block_cols, record); });
  }
  std::array<OperandStats, 3> take_stats() override {
    be_.refuse("take_stats");
    return inner_->take_stats();
  }
  Tensor weight_codes() override { return inner_->weight_codes(); }
  void set_weight_scales(Format format, const std::vector<float>& scales) override {
    be_.refuse("set_weight_scales");  // a GPU copies block factors from pageable host memory
    inner_->set_weight_scales(format, scales);
  }
  void forward(Tensor out, Tensor bias) override {
    be_.queue("fp8 forward", [=] { inner_->forward(out, bias); });
  }
  void backward(Tensor dinp, Tensor dweight) override {
    be_.queue("fp8 backward", [=] { inner_->backward(dinp, dweight); });
  }

 private:
  RecordingBackend& be_;
  std::unique_ptr<Fp8Gemms> inner_;
};

std::unique_ptr<Fp8Gemms> RecordingBackend::make_fp8_gemms(int64_t rows, int64_t C, int64_t OC,
                                                           Fp8Gemms::Scaling scaling, Format forward, Format backward,
                                                           int input_slot, Fp8Gemms::WeightCodes weight_codes,
                                                           std::string* why) {
  if (!native_fp8_)
    return ForwardingBackend::make_fp8_gemms(rows, C, OC, scaling, forward, backward, input_slot, weight_codes, why);
  if (weight_codes == Fp8Gemms::WeightCodes::handed) {  // the layer emulates, reading the codes it is handed
    *why = "these test GEMMs keep their weight's codes";
    return nullptr;
  }
  return std::make_unique<RecordedFp8Gemms>(*this, std::make_unique<DeferredFp8Gemms>(inner_, rows, C, OC, scaling));
}

const ModelShape kShape{2, 2, 32, 16, 64, 128};
constexpr int kB = 2, kT = 16;

PrecisionPolicy policy_of(const std::string& mode, const std::string& recipe = "current") {
  PrecisionConfig pc;
  pc.mode = *parse_choice<PrecisionMode>(mode);
  pc.fp8.recipe = *parse_choice<Fp8Recipe>(recipe);
  return PrecisionPolicy::from_config(pc);
}

std::vector<float> values(const Tensor& t) { return std::vector<float>(t.as<float>(), t.as<float>() + t.numel()); }

// Two models trained side by side on the same batches, one recording: an SGD step on the FP32
// master weights stands in for the optimizer, an evaluation runs between steps.
struct SideBySide {
  RecordingBackend eager_be, recording_be;
  Transformer eager, recorded;
  Rng rng{17};
  HostBuffer<double> eager_sums{std::vector<int64_t>{2}}, recorded_sums{std::vector<int64_t>{2}};

  SideBySide(const PrecisionPolicy& policy, bool native_fp8, const std::string& refused_op = "")
      : eager_be(cpu_backend(), native_fp8),
        recording_be(cpu_backend(), native_fp8, refused_op),
        eager(kShape, eager_be, DType::f32, kB, kT, policy),
        recorded(kShape, recording_be, DType::f32, kB, kT, policy) {
    eager.init(5);
    recorded.init(5);
  }

  std::vector<int32_t> tokens() {
    std::vector<int32_t> t(kB * kT);
    for (auto& x : t) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(kShape.vocab)));
    return t;
  }

  // One step of two micro-batches; CHECKs that both models computed the same, bit for bit.
  // `report_blocks`: the recording model's second micro-batch reports each block's finished
  // gradients, as for an all-reduce that overlaps the backward pass.
  void step(float dloss, bool report_blocks = false) {
    eager.zero_grad();
    recorded.zero_grad();
    std::vector<int> reported;
    for (int micro = 0; micro < 2; ++micro) {
      const auto in = tokens(), target = tokens();
      eager.train_micro_batch(in.data(), target.data(), dloss, eager_sums.view().range(micro, 1));
      const Tensor sum = recorded_sums.view().range(micro, 1);
      if (report_blocks && micro == 1)
        recorded.train_micro_batch(in.data(), target.data(), dloss, sum, [&](int block) { reported.push_back(block); });
      else
        recorded.train_micro_batch(in.data(), target.data(), dloss, sum);
    }
    if (report_blocks) CHECK(reported == std::vector<int>{2, 1, 0, -1});  // the head, the blocks, the embeddings
    CHECK(std::memcmp(eager_sums.data.data(), recorded_sums.data.data(), 2 * sizeof(double)) == 0);
    CHECK(values(eager.grads_flat()) == values(recorded.grads_flat()));
    const auto in = tokens(), target = tokens();
    CHECK(eager.forward(in.data(), target.data(), 0.0f) == recorded.forward(in.data(), target.data(), 0.0f));
    for (Transformer* model : {&eager, &recorded}) {
      float* w = model->master_flat().as<float>();
      const float* g = model->grads_flat().as<float>();
      for (int64_t i = 0; i < model->num_params(); ++i) w[i] -= 0.5f * g[i];
      model->weights_loaded();
      model->end_step();
    }
    const std::vector<Fp8TensorState*> e = eager.fp8_tensors(), r = recorded.fp8_tensors();
    REQUIRE(e.size() == r.size());
    for (size_t i = 0; i < e.size(); ++i) check_same_fp8_state(*e[i], *r[i]);
  }
};

TEST_CASE("recorded micro-batches train exactly as micro-batches run as called", "[recording]") {
  for (const auto& [mode, recipe] : std::vector<std::pair<std::string, std::string>>{
           {"fp32", ""}, {"bf16", ""}, {"fp16", ""}, {"fp8", "current"}, {"fp8", "block"}}) {
    INFO(mode << " " << recipe);
    SideBySide run(policy_of(mode, recipe.empty() ? "current" : recipe), /*native_fp8=*/true);
    REQUIRE(run.recorded.record_micro_batches().empty());
    for (int step = 0; step < 5; ++step) {
      INFO("step " << step);
      run.step(step < 3 ? 0.03f : 0.015f);  // from step 3 on a new dloss, as when the loss scale moves
    }
    CHECK(run.eager_be.recordings == 0);
    CHECK(run.recorded.recording_failure().empty());
    if (mode != "fp8") {
      // Per dloss: the first micro-batch runs as called, the second is recorded, all later ones replay.
      CHECK(run.recording_be.recordings == 2);
      CHECK(run.recording_be.replays == 8);
    } else {
      // Two kinds per step (the first casts the weights), each run as called once before it is recorded.
      CHECK(run.recording_be.recordings == 4);
      CHECK(run.recording_be.replays == 6);
    }
  }
}

TEST_CASE("a recording is not replayed after memory moved", "[recording]") {
  SideBySide run(policy_of("bf16"), true);
  REQUIRE(run.recorded.record_micro_batches().empty());
  run.step(0.03f);
  run.step(0.03f);
  REQUIRE(run.recording_be.recordings == 1);
  const int replays = run.recording_be.replays;
  // Memory handed out and back between steps (a recording may point at such memory): the next
  // micro-batch runs as called, the one after records afresh.
  run.recording_be.release(run.recording_be.allocate(64));
  run.step(0.03f);
  CHECK(run.recording_be.replays == replays + 1);
  CHECK(run.recording_be.recordings == 2);
  run.step(0.03f);
  CHECK(run.recording_be.replays == replays + 3);
}

TEST_CASE("micro-batches that cannot be recorded run as called, and say why", "[recording]") {
  SECTION("delayed FP8 scaling") {
    RecordingBackend be(cpu_backend(), true);
    Transformer model(kShape, be, DType::f32, kB, kT, policy_of("fp8", "delayed"));
    CHECK_THAT(model.record_micro_batches(), Catch::Contains("delayed FP8 scaling"));
  }
  SECTION("emulated FP8 layers") {
    RecordingBackend be(cpu_backend(), /*native_fp8=*/false);
    Transformer model(kShape, be, DType::f32, kB, kT, policy_of("fp8", "current"));
    CHECK_THAT(model.record_micro_batches(), Catch::Contains("emulate"));
  }
  SECTION("the CPU backend") {
    Transformer model(kShape, cpu_backend(), DType::f32, kB, kT, policy_of("bf16"));
    CHECK_THAT(model.record_micro_batches(), Catch::Contains("records none"));
  }
  SECTION("an op the recording cannot hold") {
    for (const auto& [mode, recipe] : std::vector<std::pair<std::string, std::string>>{{"bf16", ""}, {"fp8", "current"}}) {
      INFO(mode << " " << recipe);
      SideBySide run(policy_of(mode, recipe.empty() ? "current" : recipe), true, "attention_backward");
      REQUIRE(run.recorded.record_micro_batches().empty());
      for (int step = 0; step < 3; ++step) run.step(0.03f);  // the same numbers all along
      CHECK_THAT(run.recorded.recording_failure(), Catch::Contains("attention_backward cannot be recorded"));
      CHECK(run.recording_be.recordings == 0);
      CHECK(run.recording_be.replays == 0);
    }
  }
}

TEST_CASE("a micro-batch that reports finished blocks runs as called beside recorded ones", "[recording]") {
  for (const auto& [mode, recipe] : std::vector<std::pair<std::string, std::string>>{{"bf16", ""}, {"fp8", "block"}}) {
    INFO(mode << " " << recipe);
    SideBySide run(policy_of(mode, recipe.empty() ? "current" : recipe), true);
    REQUIRE(run.recorded.record_micro_batches().empty());
    for (int step = 0; step < 4; ++step) run.step(0.03f, /*report_blocks=*/true);
    CHECK(run.recording_be.replays > 0);
    CHECK(run.recorded.replays() == run.recording_be.replays);
  }
}

}  // namespace
