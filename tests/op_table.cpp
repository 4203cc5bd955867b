// The op cases (op_table.h) and the runner that places a case's operands on two backends.
#include "op_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "core/rng.h"
#include "model/rope_table.h"
#include "precision/formats.h"

namespace ptrain::test {
namespace {

constexpr int kB = 2, kT = 64, kC = 768, kNH = 12;  // a GPT-2 124M layer
const Format kFormats[] = {Format::fp32, Format::bf16, Format::fp16};
const int kSizes[] = {1, 7, 19, 111, 769};  // odd sizes: ragged vectors, tails, unaligned rows

std::string shape_text(std::initializer_list<std::pair<const char*, int64_t>> dims) {
  std::string s;
  for (const auto& [name, value] : dims) s += std::string(s.empty() ? "" : " ") + name + "=" + std::to_string(value);
  return s;
}

// Operand makers: an input on format f's grid, a result the op writes, one it adds into.
OpOperand in(std::string name, std::vector<int64_t> shape, Format f, float scale, uint64_t seed) {
  return {std::move(name), std::move(shape), f, false, Check::none, Fill::uniform, scale, seed, 0};
}
OpOperand out(std::string name, std::vector<int64_t> shape, Format f, Check check) {
  return {std::move(name), std::move(shape), f, true, check, Fill::zeros, 0.0f, 0, 0};
}
OpOperand added(std::string name, std::vector<int64_t> shape, Format f, Check check, float scale, uint64_t seed) {
  return {std::move(name), std::move(shape), f, false, check, Fill::uniform, scale, seed, 0};
}
OpOperand tokens(std::string name, std::vector<int64_t> shape, int vocab) {
  return {std::move(name), std::move(shape), Format::fp32, false, Check::none, Fill::tokens, 0.0f, 1, vocab};
}
// Filled by the case's prepare step on the reference backend.
OpOperand saved(std::string name, std::vector<int64_t> shape, Format f) {
  return {std::move(name), std::move(shape), f, false, Check::none, Fill::zeros, 0.0f, 0, 0};
}

using Run = std::function<void(Backend&, std::vector<Tensor>&)>;

void add_norm_cases(std::vector<OpCase>& cases) {
  struct Rows {
    int N, C;
  };
  const Rows shapes[] = {{1, 1}, {7, 7}, {19, 19}, {111, 111}, {7, 769}, {769, 19}, {kB * kT, kC}};
  const Format stat = Format::fp32;
  for (const Format f : kFormats)
    for (const Rows& s : shapes) {
      const std::string dims = std::string(format_name(f)) + " " + shape_text({{"N", s.N}, {"C", s.C}});
      const std::vector<int64_t> rows{s.N, s.C}, width{s.C}, per_row{s.N};
      // operands 0-5: inp, weight, bias, out, mean, rstd
      std::vector<OpOperand> forward{in("inp", rows, f, 2.0f, 11),
                                     in("weight", width, f, 1.0f, 12),
                                     in("bias", width, f, 0.5f, 13),
                                     out("out", rows, f, Check::op),
                                     out("mean", per_row, stat, Check::statistic),
                                     out("rstd", per_row, stat, Check::statistic)};
      const Run layernorm = [](Backend& b, std::vector<Tensor>& t) {
        b.layernorm_forward(t[3], t[4], t[5], t[0], t[1], t[2]);
      };
      cases.push_back({"layernorm", "layernorm_forward " + dims, forward, nullptr, layernorm});
      // operands 6-9: dout, dinp, dweight, dbias; both backwards from the reference's statistics
      std::vector<OpOperand> backward{forward[0],
                                      forward[1],
                                      forward[2],
                                      saved("out", rows, f),
                                      saved("mean", per_row, stat),
                                      saved("rstd", per_row, stat),
                                      in("dout", rows, f, 1.0f, 14),
                                      added("dinp", rows, f, Check::op, 0.5f, 15),
                                      added("dweight", width, f, Check::op, 0.5f, 16),
                                      added("dbias", width, f, Check::op, 0.5f, 17)};
      cases.push_back(
          {"layernorm", "layernorm_backward " + dims, backward, layernorm, [](Backend& b, std::vector<Tensor>& t) {
             b.layernorm_backward(t[7], t[8], t[9], t[6], t[0], t[1], t[4], t[5]);
           }});

      // operands 0-3: inp, weight, out, rstd
      std::vector<OpOperand> rms{in("inp", rows, f, 2.0f, 61), in("weight", width, f, 1.0f, 62),
                                 out("out", rows, f, Check::op), out("rstd", per_row, stat, Check::statistic)};
      const Run rmsnorm = [](Backend& b, std::vector<Tensor>& t) { b.rmsnorm_forward(t[2], t[3], t[0], t[1], 1e-5f); };
      cases.push_back({"rmsnorm", "rmsnorm_forward " + dims, rms, nullptr, rmsnorm});
      // operands 4-6: dout, dinp, dweight
      std::vector<OpOperand> rms_backward{rms[0],
                                          rms[1],
                                          saved("out", rows, f),
                                          saved("rstd", per_row, stat),
                                          in("dout", rows, f, 1.0f, 63),
                                          added("dinp", rows, f, Check::op, 0.5f, 64),
                                          added("dweight", width, f, Check::op, 0.5f, 65)};
      cases.push_back(
          {"rmsnorm", "rmsnorm_backward " + dims, rms_backward, rmsnorm,
           [](Backend& b, std::vector<Tensor>& t) { b.rmsnorm_backward(t[5], t[6], t[4], t[0], t[1], t[3]); }});
    }
}

// QK-norm over q's and k's heads of qkv rows; v's heads copied (forward) or their gradient added.
void add_qk_norm_cases(std::vector<OpCase>& cases) {
  struct Heads {
    int N, NH, KV, HS;
  };
  const Heads shapes[] = {{1, 1, 1, 1}, {7, 4, 2, 6}, {19, 3, 3, 5}, {kB * kT, kNH, 4, kC / kNH}};
  for (const Format f : kFormats)
    for (const Heads& s : shapes) {
      const int64_t W = int64_t{s.NH + 2 * s.KV} * s.HS, stats = int64_t{s.N} * (s.NH + s.KV);
      const int NH = s.NH;
      const std::string dims =
          std::string(format_name(f)) + " " + shape_text({{"N", s.N}, {"NH", s.NH}, {"KV", s.KV}, {"HS", s.HS}});
      // operands 0-4: inp, q_weight, k_weight, out, rstd
      std::vector<OpOperand> forward{in("inp", {s.N, W}, f, 2.0f, 71), in("q_weight", {s.HS}, f, 1.0f, 72),
                                     in("k_weight", {s.HS}, f, 1.0f, 73), out("out", {s.N, W}, f, Check::op),
                                     out("rstd", {stats}, Format::fp32, Check::statistic)};
      const Run qk_norm = [NH](Backend& b, std::vector<Tensor>& t) {
        b.qk_norm_forward(t[3], t[4], t[0], t[1], t[2], NH, 1e-5f);
      };
      cases.push_back({"qk_norm", "qk_norm_forward " + dims, forward, nullptr, qk_norm});
      // operands 5-8: dout, dinp, dq_weight, dk_weight
      std::vector<OpOperand> backward{forward[0],
                                      forward[1],
                                      forward[2],
                                      saved("out", {s.N, W}, f),
                                      saved("rstd", {stats}, Format::fp32),
                                      in("dout", {s.N, W}, f, 1.0f, 74),
                                      added("dinp", {s.N, W}, f, Check::op, 0.5f, 75),
                                      added("dq_weight", {s.HS}, f, Check::op, 0.5f, 76),
                                      added("dk_weight", {s.HS}, f, Check::op, 0.5f, 77)};
      cases.push_back(
          {"qk_norm", "qk_norm_backward " + dims, backward, qk_norm, [NH](Backend& b, std::vector<Tensor>& t) {
             b.qk_norm_backward(t[6], t[7], t[8], t[5], t[0], t[1], t[2], t[4], NH);
           }});
    }
}

void add_llama_mlp_cases(std::vector<OpCase>& cases) {
  for (const Format f : kFormats) {
    const std::string name = format_name(f);
    // q (4 heads) and k (2 heads) turn, v (2 heads) stays; head size 38.
    const int B = 2, T = 19, hs = 38, width = 8 * hs, heads = 6;
    const std::vector<OpOperand> rope{in("table", {T, hs / 2, 2}, Format::fp32, 0.0f, 0),
                                      added("x", {B, T, width}, f, Check::op, 1.0f, 66)};
    std::vector<OpOperand> rope_in = rope;
    rope_in[0].fill = Fill::rope;
    const std::string rope_dims = name + " " + shape_text({{"B", B}, {"T", T}, {"HS", hs}, {"heads", heads}});
    cases.push_back({"rope", "rope_forward " + rope_dims, rope_in, nullptr,
                     [](Backend& b, std::vector<Tensor>& t) { b.rope_forward(t[1], t[0], heads); }});
    cases.push_back({"rope", "rope_backward " + rope_dims, rope_in, nullptr,
                     [](Backend& b, std::vector<Tensor>& t) { b.rope_backward(t[1], t[0], heads); }});

    for (const auto& [N, H] : {std::pair{19, 111}, {kB * kT, 4 * kC}}) {
      const std::string dims = name + " " + shape_text({{"N", N}, {"H", H}});
      const OpOperand gate_up = in("gate_up", {N, 2 * H}, f, 2.0f, 67);
      cases.push_back({"swiglu",
                       "swiglu_forward " + dims,
                       {gate_up, out("out", {N, H}, f, Check::op)},
                       nullptr,
                       [](Backend& b, std::vector<Tensor>& t) { b.swiglu_forward(t[1], t[0]); }});
      cases.push_back(
          {"swiglu",
           "swiglu_backward " + dims,
           {gate_up, in("dout", {N, H}, f, 1.0f, 68), added("dgate_up", {N, 2 * H}, f, Check::op, 0.5f, 69)},
           nullptr,
           [](Backend& b, std::vector<Tensor>& t) { b.swiglu_backward(t[2], t[1], t[0]); }});
    }
  }
}

void add_elementwise_cases(std::vector<OpCase>& cases) {
  std::vector<std::vector<int64_t>> shapes;
  for (const int n : kSizes) shapes.push_back({n});
  shapes.push_back({kB, kT, 4 * kC});
  for (const Format f : kFormats)
    for (const auto& shape : shapes) {
      const std::string dims = std::string(format_name(f)) + " n=" + std::to_string(shape_numel(shape));
      const OpOperand inp = in("inp", shape, f, 4.0f, 61);
      cases.push_back({"gelu",
                       "gelu_forward " + dims,
                       {inp, out("out", shape, f, Check::op)},
                       nullptr,
                       [](Backend& b, std::vector<Tensor>& t) { b.gelu_forward(t[1], t[0]); }});
      cases.push_back({"gelu",
                       "gelu_backward " + dims,
                       {inp, in("dout", shape, f, 1.0f, 62), added("dinp", shape, f, Check::op, 0.5f, 63)},
                       nullptr,
                       [](Backend& b, std::vector<Tensor>& t) { b.gelu_backward(t[2], t[0], t[1]); }});
      const OpOperand other = in("b", shape, f, 2.0f, 64);
      cases.push_back({"add",
                       "add " + dims,
                       {inp, other, out("out", shape, f, Check::op)},
                       nullptr,
                       [](Backend& b, std::vector<Tensor>& t) { b.add(t[2], t[0], t[1]); }});
      // In place, as the residual stream adds.
      cases.push_back({"add",
                       "add in place " + dims,
                       {added("a", shape, f, Check::op, 4.0f, 61), other},
                       nullptr,
                       [](Backend& b, std::vector<Tensor>& t) { b.add(t[0], t[0], t[1]); }});
    }
}

void add_matmul_cases(std::vector<OpCase>& cases) {
  struct Gemm {
    int N, C, OC;
  };
  // One row (decoding's single position) and one element: shapes cuBLASLt refuses a BIAS epilogue for.
  const Gemm shapes[] = {{1, 1, 1},      {1, 111, 769},   {7, 7, 19},           {19, 111, 7},
                         {111, 19, 769}, {769, 769, 111}, {kB * kT, kC, 3 * kC}};
  // Bias: none, 256-byte aligned (cuBLASLt's BIAS epilogue, or the bias kernel where cuBLASLt
  // refuses it for the shape), one element in (added by a kernel).
  const char* const kBiasModes[] = {"no bias", "aligned bias", "unaligned bias"};
  for (const Format f : kFormats)
    for (const Gemm& s : shapes) {
      const std::string dims = std::string(format_name(f)) + " " + shape_text({{"N", s.N}, {"C", s.C}, {"OC", s.OC}});
      const int OC = s.OC;
      for (int mode = 0; mode < 3; ++mode)
        cases.push_back({"matmul",
                         "matmul_forward " + dims + " " + kBiasModes[mode],
                         {in("inp", {s.N, s.C}, f, 1.0f, 21), in("weight", {s.OC, s.C}, f, 0.5f, 22),
                          in("bias", {s.OC + 1}, f, 1.0f, 23), out("out", {s.N, s.OC}, f, Check::gemm)},
                         nullptr,
                         [mode, OC](Backend& b, std::vector<Tensor>& t) {
                           b.matmul_forward(t[3], t[0], t[1], mode == 0 ? Tensor() : t[2].range(mode == 2 ? 1 : 0, OC));
                         }});
      // All three gradients, then each alone (the others empty); they accumulate (+=).
      const bool kWanted[4][3] = {{true, true, true}, {true, false, false}, {false, true, false}, {false, false, true}};
      for (const auto& wanted : kWanted) {
        const bool dinp = wanted[0], dweight = wanted[1], dbias = wanted[2];
        cases.push_back(
            {"matmul",
             "matmul_backward " + dims + (dinp ? " dinp" : "") + (dweight ? " dweight" : "") + (dbias ? " dbias" : ""),
             {in("dout", {s.N, s.OC}, f, 1.0f, 31), in("inp", {s.N, s.C}, f, 1.0f, 32),
              in("weight", {s.OC, s.C}, f, 0.5f, 33), added("dinp", {s.N, s.C}, f, Check::gemm, 0.5f, 34),
              added("dweight", {s.OC, s.C}, f, Check::gemm, 0.5f, 35), added("dbias", {s.OC}, f, Check::op, 0.5f, 36)},
             nullptr,
             [dinp, dweight, dbias](Backend& b, std::vector<Tensor>& t) {
               b.matmul_backward(dinp ? t[3] : Tensor(), dweight ? t[4] : Tensor(), dbias ? t[5] : Tensor(), t[0], t[1],
                                 t[2]);
             }});
      }
      cases.push_back({"matmul",
                       "bias_backward " + dims,
                       {in("dout", {s.N, s.OC}, f, 1.0f, 31), added("dbias", {s.OC}, f, Check::op, 0.5f, 37)},
                       nullptr,
                       [](Backend& b, std::vector<Tensor>& t) { b.bias_backward(t[1], t[0]); }});
    }
}

void add_attention_cases(std::vector<OpCase>& cases) {
  struct Attention {
    int B, T, NH, HS;
    int KV = 0;                                                       // K/V heads (grouped-query attention); 0 = NH
    int width() const { return (NH + 2 * (KV > 0 ? KV : NH)) * HS; }  // of a qkv row
    std::string text() const {
      return shape_text({{"B", B}, {"T", T}, {"NH", NH}, {"KV", KV > 0 ? KV : NH}, {"HS", HS}});
    }
  };
  const Attention shapes[] = {{1, 1, 1, 1},     {1, 7, 1, 7},     {2, 19, 3, 5},
                              {1, 111, 2, 8},   {1, 769, 1, 16},  {kB, kT, kNH, kC / kNH},
                              {2, 19, 4, 6, 2}, {1, 111, 4, 8, 1}};
  // Several tiles of keys (the decode kernel's are 256), the largest score past the first tile
  // likely at 700, and the shape of the model tests.
  const Attention decode_shapes[] = {{1, 1, 1, 1},   {1, 7, 1, 7},           {1, 19, 3, 5},
                                     {1, 700, 2, 8}, {1, kT, kNH, kC / kNH}, {1, 300, 4, 6, 2}};
  for (const Format f : kFormats) {
    const std::string name = format_name(f);
    for (const Attention& s : shapes) {
      const int NH = s.NH, C = s.NH * s.HS, W = s.width();
      const std::vector<int64_t> qkv{s.B, s.T, W}, rows{s.B, s.T, C}, probs{s.B, s.NH, s.T, s.T};
      const Run forward = [NH](Backend& b, std::vector<Tensor>& t) { b.attention_forward(t[1], t[2], t[0], NH); };
      cases.push_back(
          {"attention",
           "attention_forward " + name + " " + s.text(),
           {in("qkv", qkv, f, 1.0f, 51), out("out", rows, f, Check::gemm), out("att", probs, f, Check::gemm)},
           nullptr,
           forward});
      // Both backwards from the reference's output and probabilities.
      cases.push_back(
          {"attention",
           "attention_backward " + name + " " + s.text(),
           {in("qkv", qkv, f, 1.0f, 51), saved("out", rows, f), saved("att", probs, f), in("dout", rows, f, 1.0f, 52),
            added("dqkv", qkv, f, Check::gemm, 0.5f, 53)},
           forward,
           [NH](Backend& b, std::vector<Tensor>& t) { b.attention_backward(t[4], t[3], t[0], t[1], t[2], NH); }});
    }
    for (const Attention& s : decode_shapes) {
      const int NH = s.NH;
      cases.push_back({"attention",
                       "attention_decode " + name + " " + s.text(),
                       {in("qkv", {s.T, s.width()}, f, 1.0f, 54), out("out", {s.NH * s.HS}, f, Check::op)},
                       nullptr,
                       [NH](Backend& b, std::vector<Tensor>& t) { b.attention_decode(t[1], t[0], NH); }});
    }
  }
}

void add_embedding_and_classifier_cases(std::vector<OpCase>& cases) {
  struct Embedding {
    int B, T, C, V;
  };
  const Embedding embeddings[] = {{1, 1, 1, 1},      {2, 7, 7, 3},     {1, 19, 19, 111},
                                  {3, 111, 111, 19}, {1, 7, 769, 769}, {kB, kT, kC, 50304}};
  struct Classifier {
    int N, V, Vp;
  };
  const Classifier classifiers[] = {{1, 1, 1},       {7, 7, 8},     {19, 19, 128},
                                    {111, 111, 128}, {7, 769, 896}, {kB * kT, 50257, 50304}};
  for (const Format f : kFormats) {
    const std::string name = format_name(f);
    // wpe has more rows than T, as the model's.
    for (const Embedding& s : embeddings)
      cases.push_back({"embedding",
                       "embedding_forward " + name + " " + shape_text({{"B", s.B}, {"T", s.T}, {"C", s.C}, {"V", s.V}}),
                       {tokens("tokens", {s.B, s.T}, s.V), in("wte", {s.V, s.C}, f, 1.0f, 2),
                        in("wpe", {s.T + 3, s.C}, f, 1.0f, 3), out("out", {s.B, s.T, s.C}, f, Check::op)},
                       nullptr,
                       [](Backend& b, std::vector<Tensor>& t) { b.embedding_forward(t[3], t[0], t[1], t[2]); }});
    for (const Classifier& s : classifiers)
      for (const float dloss : {1.0f / static_cast<float>(s.N), 0.0f}) {
        const int V = s.V;
        cases.push_back({"classifier",
                         "classifier " + name + " " + shape_text({{"N", s.N}, {"V", s.V}, {"Vp", s.Vp}}) +
                             (dloss == 0.0f ? " no gradient" : ""),
                         {added("logits", {s.N, s.Vp}, f, Check::op, 4.0f, 81),
                          out("losses", {s.N}, Format::fp32, Check::statistic), tokens("targets", {s.N}, s.V)},
                         nullptr,
                         [V, dloss](Backend& b, std::vector<Tensor>& t) { b.classifier(t[0], t[1], t[2], V, dloss); }});
      }
  }
}

std::vector<OpCase> make_table() {
  std::vector<OpCase> cases;
  add_embedding_and_classifier_cases(cases);
  add_norm_cases(cases);
  add_qk_norm_cases(cases);
  add_llama_mlp_cases(cases);
  add_elementwise_cases(cases);
  add_matmul_cases(cases);
  add_attention_cases(cases);
  return cases;
}

// An operand's starting values (token ids as floats).
std::vector<float> starting_values(const OpOperand& o) {
  const size_t n = static_cast<size_t>(shape_numel(o.shape));
  std::vector<float> v(n, 0.0f);
  switch (o.fill) {
    case Fill::zeros:
      break;
    case Fill::uniform: {
      Rng rng(o.seed, 0x67726964);
      for (auto& x : v) x = round_to_format((2.0f * rng.uniform() - 1.0f) * o.scale, o.format, false);
      break;
    }
    case Fill::tokens: {
      Rng rng(o.seed, 0x746f6b);
      for (auto& x : v) x = static_cast<float>(rng.below(static_cast<uint64_t>(o.vocab)));
      break;
    }
    case Fill::rope: {
      if (o.shape.size() != 3) throw std::logic_error("op table: a RoPE table is (T, hs/2, 2)");
      v = rope_table(static_cast<int>(o.shape[0]), static_cast<int>(2 * o.shape[1]), 10000);
      break;
    }
  }
  return v;
}

// A case's operands on one backend, in its storage for each format, released on every path.
class Placement {
 public:
  Placement(Backend& backend, const std::vector<OpOperand>& operands, const std::vector<std::vector<float>>& values)
      : backend_(backend), operands_(operands) {
    try {
      for (size_t i = 0; i < operands.size(); ++i) {
        const OpOperand& o = operands[i];
        const bool ids = o.fill == Fill::tokens;
        const DType dtype = ids ? DType::i32 : backend.storage_for(o.format, DType::f32);
        void* p = backend.allocate(values[i].size() * dtype_size(dtype));
        blocks_.push_back(p);
        Tensor t(p, dtype, o.shape, backend.device());
        if (!ids) t.format = o.format;
        tensors.push_back(t);
        write(i, values[i]);
      }
    } catch (...) {
      release();
      throw;
    }
  }
  ~Placement() { release(); }
  Placement(const Placement&) = delete;
  Placement& operator=(const Placement&) = delete;

  void write(size_t i, const std::vector<float>& values) {
    if (operands_[i].fill == Fill::tokens) {
      const std::vector<int32_t> ids(values.begin(), values.end());
      backend_.upload_tokens(tensors[i], ids.data());
    } else {
      backend_.upload(tensors[i], values.data());
    }
  }
  std::vector<float> read(size_t i) {
    std::vector<float> v(static_cast<size_t>(tensors[i].numel()));
    backend_.download(v.data(), tensors[i]);
    return v;
  }
  // NaN in everything the op writes, so an element left unwritten fails.
  void poison_written() {
    for (size_t i = 0; i < operands_.size(); ++i)
      if (operands_[i].written) write(i, std::vector<float>(static_cast<size_t>(tensors[i].numel()), NAN));
  }

  std::vector<Tensor> tensors;

 private:
  void release() {
    for (void* p : blocks_) backend_.release(p);
    blocks_.clear();
  }
  Backend& backend_;
  const std::vector<OpOperand>& operands_;
  std::vector<void*> blocks_;
};

}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> table = make_table();
  return table;
}

std::vector<OpCase> op_cases(const std::string& family) {
  std::vector<OpCase> out;
  for (const OpCase& c : op_cases())
    if (c.family == family) out.push_back(c);
  if (out.empty()) throw std::logic_error("op table: no case of family " + family);
  return out;
}

std::vector<std::string> op_families() {
  std::vector<std::string> families;
  for (const OpCase& c : op_cases())
    if (std::find(families.begin(), families.end(), c.family) == families.end()) families.push_back(c.family);
  return families;
}

std::vector<OperandResult> run_op_case(const OpCase& c, Backend& reference, Backend& tested) {
  std::vector<std::vector<float>> values;
  for (const OpOperand& o : c.operands) values.push_back(starting_values(o));
  Placement ref(reference, c.operands, values);
  if (c.prepare) {
    c.prepare(reference, ref.tensors);
    for (size_t i = 0; i < c.operands.size(); ++i)
      if (c.operands[i].fill != Fill::tokens) values[i] = ref.read(i);
  }
  Placement under_test(tested, c.operands, values);
  ref.poison_written();
  under_test.poison_written();
  c.run(reference, ref.tensors);
  c.run(tested, under_test.tensors);
  std::vector<OperandResult> results;
  for (size_t i = 0; i < c.operands.size(); ++i)
    if (c.operands[i].check != Check::none) results.push_back({&c.operands[i], ref.read(i), under_test.read(i)});
  return results;
}

Tolerance check_tolerance(const OpOperand& operand) {
  switch (operand.check) {
    case Check::gemm:
      return operand.format == Format::fp32 ? Tolerance{2e-5, 1e-4} : op_tolerance(operand.format);
    case Check::statistic:
      return {1e-5, 1e-5};
    case Check::exact:
    case Check::none:
      return {0, 0};
    case Check::op:
      break;
  }
  return op_tolerance(operand.format);
}

size_t bit_differences(const std::vector<float>& a, const std::vector<float>& b, size_t* first) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t count = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && count++ == 0 && first) *first = i;
  return count;
}

}  // namespace ptrain::test
