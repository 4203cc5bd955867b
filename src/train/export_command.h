// `ptrain export`: a checkpoint as an llm.c model file or a Hugging Face directory; and
// `ptrain data hf-tokenizer`: a tokenizer's Hugging Face files alone.
#pragma once

#include <string>

namespace ptrain {

// `ptrain export --checkpoint DIR --format llmc --out FILE [--dtype fp32|bf16] [--force]`.
// --out follows train/output_policy.h: --force replaces only an earlier llm.c model file.
void export_llmc(const std::string& checkpoint, const std::string& out, const std::string& dtype, bool force);

struct HfExportOptions {
  std::string checkpoint, out;
  std::string dtype = "fp32";            // fp32 | bf16 | fp16
  std::string max_shard_size = "5GB";
  bool force = false;                    // replace an earlier export at --out (train/output_policy.h)
  std::string vocabulary;                // gpt2: the vocabulary the run's shards were made with
};

// `ptrain export --checkpoint DIR --format hf --out DIR`: a directory transformers'
// AutoModelForCausalLM.from_pretrained loads (checkpoint/hf_layout.h), with GPT-2's tokenizer
// files when the run's data used that tokenizer. Everything is checked before anything is
// written, and the directory appears whole or not at all.
void export_hf(const HfExportOptions& options);

struct HfTokenizerExportOptions {
  std::string tokenizer, vocabulary, out;
  int model_max_length = 0;  // 0: not in tokenizer_config.json
  bool force = false;        // replace an earlier hf-tokenizer output at --out
};

// `ptrain data hf-tokenizer --tokenizer NAME --out DIR`: the tokenizer files `export --format hf`
// writes, without a model (a tiktoken encoding as a tokenizer.json that Hugging Face's
// tokenizers loads and encodes identically). --out follows train/output_policy.h.
void export_hf_tokenizer(const HfTokenizerExportOptions& options);

}  // namespace ptrain
