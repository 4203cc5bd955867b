#include "checkpoint/hf_layout.h"

#include <map>
#include <set>

#include "core/error.h"
#include "core/tensor.h"

namespace ptrain {
namespace {

// Where each ptrain tensor starts in the flat parameter vector, and its per-layer size.
struct FlatTensor {
  int64_t offset = 0;
  int64_t layer_size = 0;  // one layer's elements (the whole tensor when not per layer)
};

std::map<ParamId, FlatTensor> flat_tensors(const ModelShape& shape) {
  std::map<ParamId, FlatTensor> out;
  int64_t offset = 0;
  for (const ParamSpec& spec : param_specs(shape)) {
    const int64_t n = shape_numel(spec.shape);
    const bool per_layer = spec.id != kWte && spec.id != kWpe && spec.id != kNormFw && spec.id != kNormFb &&
                           spec.id != kLmHead;
    out[spec.id] = {offset, per_layer ? n / shape.n_layer : n};
    offset += n;
  }
  return out;
}

class SpecList {
 public:
  explicit SpecList(const ModelShape& shape) : flat_(flat_tensors(shape)) {}
  // Rows [row, row + rows) of layer `layer` (-1: not per layer) of `id`, `cols` wide.
  void add(const std::string& name, ParamId id, int layer, int64_t row, int64_t rows, int64_t cols,
           bool transposed = false) {
    const FlatTensor& t = flat_.at(id);
    const int64_t at = t.offset + (layer < 0 ? 0 : layer * t.layer_size) + row * cols;
    specs_.push_back({name, at, rows, cols, transposed});
  }
  std::vector<HfTensorSpec> take() { return std::move(specs_); }

 private:
  std::map<ParamId, FlatTensor> flat_;
  std::vector<HfTensorSpec> specs_;
};

// GPT2LMHeadModel.state_dict() as save_pretrained writes it (the lm_head tied to wte, the
// attention masks non-persistent buffers).
std::vector<HfTensorSpec> gpt2_specs(const ModelShape& s) {
  const int64_t C = s.n_embd, V = s.vocab, T = s.max_seq_len;
  SpecList l(s);
  l.add("transformer.wte.weight", kWte, -1, 0, V, C);
  l.add("transformer.wpe.weight", kWpe, -1, 0, T, C);
  for (int i = 0; i < s.n_layer; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    l.add(h + "ln_1.weight", kNorm1w, i, 0, C, 1);
    l.add(h + "ln_1.bias", kNorm1b, i, 0, C, 1);
    l.add(h + "attn.c_attn.weight", kQkvw, i, 0, 3 * C, C, true);
    l.add(h + "attn.c_attn.bias", kQkvb, i, 0, 3 * C, 1);
    l.add(h + "attn.c_proj.weight", kAttnOutw, i, 0, C, C, true);
    l.add(h + "attn.c_proj.bias", kAttnOutb, i, 0, C, 1);
    l.add(h + "ln_2.weight", kNorm2w, i, 0, C, 1);
    l.add(h + "ln_2.bias", kNorm2b, i, 0, C, 1);
    l.add(h + "mlp.c_fc.weight", kMlpUpw, i, 0, 4 * C, C, true);
    l.add(h + "mlp.c_fc.bias", kMlpUpb, i, 0, 4 * C, 1);
    l.add(h + "mlp.c_proj.weight", kMlpDownw, i, 0, C, 4 * C, true);
    l.add(h + "mlp.c_proj.bias", kMlpDownb, i, 0, C, 1);
  }
  l.add("transformer.ln_f.weight", kNormFw, -1, 0, C, 1);
  l.add("transformer.ln_f.bias", kNormFb, -1, 0, C, 1);
  return l.take();
}

// LlamaForCausalLM.state_dict(): ptrain's qkv rows are n_head query heads, then the K heads,
// then the V heads (backend/attention_heads.h); gate_up's are gate's, then up's.
std::vector<HfTensorSpec> llama_specs(const ModelShape& s) {
  const int64_t C = s.n_embd, V = s.vocab, F = s.mlp_width();
  const int64_t q = int64_t{s.n_head} * s.head_size(), kv = int64_t{s.kv_heads()} * s.head_size();
  SpecList l(s);
  l.add("model.embed_tokens.weight", kWte, -1, 0, V, C);
  for (int i = 0; i < s.n_layer; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    l.add(p + "input_layernorm.weight", kNorm1w, i, 0, C, 1);
    l.add(p + "self_attn.q_proj.weight", kQkvw, i, 0, q, C);
    l.add(p + "self_attn.k_proj.weight", kQkvw, i, q, kv, C);
    l.add(p + "self_attn.v_proj.weight", kQkvw, i, q + kv, kv, C);
    l.add(p + "self_attn.o_proj.weight", kAttnOutw, i, 0, C, q);
    l.add(p + "post_attention_layernorm.weight", kNorm2w, i, 0, C, 1);
    l.add(p + "mlp.gate_proj.weight", kMlpUpw, i, 0, F, C);
    l.add(p + "mlp.up_proj.weight", kMlpUpw, i, F, F, C);
    l.add(p + "mlp.down_proj.weight", kMlpDownw, i, 0, C, F);
  }
  l.add("model.norm.weight", kNormFw, -1, 0, C, 1);
  if (!s.tied_head) l.add("lm_head.weight", kLmHead, -1, 0, V, C);
  return l.take();
}

std::string json_text(const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// Compares config.json's keys with the model section's values, collecting what disagrees.
class ConfigChecker {
 public:
  ConfigChecker(const nlohmann::json& config, HfConfigCheck& out) : config_(config), out_(out) {}
  // `key` must be present and equal `expected` (model.* named `ours`).
  void equal(const std::string& key, const nlohmann::json& expected, const std::string& ours) {
    seen_.insert(key);
    if (!config_.contains(key)) return out_.problems.push_back(key + " is missing; expected " + json_text(expected) + " (" + ours + ")");
    compare(key, config_[key], expected, ours);
  }
  // `key` may be absent, meaning `fallback`.
  void equal_or_default(const std::string& key, const nlohmann::json& fallback, const nlohmann::json& expected,
                        const std::string& ours) {
    seen_.insert(key);
    const bool given = config_.contains(key) && !config_[key].is_null();  // null: transformers' default
    if (given) return compare(key, config_[key], expected, ours);
    // Said as what the file holds (absent or null), not as if it held the default.
    if (!same(fallback, expected))
      out_.problems.push_back(key + " " + (config_.contains(key) ? "null" : "absent") + " in config.json (transformers' "
                              "default " + json_text(fallback) + ") vs " + json_text(expected) + " in " + ours);
  }
  // `key`, if present, must be one of `allowed` (ptrain computes only that).
  void one_of(const std::string& key, const std::vector<nlohmann::json>& allowed, const std::string& why) {
    seen_.insert(key);
    if (!config_.contains(key)) return;
    for (const auto& a : allowed)
      if (same(config_[key], a)) return;
    out_.problems.push_back(key + " " + config_[key].dump() + " cannot be honoured: " + why);
  }
  void known(const std::string& key) { seen_.insert(key); }
  void list_ignored() {
    for (const auto& [key, value] : config_.items())
      if (!seen_.count(key)) out_.ignored.push_back(key);
  }

 private:
  static bool same(const nlohmann::json& a, const nlohmann::json& b) {
    if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
    return a == b;
  }
  void compare(const std::string& key, const nlohmann::json& got, const nlohmann::json& expected, const std::string& ours) {
    if (!same(got, expected))
      out_.problems.push_back(key + " " + got.dump() + " in config.json vs " + json_text(expected) + " in " + ours);
  }
  const nlohmann::json& config_;
  HfConfigCheck& out_;
  std::set<std::string> seen_;
};

}  // namespace

std::vector<int64_t> HfTensorSpec::shape() const {
  if (cols == 1) return {rows};
  return transposed ? std::vector<int64_t>{cols, rows} : std::vector<int64_t>{rows, cols};
}

std::vector<HfTensorSpec> hf_tensor_specs(const ModelConfig& model) {
  if (model.arch == Arch::llama && model.qk_norm)
    throw UserError("model.qk_norm is true: LlamaForCausalLM has no per-head q/k norms, so this model has no Hugging "
                    "Face layout (its q_norm/k_norm weights would be dropped and its outputs change)");
  const ModelShape shape = ModelShape::of(model);
  return shape.arch == Arch::llama ? llama_specs(shape) : gpt2_specs(shape);
}

std::vector<float> hf_values(const HfTensorSpec& spec, const float* flat) {
  std::vector<float> out(static_cast<size_t>(spec.numel()));
  const float* src = flat + spec.offset;
  for (int64_t r = 0; r < spec.rows; ++r)
    for (int64_t c = 0; c < spec.cols; ++c)
      out[spec.transposed ? c * spec.rows + r : r * spec.cols + c] = src[r * spec.cols + c];
  return out;
}

void put_hf_values(const HfTensorSpec& spec, const float* values, float* flat) {
  float* dst = flat + spec.offset;
  for (int64_t r = 0; r < spec.rows; ++r)
    for (int64_t c = 0; c < spec.cols; ++c)
      dst[r * spec.cols + c] = values[spec.transposed ? c * spec.rows + r : r * spec.cols + c];
}

nlohmann::ordered_json hf_config_json(const ModelConfig& m, int end_of_text, const std::string& torch_dtype) {
  const nlohmann::json token = end_of_text >= 0 ? nlohmann::json(end_of_text) : nlohmann::json(nullptr);
  nlohmann::ordered_json j;
  if (m.arch == Arch::llama) {
    const bool tied = ModelShape::of(m).tied_head;
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["vocab_size"] = m.vocab_size;
    j["hidden_size"] = m.n_embd;
    j["intermediate_size"] = m.swiglu_hidden();
    j["num_hidden_layers"] = m.n_layer;
    j["num_attention_heads"] = m.n_head;
    j["num_key_value_heads"] = m.kv_heads();
    j["head_dim"] = m.n_embd / m.n_head;
    j["max_position_embeddings"] = m.seq_len;
    j["hidden_act"] = "silu";
    j["rms_norm_eps"] = m.norm_eps;
    j["rope_theta"] = m.rope_theta;
    j["rope_scaling"] = nullptr;
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["attention_dropout"] = 0.0;
    j["tie_word_embeddings"] = tied;
  } else {
    j["architectures"] = {"GPT2LMHeadModel"};
    j["model_type"] = "gpt2";
    j["vocab_size"] = m.vocab_size;
    j["n_positions"] = m.seq_len;
    j["n_embd"] = m.n_embd;
    j["n_layer"] = m.n_layer;
    j["n_head"] = m.n_head;
    j["n_inner"] = nullptr;
    j["activation_function"] = "gelu_new";  // GELU's tanh approximation, as ptrain computes
    j["layer_norm_epsilon"] = 1e-5;
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["attn_pdrop"] = 0.0;
    j["scale_attn_weights"] = true;
    j["tie_word_embeddings"] = true;
  }
  j["initializer_range"] = m.init_std;
  j["bos_token_id"] = token;
  j["eos_token_id"] = token;
  j["torch_dtype"] = torch_dtype;
  return j;
}

HfConfigCheck check_hf_config(const nlohmann::json& config, const ModelConfig& m) {
  HfConfigCheck out;
  if (!config.is_object()) {
    out.problems.push_back("config.json is not a JSON object");
    return out;
  }
  const std::string type = config.value("model_type", nlohmann::json()).is_string() ? config["model_type"].get<std::string>() : "";
  if (type != choice_name(m.arch)) {  // Hugging Face's model_type names the architecture as model.arch does
    out.problems.push_back("model_type " + (type.empty() ? std::string("missing") : "\"" + type + "\"") +
                           "; expected \"" + choice_name(m.arch) + "\" (model.arch)");
    return out;
  }
  ConfigChecker c(config, out);
  c.known("model_type");
  c.known("architectures");
  c.equal("vocab_size", m.vocab_size, "model.vocab_size");
  if (m.arch == Arch::llama) {
    const ModelShape s = ModelShape::of(m);
    if (m.qk_norm) out.problems.push_back("model.qk_norm is true, and a LlamaForCausalLM has no q/k norms");
    c.equal("hidden_size", m.n_embd, "model.n_embd");
    c.equal("num_hidden_layers", m.n_layer, "model.n_layer");
    c.equal("num_attention_heads", m.n_head, "model.n_head");
    c.equal_or_default("num_key_value_heads", m.n_head, m.kv_heads(), "model.n_kv_head");
    c.equal("intermediate_size", m.swiglu_hidden(), "model.mlp_hidden");
    c.equal_or_default("rms_norm_eps", 1e-6, m.norm_eps, "model.norm_eps");
    // transformers 5 keeps RoPE's settings in rope_parameters; earlier versions at the top level.
    const nlohmann::json rope = config.value("rope_parameters", nlohmann::json());
    c.known("rope_parameters");
    if (!rope.is_null() && (!rope.is_object() || rope.value("rope_type", nlohmann::json("default")) != "default")) {
      out.problems.push_back("rope_parameters " + rope.dump() + " cannot be honoured: ptrain's RoPE is the default, "
                             "unscaled one (expected rope_type \"default\")");
    } else if (rope.is_object() && rope.contains("rope_theta")) {
      c.known("rope_theta");
      ConfigChecker(rope, out).equal("rope_theta", m.rope_theta, "model.rope_theta");
    } else {
      c.equal_or_default("rope_theta", 10000.0, m.rope_theta, "model.rope_theta");
    }
    c.equal_or_default("tie_word_embeddings", false, s.tied_head, "model.tie_embeddings");
    c.known("max_position_embeddings");
    // RoPE has no position weights: a shorter context than the model's is the same model.
    const nlohmann::json positions = config.value("max_position_embeddings", nlohmann::json());
    if (!positions.is_number_integer() || positions.get<int64_t>() < m.seq_len)
      out.problems.push_back("max_position_embeddings " + json_text(positions) + " is below model.seq_len " +
                             std::to_string(m.seq_len) + " (or missing)");
    c.one_of("hidden_act", {"silu"}, "ptrain's SwiGLU uses SiLU");
    c.one_of("rope_scaling", {nullptr}, "ptrain's RoPE has no scaling (expected null)");
    c.one_of("attention_bias", {false}, "ptrain's Llama has no attention biases");
    c.one_of("mlp_bias", {false}, "ptrain's Llama has no MLP biases");
    c.one_of("head_dim", {m.n_embd / m.n_head, nullptr}, "ptrain's head size is n_embd / n_head = " + std::to_string(m.n_embd / m.n_head));
  } else {
    c.equal("n_embd", m.n_embd, "model.n_embd");
    c.equal("n_layer", m.n_layer, "model.n_layer");
    c.equal("n_head", m.n_head, "model.n_head");
    c.equal("n_positions", m.seq_len, "model.seq_len");
    c.equal_or_default("layer_norm_epsilon", 1e-5, 1e-5, "ptrain's LayerNorm (epsilon 1e-5)");
    c.equal_or_default("tie_word_embeddings", true, true, "ptrain's GPT-2 (a tied LM head)");
    c.one_of("activation_function", {"gelu_new", "gelu_pytorch_tanh"}, "ptrain's GELU is the tanh approximation");
    c.one_of("n_inner", {nullptr, 4 * m.n_embd}, "ptrain's MLP is 4 n_embd wide");
    c.one_of("scale_attn_weights", {true}, "ptrain scales attention scores by 1/sqrt(head size)");
    c.one_of("scale_attn_by_inverse_layer_idx", {false}, "ptrain does not scale attention by layer");
    c.one_of("add_cross_attention", {false}, "ptrain's GPT-2 is decoder-only");
  }
  c.list_ignored();
  return out;
}

}  // namespace ptrain
