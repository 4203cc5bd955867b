// Text generation from a model, shared by `ptrain sample` and the samples `train` prints every
// logging.sample_every steps. Deterministic for a seed: ties between equal logits go to the
// lower token id.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/tokenizer.h"
#include "model/transformer.h"

namespace ptrain {

struct GenerateOptions {
  int tokens = 128;          // at most this many new tokens
  double temperature = 1.0;  // 0 = greedy
  int top_k = 0;             // 0 = the whole vocabulary
  int stop_token = -1;       // generation ends when it draws this token (not emitted); -1 = never
  int vocab = 0;             // draw among ids below this (the tokenizer's; a padded model has more); 0 = all
  bool kv_cache = true;      // false: every token runs the forward pass over the whole window
};

// The tokens a generation with no prompt starts from: <|endoftext|> for gpt2 (a document
// begins), a line feed for bytes, token 0 when there is no tokenizer.
std::vector<int32_t> empty_prompt(const Tokenizer* tokenizer);

// Extends `tokens` (non-empty) with tokens drawn from `model` (micro-batch 1), calling
// `emit(token)` for each. The KV cache (Transformer::decode_next) computes each new position alone
// while the sequence fits the model's context. Past it the window slides over the last seq_len
// tokens, since learned positions cannot extrapolate; sliding moves every token to a new
// position, which no cached key holds, so each token there runs the whole window again.
void generate(Transformer& model, std::vector<int32_t>& tokens, const GenerateOptions& options, Rng& rng,
              const std::function<void(int32_t)>& emit);

// The samples `train` prints every logging.sample_every steps: from a copy of the current
// weights in an FP32 model of micro-batch 1 on the CPU, with its own RNG, so the training run is
// untouched by them (its losses are the same with samples on or off).
class TrainingSamples {
 public:
  // A model of `shape` over its whole context; `prompt` as written (logging.sample_prompt) and
  // encoded; `tokenizer` absent: token ids shown.
  TrainingSamples(const ModelShape& shape, std::optional<Tokenizer> tokenizer, std::string prompt,
                  std::vector<int32_t> prompt_tokens, uint64_t seed, int tokens, double temperature);
  ~TrainingSamples();
  // The sample after `step` from the whole FP32 master weights in the flat layout
  // (AdamW::master_on_main), as the log shows it.
  std::string at_step(int64_t step, const std::vector<float>& master);

 private:
  ModelShape shape_;
  std::optional<Tokenizer> tokenizer_;
  std::string prompt_;
  std::vector<int32_t> prompt_tokens_;
  uint64_t seed_;
  int tokens_;
  double temperature_;
  std::unique_ptr<Backend> backend_;  // made at the first sample
  std::unique_ptr<Transformer> model_;
};

}  // namespace ptrain
