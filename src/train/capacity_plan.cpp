#include "train/capacity_plan.h"

#include <algorithm>

#include "backend/cuda/arena_sizing.h"
#include "core/format.h"
#include "train/gpu_memory_plan.h"

namespace ptrain {

const std::vector<GpuKind>& known_gpus() {
  static const std::vector<GpuKind> gpus = {{"h100-80gb", "an 80 GB H100", int64_t(81559) << 20},
                                            {"h200", "a 141 GB H200", int64_t(143771) << 20}};
  return gpus;
}

int64_t gpu_arena_bytes(int64_t total_bytes) {
  return total_bytes - static_cast<int64_t>(arena_margin_bytes(static_cast<size_t>(total_bytes)));
}

namespace {

constexpr int kMostRanks = 4096;

// spec with micro-batch B on `ranks` ranks, accumulating the batch (a micro-batch past the
// batch's tokens per rank is planned, so that the memory search can see it grow, but never
// named) and recomputation `recompute`.
RunSpec variant(const RunSpec& spec, int64_t batch_tokens, int B, int ranks, Recompute recompute) {
  RunSpec v = spec;
  v.batch.micro_batch = B;
  v.batch.world_size = ranks;
  v.batch.accumulation =
      static_cast<int>(std::max<int64_t>(1, batch_tokens / (int64_t{B} * spec.batch.seq_len * ranks)));
  v.recompute = recompute;
  return v;
}

std::string per_rank(const GpuMemoryPlan& plan, int64_t arena) {
  return format_number("%.2f", static_cast<double>(plan.model_state()) / static_cast<double>(plan.parameters)) +
         " bytes/param without activations, " + format_mib(plan.total()) + " per rank (" +
         std::to_string(static_cast<int>(100.0 * static_cast<double>(plan.total()) / static_cast<double>(arena))) +
         "% of the arena)";
}

}  // namespace

std::string describe_capacity(const RunSpec& spec, const DistributedConfig& distributed, AttentionPath attention,
                              const GpuKind& gpu, bool guard_rollback) {
  const int64_t arena = gpu_arena_bytes(gpu.total_bytes);
  const int T = spec.batch.seq_len, ranks = spec.batch.world_size;
  const int64_t batch_tokens = spec.batch.tokens_per_micro_batch() * ranks * spec.batch.accumulation;
  const auto plan = [&](const RunSpec& v, int zero_stage) {
    DistributedConfig d = distributed;
    d.zero_stage = zero_stage;
    return plan_gpu_memory(v, d, attention);
  };
  std::string text = "fit on " + gpu.name + " (arena at most " + format_mib(arena) + "), T " + std::to_string(T) +
                     ", training.batch_tokens " + format_thousands(static_cast<double>(batch_tokens)) + ":\n";

  // Only settings whose micro-batches share the batch evenly, as the run requires, and whose
  // tokens FP8's GEMMs take (the config refuses others).
  int fp8_multiple = 1;
  for (const PrecisionSchedule::Phase& phase : spec.precision.phases)
    if (phase.policy.fp8.enabled) fp8_multiple = std::max(fp8_multiple, fp8_dimension_multiple(phase.policy.fp8.recipe));
  const auto shares = [&](int B, int d) {
    return batch_tokens % (int64_t{B} * T * d) == 0 && int64_t{B} * T % fp8_multiple == 0;
  };
  // The micro-batch: at most the batch's tokens per rank; the memory grows with it (among the
  // micro-batches a run takes: one it refuses may be planned otherwise, e.g. FP8 emulated).
  const int most = static_cast<int>(std::max<int64_t>(1, batch_tokens / (int64_t{T} * ranks)));
  int largest = 0, smallest = 0;
  GpuMemoryPlan at_largest, at_smallest;
  for (int B = 1; B <= most; ++B) {
    if (!shares(B, ranks)) continue;
    const GpuMemoryPlan p = plan(variant(spec, batch_tokens, B, ranks, spec.recompute), distributed.zero_stage);
    if (smallest == 0) {
      smallest = B;
      at_smallest = p;
    }
    if (p.total() > arena) break;
    largest = B;
    at_largest = p;
  }
  const std::string setting = std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks") + ", ZeRO-" +
                              std::to_string(distributed.zero_stage) + ", recompute " + choice_name(spec.recompute);
  text += "  the largest micro-batch on " + setting + ": ";
  if (largest > 0)
    text += std::to_string(largest) + " of at most " + std::to_string(most) + ", " + per_rank(at_largest, arena) + "\n";
  else  // the run's own micro-batch is one a run takes: there is a smallest
    text += "none fits (micro-batch " + std::to_string(smallest) + ", the smallest a run takes, takes " +
            format_mib(at_smallest.total()) + ")\n";

  // The ranks: ZeRO-1 divides the optimizer state and master weights among them, ZeRO-2 the
  // FP32 gradients too, ZeRO-3 the weights as well; ZeRO-0 keeps all of it on each rank, so more
  // ranks do not make it fit.
  const int B = spec.batch.micro_batch;
  text += "  the fewest ranks at micro-batch " + std::to_string(B) + " that share training.batch_tokens evenly:\n";
  // ZeRO-3 does not run a precision schedule (the config refuses it).
  const bool schedule = spec.precision.phases.size() > 1;
  // The MLP's input as FP8 codes goes with recompute none only: the other settings plan the run
  // without it, and say so.
  const bool mlp_codes = spec.precision.phases.front().policy.fp8.mlp_input_codes;
  for (const Recompute recompute : {Recompute::none, Recompute::mlp, Recompute::block})
    for (const int zero_stage : {0, 1, 2, 3}) {
      std::string found = zero_stage == 3 && schedule ? "not with a precision.schedule (not implemented)"
                          : zero_stage >= 1 && guard_rollback
                              ? "not with training.guard.action rollback (not implemented)"
                              : "";
      for (int d = 1; d <= (zero_stage == 0 ? 1 : kMostRanks) && found.empty(); ++d) {
        if (!shares(B, d)) continue;
        const GpuMemoryPlan p = plan(variant(spec, batch_tokens, B, d, recompute), zero_stage);
        if (p.total() <= arena) found = std::to_string(d) + (d == 1 ? " rank: " : " ranks: ") + per_rank(p, arena);
      }
      if (found.empty())
        found = zero_stage == 0 ? "does not fit at any rank count (every rank keeps the whole model state)"
                                : "does not fit on up to " + std::to_string(kMostRanks) + " ranks that share the batch";
      if (mlp_codes && recompute != Recompute::none)
        found += " (without precision.fp8.mlp_input_codes, which needs recompute none)";
      std::string name = std::string(choice_name(recompute)) + ",";
      name.resize(7, ' ');
      text += "    recompute " + name + "ZeRO-" + std::to_string(zero_stage) + ": " + found + "\n";
    }
  return text;
}

}  // namespace ptrain
