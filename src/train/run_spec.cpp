#include "train/run_spec.h"

#include <algorithm>

#include "core/error.h"

namespace ptrain {

PrecisionSchedule resolve_precision(const Config& config) {
  return PrecisionSchedule::from_config(config.precision, config.training.steps);
}

double training_flops_per_token(const ModelShape& s, int seq_len) {
  double matmul_params = static_cast<double>(param_count(s));
  // An untied input embedding is a lookup, not matmul work. (GPT-2 keeps llm.c's count, wpe and
  // all, so that its figures stay comparable with earlier runs.)
  if (s.arch == Arch::llama && !s.tied_head) matmul_params -= static_cast<double>(s.padded_vocab) * s.n_embd;
  // Attention's scores and weighted sum: n_head * head_size = n_embd wide whatever the K/V heads.
  return 6.0 * matmul_params + 6.0 * s.n_layer * s.n_embd * seq_len;
}

RunSpec resolve_run(const Config& config, int world_size) {
  RunSpec spec;
  spec.shape = ModelShape::of(config.model);
  BatchGeometry& b = spec.batch;
  b.micro_batch = config.training.micro_batch;
  b.seq_len = config.training.effective_seq_len(config.model);
  b.world_size = world_size;
  const int64_t per_step = b.tokens_per_micro_batch() * world_size;
  PTRAIN_CHECK(per_step > 0 && config.training.batch_tokens % per_step == 0,
               "training.batch_tokens is not a whole number of micro-batches on every rank");
  b.accumulation = static_cast<int>(config.training.batch_tokens / per_step);
  spec.precision = resolve_precision(config);
  PrecisionConfig bf16 = config.precision;
  bf16.mode = PrecisionMode::bf16;
  bf16.schedule.clear();
  spec.fallback = PrecisionPolicy::from_config(bf16);
  spec.recompute = config.training.recompute;
  spec.fp8_throughout = config.training.guard.action != GuardAction::rollback &&
                        std::all_of(spec.precision.phases.begin(), spec.precision.phases.end(), [](const auto& phase) {
                          return phase.policy.fp8.enabled && !phase.policy.fp8.bf16_first_last;
                        });
  spec.lr.lr = config.optimizer.lr;
  spec.lr.warmup_steps = config.schedule.warmup_steps;
  spec.lr.total_steps = config.training.steps;
  spec.lr.decay = config.schedule.decay;
  spec.lr.min_lr_ratio = config.schedule.min_lr_ratio;
  spec.lr.wsd_decay_fraction = config.schedule.wsd_decay_fraction;
  spec.adamw = AdamWConfig{config.optimizer.beta1, config.optimizer.beta2, config.optimizer.eps,
                           config.optimizer.weight_decay, config.training.grad_clip};
  spec.flops_per_token = training_flops_per_token(spec.shape, b.seq_len);
  return spec;
}

}  // namespace ptrain
