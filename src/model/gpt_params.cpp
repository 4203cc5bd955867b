#include "core/tensor.h"
#include "model/gpt_params.h"

namespace ptrain {

GptShape GptShape::of(const ModelConfig& m) {
  GptShape s{m.n_layer, m.n_head, m.n_embd, m.seq_len, m.vocab_size, m.padded_vocab()};
  if (m.arch != Arch::llama) return s;
  s.arch = Arch::llama;
  s.n_kv_head = m.kv_heads();
  s.mlp_hidden = m.swiglu_hidden();
  s.tied_head = m.tie_embeddings == TieEmbeddings::yes;
  s.rope_theta = static_cast<float>(m.rope_theta);
  s.norm_eps = static_cast<float>(m.norm_eps);
  s.qk_norm = m.qk_norm;
  return s;
}

static std::vector<ParamSpec> gpt2_specs(const GptShape& s) {
  const int64_t L = s.n_layer, C = s.n_embd;
  return {
      {kWte, "wte", {s.padded_vocab, C}, true},
      {kWpe, "wpe", {s.max_seq_len, C}, true},
      {kLn1w, "ln1w", {L, C}, false},
      {kLn1b, "ln1b", {L, C}, false},
      {kQkvw, "qkvw", {L, 3 * C, C}, true},
      {kQkvb, "qkvb", {L, 3 * C}, false},
      {kAttprojw, "attprojw", {L, C, C}, true},
      {kAttprojb, "attprojb", {L, C}, false},
      {kLn2w, "ln2w", {L, C}, false},
      {kLn2b, "ln2b", {L, C}, false},
      {kFcw, "fcw", {L, 4 * C, C}, true},
      {kFcb, "fcb", {L, 4 * C}, false},
      {kFcprojw, "fcprojw", {L, C, 4 * C}, true},
      {kFcprojb, "fcprojb", {L, C}, false},
      {kLnfw, "lnfw", {C}, false},
      {kLnfb, "lnfb", {C}, false},
  };
}

static std::vector<ParamSpec> llama_specs(const GptShape& s) {
  const int64_t L = s.n_layer, C = s.n_embd, H = s.mlp_width();
  std::vector<ParamSpec> specs = {
      {kWte, "embed", {s.padded_vocab, C}, true},
      {kLn1w, "attn_norm", {L, C}, false},
      {kQkvw, "qkv", {L, s.qkv_width(), C}, true},
  };
  if (s.qk_norm) {
    specs.push_back({kQNormw, "q_norm", {L, s.head_size()}, false});
    specs.push_back({kKNormw, "k_norm", {L, s.head_size()}, false});
  }
  specs.insert(specs.end(), {
      {kAttprojw, "o_proj", {L, C, C}, true},
      {kLn2w, "mlp_norm", {L, C}, false},
      {kFcw, "gate_up", {L, 2 * H, C}, true},
      {kFcprojw, "down", {L, C, H}, true},
      {kLnfw, "final_norm", {C}, false},
  });
  if (!s.tied_head) specs.push_back({kLmHead, "lm_head", {s.padded_vocab, C}, true});
  return specs;
}

std::vector<ParamSpec> gpt_param_specs(const GptShape& s) {
  return s.arch == Arch::llama ? llama_specs(s) : gpt2_specs(s);
}

int64_t gpt_num_params(const GptShape& s) {
  int64_t n = 0;
  for (const auto& spec : gpt_param_specs(s)) n += shape_numel(spec.shape);
  return n;
}

}  // namespace ptrain
