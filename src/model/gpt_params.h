// The model's shape and every parameter tensor's name and shape, per architecture (model.arch):
// GPT-2's in llm.c's order, Llama's in the same roles without biases or position embeddings.
// Apart from the model itself so that the file parsers (checkpoints, llm.c model files) can
// check shapes without a backend.
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
  // Llama's settings (model.*); GPT-2 keeps these defaults.
  Arch arch = Arch::gpt2;
  int n_kv_head = 0;   // K/V heads of grouped-query attention; 0 = n_head
  int mlp_hidden = 0;  // MLP width; 0 = 4 n_embd (GPT-2)
  bool tied_head = true;  // the LM head is the token embedding
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  bool qk_norm = false;  // RMSNorm on each q and k head before RoPE (model.qk_norm)

  int head_size() const { return n_embd / n_head; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int mlp_width() const { return mlp_hidden > 0 ? mlp_hidden : 4 * n_embd; }
  int64_t qkv_width() const { return int64_t{n_head + 2 * kv_heads()} * head_size(); }

  // The shape a config asks for, its defaults resolved (ModelConfig's rules).
  static GptShape of(const ModelConfig& m);
};

// Every parameter tensor of either architecture; a model has the ones its specs list.
enum ParamId {
  kWte, kWpe, kLn1w, kLn1b, kQkvw, kQkvb, kAttprojw, kAttprojb,
  kLn2w, kLn2b, kFcw, kFcb, kFcprojw, kFcprojb, kLnfw, kLnfb,
  kLmHead,  // an untied LM head (llama)
  kQNormw, kKNormw,  // QK-norm's weights (llama with model.qk_norm): one head_size vector per layer
  kNumParams
};

struct ParamSpec {
  ParamId id;
  std::string name;            // llm.c / PyTorch-like name; the checkpoint's tensor name
  std::vector<int64_t> shape;  // stacked over layers where per-layer
  bool weight_decay;           // 2-D weights only
};

// In the order of the model's flat parameter buffer. Llama reuses GPT-2's ids for the tensors
// in the same role: kLn1w/kLn2w/kLnfw are RMSNorm weights, kFcw the SwiGLU gate and up
// projections stacked (gate rows first), kFcprojw the down projection.
std::vector<ParamSpec> gpt_param_specs(const GptShape& s);
int64_t gpt_num_params(const GptShape& s);  // includes the padded vocabulary rows, as llm.c counts

}  // namespace ptrain
