// The commands around training: evaluate, sample from, inspect and export checkpoints.
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"

namespace ptrain {

// `ptrain eval CONFIG --checkpoint DIR`: the val loss of the checkpoint's weights on the
// config's validation batches, and the gap to the oracle loss for synthetic data.
void eval_checkpoint(const Config& config, const std::string& checkpoint);

struct SampleOptions {
  std::string checkpoint;
  std::string prompt;       // bytes for a 256-token vocabulary, else space-separated token ids
  int tokens = 128;         // tokens to generate
  double temperature = 1.0; // 0 = greedy
  int top_k = 0;            // 0 = the whole vocabulary
  uint64_t seed = 1;
};

// `ptrain sample`: generates text (byte vocabulary) or token ids, deterministic for a seed.
void sample(const SampleOptions& options);

// `ptrain inspect PATH`: what a checkpoint directory, a safetensors file or an llm.c model file
// holds, and whether a checkpoint's checksums are valid.
void inspect(const std::string& path);

// `ptrain export --checkpoint DIR --format llmc --out FILE [--dtype fp32|bf16]`.
void export_llmc(const std::string& checkpoint, const std::string& out, const std::string& dtype);

}  // namespace ptrain
