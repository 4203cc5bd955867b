// `ptrain export`: a checkpoint as an llm.c model file or a Hugging Face directory.
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

}  // namespace ptrain
