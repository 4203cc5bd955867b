#include "core/tensor.h"
#include "model/param_layout.h"

#include <algorithm>

namespace ptrain {

ModelShape ModelShape::of(const ModelConfig& m) {
  ModelShape s{m.n_layer, m.n_head, m.n_embd, m.seq_len, m.vocab_size, m.padded_vocab()};
  if (m.arch != Arch::llama) return s;
  s.arch = Arch::llama;
  s.n_kv_head = m.kv_heads();
  s.swiglu_width = m.swiglu_hidden();
  s.tied_head = m.tie_embeddings == TieEmbeddings::yes;
  s.rope_theta = static_cast<float>(m.rope_theta);
  s.norm_eps = static_cast<float>(m.norm_eps);
  s.qk_norm = m.qk_norm;
  return s;
}

static std::vector<ParamSpec> gpt2_specs(const ModelShape& s) {
  const int64_t L = s.n_layer, C = s.n_embd;
  return {
      {kWte, "wte", {s.padded_vocab, C}, true},
      {kWpe, "wpe", {s.max_seq_len, C}, true},
      {kNorm1w, "ln1w", {L, C}, false},
      {kNorm1b, "ln1b", {L, C}, false},
      {kQkvw, "qkvw", {L, 3 * C, C}, true},
      {kQkvb, "qkvb", {L, 3 * C}, false},
      {kAttnOutw, "attprojw", {L, C, C}, true},
      {kAttnOutb, "attprojb", {L, C}, false},
      {kNorm2w, "ln2w", {L, C}, false},
      {kNorm2b, "ln2b", {L, C}, false},
      {kMlpUpw, "fcw", {L, 4 * C, C}, true},
      {kMlpUpb, "fcb", {L, 4 * C}, false},
      {kMlpDownw, "fcprojw", {L, C, 4 * C}, true},
      {kMlpDownb, "fcprojb", {L, C}, false},
      {kNormFw, "lnfw", {C}, false},
      {kNormFb, "lnfb", {C}, false},
  };
}

static std::vector<ParamSpec> llama_specs(const ModelShape& s) {
  const int64_t L = s.n_layer, C = s.n_embd, H = s.mlp_width();
  std::vector<ParamSpec> specs = {
      {kWte, "embed", {s.padded_vocab, C}, true},
      {kNorm1w, "attn_norm", {L, C}, false},
      {kQkvw, "qkv", {L, s.qkv_width(), C}, true},
  };
  if (s.qk_norm) {
    specs.push_back({kQNormw, "q_norm", {L, s.head_size()}, false});
    specs.push_back({kKNormw, "k_norm", {L, s.head_size()}, false});
  }
  specs.insert(specs.end(), {
      {kAttnOutw, "o_proj", {L, C, C}, true},
      {kNorm2w, "mlp_norm", {L, C}, false},
      {kMlpUpw, "gate_up", {L, 2 * H, C}, true},
      {kMlpDownw, "down", {L, C, H}, true},
      {kNormFw, "final_norm", {C}, false},
  });
  if (!s.tied_head) specs.push_back({kLmHead, "lm_head", {s.padded_vocab, C}, true});
  return specs;
}

std::vector<ParamSpec> param_specs(const ModelShape& s) {
  return s.arch == Arch::llama ? llama_specs(s) : gpt2_specs(s);
}

int64_t param_count(const ModelShape& s) {
  int64_t n = 0;
  for (const auto& spec : param_specs(s)) n += shape_numel(spec.shape);
  return n;
}

GradBucketSizes grad_bucket_sizes(const ModelShape& s) {
  GradBucketSizes sizes;
  for (const auto& spec : param_specs(s))
    (is_block_param(spec.id) ? sizes.block : is_head_param(spec.id) ? sizes.head : sizes.embedding) +=
        shape_numel(spec.shape);
  sizes.block /= s.n_layer;
  sizes.shared = !s.tied_head;
  sizes.in_block_rooms = sizes.shared && std::max(sizes.head, sizes.embedding) <= sizes.block;
  return sizes;
}

}  // namespace ptrain
