// GPT-2's parameters: the model's shape and every parameter tensor's name and shape, in llm.c's
// order. Apart from the model itself so that the file parsers (checkpoints, llm.c model files)
// can check shapes without a backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace ptrain {

struct GptShape {
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int max_seq_len = 0;
  int vocab = 0;         // real vocabulary
  int padded_vocab = 0;  // multiple of 128

  static GptShape of(const ModelConfig& m) {
    return GptShape{m.n_layer, m.n_head, m.n_embd, m.seq_len, m.vocab_size, m.padded_vocab()};
  }
};

enum ParamId {
  kWte, kWpe, kLn1w, kLn1b, kQkvw, kQkvb, kAttprojw, kAttprojb,
  kLn2w, kLn2b, kFcw, kFcb, kFcprojw, kFcprojb, kLnfw, kLnfb, kNumParams
};

struct ParamSpec {
  std::string name;            // llm.c / PyTorch-like name
  std::vector<int64_t> shape;  // stacked over layers where per-layer
  bool weight_decay;           // 2-D weights only
};

std::vector<ParamSpec> gpt_param_specs(const GptShape& s);
int64_t gpt_num_params(const GptShape& s);  // includes the padded wte rows, as llm.c counts

}  // namespace ptrain
