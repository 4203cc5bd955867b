// Reduced precision on the CPU reference: each mode trains a tiny model to within 2% of FP32,
// loss scaling and block scaling are shown to matter, and reduced-precision tensors really hold
// values of their format.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "config/config.h"
#include "model/transformer.h"
#include "test_util.h"
#include "train/trainer.h"

using namespace ptrain;
using namespace ptrain::test;
namespace fs = std::filesystem;

namespace {

// n_embd 128 so that the block recipe's 128-wide blocks fit.
const char* kRun =
    "model: {n_layer: 2, n_head: 4, n_embd: 128, seq_len: 32, vocab_size: 32}\n"
    "data: {synthetic: {vocab: 32, order: 2, branching: 2, tokens: 200000, seed: 3}}\n"
    "training: {steps: 100, batch_tokens: 256, micro_batch: 8, eval_every: 0, eval_batches: 8}\n"
    "optimizer: {lr: 3.0e-3, weight_decay: 0.0}\n"
    "schedule: {warmup_steps: 10}\n"
    "logging: {every: 1000, numerics_every: 50}\n";

struct Run {
  double val_loss;
  std::vector<nlohmann::json> metrics;
};

Run train_run(const fs::path& dir, const std::string& name, const std::vector<std::string>& overrides,
              const std::vector<std::string>& model = {}) {
  std::vector<std::string> all = {"run.name=" + name, "run.out_dir=" + dir.string()};
  all.insert(all.end(), model.begin(), model.end());
  all.insert(all.end(), overrides.begin(), overrides.end());
  const TrainResult result = train(parse_config(kRun, "precision-test.yaml", all), TrainOptions{});
  return Run{result.final_val_loss, read_metrics(dir / name / "metrics.jsonl")};
}

// The numerics records of a run (logged every logging.numerics_every steps).
std::vector<nlohmann::json> numerics(const Run& run) {
  std::vector<nlohmann::json> out;
  for (const auto& m : run.metrics)
    if (m.contains("numerics")) out.push_back(m["numerics"]);
  return out;
}

}  // namespace

TEST_CASE("every reduced precision ends within 2 percent of fp32", "[precision]") {
  // Llama's K/V width 4 x 32 = 128 fits the block recipe's 128-wide blocks; SwiGLU 256 wide.
  const std::vector<std::string> model =
      GENERATE(std::vector<std::string>{},
               std::vector<std::string>{"model.arch=llama", "model.n_kv_head=4", "model.mlp_hidden=256"});
  CAPTURE(model);
  const fs::path dir = make_temp_dir("precision");
  const double fp32 = train_run(dir, "fp32", {}, model).val_loss;
  REQUIRE(std::isfinite(fp32));
  REQUIRE(fp32 < std::log(32.0) * 0.5);  // the reference itself learned

  const std::vector<std::pair<std::string, std::vector<std::string>>> modes = {
      {"bf16", {"precision.mode=bf16"}},
      {"fp16", {"precision.mode=fp16"}},
      {"fp8-delayed", {"precision.mode=fp8", "precision.fp8.recipe=delayed"}},
      {"fp8-current", {"precision.mode=fp8", "precision.fp8.recipe=current"}},
      {"fp8-block", {"precision.mode=fp8", "precision.fp8.recipe=block"}},
      // The block linears' weights as FP8 codes only, cast from the FP32 master.
      {"fp8-current-primary",
       {"precision.mode=fp8", "precision.fp8.recipe=current", "precision.fp8.primary_weights=true"}},
      // The MLP's pre-activation kept for the backward pass as E4M3 codes in 1x128 tiles.
      {"fp8-block-mlp-input-codes",
       {"precision.mode=fp8", "precision.fp8.recipe=block", "precision.fp8.mlp_input_codes=true"}},
  };
  for (const auto& [name, overrides] : modes) {
    const Run run = train_run(dir, name, overrides, model);
    INFO(name << ": val " << run.val_loss << " vs fp32 " << fp32);
    CHECK(std::abs(run.val_loss - fp32) / fp32 < 0.02);
    // The MLP's input went through the FP8 store in the run that asked for it, and only there.
    CHECK((read_file(dir / name / "log.txt").find("the MLP's input is kept for the backward pass as E4M3 codes") !=
           std::string::npos) == (name.find("mlp-input-codes") != std::string::npos));
    const auto records = numerics(run);
    REQUIRE_FALSE(records.empty());
    CHECK(records.back().contains("grad_underflow"));
    if (name.rfind("fp8", 0) == 0) {
      // Telemetry for every FP8 tensor: 2 layers x 4 linears x (input, weight, grad); with the
      // MLP's input kept as FP8 codes, each layer's store too.
      const auto& fp8 = records.back()["fp8"];
      const bool stored = name.find("mlp-input-codes") != std::string::npos;
      REQUIRE(fp8.size() == (stored ? 26u : 24u));
      if (stored)
        for (const int l : {0, 1})
          CHECK(fp8[24 + l]["tensor"] == "h" + std::to_string(l) + (model.empty() ? ".fc" : ".gate_up") + ".output");
      int moved_scales = 0;
      for (const auto& t : fp8) {
        CHECK(t["amax"].get<double>() > 0);
        CHECK(t["underflow"].get<double>() < 0.5);
        CHECK(t["saturated"].get<double>() < 0.01);
        if (!t["scale"].is_null() && t["scale"].get<double>() != 1.0) ++moved_scales;
      }
      // Per-tensor recipes report the scale they used, and it has moved off its initial 1.
      if (name.rfind("fp8-block", 0) != 0) CHECK(moved_scales == 24);
    }
    if (name == "fp16") CHECK(run.metrics.front()["loss_scale"].get<double>() == 65536.0);
  }
  fs::remove_all(dir);
}

TEST_CASE("fp16 without loss scaling loses a tiny learning signal that dynamic scaling keeps", "[precision]") {
  // training.loss_weight 1e-6 shrinks every gradient below fp16's smallest subnormal (6e-8).
  const fs::path dir = make_temp_dir("lossscale");
  const std::vector<std::string> tiny = {"training.loss_weight=1e-6"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), tiny.begin(), tiny.end());
    return extra;
  };
  const Run fp32 = train_run(dir, "fp32", with({}));
  const Run unscaled = train_run(dir, "off", with({"precision.mode=fp16", "precision.loss_scaling.mode=off"}));
  const Run scaled = train_run(dir, "dynamic", with({"precision.mode=fp16", "precision.loss_scaling.mode=dynamic"}));
  INFO("fp32 " << fp32.val_loss << ", fp16 unscaled " << unscaled.val_loss << ", fp16 dynamic " << scaled.val_loss);

  const double unscaled_underflow = numerics(unscaled).back()["grad_underflow"].get<double>();
  const double scaled_underflow = numerics(scaled).back()["grad_underflow"].get<double>();
  CHECK(unscaled_underflow > 0.5);
  CHECK(scaled_underflow < 0.1);
  CHECK(unscaled.val_loss > fp32.val_loss * 1.5);
  CHECK(std::abs(scaled.val_loss - fp32.val_loss) / fp32.val_loss < 0.02);
  fs::remove_all(dir);
}

TEST_CASE("block scaling keeps an outlier block from crushing the rest of the tensor", "[precision]") {
  auto backend = make_cpu_backend(0);
  const int rows = 256, cols = 256;
  HostBuffer<float> x({rows, cols}), per_tensor({rows, cols}), blocked({rows, cols});
  fill_normal(x.data, 31);
  for (int r = 0; r < 128; ++r)
    for (int c = 0; c < 128; ++c) x.data[r * cols + c] *= 1e5f;  // one 128x128 block of outliers

  const float scale = current_scale(backend->amax(x.view()), format_max(Format::e4m3));
  const Fp8CastStats tensor_stats = backend->fp8_cast(per_tensor.view(), x.view(), Format::e4m3, scale);
  const Fp8CastStats block_stats = backend->fp8_cast_blocks(blocked.view(), x.view(), Format::e4m3, 128, 128);

  // Error on the ordinary blocks, where a per-tensor scale set by the outliers flushes values.
  auto error_outside_outliers = [&](const std::vector<float>& q) {
    std::vector<double> ref, got;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        if (r >= 128 || c >= 128) {
          ref.push_back(x.data[r * cols + c]);
          got.push_back(q[r * cols + c]);
        }
    return relative_error(got, ref);
  };
  const double tensor_error = error_outside_outliers(per_tensor.data);
  const double block_error = error_outside_outliers(blocked.data);
  INFO("per-tensor " << tensor_error << ", block " << block_error);
  CHECK(block_error < 0.05);               // e4m3 keeps about 3 significant bits
  CHECK(tensor_error > 10 * block_error);  // much larger: about 20x, as measured
  CHECK(tensor_stats.underflow > 10 * block_stats.underflow);
  CHECK(tensor_stats.amax == block_stats.amax);
}

TEST_CASE("reduced-precision tensors hold values of their format", "[precision]") {
  auto backend = make_cpu_backend(0);
  const ModelShape shape{1, 2, 32, 16, 64, 128};
  for (const char* mode : {"bf16", "fp16"}) {
    CAPTURE(mode);
    PrecisionConfig pc;
    pc.mode = *parse_choice<PrecisionMode>(mode);
    const PrecisionPolicy policy = PrecisionPolicy::from_config(pc);
    Transformer model(shape, *backend, DType::f32, 2, 16, policy);
    model.init(5);
    std::vector<int32_t> tokens(32);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7) % 64);
    model.zero_grad();
    model.forward(tokens.data(), tokens.data(), 1.0f / 32);
    model.backward();
    auto off_grid = [&](const Tensor& t) {
      const float* v = t.as<float>();
      int64_t off = 0;
      for (int64_t i = 0; i < t.numel(); ++i) off += round_to_format(v[i], policy.weights, false) != v[i];
      return off;
    };
    CHECK(off_grid(model.params_flat()) == 0);
    // The weight gradients are the FP32 main gradients: nothing rounds them to the narrow format.
    CHECK(off_grid(model.grads_flat()) > model.num_params() / 2);
    // The master weights keep what the low-precision copy rounds away.
    const float* master = model.master_flat().as<float>();
    const float* copy = model.params_flat().as<float>();
    int64_t differ = 0;
    for (int64_t i = 0; i < model.num_params(); ++i) differ += master[i] != copy[i];
    CHECK(differ > model.num_params() / 2);
  }
}
