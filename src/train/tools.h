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
  std::string prompt;       // text, encoded by the checkpoint's tokenizer; token ids when it has none
  int tokens = 128;         // tokens to generate
  double temperature = 1.0; // 0 = greedy
  int top_k = 0;            // 0 = the whole vocabulary
  uint64_t seed = 1;
  std::string vocabulary;   // gpt2: another vocabulary file or directory (data prepare's --vocab)
  bool ignore_end_of_text = false;  // go on past <|endoftext|> instead of stopping there
  bool kv_cache = true;             // false: each token reruns the window (checks and timing)
  bool timing = false;              // the generation's tokens/s on stderr
};

// `ptrain sample`: generates text decoded by the tokenizer the checkpoint's run recorded (token
// ids when none is known), deterministic for a seed, with a KV cache while the sequence fits the
// model's context. Past it the window slides: each token sees the last seq_len tokens (learned
// positions cannot extrapolate) and reruns the window.
void sample(const SampleOptions& options);

// `ptrain inspect PATH`: what a checkpoint directory, a safetensors file or an llm.c model file
// holds, and whether a checkpoint's checksums are valid.
void inspect(const std::string& path);

// `ptrain export --checkpoint DIR --format llmc --out FILE [--dtype fp32|bf16]`.
void export_llmc(const std::string& checkpoint, const std::string& out, const std::string& dtype);

}  // namespace ptrain
