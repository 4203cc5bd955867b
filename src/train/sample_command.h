// `ptrain sample`: text from a checkpoint.
#pragma once

#include <cstdint>
#include <string>

#include "train/checkpoint_model.h"

namespace ptrain {

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
  WeightFormat weights = WeightFormat::fp32;
};

// `ptrain sample`: generates text decoded by the tokenizer the checkpoint's run recorded (token
// ids when none is known), deterministic for a seed, with a KV cache while the sequence fits the
// model's context. Past it the window slides: each token sees the last seq_len tokens (learned
// positions cannot extrapolate) and reruns the window.
void sample(const SampleOptions& options);

}  // namespace ptrain
