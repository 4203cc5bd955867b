// llm.c's model file: a 256 x int32 header (magic 20240326, version 3 = fp32 or 5 = bf16,
// max_seq_len, vocab_size, n_layer, n_head, n_embd, padded_vocab_size), then every parameter
// in llm.c's order (wte, wpe, ln1w, ln1b, qkvw, ..., lnfw, lnfb), PyTorch (out, in) layout,
// each stacked over layers. ptrain's parameter layout is the same, so a file maps one to one.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"

namespace ptrain {

constexpr int kLlmcMagic = 20240326;

struct LlmcModel {
  int version = 3;  // 3: fp32, 5: bf16
  int max_seq_len = 0, vocab_size = 0, n_layer = 0, n_head = 0, n_embd = 0, padded_vocab = 0;
  std::vector<float> params;  // all parameters, in order, as float
};

// Reads and validates a model file: magic, version, header fields consistent with each other and
// within a config's bounds, file size equal to header + parameters, every parameter finite.
// Throws UserError naming the file (as `what`, e.g. "model.init_from") and the field.
LlmcModel read_llmc(const std::string& path, const std::string& what);

// Whether `path` begins as a model file ptrain writes: the magic, then version 3 or 5. Only the
// header is read (the output rule's check of what `export --force` may replace).
bool is_llmc_model_file(const std::string& path);

// The header fields that disagree with a model config ("n_embd 768 in the file vs 128 in
// model.n_embd"); empty when the file fits the config.
std::vector<std::string> llmc_mismatches(const LlmcModel& file, const ModelConfig& model);

// Writes a model file in fp32 (version 3) or bf16 (version 5, rounded to nearest even),
// atomically; EnvironmentError on I/O failure.
void write_llmc(const std::string& path, const LlmcModel& model);

}  // namespace ptrain
