// Which format each class of tensor uses under a precision mode (README, "Precision"), which
// layers run their GEMMs in FP8 and how they are scaled, and how the loss is scaled. The model
// and trainer ask the policy instead of testing mode strings.
//
// | mode | master | weights | activations | activation grads | FP8 GEMMs            |
// | fp32 | fp32   | fp32    | fp32        | fp32             | -                    |
// | bf16 | fp32   | bf16    | bf16        | bf16             | -                    |
// | fp16 | fp32   | fp16    | fp16        | fp16             | -                    |
// | fp8  | fp32   | bf16    | bf16        | bf16             | the 4 block linears  |
// Parameter gradients (the main gradients), layernorm statistics, softmax/cross-entropy,
// reductions, accumulation and AdamW state stay FP32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "precision/formats.h"
#include "precision/fp8_scaling.h"
#include "precision/loss_scaler.h"

namespace ptrain {

struct Fp8Policy {
  bool enabled = false;
  Fp8Recipe recipe = Fp8Recipe::delayed;
  Format forward = Format::e4m3;   // inputs and weights
  Format backward = Format::e5m2;  // output gradients (hybrid); e4m3 with format: e4m3
  int margin = 0;
  int amax_history = 16;
  AmaxAlgo amax_algo = AmaxAlgo::max;
  bool bf16_first_last = false;  // keep the first and last block's linears in bf16
  bool bf16_lm_head = true;      // keep the LM head in bf16
  bool primary_weights = false;  // the block linears' weights as FP8 codes only (Transformer)
  bool mlp_input_codes = false;  // the MLP's pre-activation kept as FP8 codes (keeps_mlp_input_codes)
  int block = 128;               // block recipe: 1 x block tiles, block x block weight blocks
};

struct PrecisionPolicy {
  PrecisionMode mode = PrecisionMode::fp32;
  Format weights = Format::fp32;      // the copy the GEMMs read
  Format activations = Format::fp32;
  Format activation_grads = Format::fp32;  // the backward pass's activations; parameter gradients are FP32
  Fp8Policy fp8;
  // Mode resolved from the config's "auto": dynamic for fp16, off otherwise.
  LossScalingConfig loss_scaling = [] {
    LossScalingConfig off;
    off.mode = LossScalingMode::off;
    return off;
  }();

  // With precision.schedule, the first phase's policy (PrecisionSchedule has them all).
  static PrecisionPolicy from_config(const PrecisionConfig& config);

  // FP32 master weights are kept apart from the weights the GEMMs read.
  bool has_master_weights() const { return weights != Format::fp32; }
  // Whether block `layer` of `n_layer` runs its linears in FP8.
  bool fp8_block(int layer, int n_layer) const {
    return fp8.enabled && !(fp8.bf16_first_last && (layer == 0 || layer == n_layer - 1));
  }
  // "fp8:delayed", "fp8:current+primary" (primary FP8 weights), "fp8:block+codes" (the MLP's
  // input as FP8 codes), "bf16", ... for logs and checkpoints.
  std::string label() const;
};

// Every label() a policy can have: what a checkpoint's state.json may name.
std::vector<std::string> precision_labels();

// precision.schedule resolved against training.steps: phase i runs steps (last_step of phase
// i - 1, last_step of phase i] under its policy. Without a schedule, one phase: the mode.
struct PrecisionSchedule {
  struct Phase {
    PrecisionPolicy policy;
    int64_t last_step;
  };
  std::vector<Phase> phases;

  static PrecisionSchedule from_config(const PrecisionConfig& config, int64_t steps);
  // The phase that trains step `step` (1-based; past the end: the last).
  size_t phase_at(int64_t step) const;
  bool scheduled() const { return phases.size() > 1; }
  // For logs, reports and run names: the one policy's label, or the phases' labels joined by
  // ">" and the steps they end after, e.g. "fp8:current>bf16@450".
  std::string label() const;
  // "fp8:current for steps 1-450, then bf16 for steps 451-500".
  std::string describe() const;
};

}  // namespace ptrain
