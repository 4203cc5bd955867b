// A run's config resolved once into the types the rest of ptrain takes: the model's shape, the
// batch geometry, the precision phases with the guard's fallback, the learning-rate schedule,
// AdamW's settings and the training FLOPs of a token. The run plan resolves it; the trainer, the
// memory plans and the reports read it, and none of them turns a config section into a policy
// again.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "model/param_layout.h"
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "precision/policy.h"

namespace ptrain {

struct BatchGeometry {
  int micro_batch = 1;   // B: sequences per micro-batch
  int seq_len = 1;       // T: training.seq_len, else the model's context
  int world_size = 1;    // data-parallel ranks
  int accumulation = 1;  // micro-batches per rank per step
  int64_t tokens_per_micro_batch() const { return int64_t{micro_batch} * seq_len; }
};

struct RunSpec {
  ModelShape shape;
  BatchGeometry batch;
  PrecisionSchedule precision;  // the phases over training.steps (one without precision.schedule)
  PrecisionPolicy fallback;     // training.guard.action rollback's: bf16 with the run's other settings
  Recompute recompute = Recompute::none;
  // Every block's linears run FP8 in every phase, and no guard rollback falls back to bf16: the
  // model keeps their inputs as FP8 codes only (model_activation_bytes).
  bool fp8_throughout = false;
  LrSchedule lr;
  AdamWConfig adamw;
  double flops_per_token = 0;  // 6N + 6LCT
};

// `config` for `world_size` ranks; training.batch_tokens must be a multiple of micro_batch x
// seq_len x world_size (the run plan checks it first, naming the keys).
RunSpec resolve_run(const Config& config, int world_size);

// The precision phases alone (compare's and bench's labels of a config).
PrecisionSchedule resolve_precision(const Config& config);

// Training FLOPs per token, as llm.c and PaLM count them: 6N for the weights plus the attention
// score and value matmuls, 6 * L * C * T.
double training_flops_per_token(const ModelShape& shape, int seq_len);

}  // namespace ptrain
