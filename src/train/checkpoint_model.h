// A checkpoint's weights as the commands around training use them (eval, sample, export,
// compare): in an FP32 model on the CPU, or as ptrain's flat parameter vector; and --weights int8.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "data/tokenizer.h"
#include "model/transformer.h"

namespace ptrain {

// The weights a checkpoint runs with in eval and sample (--weights): its FP32 masters, or int8:
// the block linears' weights (attention qkv and output, the MLP's two) quantized per output
// channel and dequantized (precision/int8_weights.h); embeddings, norms, biases and the head stay.
enum class WeightFormat { fp32, int8 };
WeightFormat parse_weight_format(const std::string& text);  // "fp32" | "int8"; UserError naming --weights

// A model holding a checkpoint's weights, in FP32.
struct LoadedModel {
  std::unique_ptr<Backend> backend = make_cpu_backend(0);
  std::unique_ptr<Transformer> model;
};

// The checkpoint's weights in a model of micro-batch B and context T; `weights` int8: the block
// linears' weights replaced by their INT8 round trip.
LoadedModel load_model(const LoadedCheckpoint& ckpt, const ModelConfig& m, int B, int T,
                       WeightFormat weights = WeightFormat::fp32);

// "786,432 of 842,496 parameters (the block linears) in INT8, per output channel".
std::string int8_note(const ModelConfig& m);

// A checkpoint's weights as ptrain's flat parameter vector (the order of param_specs).
std::vector<float> flat_weights(const LoadedCheckpoint& ckpt, const ModelConfig& m);

// The checkpoint's tokenizer `name` (none for "": synthetic tokens) with the vocabulary
// `vocabulary` names ("" the default), refused (UserError naming --vocab) when its files hash
// otherwise than those the checkpoint's shards were made with, whose ids the embeddings
// learned, or when the tokenizer takes no vocabulary (none, bytes) and one is named.
std::optional<Tokenizer> checkpoint_tokenizer(const LoadedCheckpoint& ckpt, const std::string& name,
                                              const std::string& vocabulary);

}  // namespace ptrain
