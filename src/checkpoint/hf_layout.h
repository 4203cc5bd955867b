// Hugging Face's layouts of ptrain's two architectures, tensor by tensor, and their config.json:
// GPT2LMHeadModel (transformers' modeling_gpt2.py, whose Conv1D layers store weights (in, out),
// the transpose of ptrain's (out, in)) and LlamaForCausalLM (modeling_llama.py, nn.Linear's
// (out, in) as ptrain; q/k/v and gate/up are separate tensors where ptrain stacks them). Both
// keep the real vocabulary only, and leave a tied LM head out. ptrain's RoPE is HF's rotate-half
// layout, so q_proj and k_proj need no permutation.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/param_layout.h"

namespace ptrain {

// One Hugging Face tensor: `rows` consecutive rows of ptrain's matrix of `cols` columns that
// starts at `offset` in the flat parameter vector (a vector is rows x 1), transposed for Conv1D.
struct HfTensorSpec {
  std::string name;
  int64_t offset = 0;
  int64_t rows = 0, cols = 1;
  bool transposed = false;
  std::vector<int64_t> shape() const;  // HF's: (rows), (rows, cols) or (cols, rows) transposed
  int64_t numel() const { return rows * cols; }
};

// Every tensor of the architecture's HF model, in HF's module order. Refuses (UserError) what
// HF's classes cannot hold: llama with model.qk_norm.
std::vector<HfTensorSpec> hf_tensor_specs(const ModelConfig& model);

// The tensor in HF's layout, from ptrain's flat parameters; and the inverse, into `flat`.
std::vector<float> hf_values(const HfTensorSpec& spec, const float* flat);
void put_hf_values(const HfTensorSpec& spec, const float* values, float* flat);

// config.json for `model`. `end_of_text` is the tokenizer's <|endoftext|> id (bos and eos), or
// -1 for vocabularies without one (bytes, synthetic): then bos/eos are null. `torch_dtype` is
// float32, bfloat16 or float16.
nlohmann::ordered_json hf_config_json(const ModelConfig& model, int end_of_text, const std::string& torch_dtype);

// config.json held against a run config's model section: each key that disagrees or that ptrain
// cannot honour (rope_scaling, attention_bias, mlp_bias, another head_dim, ...) is a problem
// naming the key and model.*; keys with no bearing on the weights' meaning are `ignored`.
struct HfConfigCheck {
  std::vector<std::string> problems;
  std::vector<std::string> ignored;
};
HfConfigCheck check_hf_config(const nlohmann::json& config, const ModelConfig& model);

}  // namespace ptrain
