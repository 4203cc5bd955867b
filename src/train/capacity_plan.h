// `ptrain train CONFIG --dry-run --fit GPU`: what a config needs to fit one kind of GPU,
// answered from the GPU memory plan (gpu_memory_plan.h) of the config's variants: the largest
// micro-batch that fits the planned ranks, and for each recompute setting and ZeRO stage the
// fewest data-parallel ranks that fit, each with its bytes per parameter per rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "train/run_spec.h"

namespace ptrain {

struct GpuKind {
  std::string key;   // what --fit takes
  std::string name;  // as the plan prints it
  int64_t total_bytes = 0;  // nvidia-smi's memory total
};
// The GPUs the plan knows: h100-80gb (80 GB H100) and h200 (141 GB H200).
const std::vector<GpuKind>& known_gpus();
// The arena a GPU of `total_bytes` leaves (its total less the backend's margin).
int64_t gpu_arena_bytes(int64_t total_bytes);

// The planner's answer for `gpu`, in lines: spec and distributed as configured (spec's world
// size is the planned ranks), attention taking `attention`; `guard_rollback`:
// training.guard.action is rollback, which runs at ZeRO-0 only. The ranks tried go up to 4096.
std::string describe_capacity(const RunSpec& spec, const DistributedConfig& distributed, AttentionPath attention,
                              const GpuKind& gpu, bool guard_rollback);

}  // namespace ptrain
