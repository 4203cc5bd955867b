// A GPU run's memory, planned without a GPU: what the CUDA backend's arena will hold for a
// config on one rank, block by block as the model, the optimizer and the backend allocate them
// (formats stored as the CUDA backend stores them, each block rounded as its arena rounds it),
// and whether that fits the arena a given GPU leaves after its margin (arena_sizing.h). For
// `--dry-run`, so that a user knows before renting a GPU whether a config fits it.
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "config/config.h"
#include "train/run_spec.h"

namespace ptrain {

struct GpuMemoryPlan {
  int64_t parameters = 1;  // the model's, for bytes per parameter
  int64_t params = 0, master = 0, grads = 0, optimizer = 0, activations = 0;
  // FP8 layers' codes: the weights' own (kept through the step, about a byte per parameter; a
  // layer that emulates keeps an FP32 dequantised copy instead) and the operands' (inputs,
  // output gradients and the weights' transposes, mostly shared).
  int64_t fp8_weights = 0, fp8_operands = 0;
  // ZeRO-3 with primary FP8 weights and a bf16 LM head: the codes are counted with the weights
  // (the rank's range and rooms), and fp8_weights holds the layers' scales alone.
  bool fp8_codes_in_weights = false;
  int64_t backend = 0;  // the backend's own blocks: cuBLASLt workspace, the ops' scratch
  bool cudnn_workspace_unknown = false;  // fused attention: cuDNN sizes its workspace on the GPU
  int64_t total() const { return model_state() + activations + fp8_operands + backend; }
  // Weights (with their FP8 codes), master, gradients and optimizer state: what Megatron's and
  // ZeRO's papers count per parameter.
  int64_t model_state() const { return params + master + grads + optimizer + fp8_weights; }
  std::string describe() const;
  // Each class in bytes per model parameter, the model state's sum and the total per rank.
  std::string describe_per_parameter() const;
};

// The plan for one rank of spec's world size under `distributed` (the ZeRO stage, the gradient
// exchange's format), attention taking `attention`.
GpuMemoryPlan plan_gpu_memory(const RunSpec& spec, const DistributedConfig& distributed, AttentionPath attention);

// The attention path a CUDA run would take when no device is here to ask cuDNN: fused for bf16
// or fp16 activations unless model.attention (`want`) is fallback.
AttentionPath expected_gpu_attention(const RunSpec& spec, AttentionRequest want);

// Lines saying whether the plan fits each GPU: the one named (device_total bytes, 0 for none
// here) and the common 80 GB and 141 GB Hopper parts.
std::string describe_gpu_fit(const GpuMemoryPlan& plan, const std::string& device_name, int64_t device_total);

}  // namespace ptrain
