// Whole training on the GPU against the CPU backend: one micro-batch's gradients tensor by
// tensor, 10 steps of a small model per precision mode through the real binary, two GPU runs
// with the same seed giving identical losses, and runs replaying CUDA graphs giving the losses
// of runs without. Skipped without a CUDA device.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "model/transformer.h"
#include "precision/policy.h"
#include "test_util.h"

namespace ptrain::test {
namespace {

namespace fs = std::filesystem;

const char* kModes[] = {"fp32", "bf16", "fp16", "fp8"};

double mode_tolerance(const std::string& mode) { return mode == "fp32" ? 1e-4 : mode == "fp16" ? 5e-3 : 2e-2; }
// Per-tensor gradients may differ by 3x the mode's loss tolerance (summation orders compound
// through the layers), no more: a gradient missing 20% of its norm is off by 0.2, over 3x the
// widest (6e-2 for bf16). FP8 is checked differently (below).
double gradient_tolerance(const std::string& mode) { return 3 * mode_tolerance(mode); }

// FP8 gradients cannot agree that closely between two correct implementations: a bf16 input one
// ulp apart crosses an E5M2 rounding boundary for a few percent of elements, each a 25% step,
// and that compounds through the layers. On the simulated device the GPU's FP8 gradients were as
// far from the CPU's (0.01 to 0.34 per tensor) as the CPU's own FP8 gradients are from its bf16
// ones, with norms within 3%. So FP8 must stay within 1.5x the CPU's FP8-vs-bf16 distance, and
// its norm within 6%: a gradient missing 20% of its norm fails the second.
void expect_fp8_gradient(const std::vector<float>& gpu, const std::vector<float>& cpu_fp8,
                         const std::vector<float>& cpu_bf16) {
  const double noise = relative_error(cpu_fp8, cpu_bf16), err = relative_error(gpu, cpu_fp8);
  double norm_gpu = 0, norm_cpu = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    norm_gpu += double(gpu[i]) * gpu[i];
    norm_cpu += double(cpu_fp8[i]) * cpu_fp8[i];
  }
  const double ratio = std::sqrt(norm_gpu / norm_cpu);
  INFO("FP8: GPU vs CPU " << err << ", CPU FP8 vs bf16 " << noise << ", norm ratio " << ratio);
  CHECK(err <= std::max(gradient_tolerance("fp8"), 1.5 * noise));
  CHECK(std::fabs(ratio - 1.0) <= 0.06);
}

PrecisionPolicy policy_for(const std::string& mode) {
  PrecisionConfig c;
  c.mode = *parse_choice<PrecisionMode>(mode);
  return PrecisionPolicy::from_config(c);
}

// The fused (cuDNN) attention path must be what runs for this shape, or its test tests nothing.
void require_fused_attention(Backend& gpu, const PrecisionPolicy& policy, const ModelShape& shape, int B, int T) {
  REQUIRE(gpu.choose_attention(AttentionRequest::cudnn, gpu.storage_for(policy.activations, DType::f32), B, T, shape.n_head,
                               shape.kv_heads(), shape.head_size())
              .path == AttentionPath::fused);
}

TEST_CASE("gpu: one micro-batch gives the CPU backend's gradients tensor by tensor", "[gpu][train]") {
  const ModelShape gpt2{/*n_layer=*/2, /*n_head=*/4, /*n_embd=*/128, /*max_seq_len=*/64, /*vocab=*/256,
                      /*padded_vocab=*/256};
  // Llama with 4 query heads over 2 K/V heads (cuDNN's grouped graph on the fused path), with
  // QK-norm, and multi-head.
  const ModelShape shape =
      GENERATE_COPY(values<ModelShape>({gpt2, llama_shape(gpt2, 2, 256), llama_shape(gpt2, 4, 256),
                                      with_qk_norm(llama_shape(gpt2, 2, 256))}));
  INFO(choice_name(shape.arch) << " with " << shape.kv_heads() << " K/V heads" << (shape.qk_norm ? ", QK-norm" : ""));
  const int B = 4, T = 64;
  std::vector<int32_t> inputs(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) {
    inputs[i] = (i * 37 + 11) % shape.vocab;
    targets[i] = (i * 53 + 7) % shape.vocab;
  }
  for (const char* mode : kModes)
    for (const AttentionPath path : {AttentionPath::fallback, AttentionPath::fused}) {
    if (path == AttentionPath::fused && std::string(mode) == "fp32") continue;  // cuDNN's is bf16/fp16 only
    INFO("mode " << mode << (path == AttentionPath::fused ? ", fused attention" : ", fallback attention"));
    const PrecisionPolicy policy = policy_for(mode);
    auto cpu = make_cpu_backend(0);
    auto gpu = make_cuda_backend(0);
    if (path == AttentionPath::fused) require_fused_attention(*gpu, policy, shape, B, T);
    Transformer on_cpu(shape, *cpu, DType::f32, B, T, policy), on_gpu(shape, *gpu, DType::f32, B, T, policy, path);
    const bool fp8 = std::string(mode) == "fp8";
    Transformer on_cpu_bf16(shape, *cpu, DType::f32, B, T, policy_for("bf16"));  // FP8's own noise, measured
    if (fp8) {
      on_cpu_bf16.init(7);
      on_cpu_bf16.zero_grad();
      on_cpu_bf16.forward(inputs.data(), targets.data(), 1.0f / (B * T));
      on_cpu_bf16.backward();
    }
    if (std::string(mode) == "fp8") CHECK(on_gpu.fp8_gemm_summary().rfind("8 of 8 ", 0) == 0);  // native FP8 GEMMs
    on_cpu.init(7);
    on_gpu.init(7);
    on_cpu.zero_grad();
    on_gpu.zero_grad();
    const double loss_cpu = on_cpu.forward(inputs.data(), targets.data(), 1.0f / (B * T));
    const double loss_gpu = on_gpu.forward(inputs.data(), targets.data(), 1.0f / (B * T));
    CHECK(std::fabs(loss_gpu - loss_cpu) <= mode_tolerance(mode) * std::fabs(loss_cpu));
    on_cpu.backward();
    on_gpu.backward();
    for (const ParamSpec& spec : on_cpu.specs()) {
      const ParamId id = spec.id;
      INFO("gradient of " << spec.name);
      std::vector<float> g_cpu(on_cpu.grad(id).numel()), g_gpu(g_cpu.size());
      cpu->download(g_cpu.data(), on_cpu.grad(id));
      gpu->download(g_gpu.data(), on_gpu.grad(id));
      if (fp8) {
        std::vector<float> g_bf16(g_cpu.size());
        cpu->download(g_bf16.data(), on_cpu_bf16.grad(id));
        expect_fp8_gradient(g_gpu, g_cpu, g_bf16);
      } else {
        CHECK(relative_error(g_gpu, g_cpu) <= gradient_tolerance(mode));
      }
    }
    }
}

// precision.fp8.mlp_input_codes: the MLP's pre-activation stored as FP8 codes and read back for
// the activation, forward and backward, with the down projection's input made again from them
// before its backward pass. The GPU's store and kernels against the CPU's emulated store.
TEST_CASE("gpu: with the MLP's input stored as FP8 codes, one micro-batch gives the CPU backend's gradients",
          "[gpu][train]") {
  const ModelShape gpt2{/*n_layer=*/2, /*n_head=*/4, /*n_embd=*/128, /*max_seq_len=*/64, /*vocab=*/256,
                        /*padded_vocab=*/256};
  const ModelShape shape = GENERATE_COPY(values<ModelShape>({gpt2, llama_shape(gpt2, 2, 256)}));
  INFO(choice_name(shape.arch));
  const int B = 4, T = 64;
  std::vector<int32_t> inputs(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) {
    inputs[i] = (i * 37 + 11) % shape.vocab;
    targets[i] = (i * 53 + 7) % shape.vocab;
  }
  PrecisionConfig config;
  config.mode = PrecisionMode::fp8;
  config.fp8.mlp_input_codes = true;
  const PrecisionPolicy policy = PrecisionPolicy::from_config(config);
  auto cpu = make_cpu_backend(0);
  auto gpu = make_cuda_backend(0);
  const auto made = [&](Backend& be, const PrecisionPolicy& p) {
    return std::make_unique<Transformer>(shape, be, DType::f32, B, T, p, AttentionPath::fallback, true,
                                         Recompute::none, MasterRange{}, /*fp8_throughout=*/true);
  };
  auto on_cpu = made(*cpu, policy), on_gpu = made(*gpu, policy);
  auto on_cpu_bf16 = std::make_unique<Transformer>(shape, *cpu, DType::f32, B, T, policy_for("bf16"));
  CHECK(on_gpu->fp8_gemm_summary().rfind("8 of 8 ", 0) == 0);
  for (Transformer* m : {on_cpu.get(), on_gpu.get(), on_cpu_bf16.get()}) {
    m->init(7);
    m->zero_grad();
  }
  const double loss_cpu = on_cpu->forward(inputs.data(), targets.data(), 1.0f / (B * T));
  const double loss_gpu = on_gpu->forward(inputs.data(), targets.data(), 1.0f / (B * T));
  on_cpu_bf16->forward(inputs.data(), targets.data(), 1.0f / (B * T));
  CHECK(std::fabs(loss_gpu - loss_cpu) <= mode_tolerance("fp8") * std::fabs(loss_cpu));
  for (Transformer* m : {on_cpu.get(), on_gpu.get(), on_cpu_bf16.get()}) m->backward();
  for (const ParamSpec& spec : on_cpu->specs()) {
    INFO("gradient of " << spec.name);
    std::vector<float> g_cpu(on_cpu->grad(spec.id).numel()), g_gpu(g_cpu.size()), g_bf16(g_cpu.size());
    cpu->download(g_cpu.data(), on_cpu->grad(spec.id));
    gpu->download(g_gpu.data(), on_gpu->grad(spec.id));
    cpu->download(g_bf16.data(), on_cpu_bf16->grad(spec.id));
    expect_fp8_gradient(g_gpu, g_cpu, g_bf16);
  }
}

// Two micro-batches a step; on the simulated device (kernels under the SIMT emulator) of half
// the tokens.
#ifdef PTRAIN_SIM_DEVICE
constexpr const char* kBatch = "batch_tokens: 512, micro_batch: 4";
#else
constexpr const char* kBatch = "batch_tokens: 1024, micro_batch: 8";
#endif

// A small synthetic run through the real binary (two micro-batches a step); returns its
// per-step training losses. `mode` is precision.mode, or fp8:RECIPE; `training_extra` more
// training keys (", key: value"), `model_extra` more model keys; *output receives what the run
// printed.
std::vector<double> train_losses(const fs::path& dir, const std::string& name, const std::string& device,
                                 const std::string& mode, const std::string& training_extra = "",
                                 std::string* output = nullptr, const std::string& model_extra = "",
                                 int steps = 10) {
  // fp8:RECIPE+primary: with precision.fp8.primary_weights (the only suffix these runs take).
  const size_t colon = mode.find(':'), plus = mode.find('+');
  REQUIRE((plus == std::string::npos || mode.substr(plus) == "+primary"));
  const std::string primary = plus != std::string::npos ? ", primary_weights: true" : "";
  // fp16's loss scale starts at 1024, which cannot overflow these gradients: at 65536 a step could
  // overflow on one backend and not on the other, and the runs would part there.
  const std::string precision =
      colon != std::string::npos ? "{mode: " + mode.substr(0, colon) + ", fp8: {recipe: " +
                                       mode.substr(colon + 1, plus - colon - 1) + primary + "}}"
      : mode == "fp16"           ? "{mode: fp16, loss_scaling: {init: 1024}}"
                                 : "{mode: " + mode + "}";
  const std::string config =
      "run: {name: " + name + ", out_dir: runs, seed: 3, device: " + device + "}\n"
      "model: {n_layer: 2, n_head: 4, n_embd: 128, seq_len: 64, vocab_size: 256" + model_extra + "}\n"
      "data: {synthetic: {vocab: 256, order: 2, branching: 4, tokens: 200000, seed: 5}}\n"
      "training: {steps: " + std::to_string(steps) + ", " + std::string(kBatch) + ", eval_every: 0, eval_batches: 2" + training_extra +
      "}\n"
      "optimizer: {lr: 3.0e-3}\n"
      "schedule: {warmup_steps: 0}\n"  // full lr from the first step, so the 10 losses move
      "precision: " + precision + "\n"
      "checkpoint: {save_final: false}\n";
  write_file(dir / (name + ".yaml"), config);
  const CommandResult r = run_ptrain("train " + name + ".yaml", dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  if (output) *output = r.output;
  std::vector<double> losses;
  for (const auto& m : read_metrics(dir / "runs" / name / "metrics.jsonl"))
    if (m.contains("loss") && m.contains("step")) losses.push_back(m["loss"].get<double>());
  REQUIRE(losses.size() == static_cast<size_t>(steps));
  return losses;
}

TEST_CASE("gpu: KV-cache decoding gives the logits of the CPU's whole forward pass", "[gpu][sample]") {
  const ModelShape gpt2{/*n_layer=*/2, /*n_head=*/4, /*n_embd=*/64, /*max_seq_len=*/32, /*vocab=*/100,
                      /*padded_vocab=*/128};
  // Llama: each decoded row turned by RoPE at its own position, over grouped K/V heads (the
  // prompt's forward pass on cuDNN's grouped graph when fused).
  const ModelShape shape = GENERATE_COPY(values<ModelShape>({gpt2, llama_shape(gpt2, 2, 128)}));
  const int B = 2, T = 32, prompt = 5;
  std::vector<int32_t> tokens(T);
  for (int i = 0; i < T; ++i) tokens[i] = (i * 37 + 11) % shape.vocab;
  for (const char* mode : {"fp32", "bf16"})
    for (const AttentionPath path : {AttentionPath::fallback, AttentionPath::fused}) {
      if (path == AttentionPath::fused && std::string(mode) == "fp32") continue;
      INFO(choice_name(shape.arch) << " mode " << mode << (path == AttentionPath::fused ? ", fused attention" : ", fallback attention"));
      const PrecisionPolicy policy = policy_for(mode);
      auto cpu = make_cpu_backend(0);
      auto gpu = make_cuda_backend(0);
      if (path == AttentionPath::fused) require_fused_attention(*gpu, policy, shape, B, T);
      Transformer on_cpu(shape, *cpu, DType::f32, B, T, policy), on_gpu(shape, *gpu, DType::f32, B, T, policy, path);
      on_cpu.init(9, 0.2);
      on_gpu.init(9, 0.2);
      std::vector<float> got = on_gpu.start_decoding(tokens.data(), prompt);
      for (int length = prompt; length <= T; ++length) {
        INFO("position " << length - 1);
        CHECK(relative_error(got, on_cpu.start_decoding(tokens.data(), length)) <= mode_tolerance(mode));
        if (length < T) got = on_gpu.decode_next(tokens[static_cast<size_t>(length)]);
      }
      CHECK(on_gpu.decoded_length() == T);
    }
}

// Tagged [cpu_training]: it trains on the CPU backend too, so CI runs it again under the second
// numerics (tests/CMakeLists.txt).
TEST_CASE("gpu: 10 training steps per precision mode follow the CPU backend", "[gpu][train][cpu_training]") {
  const fs::path dir = make_temp_dir("gpu-train");
  // GPT-2 in every mode (block scaling also with primary FP8 weights); Llama (4 query heads over
  // 2 K/V heads) in bf16 and FP8.
  const std::string llama = ", arch: llama, n_kv_head: 2, mlp_hidden: 256";
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"fp32", ""},          {"bf16", ""},   {"fp16", ""},        {"fp8:delayed", ""}, {"fp8:current", ""},
      {"fp8:block", ""},     {"bf16", llama}, {"fp8:current", llama}, {"fp8:block+primary", ""}};
  for (const auto& [mode, model] : runs) {
    INFO("mode " << mode << (model.empty() ? ", gpt2" : ", llama"));
    std::string tag = mode + (model.empty() ? "" : "-llama");  // a run name: no ':'
    std::replace(tag.begin(), tag.end(), ':', '-');
    std::replace(tag.begin(), tag.end(), '+', '-');
    const auto cpu = train_losses(dir, "cpu-" + tag, "cpu", mode, "", nullptr, model);
    const auto gpu = train_losses(dir, "gpu-" + tag, "cuda", mode, "", nullptr, model);
    for (size_t s = 0; s < cpu.size(); ++s) {
      INFO("step " << s + 1 << ": cpu " << cpu[s] << " gpu " << gpu[s]);
      CHECK(std::fabs(gpu[s] - cpu[s]) <= mode_tolerance(mode) * std::fabs(cpu[s]));
    }
    // The CPU's loss falls by far more than the tolerance (else the comparison proves nothing),
    // and so does the GPU's.
    CHECK(cpu.front() - cpu.back() > 4 * mode_tolerance(mode) * cpu.front());
    CHECK(gpu.front() - gpu.back() > 4 * mode_tolerance(mode) * gpu.front());
  }
  fs::remove_all(dir);
}

// Runs compared with each other for equality, not with the CPU: a few steps, each one's loss
// depending on every step before it, show a difference as well as ten would.
constexpr int kEqualitySteps = 5;

// training.recompute: block runs each block's forward pass again before its backward pass, and
// its FP8 layers then cast their inputs again into codes the blocks share (one set per linear of
// a block, not one per layer); recompute: mlp does so for the MLP's two linears (the second
// casts its recomputed input without its GEMM). The losses of both are those of the run that
// kept everything.
TEST_CASE("gpu: two runs with the same seed give identical losses, and so do recomputed blocks and MLPs with shared "
          "FP8 inputs",
          "[gpu][train]") {
  const fs::path dir = make_temp_dir("gpu-determinism");
  for (const std::string mode : {"bf16", "fp8", "fp8:block"}) {  // fp8: the default (delayed) recipe
    INFO("mode " << mode);
    std::string tag = mode;
    std::replace(tag.begin(), tag.end(), ':', '-');
    std::string recomputed_log;
    const auto first = train_losses(dir, "a-" + tag, "cuda", mode, "", nullptr, "", kEqualitySteps);
    CHECK(first == train_losses(dir, "b-" + tag, "cuda", mode, "", nullptr, "", kEqualitySteps));
    for (const std::string recompute : {"block", "mlp"}) {
      INFO("recompute " << recompute);
      CHECK(first == train_losses(dir, "recomputed-" + recompute + "-" + tag, "cuda", mode, ", recompute: " + recompute,
                                  &recomputed_log, "", kEqualitySteps));
      if (mode != "bf16")  // the shared codes are the native GEMMs'
        CHECK(recomputed_log.find("fp8: 8 of 8 FP8 linear layers run native FP8 GEMMs") != std::string::npos);
    }
  }
  // Llama with grouped K/V heads on cuDNN's attention: its K/V gradient group sums must be
  // reproducible too.
  const std::string llama = ", arch: llama, n_kv_head: 2, mlp_hidden: 256, attention: cudnn";
  CHECK(train_losses(dir, "a-llama", "cuda", "bf16", "", nullptr, llama, kEqualitySteps) ==
        train_losses(dir, "b-llama", "cuda", "bf16", "", nullptr, llama, kEqualitySteps));
  fs::remove_all(dir);
}

TEST_CASE("gpu: micro-batches replayed as CUDA graphs train exactly as ops run one by one", "[gpu][train]") {
  const fs::path dir = make_temp_dir("gpu-graphs");
  for (const std::string mode : {"fp32", "bf16", "fp16", "fp8:current", "fp8:block"}) {
    INFO("mode " << mode);
    std::string tag = mode;
    std::replace(tag.begin(), tag.end(), ':', '-');
    std::string log;
    const auto replayed = train_losses(dir, "graph-" + tag, "cuda", mode, ", cuda_graph: true", &log, "", kEqualitySteps);
    INFO(log);
    CHECK(replayed == train_losses(dir, "eager-" + tag, "cuda", mode, "", nullptr, "", kEqualitySteps));
    // A layer cuBLASLt has no block-scaled GEMMs for emulates, and emulated layers are not
    // recorded: then only the losses are compared.
    if (log.find("the others emulate") != std::string::npos) continue;
    CHECK(log.find("replayed as one CUDA graph") != std::string::npos);  // recording was on,
    CHECK(log.find("run as called") == std::string::npos);               // never failed,
    // and the steps' 2 micro-batches each replayed all but each kind's first (run as called): one
    // kind, or two with FP8 (the first micro-batch of a step casts the weights). fp16's loss
    // scale may move, and each new scale makes a new kind.
    const int kinds = mode.rfind("fp8", 0) == 0 ? 2 : 1;
    if (mode == "fp16")
      CHECK(log.find("cuda graph: 0 of") == std::string::npos);
    else
      CHECK(log.find("cuda graph: " + std::to_string(2 * kEqualitySteps - kinds) + " of " +
                     std::to_string(2 * kEqualitySteps) + " micro-batches replayed") != std::string::npos);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ptrain::test
