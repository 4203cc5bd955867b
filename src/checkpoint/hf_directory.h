// A Hugging Face model directory: config.json, the weights in model.safetensors (or shards
// model-0000K-of-0000N.safetensors with model.safetensors.index.json, split as transformers'
// save_pretrained splits them), and whatever other files go beside them (tokenizer files).
// Written whole or not at all: into a temporary sibling, fsynced, then renamed into place.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/hf_layout.h"
#include "checkpoint/safetensors.h"
#include "config/config.h"

namespace ptrain {

constexpr int64_t kHfMaxShardBytes = 5'000'000'000;  // save_pretrained's default, "5GB"

// "5GB", "200MB", "64KB" (decimal, as transformers reads them) or a byte count; UserError
// naming `what` otherwise.
int64_t parse_shard_size(const std::string& text, const std::string& what);


struct HfDirectoryContents {
  std::vector<HfTensorSpec> specs;     // in order
  const float* flat = nullptr;         // ptrain's flat FP32 parameters
  StDtype dtype = StDtype::f32;        // what the safetensors hold (rounded to nearest even)
  int64_t max_shard_bytes = kHfMaxShardBytes;
  std::map<std::string, std::string> text_files;  // config.json and the like, by file name
};

// Writes the directory (replacing `out` when it exists: train/output_policy.h first) and returns
// the safetensors file names written (none without specs: text files only). EnvironmentError on I/O failure; `out` is then untouched.
std::vector<std::string> write_hf_directory(const std::string& out, const HfDirectoryContents& contents);

struct HfWeights {
  std::vector<float> params;         // ptrain's flat parameters, padded vocabulary rows 0
  std::vector<std::string> files;    // the safetensors read
  std::vector<std::string> ignored;  // config.json keys with no bearing on the weights
  std::vector<std::string> skipped;  // tensors that are not weights (GPT-2's attn.bias masks)
};

// Reads a Hugging Face directory for a model of the config's model section (`what` names it in
// messages, e.g. model.init_from): config.json checked key by key, every tensor present once with
// HF's shape, none unknown (GPT-2's names with or without "transformer.", its attention mask
// buffers skipped, a tied lm_head equal to wte accepted), F32, BF16 or F16, all finite. Throws
// UserError(s) naming the file and the key or tensor.
HfWeights read_hf_directory(const std::string& dir, const ModelConfig& model, const std::string& what);

}  // namespace ptrain
