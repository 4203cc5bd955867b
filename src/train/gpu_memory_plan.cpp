#include "train/gpu_memory_plan.h"

#include <algorithm>
#include <cstdio>

#include "backend/cuda/arena_sizing.h"
#include "metrics/run_log.h"
#include "model/gpt.h"
#include "precision/policy.h"

namespace ptrain {
namespace {

// Backend::storage_for of the CUDA backend: bf16 and fp16 in their own 2 bytes, the rest as f32.
DType cuda_storage(Format f) { return f == Format::bf16 ? DType::bf16 : f == Format::fp16 ? DType::f16 : DType::f32; }

// The arena's block for `bytes` (none for none).
int64_t block(int64_t bytes) { return bytes > 0 ? static_cast<int64_t>(arena_block_bytes(static_cast<size_t>(bytes))) : 0; }
int64_t block_of(int64_t n, Format f) { return block(n * static_cast<int64_t>(dtype_size(cuda_storage(f)))); }

std::string gib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / double(int64_t(1) << 30));
  return text;
}

}  // namespace

GpuMemoryPlan plan_gpu_memory(const Config& config, int world_size, AttentionPath attention) {
  const GptShape s = GptShape::of(config.model);
  const PrecisionPolicy policy = PrecisionPolicy::from_config(config.precision);
  const int B = config.training.micro_batch, T = config.training.effective_seq_len(config.model);
  const int64_t n = gpt_num_params(s);
  GpuMemoryPlan p;
  p.cudnn_workspace_unknown = attention == AttentionPath::fused;
  // Gpt: flat parameters, gradients, FP32 master weights and gradient sums where the formats
  // are narrower, one block of activations, and the FP8 layers' cast copies.
  p.params = block_of(n, policy.weights);
  p.grads = block_of(n, policy.grads);
  if (policy.has_master_weights()) p.master = block_of(n, Format::fp32);
  if (policy.grads != Format::fp32) p.grad_sums = block_of(n, Format::fp32);
  p.activations = block(gpt_activation_bytes(s, B, T, policy.activations, policy.grads, attention, cuda_storage));
  p.fp8 = block(gpt_fp8_buffer_bytes(s, policy, B, T));
  // AdamW: the moments of this rank's shard; with ZeRO-1 also the shard's gradients and FP32
  // master weights (the full master block is released after the shard is taken, but both are
  // held for a moment).
  const bool sharded = config.distributed.zero_stage == 1 && world_size > 1;
  const int64_t shard = sharded ? (n + world_size - 1) / world_size : n;
  p.optimizer = 2 * block_of(shard, Format::fp32);
  if (sharded) {
    p.optimizer += block_of(shard, policy.grads);
    if (policy.has_master_weights()) p.optimizer += block_of(shard, Format::fp32);
  }
  // The backend's own blocks and the trainer's per-micro-batch loss sums.
  const int64_t accumulation = config.training.batch_tokens / (int64_t{B} * T * world_size);
  p.backend = static_cast<int64_t>(kBackendFixedBytes) + block(accumulation * int64_t(sizeof(double)));
  // The ops' scratch, kept between calls (cuda_backend.cu, enum Slot), at its largest:
  const int64_t rows = int64_t{B} * T, C = s.n_embd, act = dtype_size(cuda_storage(policy.activations));
  if (attention == AttentionPath::fused) {
    p.backend += block(rows * 3 * C * act);  // dq, dk, dv before they are added into dqkv
  } else {
    // q, k, v, y and their gradients per head, and the attention matrix's gradient
    p.backend += 7 * block(rows * C * act) + block(int64_t{B} * s.n_head * T * T * act);
  }
  // The layernorm and bias gradients' partial sums (one row per 32 rows of the widest layer).
  p.backend += block((rows + 31) / 32 * 2 * 4 * C * int64_t(sizeof(float)));
  // A parameter-sized FP32 staging copy where the weights are stored narrower (the optimizer's
  // operands converted to FP32).
  if (policy.has_master_weights()) p.backend += block(n * int64_t(sizeof(float)));
  return p;
}

AttentionPath expected_gpu_attention(const Config& config) {
  const PrecisionPolicy policy = PrecisionPolicy::from_config(config.precision);
  const bool half = policy.activations == Format::bf16 || policy.activations == Format::fp16;
  return half && config.model.attention != "fallback" ? AttentionPath::fused : AttentionPath::fallback;
}

std::string GpuMemoryPlan::describe() const {
  std::string text = format_mib(total()) + " = " + format_mib(params) + " params";
  const auto add = [&](int64_t bytes, const char* what) {
    if (bytes > 0) text += " + " + format_mib(bytes) + " " + what;
  };
  add(master, "FP32 master weights");
  add(grads, "grads");
  add(grad_sums, "FP32 gradient sums");
  add(optimizer, "AdamW state");
  add(activations, "activations");
  add(fp8, "FP8 cast copies");
  add(backend, "backend workspace and scratch");
  if (cudnn_workspace_unknown) text += " + cuDNN's attention workspace (known on the GPU: a few MiB on small shapes)";
  return text;
}

std::string describe_gpu_fit(const GpuMemoryPlan& plan, const std::string& device_name, int64_t device_total) {
  struct Gpu {
    std::string name;
    int64_t total;
  };
  // nvidia-smi's memory totals for the 80 GB H100 and the 141 GB H200.
  std::vector<Gpu> gpus = {{"an 80 GB H100", int64_t(81559) << 20}, {"a 141 GB H200", int64_t(143771) << 20}};
  if (device_total > 0) gpus.insert(gpus.begin(), Gpu{device_name, device_total});
  std::string text;
  for (const Gpu& g : gpus) {
    // The arena is what is free at start less the margin; the CUDA context's own share of the
    // free memory (some hundreds of MiB) is known only on the device.
    const int64_t arena = g.total - static_cast<int64_t>(arena_margin_bytes(static_cast<size_t>(g.total)));
    const bool fits = plan.total() <= arena;
    text += "  " + g.name + " (" + gib(g.total) + ", arena at most " + gib(arena) + "): " +
            (fits ? "fits, " + std::to_string(static_cast<int>(100.0 * plan.total() / arena)) + "% of the arena"
                  : "does not fit: " + gib(plan.total() - arena) + " over; lower training.micro_batch") +
            "\n";
  }
  return text;
}

}  // namespace ptrain
