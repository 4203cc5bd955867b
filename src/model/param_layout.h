// The model's shape and every parameter tensor's name and shape, per architecture (model.arch):
// GPT-2's in llm.c's order, Llama's in the same roles without biases or position embeddings.
// Apart from the model itself so that the file parsers (checkpoints, llm.c model files) can
// check shapes without a backend.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace ptrain {

struct ModelShape {
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int max_seq_len = 0;
  int vocab = 0;         // real vocabulary
  int padded_vocab = 0;  // multiple of 128
  // Llama's settings (model.*); GPT-2 keeps these defaults.
  Arch arch = Arch::gpt2;
  int n_kv_head = 0;   // K/V heads of grouped-query attention; 0 = n_head
  int swiglu_width = 0;  // Llama's SwiGLU width (model.mlp_hidden resolved); GPT-2's MLP is 4 n_embd
  bool tied_head = true;  // the LM head is the token embedding
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  bool qk_norm = false;  // RMSNorm on each q and k head before RoPE (model.qk_norm)

  int head_size() const { return n_embd / n_head; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int mlp_width() const { return arch == Arch::llama ? swiglu_width : 4 * n_embd; }
  int64_t qkv_width() const { return int64_t{n_head + 2 * kv_heads()} * head_size(); }

  // The shape a config asks for, its defaults resolved (ModelConfig's rules).
  static ModelShape of(const ModelConfig& m);
};

// Every parameter tensor of either architecture; a model has the ones its specs list.
// Named by role: kNorm* are GPT-2's LayerNorms and Llama's RMSNorms (no bias); kMlpUpw is GPT-2's
// fc and Llama's gate and up projections stacked (gate rows first); kMlpDownw the projection back
// to n_embd (GPT-2's fcproj). The checkpoints' tensor names (ParamSpec::name) stay llm.c's.
enum ParamId {
  kWte, kWpe, kNorm1w, kNorm1b, kQkvw, kQkvb, kAttnOutw, kAttnOutb,
  kNorm2w, kNorm2b, kMlpUpw, kMlpUpb, kMlpDownw, kMlpDownb, kNormFw, kNormFb,
  kLmHead,  // an untied LM head (llama)
  kQNormw, kKNormw,  // QK-norm's weights (llama with model.qk_norm): one head_size vector per layer
  kNumParams
};

// The weights of the four linears of every block (attention qkv and output, the MLP's two):
// what FP8 layers cast, primary FP8 weights keep as codes only, and --weights int8 quantizes.
constexpr bool is_block_linear(ParamId id) {
  return id == kQkvw || id == kAttnOutw || id == kMlpUpw || id == kMlpDownw;
}

// Tensors stacked over the blocks (one slice per layer); the others are the embeddings, the
// final norm and an untied LM head.
constexpr bool is_block_param(ParamId id) {
  return id != kWte && id != kWpe && id != kNormFw && id != kNormFb && id != kLmHead;
}

struct ParamSpec {
  ParamId id;
  std::string name;            // llm.c / PyTorch-like name; the checkpoint's tensor name
  std::vector<int64_t> shape;  // stacked over layers where per-layer
  bool weight_decay;           // 2-D weights only
};

// In the order of the model's flat parameter buffer.
std::vector<ParamSpec> param_specs(const ModelShape& s);
int64_t param_count(const ModelShape& s);  // includes the padded vocabulary rows, as llm.c counts

// The tensors whose gradients are final once the LM head and final norm are through their
// backward pass: the final norm and an untied LM head (a tied one is the token embedding).
constexpr bool is_head_param(ParamId id) { return id == kNormFw || id == kNormFb || id == kLmHead; }

// ZeRO-2's gradient buckets (Transformer's grad buckets): one block's gradients (each stacked
// tensor's slice of one layer), the head's (is_head_param) and the embeddings'. Two rooms for
// blocks, used in turn: one block's gradients are summed across ranks while the next block's
// backward pass fills the other. An untied head's bucket is handed on before the embeddings'
// is written, so the two share their room; with a tied head the token embedding's gradient
// grows from the first step of the backward pass to the last, beside the head's.
struct GradBucketSizes {
  static constexpr int kBlockRooms = 2;
  int64_t block = 0, head = 0, embedding = 0;
  bool shared = false;  // head and embedding buckets in the same room (an untied head)
  // ... and when both fit a block's room, that room is a block room: the head's is the one
  // block L-2 fills next, the embeddings' block 1's, each free by then.
  bool in_block_rooms = false;
  int64_t rest() const { return in_block_rooms ? 0 : shared ? std::max(head, embedding) : head + embedding; }
  int64_t total() const { return kBlockRooms * block + rest(); }
};
GradBucketSizes grad_bucket_sizes(const ModelShape& s);

}  // namespace ptrain
