// Hugging Face export and import (`export --format hf`, model.init_from of an HF directory):
// the round trip, the layout against a table written from transformers' documented state
// dicts, a forward pass written here from that layout alone, and the errors of bad input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_directory.h"
#include "config/config.h"
#include "data/hf_tokenizer_files.h"
#include "data/tokenizer.h"
#include "model/transformer.h"
#include "precision/formats.h"
#include "test_util.h"

using namespace ptrain;
using namespace ptrain::test;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The tiny models: GPT-2, Llama with grouped K/V heads and its own LM head, Llama tied with one
// K/V head. Vocabulary 200 pads to 256, so the cut back to vocab_size is exercised.
struct TinyModel {
  const char* name;
  const char* model_yaml;
};
const TinyModel kGpt2{"gpt2", "{n_layer: 2, n_head: 2, n_embd: 32, seq_len: 16, vocab_size: 200}"};
const TinyModel kLlama{"llama", "{arch: llama, n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 32, seq_len: 16, "
                           "vocab_size: 200, mlp_hidden: 48, rope_theta: 500}"};
const TinyModel kLlamaTied{"llama tied", "{arch: llama, n_layer: 2, n_head: 4, n_kv_head: 1, n_embd: 32, seq_len: 16, "
                                    "vocab_size: 200, mlp_hidden: 40, tie_embeddings: true}"};

std::string run_yaml(const TinyModel& a) {
  return std::string("run: {name: r, out_dir: runs}\nmodel: ") + a.model_yaml +
         "\ndata: {synthetic: {vocab: 200, order: 1, branching: 3, tokens: 50000, seed: 5}}\n"
         "training: {steps: 6, batch_tokens: 128, micro_batch: 8, eval_every: 0, eval_batches: 2}\n"
         "optimizer: {lr: 1.0e-2}\n";
}

struct Trained {
  TempDir tmp{"hf"};
  fs::path dir = tmp.dir;
  fs::path checkpoint = dir / "runs/r/checkpoints/step_00000006";
  Config config;
  explicit Trained(const TinyModel& a) {
    write_file(dir / "run.yaml", run_yaml(a));
    const CommandResult r = run_ptrain("train run.yaml", dir);
    if (r.exit_code != 0) throw std::runtime_error(r.output);
    config = load_config((dir / "run.yaml").string(), {});
  }
  CommandResult ptrain(const std::string& args) const { return run_ptrain(args, dir); }
  std::vector<float> weights() const {
    const LoadedCheckpoint ck = load_checkpoint(checkpoint.string());
    Transformer model(ModelShape::of(config.model), *cpu, DType::f32, 1, config.model.seq_len);
    load_weights(ck.weights, model);
    std::vector<float> flat(static_cast<size_t>(model.num_params()));
    cpu->download(flat.data(), model.master_flat());
    return flat;
  }
  std::unique_ptr<Backend> cpu = make_cpu_backend(0);
};

// A safetensors file read with a few lines of its own (not ptrain's reader): the header, and
// each tensor's dtype, shape and raw bytes.
struct RawTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
  std::vector<float> f32() const {
    REQUIRE(dtype == "F32");
    std::vector<float> v(bytes.size() / 4);
    std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
  }
  std::vector<uint16_t> u16() const {
    std::vector<uint16_t> v(bytes.size() / 2);
    std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
  }
};
struct RawFile {
  json metadata;
  std::map<std::string, RawTensor> tensors;
};
RawFile read_raw(const fs::path& path) {
  const std::string all = read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, all.data(), 8);
  const json header = json::parse(all.substr(8, n));
  RawFile f;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") {
      f.metadata = e;
      continue;
    }
    const size_t begin = e["data_offsets"][0], end = e["data_offsets"][1];
    f.tensors[name] = {e["dtype"], e["shape"].get<std::vector<int64_t>>(), all.substr(8 + n + begin, end - begin)};
  }
  return f;
}

// transformers' GPT2LMHeadModel and LlamaForCausalLM state dicts as documented by their
// modeling files (modeling_gpt2.py: Conv1D(nf, nx) holds weight (nx, nf), i.e. (in, out);
// modeling_llama.py: nn.Linear(in, out) holds (out, in)), for the tiny models above.
std::map<std::string, std::vector<int64_t>> documented_layout(const TinyModel& a) {
  std::map<std::string, std::vector<int64_t>> t;
  if (std::string(a.name) == "gpt2") {
    const int64_t C = 32, V = 200, T = 16;
    t["transformer.wte.weight"] = {V, C};
    t["transformer.wpe.weight"] = {T, C};
    for (int l = 0; l < 2; ++l) {
      const std::string h = "transformer.h." + std::to_string(l) + ".";
      for (const char* ln : {"ln_1", "ln_2"}) t[h + ln + ".weight"] = t[h + ln + ".bias"] = {C};
      t[h + "attn.c_attn.weight"] = {C, 3 * C};
      t[h + "attn.c_attn.bias"] = {3 * C};
      t[h + "attn.c_proj.weight"] = {C, C};
      t[h + "attn.c_proj.bias"] = {C};
      t[h + "mlp.c_fc.weight"] = {C, 4 * C};
      t[h + "mlp.c_fc.bias"] = {4 * C};
      t[h + "mlp.c_proj.weight"] = {4 * C, C};
      t[h + "mlp.c_proj.bias"] = {C};
    }
    t["transformer.ln_f.weight"] = t["transformer.ln_f.bias"] = {C};
    return t;  // lm_head.weight is tied to wte: save_pretrained leaves it out
  }
  const bool tied = std::string(a.name) == "llama tied";
  const int64_t C = 32, V = 200, HS = 8, KV = tied ? 1 : 2, F = tied ? 40 : 48;
  t["model.embed_tokens.weight"] = {V, C};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t[p + "input_layernorm.weight"] = t[p + "post_attention_layernorm.weight"] = {C};
    t[p + "self_attn.q_proj.weight"] = {4 * HS, C};
    t[p + "self_attn.k_proj.weight"] = t[p + "self_attn.v_proj.weight"] = {KV * HS, C};
    t[p + "self_attn.o_proj.weight"] = {C, 4 * HS};
    t[p + "mlp.gate_proj.weight"] = t[p + "mlp.up_proj.weight"] = {F, C};
    t[p + "mlp.down_proj.weight"] = {C, F};
  }
  t["model.norm.weight"] = {C};
  if (!tied) t["lm_head.weight"] = {V, C};
  return t;
}

// --- A forward pass from the HF layout's definition, in double ---------------------------------

using Mat = std::vector<std::vector<double>>;  // rows of a (T, n) activation

struct HfModel {
  std::map<std::string, std::vector<float>> w;
  const std::vector<float>& operator[](const std::string& name) const { return w.at(name); }
};

// x (T, in) times W, W stored (in, out) row-major (Conv1D), plus bias b.
Mat conv1d(const Mat& x, const std::vector<float>& W, const std::vector<float>* b, size_t out) {
  Mat y(x.size(), std::vector<double>(out));
  for (size_t t = 0; t < x.size(); ++t)
    for (size_t o = 0; o < out; ++o) {
      double s = b ? (*b)[o] : 0.0;
      for (size_t i = 0; i < x[t].size(); ++i) s += x[t][i] * W[i * out + o];
      y[t][o] = s;
    }
  return y;
}

// x (T, in) times W transposed, W stored (out, in) row-major (nn.Linear), no bias.
Mat linear(const Mat& x, const std::vector<float>& W, size_t out) {
  Mat y(x.size(), std::vector<double>(out));
  const size_t in = x[0].size();
  for (size_t t = 0; t < x.size(); ++t)
    for (size_t o = 0; o < out; ++o) {
      double s = 0;
      for (size_t i = 0; i < in; ++i) s += x[t][i] * W[o * in + i];
      y[t][o] = s;
    }
  return y;
}

Mat layer_norm(const Mat& x, const std::vector<float>& g, const std::vector<float>& b) {
  Mat y = x;
  for (auto& row : y) {
    double mean = 0, var = 0;
    for (double v : row) mean += v;
    mean /= row.size();
    for (double v : row) var += (v - mean) * (v - mean);
    var /= row.size();
    for (size_t i = 0; i < row.size(); ++i) row[i] = (row[i] - mean) / std::sqrt(var + 1e-5) * g[i] + b[i];
  }
  return y;
}

Mat rms_norm(const Mat& x, const std::vector<float>& g, double eps) {
  Mat y = x;
  for (auto& row : y) {
    double ms = 0;
    for (double v : row) ms += v * v;
    ms /= row.size();
    for (size_t i = 0; i < row.size(); ++i) row[i] = row[i] / std::sqrt(ms + eps) * g[i];
  }
  return y;
}

// Causal softmax attention: q (T, NH*HS), k and v (T, KV*HS); query head h reads K/V head
// h / (NH / KV) (repeat_kv).
Mat attention(const Mat& q, const Mat& k, const Mat& v, int NH, int KV, int HS) {
  const size_t T = q.size();
  Mat y(T, std::vector<double>(static_cast<size_t>(NH) * HS, 0.0));
  for (int h = 0; h < NH; ++h) {
    const int g = h / (NH / KV);
    for (size_t t = 0; t < T; ++t) {
      std::vector<double> s(t + 1);
      double mx = -1e300, sum = 0;
      for (size_t u = 0; u <= t; ++u) {
        double d = 0;
        for (int i = 0; i < HS; ++i) d += q[t][h * HS + i] * k[u][g * HS + i];
        s[u] = d / std::sqrt(static_cast<double>(HS));
        mx = std::max(mx, s[u]);
      }
      for (double& e : s) sum += (e = std::exp(e - mx));
      for (size_t u = 0; u <= t; ++u)
        for (int i = 0; i < HS; ++i) y[t][h * HS + i] += s[u] / sum * v[u][g * HS + i];
    }
  }
  return y;
}

void add(Mat& x, const Mat& y) {
  for (size_t t = 0; t < x.size(); ++t)
    for (size_t i = 0; i < x[t].size(); ++i) x[t][i] += y[t][i];
}

Mat logits_of(const Mat& h, const std::vector<float>& head, size_t V) { return linear(h, head, V); }

// GPT2LMHeadModel: learned positions, pre-LayerNorm blocks, GELU's tanh form ("gelu_new").
Mat gpt2_forward(const HfModel& m, const json& cfg, const std::vector<int>& tokens) {
  const size_t C = cfg["n_embd"], V = cfg["vocab_size"];
  const int NH = cfg["n_head"], L = cfg["n_layer"], HS = static_cast<int>(C) / NH;
  Mat h(tokens.size(), std::vector<double>(C));
  for (size_t t = 0; t < tokens.size(); ++t)
    for (size_t i = 0; i < C; ++i) h[t][i] = double{m["transformer.wte.weight"][tokens[t] * C + i]} + m["transformer.wpe.weight"][t * C + i];
  for (int l = 0; l < L; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    const Mat a = layer_norm(h, m[p + "ln_1.weight"], m[p + "ln_1.bias"]);
    const Mat qkv = conv1d(a, m[p + "attn.c_attn.weight"], &m[p + "attn.c_attn.bias"], 3 * C);
    Mat q(a.size()), k(a.size()), v(a.size());
    for (size_t t = 0; t < a.size(); ++t) {
      q[t].assign(qkv[t].begin(), qkv[t].begin() + C);
      k[t].assign(qkv[t].begin() + C, qkv[t].begin() + 2 * C);
      v[t].assign(qkv[t].begin() + 2 * C, qkv[t].end());
    }
    add(h, conv1d(attention(q, k, v, NH, NH, HS), m[p + "attn.c_proj.weight"], &m[p + "attn.c_proj.bias"], C));
    Mat f = conv1d(layer_norm(h, m[p + "ln_2.weight"], m[p + "ln_2.bias"]), m[p + "mlp.c_fc.weight"], &m[p + "mlp.c_fc.bias"], 4 * C);
    for (auto& row : f)
      for (double& x : row) x = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    add(h, conv1d(f, m[p + "mlp.c_proj.weight"], &m[p + "mlp.c_proj.bias"], C));
  }
  return logits_of(layer_norm(h, m["transformer.ln_f.weight"], m["transformer.ln_f.bias"]), m["transformer.wte.weight"], V);
}

// rotate_half RoPE (modeling_llama.py's apply_rotary_pos_emb): within each head, element i and
// i + HS/2 turn by position * theta^(-2i/HS), the angle computed in FP32 as HF computes it.
void rope(Mat& x, int heads, int HS, double theta) {
  for (size_t t = 0; t < x.size(); ++t)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < HS / 2; ++i) {
        const float inv_freq = static_cast<float>(1.0 / std::pow(theta, 2.0 * i / HS));
        const float angle = static_cast<float>(t) * inv_freq;
        double& a = x[t][h * HS + i];
        double& b = x[t][h * HS + i + HS / 2];
        const double c = std::cos(angle), s = std::sin(angle), a0 = a, b0 = b;
        a = a0 * c - b0 * s;
        b = b0 * c + a0 * s;
      }
}

// LlamaForCausalLM: RMSNorm, RoPE on q and k, grouped K/V heads, SwiGLU down(silu(gate) * up).
Mat llama_forward(const HfModel& m, const json& cfg, const std::vector<int>& tokens) {
  const size_t C = cfg["hidden_size"], V = cfg["vocab_size"], F = cfg["intermediate_size"];
  const int NH = cfg["num_attention_heads"], KV = cfg["num_key_value_heads"], L = cfg["num_hidden_layers"];
  const int HS = static_cast<int>(C) / NH;
  const double eps = cfg["rms_norm_eps"], theta = cfg["rope_theta"];
  Mat h(tokens.size(), std::vector<double>(C));
  for (size_t t = 0; t < tokens.size(); ++t)
    for (size_t i = 0; i < C; ++i) h[t][i] = m["model.embed_tokens.weight"][tokens[t] * C + i];
  for (int l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const Mat a = rms_norm(h, m[p + "input_layernorm.weight"], eps);
    Mat q = linear(a, m[p + "self_attn.q_proj.weight"], NH * HS);
    Mat k = linear(a, m[p + "self_attn.k_proj.weight"], KV * HS);
    const Mat v = linear(a, m[p + "self_attn.v_proj.weight"], KV * HS);
    rope(q, NH, HS, theta);
    rope(k, KV, HS, theta);
    add(h, linear(attention(q, k, v, NH, KV, HS), m[p + "self_attn.o_proj.weight"], C));
    const Mat b = rms_norm(h, m[p + "post_attention_layernorm.weight"], eps);
    Mat gate = linear(b, m[p + "mlp.gate_proj.weight"], F);
    const Mat up = linear(b, m[p + "mlp.up_proj.weight"], F);
    for (size_t t = 0; t < gate.size(); ++t)
      for (size_t i = 0; i < F; ++i) gate[t][i] = gate[t][i] / (1 + std::exp(-gate[t][i])) * up[t][i];
    add(h, linear(gate, m[p + "mlp.down_proj.weight"], C));
  }
  const bool tied = cfg["tie_word_embeddings"];
  return logits_of(rms_norm(h, m["model.norm.weight"], eps), m[tied ? "model.embed_tokens.weight" : "lm_head.weight"], V);
}

}  // namespace

TEST_CASE("HF export: tensor names, shapes and dtypes are transformers' documented layout", "[hf]") {
  for (const TinyModel& a : {kGpt2, kLlama, kLlamaTied}) {
    DYNAMIC_SECTION(a.name) {
      Trained t(a);
      const CommandResult r = t.ptrain("export --checkpoint " + t.checkpoint.string() + " --format hf --out hf");
      INFO(r.output);
      REQUIRE(r.exit_code == 0);
      const RawFile f = read_raw(t.dir / "hf/model.safetensors");
      CHECK(f.metadata == json{{"format", "pt"}});
      std::map<std::string, std::vector<int64_t>> got;
      for (const auto& [name, tensor] : f.tensors) {
        got[name] = tensor.shape;
        CHECK(tensor.dtype == "F32");
      }
      CHECK(got == documented_layout(a));
      CHECK_FALSE(fs::exists(t.dir / "hf/model.safetensors.index.json"));
      CHECK_FALSE(fs::exists(t.dir / "hf/vocab.json"));  // synthetic data: no tokenizer to ship

      const json cfg = json::parse(read_file(t.dir / "hf/config.json"));
      CHECK(cfg["bos_token_id"].is_null());
      CHECK(cfg["eos_token_id"].is_null());
      CHECK(cfg["vocab_size"] == 200);
      CHECK(cfg["torch_dtype"] == "float32");
      if (std::string(a.name) == "gpt2") {
        CHECK(cfg["model_type"] == "gpt2");
        CHECK(cfg["architectures"] == json{"GPT2LMHeadModel"});
        CHECK(cfg["activation_function"] == "gelu_new");
        CHECK(cfg["layer_norm_epsilon"] == 1e-5);
        CHECK(cfg["n_positions"] == 16);
        CHECK(cfg["n_embd"] == 32);
        CHECK(cfg["n_layer"] == 2);
        CHECK(cfg["n_head"] == 2);
      } else {
        const bool tied = std::string(a.name) == "llama tied";
        CHECK(cfg["model_type"] == "llama");
        CHECK(cfg["architectures"] == json{"LlamaForCausalLM"});
        CHECK(cfg["num_key_value_heads"] == (tied ? 1 : 2));
        CHECK(cfg["num_attention_heads"] == 4);
        CHECK(cfg["intermediate_size"] == (tied ? 40 : 48));
        CHECK(cfg["rope_theta"] == (tied ? 10000.0 : 500.0));
        CHECK(cfg["rms_norm_eps"] == 1e-5);
        CHECK(cfg["tie_word_embeddings"] == tied);
        CHECK(cfg["hidden_act"] == "silu");
        CHECK(cfg["rope_scaling"].is_null());
      }
    }
  }
}

TEST_CASE("HF export: a forward pass written from the HF layout gives ptrain's logits", "[hf]") {
  for (const TinyModel& a : {kGpt2, kLlama, kLlamaTied}) {
    DYNAMIC_SECTION(a.name) {
      Trained t(a);
      REQUIRE(t.ptrain("export --checkpoint " + t.checkpoint.string() + " --format hf --out hf").exit_code == 0);
      const CommandResult dumped = t.ptrain("eval run.yaml --checkpoint " + t.checkpoint.string() + " --dump-logits l.json");
      INFO(dumped.output);
      REQUIRE(dumped.exit_code == 0);
      const json ours = json::parse(read_file(t.dir / "l.json"));
      const std::vector<int> tokens = ours["tokens"];
      REQUIRE(tokens.size() == 16);

      HfModel m;
      for (const auto& [name, tensor] : read_raw(t.dir / "hf/model.safetensors").tensors) m.w[name] = tensor.f32();
      const json cfg = json::parse(read_file(t.dir / "hf/config.json"));
      const Mat theirs = std::string(a.name) == "gpt2" ? gpt2_forward(m, cfg, tokens) : llama_forward(m, cfg, tokens);
      double worst = 0, largest = 0;
      for (size_t pos = 0; pos < tokens.size(); ++pos) {
        const std::vector<float> row = ours["logits"][pos];
        REQUIRE(row.size() == 200);
        for (size_t v = 0; v < row.size(); ++v) {
          worst = std::max(worst, std::abs(row[v] - theirs[pos][v]));
          largest = std::max(largest, std::abs(theirs[pos][v]));
        }
      }
      WARN(a.name << ": largest |logit difference| " << worst << " (logits up to " << largest << ")");
      CHECK(largest > 0.25);  // trained weights, not a model whose logits are all near zero
      CHECK(worst < 1e-5);
    }
  }
}

TEST_CASE("HF export then import: fp32 is bit-identical, bf16 and fp16 are the weights rounded", "[hf]") {
  for (const TinyModel& a : {kGpt2, kLlama, kLlamaTied}) {
    DYNAMIC_SECTION(a.name) {
      Trained t(a);
      const std::vector<float> master = t.weights();
      REQUIRE(t.ptrain("export --checkpoint " + t.checkpoint.string() + " --format hf --out hf").exit_code == 0);
      const HfWeights back = read_hf_directory((t.dir / "hf").string(), t.config.model, "test");
      REQUIRE(back.params.size() == master.size());
      // Bit for bit, padded vocabulary rows (zero in both) included.
      CHECK(std::memcmp(back.params.data(), master.data(), master.size() * 4) == 0);

      // Training from the export starts where the checkpoint ended: its step-0 evaluation
      // equals an evaluation of the checkpoint itself.
      const CommandResult init = t.ptrain(
          "train run.yaml --set run.name=init --set model.init_from=hf --set training.eval_every=3 --set training.steps=3");
      INFO(init.output);
      REQUIRE(init.exit_code == 0);
      CHECK_THAT(init.output, Catch::Contains("initialised from hf (Hugging Face"));
      const CommandResult eval = t.ptrain("eval run.yaml --checkpoint " + t.checkpoint.string());
      char expected[32];
      std::snprintf(expected, sizeof expected, "val_loss %.6f", read_metrics(t.dir / "runs/init/metrics.jsonl").front()["val_loss"].get<double>());
      CHECK_THAT(eval.output, Catch::Contains(expected));

      for (const char* dtype : {"bf16", "fp16"}) {
        const std::string out = std::string("hf-") + dtype;
        REQUIRE(t.ptrain("export --checkpoint " + t.checkpoint.string() + " --format hf --out " + out + " --dtype " + dtype)
                    .exit_code == 0);
        const RawFile f = read_raw(t.dir / out / "model.safetensors");
        const std::vector<HfTensorSpec> specs = hf_tensor_specs(t.config.model);
        for (const HfTensorSpec& spec : specs) {
          const RawTensor& raw = f.tensors.at(spec.name);
          CHECK(raw.dtype == (std::string(dtype) == "bf16" ? "BF16" : "F16"));
          const std::vector<float> exact = hf_values(spec, master.data());
          const std::vector<uint16_t> bits = raw.u16();
          REQUIRE(bits.size() == exact.size());
          for (size_t i = 0; i < exact.size(); ++i)
            REQUIRE(bits[i] == (std::string(dtype) == "bf16" ? bf16_bits(exact[i]) : fp16_bits(exact[i])));
        }
        // Export -> import -> export is byte-identical.
        const HfWeights rounded = read_hf_directory((t.dir / out).string(), t.config.model, "test");
        HfDirectoryContents again;
        again.specs = specs;
        again.flat = rounded.params.data();
        again.dtype = std::string(dtype) == "bf16" ? StDtype::bf16 : StDtype::f16;
        write_hf_directory((t.dir / (out + "-again")).string(), again);
        CHECK(read_file(t.dir / (out + "-again") / "model.safetensors") == read_file(t.dir / out / "model.safetensors"));
        const std::string json_again = json::parse(read_file(t.dir / out / "config.json")).dump();
        CHECK(json::parse(json_again)["torch_dtype"] == (std::string(dtype) == "bf16" ? "bfloat16" : "float16"));
      }
    }
  }
}

TEST_CASE("HF export: shards above --max-shard-size with an index, and import reads them", "[hf]") {
  Trained t(kLlama);
  const CommandResult r = t.ptrain("export --checkpoint " + t.checkpoint.string() + " --format hf --out hf --max-shard-size 20KB");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const json index = json::parse(read_file(t.dir / "hf/model.safetensors.index.json"));
  std::set<std::string> files;
  int64_t total = 0;
  for (const auto& [name, file] : index["weight_map"].items()) {
    files.insert(file.get<std::string>());
    const RawTensor& raw = read_raw(t.dir / "hf" / file.get<std::string>()).tensors.at(name);
    total += static_cast<int64_t>(raw.bytes.size());
  }
  CHECK(files.size() > 2);
  CHECK(index["metadata"]["total_size"] == total);
  CHECK(files.count("model-00001-of-0000" + std::to_string(files.size()) + ".safetensors") == 1);
  CHECK_FALSE(fs::exists(t.dir / "hf/model.safetensors"));
  for (const auto& file : files) {
    // At most 20 KB of tensor data, or one tensor alone that is larger (save_pretrained's rule).
    const RawFile shard = read_raw(t.dir / "hf" / file);
    size_t bytes = 0;
    for (const auto& [name, tensor] : shard.tensors) bytes += tensor.bytes.size();
    CHECK((bytes <= 20000 || shard.tensors.size() == 1));
    CHECK(shard.metadata == json{{"format", "pt"}});
  }
  const HfWeights back = read_hf_directory((t.dir / "hf").string(), t.config.model, "test");
  CHECK(back.files.size() == files.size());
  CHECK(back.params == t.weights());

  // The index is the one truth of where each tensor is: a tensor found in another file than the
  // index names, or named in a file that does not hold it, is refused by name.
  const auto refused_index = [&](const std::function<void(json&)>& change, const std::vector<std::string>& words) {
    fs::remove_all(t.dir / "bad");
    fs::copy(t.dir / "hf", t.dir / "bad");
    json edited = index;
    change(edited);
    write_file(t.dir / "bad/model.safetensors.index.json", edited.dump());
    const CommandResult dry = t.ptrain("train run.yaml --set run.name=x --set model.init_from=bad --dry-run");
    INFO(dry.output);
    CHECK(dry.exit_code == 2);
    for (const auto& w : words) CHECK_THAT(dry.output, Catch::Contains(w));
  };
  const std::string norm_file = index["weight_map"]["model.norm.weight"].get<std::string>();
  const std::string other_file = *std::find_if(files.begin(), files.end(), [&](const std::string& f) { return f != norm_file; });
  refused_index([&](json& j) { j["weight_map"]["model.norm.weight"] = other_file; },
                {"model.norm.weight is here, but model.safetensors.index.json names " + other_file});
  refused_index([&](json& j) { j["weight_map"]["model.layers.0.extra.weight"] = norm_file; },
                {"weight_map puts tensor model.layers.0.extra.weight in " + norm_file + ", which does not hold it"});
  refused_index([&](json& j) { j["weight_map"].erase("model.norm.weight"); },
                {"model.norm.weight is not in model.safetensors.index.json's weight_map"});
}

TEST_CASE("HF import: links are followed inside the directory and into the HF cache's blobs, never elsewhere",
          "[hf][hardening]") {
  Trained t(kLlama);
  REQUIRE(t.ptrain("export --checkpoint " + t.checkpoint.string() + " --format hf --out hf").exit_code == 0);
  // Hugging Face's cache: snapshots/<revision>/<file> -> ../../blobs/<hash>.
  const fs::path repo = t.dir / "cache/models--me--tiny";
  fs::create_directories(repo / "blobs");
  fs::create_directories(repo / "snapshots/abc123");
  for (const char* name : {"config.json", "model.safetensors"}) {
    fs::copy_file(t.dir / "hf" / name, repo / "blobs" / (std::string("blob-") + name));
    fs::create_symlink(fs::path("../../blobs") / (std::string("blob-") + name), repo / "snapshots/abc123" / name);
  }
  const CommandResult cached =
      t.ptrain("train run.yaml --set run.name=cached --set model.init_from=cache/models--me--tiny/snapshots/abc123 --dry-run");
  INFO(cached.output);
  CHECK(cached.exit_code == 0);

  // A link out of the directory: refused, and nothing of the file it reaches is printed.
  write_file(t.dir / "secret.txt", "SECRET-BYTES-0123456789");
  fs::create_directories(t.dir / "planted");
  fs::copy_file(t.dir / "hf/config.json", t.dir / "planted/config.json");
  fs::create_symlink(t.dir / "secret.txt", t.dir / "planted/model.safetensors");
  const CommandResult planted = t.ptrain("train run.yaml --set run.name=planted --set model.init_from=planted");
  INFO(planted.output);
  CHECK(planted.exit_code == 2);
  CHECK_THAT(planted.output, Catch::Contains("model.safetensors\" is a symbolic link to a file outside"));
  CHECK_THAT(planted.output, !Catch::Contains("SECRET") && !Catch::Contains("0123456789"));
  CHECK_FALSE(fs::exists(t.dir / "runs/planted"));
  // The same file reached without a link: it is read, found not to be safetensors, and no byte shown.
  fs::remove(t.dir / "planted/model.safetensors");
  fs::copy_file(t.dir / "secret.txt", t.dir / "planted/model.safetensors");
  const CommandResult copied = t.ptrain("train run.yaml --set run.name=planted --set model.init_from=planted");
  CHECK(copied.exit_code == 2);
  CHECK_THAT(copied.output, Catch::Contains("not a valid safetensors file") && !Catch::Contains("SECRET"));
  // A checkpoint's files obey the same rule.
  const fs::path ck = t.dir / "ck-copy";
  fs::copy(t.checkpoint, ck);
  fs::rename(ck / "weights.safetensors", t.dir / "weights-elsewhere.safetensors");
  fs::create_symlink(t.dir / "weights-elsewhere.safetensors", ck / "weights.safetensors");
  const CommandResult linked_ck = t.ptrain("inspect " + ck.string());
  CHECK(linked_ck.exit_code == 2);
  CHECK_THAT(linked_ck.output, Catch::Contains("weights.safetensors\" is a symbolic link to a file outside"));
}

TEST_CASE("HF import: HF's own gpt2 names (no transformer. prefix, attn.bias masks, tied lm_head)", "[hf]") {
  Trained t(kGpt2);
  REQUIRE(t.ptrain("export --checkpoint " + t.checkpoint.string() + " --format hf --out hf").exit_code == 0);
  // Rewrite the file as the Hub's gpt2 keeps it.
  RawFile f = read_raw(t.dir / "hf/model.safetensors");
  std::vector<std::string> keep;  // the data the views point into
  std::vector<SafetensorView> views;
  std::vector<float> mask(16 * 16, 1.0f);
  std::map<std::string, RawTensor> renamed;
  for (auto& [name, tensor] : f.tensors) renamed[name.substr(std::string("transformer.").size())] = tensor;
  renamed["lm_head.weight"] = f.tensors.at("transformer.wte.weight");
  for (const auto& [name, tensor] : renamed) views.push_back({name, tensor.shape, tensor.bytes.data()});
  for (int l = 0; l < 2; ++l) views.push_back({"h." + std::to_string(l) + ".attn.bias", {1, 1, 16, 16}, mask.data()});
  fs::create_directories(t.dir / "hub");
  write_safetensors((t.dir / "hub/model.safetensors").string(), views, {{"format", "pt"}});
  json cfg = json::parse(read_file(t.dir / "hf/config.json"));
  cfg["summary_type"] = "cls_index";  // keys the Hub's gpt2 config has and ptrain does not use
  cfg["task_specific_params"] = {{"text-generation", {{"do_sample", true}}}};
  write_file(t.dir / "hub/config.json", cfg.dump());
  const HfWeights back = read_hf_directory((t.dir / "hub").string(), t.config.model, "test");
  CHECK(back.params == t.weights());
  CHECK(back.skipped.size() == 2);
  CHECK(std::find(back.ignored.begin(), back.ignored.end(), "summary_type") != back.ignored.end());
  CHECK(std::find(back.ignored.begin(), back.ignored.end(), "task_specific_params") != back.ignored.end());
  const CommandResult dry = t.ptrain("train run.yaml --set run.name=hub --set model.init_from=hub --dry-run");
  INFO(dry.output);
  CHECK(dry.exit_code == 0);
  CHECK_THAT(dry.output, Catch::Contains("attention-mask buffers skipped") && Catch::Contains("summary_type"));
}

TEST_CASE("HF import: bad directories are refused with exit 2, naming the file and the tensor or key", "[hf][hardening]") {
  Trained t(kLlama);
  REQUIRE(t.ptrain("export --checkpoint " + t.checkpoint.string() + " --format hf --out hf").exit_code == 0);
  const RawFile good = read_raw(t.dir / "hf/model.safetensors");
  const std::string config = read_file(t.dir / "hf/config.json");
  int case_number = 0;
  // A copy of the export with `edit` applied, then a dry run from it: exit 2 and every word named.
  const auto refused = [&](const std::function<void(const fs::path&)>& edit, const std::vector<std::string>& words) {
    const fs::path dir = t.dir / ("bad" + std::to_string(++case_number));
    fs::copy(t.dir / "hf", dir);
    edit(dir);
    const CommandResult r = t.ptrain("train run.yaml --set run.name=x" + std::to_string(case_number) +
                                     " --set model.init_from=" + dir.filename().string());
    INFO(r.output);
    CHECK(r.exit_code == 2);
    for (const auto& w : words) CHECK_THAT(r.output, Catch::Contains(w));
    CHECK_FALSE(fs::exists(t.dir / ("runs/x" + std::to_string(case_number))));
  };
  const auto rewrite = [&](const fs::path& dir, const std::function<void(std::map<std::string, RawTensor>&)>& change) {
    std::map<std::string, RawTensor> tensors = good.tensors;
    change(tensors);
    std::vector<SafetensorView> views;
    for (const auto& [name, tensor] : tensors) views.push_back({name, tensor.shape, tensor.bytes.data()});
    write_safetensors((dir / "model.safetensors").string(), views, {{"format", "pt"}});
  };
  const auto edit_config = [&](const fs::path& dir, const std::function<void(json&)>& change) {
    json cfg = json::parse(config);
    change(cfg);
    write_file(dir / "config.json", cfg.dump());
  };

  refused([](const fs::path& d) { fs::remove(d / "config.json"); }, {"bad1", "config.json"});
  refused([&](const fs::path& d) { edit_config(d, [](json& c) { c["model_type"] = "mistral"; }); },
          {"config.json", "model_type \"mistral\"", "model.arch"});
  refused([&](const fs::path& d) { edit_config(d, [](json& c) { c["num_key_value_heads"] = 4; c["rope_theta"] = 10000.0; }); },
          {"config.json", "num_key_value_heads 4", "model.n_kv_head", "rope_theta", "model.rope_theta"});
  // A null is transformers' default (num_attention_heads), and said as a null, not as the default.
  refused([&](const fs::path& d) { edit_config(d, [](json& c) { c["num_key_value_heads"] = nullptr; }); },
          {"config.json", "num_key_value_heads null in config.json (transformers' default 4) vs 2 in model.n_kv_head"});
  refused([&](const fs::path& d) { edit_config(d, [](json& c) { c["rope_scaling"] = {{"rope_type", "llama3"}}; }); },
          {"config.json", "rope_scaling"});
  refused([&](const fs::path& d) { edit_config(d, [](json& c) { c.erase("rope_theta"); c["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500.0}}; }); },
          {"config.json", "rope_parameters", "llama3"});
  refused([&](const fs::path& d) { edit_config(d, [](json& c) { c.erase("rope_theta"); c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e4}}; }); },
          {"config.json", "rope_theta 10000.0", "model.rope_theta"});
  refused([&](const fs::path& d) { edit_config(d, [](json& c) { c["attention_bias"] = true; c["head_dim"] = 16; }); },
          {"attention_bias", "head_dim 16"});
  refused([&](const fs::path& d) { rewrite(d, [](auto& m) { m.erase("model.layers.1.mlp.up_proj.weight"); }); },
          {"bad9", "model.layers.1.mlp.up_proj.weight", "missing"});
  refused([&](const fs::path& d) { rewrite(d, [&](auto& m) { m["model.layers.0.self_attn.q_norm.weight"] = m.at("model.norm.weight"); }); },
          {"model.safetensors", "unexpected tensor model.layers.0.self_attn.q_norm.weight"});
  refused([&](const fs::path& d) {
    rewrite(d, [](auto& m) {
      RawTensor& k = m.at("model.layers.0.self_attn.k_proj.weight");
      k.shape = {32, 16};  // the K/V heads' rows taken as columns: same size, wrong shape
    });
  }, {"model.safetensors", "model.layers.0.self_attn.k_proj.weight", "[32, 16]", "expected [16, 32]"});
  refused([&](const fs::path& d) { fs::resize_file(d / "model.safetensors", fs::file_size(d / "model.safetensors") - 100); },
          {"model.safetensors", "not a valid safetensors file"});
  refused([&](const fs::path& d) {
    fs::remove(d / "model.safetensors");
  }, {"model.safetensors", "model.safetensors.index.json"});
  // One dtype, the one config.json names: bytes labelled otherwise would be read as other numbers.
  refused([&](const fs::path& d) { edit_config(d, [](json& c) { c["torch_dtype"] = "float16"; }); },
          {"model.safetensors", "is labelled F32, but config.json's torch_dtype is float16"});
  // BF16 bytes labelled F16 (the same size, other numbers): the header's length kept.
  REQUIRE(t.ptrain("export --checkpoint " + t.checkpoint.string() + " --format hf --out hf-bf16 --dtype bf16").exit_code == 0);
  std::string bytes = read_file(t.dir / "hf-bf16/model.safetensors");
  const size_t at = bytes.find("\"BF16\"");
  REQUIRE(at != std::string::npos);
  bytes.replace(at, 6, "\"F16\" ");
  write_file(t.dir / "hf-bf16/model.safetensors", bytes);
  const CommandResult relabelled = t.ptrain("train run.yaml --set run.name=relabelled --set model.init_from=hf-bf16");
  INFO(relabelled.output);
  CHECK(relabelled.exit_code == 2);
  CHECK_THAT(relabelled.output, Catch::Contains("is labelled F16, but config.json's torch_dtype is bfloat16"));
}

TEST_CASE("HF export refuses what it cannot write or must not touch, before writing", "[hf][hardening]") {
  Trained t(kLlama);
  const std::string ck = t.checkpoint.string();
  const std::string weights_before = read_file(t.checkpoint / "weights.safetensors");
  const auto refused = [&](const std::string& args, const std::vector<std::string>& words) {
    const CommandResult r = t.ptrain("export --checkpoint " + ck + " --format hf " + args);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    for (const auto& w : words) CHECK_THAT(r.output, Catch::Contains(w));
  };
  fs::create_directories(t.dir / "full");
  write_file(t.dir / "full/notes.txt", "mine");
  refused("--out full", {"--out", "full", "not empty", "--force"});
  CHECK(read_file(t.dir / "full/notes.txt") == "mine");
  refused("--out " + ck, {"--out", "checkpoint"});
  refused("--out " + ck + "/hf", {"--out", "checkpoint"});
  refused("--out runs/r/checkpoints/hf", {"--out", "checkpoint directory"});
  refused("--out runs/r --force", {"--out", "not an earlier output of ptrain export --format hf"});
  refused("--out run.yaml", {"--out", "not a directory"});
  refused("--out x --max-shard-size 5XB", {"--max-shard-size", "5XB"});
  CHECK(read_file(t.checkpoint / "weights.safetensors") == weights_before);
  CHECK_FALSE(fs::exists(t.dir / "x"));

  // --force replaces an earlier export whole, and nothing else: not a directory with a
  // config.json beside a user's files, not a Hugging Face download, not an export a user added
  // a file to.
  refused("--out full --force", {"--out", "full", "not an earlier output"});
  CHECK(read_file(t.dir / "full/notes.txt") == "mine");
  write_file(t.dir / "full/config.json", "{}");
  refused("--out full --force", {"--out", "full", "not an earlier output"});
  CHECK(read_file(t.dir / "full/notes.txt") == "mine");
  fs::create_directories(t.dir / "download");
  write_file(t.dir / "download/config.json", R"({"model_type": "llama", "transformers_version": "4.46.0"})");
  write_file(t.dir / "download/model.safetensors", "weights");
  refused("--out download --force", {"--out", "download", "not an earlier output"});
  CHECK(read_file(t.dir / "download/model.safetensors") == "weights");
  const CommandResult first = t.ptrain("export --checkpoint " + ck + " --format hf --out prev/");  // a trailing slash too
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  write_file(t.dir / "prev/README.md", "my model card");
  refused("--out prev", {"--out", "prev", "not empty", "--force"});
  refused("--out prev --force", {"--out", "prev", "not an earlier output"});
  CHECK(read_file(t.dir / "prev/README.md") == "my model card");
  fs::remove(t.dir / "prev/README.md");
  const CommandResult forced = t.ptrain("export --checkpoint " + ck + " --format hf --out prev --force --dtype bf16");
  INFO(forced.output);
  CHECK(forced.exit_code == 0);
  CHECK(read_raw(t.dir / "prev/model.safetensors").tensors.at("model.norm.weight").dtype == "BF16");
  for (const auto& entry : fs::directory_iterator(t.dir))  // no temporary or set-aside directory left
    CHECK(entry.path().filename().string().find("ptrain-export") == std::string::npos);
  CHECK(read_file(t.checkpoint / "weights.safetensors") == weights_before);

  // QK-norm has no place in LlamaForCausalLM.
  const CommandResult qk = t.ptrain("train run.yaml --set run.name=qk --set model.qk_norm=true --set training.steps=2");
  REQUIRE(qk.exit_code == 0);
  const CommandResult r = t.ptrain("export --checkpoint runs/qk/checkpoints/step_00000002 --format hf --out qk-hf");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("model.qk_norm"));
  CHECK_FALSE(fs::exists(t.dir / "qk-hf"));
}

TEST_CASE("gpt2: the exported vocab.json and merges.txt are GPT-2's own files", "[hf][tokenizer]") {
  const std::string hf = (fs::path(data_cache_dir()) / "gpt2-hf").string();
  REQUIRE(fs::exists(default_vocabulary("gpt2")));
  REQUIRE(fs::exists(fs::path(hf) / "vocab.json"));
  const Tokenizer tiktoken = Tokenizer::load("gpt2");
  CHECK(json::parse(bpe_vocab_json(*tiktoken.bpe())) == json::parse(read_file(fs::path(hf) / "vocab.json")));
  // merges.txt line by line (OpenAI's vocab.bpe ends with a blank line).
  const auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line))
      if (!line.empty()) out.push_back(line);
    return out;
  };
  const std::vector<std::string> ours = lines(bpe_merges_txt(*tiktoken.bpe()));
  const std::vector<std::string> theirs = lines(read_file(fs::path(hf) / "merges.txt"));
  CHECK(ours.size() == 50001);
  CHECK(ours == theirs);
  CHECK(json::parse(gpt2_tokenizer_config(1024))["eos_token"] == "<|endoftext|>");
}
