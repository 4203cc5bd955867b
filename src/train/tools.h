// The commands around training: evaluate, sample from, inspect and export checkpoints.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config/config.h"

namespace ptrain {

// The weights a checkpoint runs with in eval and sample (--weights): its FP32 masters, or int8:
// the block linears' weights (attention qkv and output, the MLP's two) quantized per output
// channel and dequantized (precision/int8_weights.h); embeddings, norms, biases and the head stay.
enum class WeightFormat { fp32, int8 };
WeightFormat parse_weight_format(const std::string& text);  // "fp32" | "int8"; UserError naming --weights

// The val loss of a checkpoint's weights on the config's validation batches, computed in FP32:
// with its masters, and with int8 weights also with those; `oracle` for synthetic data. Throws
// UserError for a checkpoint of another model shape or missing val data.
struct CheckpointLosses {
  int64_t step = 0;
  int batches = 0;
  double fp32 = 0;
  std::optional<double> int8, oracle;
};
CheckpointLosses checkpoint_val_losses(const Config& config, const std::string& checkpoint, WeightFormat weights);

// `ptrain eval CONFIG --checkpoint DIR`: the val loss of the checkpoint's weights on the
// config's validation batches, and the gap to the oracle loss for synthetic data. With int8
// weights, the loss with the masters first, then with INT8 weights and the difference. With
// `dump_logits`, also writes that file (JSON: the first validation window's tokens and the FP32
// logits over the real vocabulary at each of its positions), for comparing with another
// implementation of the model (scripts/hf_logits.py).
void eval_checkpoint(const Config& config, const std::string& checkpoint, const std::string& dump_logits = "",
                     WeightFormat weights = WeightFormat::fp32);

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

// `ptrain inspect PATH`: what a checkpoint directory, a safetensors file or an llm.c model file
// holds, and whether a checkpoint's checksums are valid.
void inspect(const std::string& path);

// `ptrain export --checkpoint DIR --format llmc --out FILE [--dtype fp32|bf16]`.
void export_llmc(const std::string& checkpoint, const std::string& out, const std::string& dtype);

struct HfExportOptions {
  std::string checkpoint, out;
  std::string dtype = "fp32";            // fp32 | bf16 | fp16
  std::string max_shard_size = "5GB";
  bool force = false;                    // replace a non-empty --out
  std::string vocabulary;                // gpt2: the vocabulary the run's shards were made with
};

// `ptrain export --checkpoint DIR --format hf --out DIR`: a directory transformers'
// AutoModelForCausalLM.from_pretrained loads (checkpoint/hf_layout.h), with GPT-2's tokenizer
// files when the run's data used that tokenizer. Everything is checked before anything is
// written, and the directory appears whole or not at all.
void export_hf(const HfExportOptions& options);

}  // namespace ptrain
